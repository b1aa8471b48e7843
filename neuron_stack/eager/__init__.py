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

import torch

__all__ = ["register", "registered"]

_done = False


def registered() -> bool:
    """Whether :func:`register` ran in this process. Example: ``registered()`` -> True after ``import torch``."""
    return _done


def register() -> None:
    """Make ``neuron`` a torch device in this process (idempotent, a few milliseconds, touches no core).

    PrivateUse1 is renamed ``neuron``; ``torch.neuron`` is the device module; ``Tensor.neuron()``,
    ``Module.neuron()`` and ``Tensor.is_neuron`` exist; factories with ``device="neuron"`` make
    :class:`~neuron_stack.eager.tensor.NeuronTensor`; the Python device guard and hooks stand in for
    the C++ ones. Nothing changes for CPU tensors.

    >>> register(); register()
    >>> torch._C._get_privateuse1_backend_name()
    'neuron'
    """
    global _done
    if _done:
        return
    from torch.utils.backend_registration import _DummyDeviceGuard, _DummyPrivateUse1Hook

    from neuron_stack.eager import device_module
    from neuron_stack.eager.tensor import MEMORY
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=False)
    torch._C._acc.register_python_privateuseone_hook(_DummyPrivateUse1Hook())
    torch._C._acc.register_python_privateuseone_device_guard(_DummyDeviceGuard())
    device_module.install_factories()
    device_module.route_compile()
    MEMORY.session_of = device_module.core_of
    _done = True


def _autoload() -> None:
    """The ``torch.backends`` entry point: PyTorch calls it at the end of ``import torch``.
    A failure must never break ``import torch``: it becomes one warning line."""
    try:
        register()
    except Exception as exc:  # pragma: no cover - depends on the torch build
        import warnings
        warnings.warn(f"neuron_stack: the neuron device is not available ({exc})", stacklevel=1)
