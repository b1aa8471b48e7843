"""The runtime's errors: each message is one line naming the problem and the fix."""
from __future__ import annotations


class NeuronRuntimeError(RuntimeError):
    """A runtime failure whose message is one line naming the problem and the fix."""


class OutOfDeviceMemory(NeuronRuntimeError):
    """The model does not fit in the HBM of its NeuronCore."""


class InputMismatch(NeuronRuntimeError, ValueError):
    """Inputs that differ from the shapes and dtypes the NEFF was compiled for."""
