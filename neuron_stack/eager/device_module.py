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


def core_of(index: int):
    """The runtime session and NeuronCore behind ``neuron:index``."""
    from neuron_stack.eager.memory import core_of as _core_of
    return _core_of(index)


def index_of(device=None) -> int:
    """The device index ``device`` names (an int, ``"neuron:1"``, a torch.device); none: the current one.

    >>> index_of("neuron:0"), index_of(0)
    (0, 0)
    """
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
    from neuron_stack.eager.memory import session
    return len(session().cores)


def current_device() -> int:
    """The index new ``neuron`` tensors go to. Example: ``torch.neuron.current_device()`` -> 0."""
    from neuron_stack.eager.memory import _state
    return _state["index"]


def set_device(device) -> None:
    """Make ``neuron:i`` the current device. Example: ``torch.neuron.set_device(0)``."""
    index = index_of(device)
    core_of(index)          # refuses an index the process does not see
    from neuron_stack.eager.memory import _state
    _state["index"] = index


def synchronize(device=None) -> None:
    """Wait for the device: eager ops finish before they return, so there is nothing to wait for.
    Scripts call it before timing, as on hardware. Example: ``torch.neuron.synchronize()``."""


def memory_allocated(device=None) -> int:
    """Bytes of live ``neuron`` tensors on ``device``. Example: ``torch.neuron.memory_allocated()``."""
    from neuron_stack.eager.memory import MEMORY
    MEMORY.drain()
    return MEMORY.allocated.get(index_of(device), 0)


def max_memory_allocated(device=None) -> int:
    """The peak of :func:`memory_allocated` since the start or :func:`reset_peak_memory_stats`."""
    from neuron_stack.eager.memory import MEMORY
    return MEMORY.peak.get(index_of(device), 0)


def reset_peak_memory_stats(device=None) -> None:
    from neuron_stack.eager.memory import MEMORY
    index = index_of(device)
    MEMORY.drain()
    MEMORY.peak[index] = MEMORY.allocated.get(index, 0)


def memory_stats(device=None) -> dict:
    """``allocated_bytes.all.current`` / ``.peak`` (torch.cuda's key names) and the HBM of the core."""
    index = index_of(device)
    session, _ = core_of(index)
    return {"allocated_bytes.all.current": memory_allocated(index), "allocated_bytes.all.peak":
            max_memory_allocated(index), "hbm_bytes": session.profile.hbm_bytes_per_core}


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the core's HBM, as ``torch.cuda.mem_get_info``."""
    from neuron_stack.eager.memory import MEMORY
    MEMORY.drain()
    session, core = core_of(index_of(device))
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
