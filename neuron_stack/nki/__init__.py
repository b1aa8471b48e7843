"""NKI on the simulated NeuronCore: write a kernel, get its numbers, its engine timeline and its profile.

The real SDK's entry points (reference llm_serving_and_nki.md §1.1): ``jit`` (and ``kernel[grid]``),
the legacy ``baremetal``, ``simulate_kernel``, ``benchmark`` and ``profile``, and the current
``simulate``. A kernel written for the SDK runs after changing only its imports::

    import neuron_stack.nki as nki
    import neuron_stack.nki.language as nl
    import neuron_stack.nki.isa as nisa

Tracing the kernel records ISA instructions with their kernel source lines
(:mod:`neuron_stack.nki.core`); the interpreter gives the numbers, the compiler's scheduler and
cost model the time (``benchmark``), and ``profile`` (or any call under ``neuron-explorer inspect``)
writes one row per instruction with its ``nki_source_location`` into the trace store. docs/nki.md.

>>> import numpy as np
>>> import neuron_stack.nki.language as nl
>>> @jit
... def scale(a):
...     out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
...     nl.store(out, value=nl.load(a) * 3.0)
...     return out
>>> scale(np.ones((2, 2), np.float32)).tolist()
[[3.0, 3.0], [3.0, 3.0]]
"""
from __future__ import annotations

from . import compiler, isa, language, typing  # noqa: F401  (language supplies the tensor operators, see core.TENSOR_OPS)
from . import lowering as _lowering  # noqa: F401  (registers the nki op lowering with the compiler)
from .core import NKIError
from .kernel import Kernel, KernelRun, run_kernel
from .runner import baremetal, benchmark, jit, profile, simulate, simulate_kernel, trace


def __getattr__(name):
    # the legacy ``neuronxcc.nki`` also exposed the language at the top (``nki.ndarray``, ``nki.par_dim``)
    return getattr(language, name)


__all__ = [
           "Kernel",
           "KernelRun",
           "NKIError",
           "baremetal",
           "benchmark",
           "jit",
           "profile",
           "run_kernel",
           "simulate",
           "simulate_kernel",
           "trace",
]
