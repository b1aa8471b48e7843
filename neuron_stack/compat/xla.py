"""``torch_xla`` under the compat runner: the calls the SDK samples make to pick the device.

On the real SDK tensors move to the XLA device and an ``@nki.jit`` call on them compiles and runs the
kernel; the simulator here takes CPU tensors (torch in, torch out), so the XLA device is the CPU device
and syncs are no-ops (every kernel call has already run when it returns).

>>> xla_device().type, device().type, get_xla_supported_devices()
('cpu', 'cpu', ['xla:0'])
"""
from __future__ import annotations

import torch

__version__ = "0+neuron_stack"     # not a real torch_xla release: this stack stands in for it


def device(n: int | None = None) -> torch.device:
    """``torch_xla.device()``: the device kernels take here (CPU tensors)."""
    return torch.device("cpu")


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """``torch_xla.core.xla_model.xla_device()`` (the older spelling of :func:`device`)."""
    return device(n)


def sync(wait: bool = False) -> None:
    """``torch_xla.sync()``: nothing is pending here."""


def mark_step(wait: bool = False) -> None:
    """``xm.mark_step()``: nothing is pending here."""


def wait_device_ops(devices=None) -> None:
    """``xm.wait_device_ops()``: nothing is pending here."""


def get_xla_supported_devices(devkind: str | None = None, max_devices: int | None = None) -> list[str]:
    return ["xla:0"]


def xla_device_hw(device) -> str:
    return "NEURON"


def world_size() -> int:
    return 1


def global_ordinal() -> int:
    return 0


def get_ordinal() -> int:
    return 0


core = xla_model = runtime = __import__("sys").modules[__name__]     # torch_xla.core.xla_model as xm
