"""The generic lowering: an op without a dedicated one runs as a GpSimd library kernel
(``CUSTOM_OP``) over whole tensors, so every op of every class gets instructions and a time.
"""
from __future__ import annotations

import math

from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.registry import lowering
from neuron_stack.compiler.lower.tiles import PMAX, is_ref, nbytes_of, view_operand
from neuron_stack.device.cost import ceil_div, gpsimd_ns
from neuron_stack.ir import Node

#: ops that only assert a tensor's metadata (``.to()`` emits one): no device work
COMPILE_TIME_CHECKS = ("aten._assert_tensor_metadata.default",)
#: scatters that write a few rows of their first input and return it (the KV-cache update)
IN_PLACE_SCATTERS = ("aten.index_put.default", "aten.index_put_.default", "aten.index_copy.default",
                     "aten.index_copy_.default")


@lowering("custom")             # the fallback: every op without a dedicated lowering
def lower_custom(low: Lowerer, n: Node) -> None:
    """Ops without a dedicated lowering run as one GpSimd ``CUSTOM_OP`` over whole HBM tensors
    (GpSimd cores reach memory through their own DMA): ``150 + N`` cycles per 128-lane pass."""
    if n.target in COMPILE_TIME_CHECKS:
        return          # checked when the graph was traced; no output, nothing runs on the device
    srcs, template = [], []
    for a in n.args:
        template.append(_tmpl(low, a, srcs))
    kwargs = {k: _tmpl(low, v, srcs) for k, v in n.kwargs.items()}
    dsts = []
    for i, spec in enumerate(n.outputs):
        key = n.name if i == 0 else f"{n.name}:{i}"
        v = low.out_view(key, spec)
        dsts.append(view_operand(v))
    elems = sum(math.prod(s.shape) for s in n.inputs) + sum(math.prod(s.shape) for s in n.outputs)
    nread = sum(math.prod(_shape(o)) * nbytes_of(o["dt"]) for o in srcs)
    nwrite = sum(spec.numel * nbytes_of(spec.dtype) for spec in n.outputs)
    if n.target in IN_PLACE_SCATTERS and len(n.inputs) >= 2 and is_ref(n.args[0]) and \
            low.by_name[n.args[0]["node"]].target == "placeholder":
        # a KV-cache update: the cache is a graph input updated in place (an input/output alias, as
        # NxDI's KV cache manager writes it), so only the new rows and their indices move
        moved = n.inputs[1:]
        elems = 2 * sum(math.prod(s.shape) for s in moved)
        nread = sum(s.numel * nbytes_of(s.dtype) for s in moved)
        nwrite = n.inputs[-1].numel * nbytes_of(n.inputs[-1].dtype)
    dur = gpsimd_ns(low.p, ceil_div(elems, PMAX)) + (nread + nwrite) / low.p.dma_bytes_per_ns_per_engine
    low.emit("CUSTOM_OP", n.name, dsts, srcs, {"aten": n.target, "args": template, "kwargs": kwargs},
             dur=dur, flops=n.flops, hbm_read=nread, hbm_write=nwrite, small=False)


def _shape(o: dict) -> list[int]:
    return [num for _, num in o["ap"]]


def _tmpl(low: Lowerer, a, srcs: list):
    if is_ref(a):
        v = low.value(a)
        op = view_operand(v)
        op["shape"] = list(v.shape)
        op["strides"] = list(v.meta.stride())
        op["o"] = int(v.meta.storage_offset())
        srcs.append(op)
        return {"src": len(srcs) - 1}
    if isinstance(a, list):
        return [_tmpl(low, x, srcs) for x in a]
    return a
