"""``torch.neuron``: the device module of the ``neuron`` device, in the shape of ``torch.cuda``.

``device_count()`` is the number of NeuronCores this process sees (``NEURON_RT_VISIBLE_CORES`` /
``NEURON_RT_NUM_CORES``, one by default); ``neuron:i`` is the i-th of them. Memory figures are the
bytes of live device tensors (what compiled NEFFs hold is in ``neuron-monitor``'s other categories).

>>> import torch, neuron_stack
>>> torch.neuron.current_device(), torch.neuron.memory_allocated() >= 0
(0, True)
"""
from __future__ import annotations

import torch

from neuron_stack.eager.tensor import MEMORY, NeuronTensor

_current = {"index": 0}


def core_of(index: int):
    """The runtime session and NeuronCore behind ``neuron:index``."""
    from neuron_stack.eager.dispatch import core_of as _core_of
    return _core_of(index)


def _index(device=None) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return d.index if d.index is not None else current_device()


def is_available() -> bool:
    """Always True: the NeuronCores are simulated. Example: ``torch.neuron.is_available()``."""
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """The NeuronCores this process sees. Example: ``torch.neuron.device_count()`` -> 1."""
    from neuron_stack.eager.dispatch import session
    return len(session().cores)


def current_device() -> int:
    """The index new ``neuron`` tensors go to. Example: ``torch.neuron.current_device()`` -> 0."""
    return _current["index"]


def set_device(device) -> None:
    """Make ``neuron:i`` the current device. Example: ``torch.neuron.set_device(0)``."""
    index = _index(device)
    core_of(index)          # refuses an index the process does not see
    _current["index"] = index
    from neuron_stack.eager import dispatch
    dispatch._state["index"] = index


def synchronize(device=None) -> None:
    """Wait for the device: eager ops finish before they return, so there is nothing to wait for.
    Scripts call it before timing, as on hardware. Example: ``torch.neuron.synchronize()``."""


def memory_allocated(device=None) -> int:
    """Bytes of live ``neuron`` tensors on ``device``. Example: ``torch.neuron.memory_allocated()``."""
    return MEMORY.allocated.get(_index(device), 0)


def max_memory_allocated(device=None) -> int:
    """The peak of :func:`memory_allocated` since the start or :func:`reset_peak_memory_stats`."""
    return MEMORY.peak.get(_index(device), 0)


def reset_peak_memory_stats(device=None) -> None:
    index = _index(device)
    MEMORY.peak[index] = MEMORY.allocated.get(index, 0)


def memory_stats(device=None) -> dict:
    """``allocated_bytes.all.current`` / ``.peak`` (torch.cuda's key names) and the HBM of the core."""
    index = _index(device)
    session, _ = core_of(index)
    return {"allocated_bytes.all.current": memory_allocated(index), "allocated_bytes.all.peak":
            max_memory_allocated(index), "hbm_bytes": session.profile.hbm_bytes_per_core}


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the core's HBM, as ``torch.cuda.mem_get_info``."""
    session, core = core_of(_index(device))
    total = session.profile.hbm_bytes_per_core
    return total - sum(session.device_memory[core].values()), total


def manual_seed(seed: int) -> None:
    """Random ops on ``neuron`` tensors draw from the CPU generator: this seeds it."""
    torch.default_generator.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Called by ``torch.manual_seed``, which has already seeded the CPU generator the device draws from."""


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state, device=None) -> None:
    torch.set_rng_state(state)


def get_amp_supported_dtype() -> list:
    return [torch.bfloat16, torch.float16]


# -- factories and torch.compile ----------------------------------------------------------------------

_lib = None


def install_factories() -> None:
    """``torch.empty``/``empty_strided`` with ``device="neuron"`` (every other factory builds on them)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")

    def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return NeuronTensor(torch.empty(size, dtype=dtype, memory_format=memory_format), _index(device))

    def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
        return NeuronTensor(torch.empty_strided(size, stride, dtype=dtype), _index(device))

    _lib.impl("empty.memory_format", empty, "PrivateUse1")
    _lib.impl("empty_strided", empty_strided, "PrivateUse1")


def _on_neuron(inputs) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "neuron" for x in inputs)


def route_compile() -> None:
    """``torch.compile(model)`` (the default backend) compiles graphs on ``neuron`` tensors with the neuron
    backend, as Inductor does for CUDA tensors; graphs on CPU tensors still go to Inductor."""
    cls = getattr(torch, "_TorchCompileInductorWrapper", None)
    if cls is None or getattr(cls.__call__, "_neuron", False):
        return
    inductor = cls.__call__

    def __call__(self, model_, inputs_, *args, **kwargs):
        if _on_neuron(inputs_):
            from torch._dynamo.backends.registry import lookup_backend
            return lookup_backend("neuron")(model_, inputs_)
        return inductor(self, model_, inputs_, *args, **kwargs)

    __call__._neuron = True
    cls.__call__ = __call__
