"""Where values live and in what dtype: hooks of the Lowerer (no dependency on it, so it imports this).

- :func:`stored_dtype`: with ``--auto-cast`` an intermediate only matmuls read is stored in the cast type;
- :func:`const_broadcast`: a weight row broadcast over partitions is loaded once and broadcast on chip;
- :func:`cast_for_store`: a store into a value of another dtype converts on Scalar first (DMA cannot);
- :func:`eager_copies`: layout copies are lowered as soon as their input is ready (frees the source).

>>> sorted(MATMUL_OPERAND_ARGS)
['addmm', 'baddbmm', 'bmm', 'mm']
"""
from __future__ import annotations

from typing import Any

from neuron_stack.compiler.lower.tiles import MOVING_FMAX, PMAX, Pool, Tile, View, packet_name, view_operand
from neuron_stack.compiler.partition import refs
from neuron_stack.device.cost import ldweights_ns, matmul_ns, scalar_ns, vector_ns

Lowerer = Any      # the lowerer (lowerer.py imports this module)


#: matmul ops and the argument positions that are TensorE operands (the rest is bias)
MATMUL_OPERAND_ARGS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2)}
#: copies that keep a value's numbers (a layout change between its producer and a matmul)
_COPIES = ("clone", "_unsafe_view", "reshape", "view_copy", "permute_copy", "expand_copy")


def stored_dtype(low: Lowerer, name: str, dtype: str) -> str:
    """The dtype an intermediate is stored in: with ``--auto-cast matmult|all`` an fp32 value that
    only matmuls read (through views and layout copies) is stored in the cast type, rounded once at
    its producer's evacuation, as neuronx-cc places the cast. The numbers are those of rounding each
    matmul operand (what the runtime computes), and the value takes half the SBUF and DMA bytes.

    Example: ``gelu(x @ W1) @ W2`` keeps the [tokens, 4 x hidden] GELU output in bf16.
    """
    if low.auto_cast not in ("matmult", "all") or dtype != "float32" or ":" in name:
        return dtype
    memo = low.__dict__.setdefault("_stored_memo", {})
    if name not in memo:
        memo[name] = low.cast_type if _matmul_only(low, name, set()) else dtype
    return memo[name]


def _matmul_only(low: Lowerer, name: str, seen: set) -> bool:
    if name in seen or name not in low.in_part or low._escapes(name):
        return False
    seen.add(name)
    users = low._consumers(name)
    if not users:
        return False
    for u in users:
        un = low.by_name[u]
        if u not in low.in_part or (un.fused_into and un.fused_into in low.in_part):
            return False
        packet = packet_name(un.target)
        if un.op_class == "matmul" and packet in MATMUL_OPERAND_ARGS:
            pos = MATMUL_OPERAND_ARGS[packet]
            for i, a in enumerate(un.args):
                if _reaches(low, a, name) and i not in pos:
                    return False          # read as a bias: stays fp32
        elif packet in _COPIES and un.outputs and un.outputs[0].dtype == "float32":
            if not _matmul_only(low, u, seen):
                return False
        else:
            return False
    return True


def _reaches(low: Lowerer, arg, name: str) -> bool:
    """True if the argument ``arg`` is ``name`` or a view (chain) of it."""
    if not (isinstance(arg, dict) and set(arg) == {"node"}):
        return False
    cur = arg["node"]
    while True:
        if cur == name:
            return True
        n = low.by_name.get(cur)
        if n is None or not (n.op_class == "view" or n.target == "getitem") or not n.args:
            return False
        first = n.args[0]
        if not (isinstance(first, dict) and set(first) == {"node"}):
            return False
        cur = first["node"]



def const_broadcast(low: Lowerer, node: str, v: View, box, split: int, P: int, F: int) -> Tile:
    """A weight row broadcast over partitions (a bias along the free axis, layer-norm gamma/beta).

    It is loop-invariant, so it is built once per slot and read by every later tile, as the compiler
    hoists it: the row is loaded once from HBM ([1, F], F elements read, not P x F) and broadcast to
    the partitions on the Tensor Engine (``ones[1, P]^T @ row``, via PSUM). The slot is rebuilt only
    after the tile ring has reused it (``Lowerer.claim`` forgets it). Example: a Linear's bias read
    by every 128-row tile of its output.
    """
    op = view_operand(v, box)
    key = (v.buf, op["o"], tuple(map(tuple, op["ap"])), v.dtype)
    if key in low.bcast_tiles:
        return low.bcast_tiles[key]
    tag = f"__bcast{low.bcast_count}"
    low.bcast_count += 1
    slot = Pool(low, tag, "sbuf", P, F, v.dtype, bufs=1).tile(P, F)
    row = Pool(low, f"{tag}.row", "sbuf", 1, F, v.dtype, bufs=1).tile(1, F)
    low.dma(node, row.op(), view_operand(v, [(s0, 1) for s0, _ in box[:split]] + list(box[split:])))
    ones = Pool(low, f"{tag}.ones", "sbuf", 1, P, v.dtype, bufs=1).tile(1, P)
    low.emit("MEMSET", node, [ones.op()], [], {"value": 1.0}, dur=vector_ns(low.p, "MEMSET", P, 1, v.dtype))
    low.emit("LDWEIGHTS", node, [], [ones.op()], {}, dur=ldweights_ns(low.p, P, v.dtype))
    ps = Pool(low, f"{tag}.ps", "psum", P, min(F, MOVING_FMAX), "float32", bufs=1)
    for c0 in range(0, F, MOVING_FMAX):
        cw = min(MOVING_FMAX, F - c0)
        pt = ps.tile(P, cw)
        low.emit("MATMUL", node, [pt.op()], [ones.op(), row.cols(c0, cw).op()], {"start": True, "stop": True},
                 dur=matmul_ns(low.p, cw, P, v.dtype), flops=2 * P * cw, itype="TRANSPOSE", small=False)
        low.emit("ACTIVATE", node, [slot.cols(c0, cw).op()], [pt.op()],
                 {"func": "copy", "scale": 1.0, "bias": 0.0}, dur=scalar_ns(low.p, cw))
    low.bcast_tiles[key] = slot
    return slot


def eager_copies(low: Lowerer) -> None:
    """Lower every layout copy (``clone``) whose input is ready right away, as the compiler's scheduler
    would: the source (the fused QKV projection) is then freed after its last copy instead of staying
    resident until the graph order reaches the value head's copy."""
    for c in low.nodes:
        if c.name in low.done or c.fused_into or c.target != "aten.clone.default":
            continue
        if all(_ready(low, r) for r in refs([c.args, c.kwargs])):
            low.lower_node(c)


def _ready(low: Lowerer, name: str) -> bool:
    n = low.by_name.get(name)
    if n is None:
        return True
    if n.op_class == "view" or n.target == "getitem":      # (getitem nodes are not in in_part)
        return all(_ready(low, r) for r in refs([n.args, n.kwargs]))
    return name not in low.in_part or name in low.finished


def cast_for_store(low: Lowerer, node: str, t: Tile, dtype: str) -> Tile:
    """``t`` converted to ``dtype`` on Scalar into a staging tile: DMA engines move bytes, they do
    not convert (a value stored in bf16 under --auto-cast, evacuated from fp32 PSUM)."""
    key = (node, t.F, dtype)
    pool = low.cast_pools.get(key)
    if pool is None:
        pool = low.cast_pools[key] = Pool(low, f"{node}.cast", "sbuf", PMAX, t.F, dtype, bufs=4)
    c = pool.tile(t.P, t.F)
    low.emit("ACTIVATE", node, [c.op()], [t.op()], {"func": "copy", "scale": 1.0, "bias": 0.0},
             dur=scalar_ns(low.p, t.F))
    return c
