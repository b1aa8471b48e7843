"""The ``neuron`` torch device (TorchNeuron-style): PyTorch's PrivateUse1 backend renamed to ``neuron``,
a device module reachable as ``torch.neuron``, tensors placed on simulated NeuronCores and eager ops
compiled one by one into cached NEFFs (:mod:`.dispatch`).

:func:`register` does it once per process. It runs when torch is imported (PyTorch loads the
``torch.backends`` entry point of installed device backends) and again, as a no-op, on
``import neuron_stack``. ``torch.compile(model)`` on neuron tensors uses the neuron backend.

>>> import torch, neuron_stack
>>> torch.neuron.is_available(), torch.device("neuron").type
(True, 'neuron')
>>> m = torch.nn.Linear(3, 2)
>>> x = torch.randn(4, 3)
>>> torch.allclose(m.to("neuron")(x.to("neuron")).cpu(), m.cpu()(x), rtol=1e-4, atol=1e-6)
True
"""
from __future__ import annotations

# no module-level torch import: `import torch` runs this package's autoload, which must find it whole
__all__ = ["register", "registered"]

_done = False


def registered() -> bool:
    """Whether :func:`register` ran in this process. Example: ``registered()`` -> True after ``import torch``."""
    return _done


def register() -> None:
    """Make ``neuron`` a torch device in this process (idempotent, a few milliseconds, touches no core).

    PrivateUse1 is renamed ``neuron``; ``torch.neuron`` is the device module; ``Tensor.neuron()``,
    ``Module.neuron()`` and ``Tensor.is_neuron`` exist; factories with ``device="neuron"`` make
    :class:`~neuron_stack.eager.dispatch.NeuronTensor`; the Python device guard and hooks stand in for
    the C++ ones. Nothing changes for CPU tensors.

    >>> import torch
    >>> register(); register()
    >>> torch._C._get_privateuse1_backend_name()
    'neuron'
    """
    global _done
    if _done:
        return
    import torch  # if this is the process's first import of torch, its autoload has registered already
    if _done:
        return
    from torch.utils.backend_registration import _DummyDeviceGuard, _DummyPrivateUse1Hook

    from neuron_stack.eager import device_module  # may still be importing (it imported torch): fine
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=False)
    torch._C._acc.register_python_privateuseone_hook(_DummyPrivateUse1Hook())
    torch._C._acc.register_python_privateuseone_device_guard(_DummyDeviceGuard())
    _install_factories(torch)
    _route_compile(torch)
    _register_distributed(torch)
    _done = True


def _register_distributed(torch) -> None:
    """``torch.distributed.init_process_group("neuron")``: the group of :mod:`.distributed`, imported
    only when a job creates it."""
    dist = torch.distributed
    if not dist.is_available() or "neuron" in dist.Backend.backend_list:
        return

    def create(store, rank, size, timeout):
        from neuron_stack.eager.distributed import create_backend
        return create_backend(store, rank, size, timeout)

    dist.Backend.register_backend("neuron", create, devices=["neuron", "cpu"])


_lib = None


def _install_factories(torch) -> None:
    """``torch.empty``/``empty_strided`` with ``device="neuron"`` (every other factory builds on them)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")

    def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        from neuron_stack.eager.device_module import index_of
        from neuron_stack.eager.dispatch import NeuronTensor
        return NeuronTensor(torch.empty(size, dtype=dtype, memory_format=memory_format), index_of(device))

    def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
        from neuron_stack.eager.device_module import index_of
        from neuron_stack.eager.dispatch import NeuronTensor
        return NeuronTensor(torch.empty_strided(size, stride, dtype=dtype), index_of(device))

    _lib.impl("empty.memory_format", empty, "PrivateUse1")
    _lib.impl("empty_strided", empty_strided, "PrivateUse1")


def _route_compile(torch) -> None:
    """``torch.compile(model)`` (the default backend) compiles graphs on ``neuron`` tensors with the neuron
    backend, as Inductor does for CUDA tensors; graphs on CPU tensors still go to Inductor."""
    cls = getattr(torch, "_TorchCompileInductorWrapper", None)
    if cls is None or getattr(cls.__call__, "_neuron", False):
        return
    inductor = cls.__call__

    def __call__(self, model_, inputs_, *args, **kwargs):
        if any(isinstance(x, torch.Tensor) and x.device.type == "neuron" for x in inputs_):
            from torch._dynamo.backends.registry import lookup_backend
            return lookup_backend("neuron")(model_, inputs_)
        return inductor(self, model_, inputs_, *args, **kwargs)

    __call__._neuron = True
    cls.__call__ = __call__


def _autoload() -> None:
    """The ``torch.backends`` entry point: PyTorch calls it at the end of ``import torch``.
    A failure must never break ``import torch``: it becomes one warning line."""
    try:
        register()
    except Exception as exc:  # pragma: no cover - depends on the torch build
        import warnings
        warnings.warn(f"neuron_stack: the neuron device is not available ({exc})", stacklevel=1)
