"""NKI kernels inside PyTorch models: each kernel becomes the custom op ``torch.ops.nki.<name>``.

Calling an ``@nki.jit`` kernel on tensors while a model is being captured (``neuron_stack.trace``,
``torch.export``, ``torch.compile(backend="neuron")``) records one op in the graph instead of
tracing the kernel's Python. The compiler gives that op the class ``nki`` and its lowering
(:mod:`neuron_stack.nki.lowering`, registered in the compiler's lowering registry) emits the
kernel's own instructions; at run time the op's CPU implementation runs the kernel in the ISA
interpreter, so the model's numbers are the kernel's numbers.

The op name carries a hash of the kernel's source and launch grid: editing the kernel changes the
graph, so the persistent compile cache never serves a NEFF built from an older kernel.

>>> import torch
>>> import neuron_stack.nki as nki, neuron_stack.nki.language as nl
>>> @nki.jit
... def twice(a):
...     out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
...     nl.store(out, value=nl.load(a) * 2.0)
...     return out
>>> op = torch_op(twice, (torch.ones(2, 3),))
>>> op(torch.ones(2, 3))[0, 0].item(), str(op).startswith("nki.twice_")
(2.0, True)
"""
from __future__ import annotations

import hashlib
import inspect
import threading

import torch

from .core import NKIError

_lib = None
_lock = threading.Lock()
#: op name -> (kernel, grid); the lowering finds the kernel of a graph node here
KERNELS: dict[str, tuple] = {}
_OPS: dict[tuple, object] = {}


def _library():
    global _lib
    if _lib is None:
        _lib = torch.library.Library("nki", "FRAGMENT")
    return _lib


def op_name(kernel) -> str:
    """``<kernel name>_<hash of its source and grid>`` (a valid op name)."""
    try:
        src = inspect.getsource(kernel.fn)
    except (OSError, TypeError):
        src = kernel.fn.__code__.co_code.hex()
    h = hashlib.sha1((src + repr(kernel.grid)).encode()).hexdigest()[:10]
    return f"{kernel.__name__}_{h}"


def _outputs_of(kernel, tensors) -> list[tuple]:
    """(shape, dtype) of each output, from a timing-only trace of the kernel on these shapes."""
    from .core import dtype_name
    from .kernel import Spec, run_kernel
    specs = tuple(Spec(tuple(int(d) for d in t.shape), dtype_name(t.dtype)) for t in tensors)
    run = run_kernel(kernel, specs, execute=False)
    outs = []
    for name in run.schedule.outputs:
        meta = run.trace.hbm[name]
        outs.append((tuple(meta["shape"]), meta["dtype"]))
    return outs


def torch_op(kernel, example: tuple):
    """The ``torch.ops.nki`` overload running ``kernel`` (registered on first use for its signature).

    ``example``: the tensors it will be called with (shapes define the op's outputs).
    """
    name = op_name(kernel)
    with _lock:
        if name in KERNELS:
            return getattr(torch.ops.nki, name).default
        sig = inspect.signature(kernel.fn).parameters
        params = list(sig)
        required = [p for p in params if sig[p].default is inspect.Parameter.empty]
        if not len(required) <= len(example) <= len(params):
            raise NKIError(f"kernel {kernel.__name__} called from PyTorch takes tensors only: it has "
                           f"{len(params)} parameters ({len(required)} without a default), got {len(example)} "
                           f"tensors")
        params = params[:len(example)]      # the rest keep their defaults
        outs = _outputs_of(kernel, example)
        ret = "Tensor" if len(outs) == 1 else "(" + ", ".join(["Tensor"] * len(outs)) + ")"
        lib = _library()
        lib.define(f"{name}({', '.join(f'Tensor {p}' for p in params)}) -> {ret}")

        def cpu(*tensors):
            from .kernel import run_kernel
            run = run_kernel(kernel, tuple(t.detach() for t in tensors))
            res = [o.clone() for o in run.outputs]
            return res[0] if len(res) == 1 else tuple(res)

        shapes = {tuple((tuple(t.shape), t.dtype) for t in example): outs}

        def fake(*tensors):
            key = tuple((tuple(t.shape), t.dtype) for t in tensors)
            if key not in shapes:
                shapes[key] = _outputs_of(kernel, tensors)
            res = [tensors[0].new_empty(s, dtype=getattr(torch, dt)) for s, dt in shapes[key]]
            return res[0] if len(res) == 1 else tuple(res)

        lib.impl(name, cpu, "CPU")
        torch.library.register_fake(f"nki::{name}", fake, lib=lib)
        KERNELS[name] = (kernel, kernel.grid)
        return getattr(torch.ops.nki, name).default


def captured(args) -> bool:
    """A call on torch tensors that are being captured into a graph (not an eager call)."""
    return any(isinstance(a, torch.Tensor) for a in args) and tracing(args)


def tracing(args) -> bool:
    """Whether a kernel call with these arguments is being captured into a graph (fake tensors,
    torch.export, dynamo) rather than run eagerly."""
    if torch.compiler.is_compiling():
        return True
    from torch._subclasses.fake_tensor import FakeTensor
    for a in args:
        if isinstance(a, torch.Tensor) and (isinstance(a, FakeTensor)
                                            or torch._C._functorch.is_functorch_wrapped_tensor(a)
                                            or type(a).__name__ in ("FunctionalTensor", "Proxy")):
            return True
    return False
