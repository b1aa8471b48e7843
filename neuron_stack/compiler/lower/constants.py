"""Compile-time layout and dtype choices for weights, as neuronx-cc makes them: a weight used as a
matmul operand whose contraction dim is contiguous is stored transposed, a convolution weight as
[C, *K, O], and with ``--auto-cast`` in the cast type. Runs before any node is lowered.
"""
from __future__ import annotations

from neuron_stack.compiler.lower.custom import COMPILE_TIME_CHECKS
from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.matmul import lane_predicted, matmul_operands
from neuron_stack.compiler.lower.registry import lowering_name, prepare_pass
from neuron_stack.compiler.lower.tiles import MOVING_FMAX, PMAX, conv_weight_strides, is_ref


@prepare_pass
def prepare_constants(low: Lowerer) -> None:
    """Weights are laid out and cast at compile time, as neuronx-cc does: a weight used as a
    matmul operand whose contraction dim is contiguous is stored transposed (so tiles load with
    long contiguous rows), and with ``--auto-cast`` it is stored in the cast type."""
    low.const_strides.clear()
    low.const_dtype.clear()
    low.const_ktiled.clear()
    ktiled: dict[str, tuple[int, int] | None] = {}      # None: some use of the weight cannot take K-tiles
    low.preparing = True
    for n in low.nodes:
        if lowering_name(n.target, n.op_class) == "conv" and len(n.args) > 1 and is_ref(n.args[1]):
            w = low.value(n.args[1])
            base = low.hbm.get(w.buf, {}).get("shape", [])
            if w.buf in low.const_names and len(base) in (3, 4) and tuple(base) == w.shape:
                low.const_strides[w.buf] = conv_weight_strides(base)      # [C, *K, O] storage
                if low.auto_cast in ("matmult", "all") and w.dtype == "float32" and _only_matmul_users(low, w.buf):
                    low.const_dtype[w.buf] = low.cast_type
            continue
        if n.op_class != "matmul" or n.fused_into:
            continue
        ops = matmul_operands(low, n)
        if ops is None:
            continue
        a, b = ops[0], ops[1]
        if a.buf in low.const_names:
            ktiled[a.buf] = None
        if b.buf in low.const_names:
            # a decode step's activations kept in the lane layout contract in its order: the weight stays K-major
            kt = None if lane_predicted(low, a) else _ktiles(low, b)
            ktiled[b.buf] = kt if ktiled.get(b.buf, kt) == kt else None
        for v, want_contig_dim in ((a, -2), (b, -1)):
            if v.buf not in low.const_names or len(low.hbm.get(v.buf, {}).get("shape", [])) != 2:
                continue
            if v.meta.stride()[want_contig_dim] != 1 and v.meta.dim() >= 2:
                base = low.hbm[v.buf]["shape"]
                low.const_strides[v.buf] = (1, base[0])      # column-major storage
            if low.auto_cast in ("matmult", "all") and v.dtype == "float32" and _only_matmul_users(low, v.buf):
                low.const_dtype[v.buf] = low.cast_type
    low.const_ktiled.update({k: v for k, v in ktiled.items() if v is not None and _only_matmul_users(low, k)})
    # forget the views resolved while looking, so they are rebuilt over the chosen layouts
    low.values.clear()
    low.hbm.clear()
    low.inputs.clear()
    low.preparing = False


def _ktiles(low: Lowerer, b) -> tuple[int, int] | None:
    """``(the weight's contraction dim, K / 128)`` when the moving operand ``b`` [K, N] (a whole 2-D weight) is
    worth storing in K-tiles: a decode or tensor-parallel shard whose rows are short (N x 2 B of a 128-column
    shard is 256 B per partition, descriptor-bound under the DMA guide's 2 KiB) loads several K-tiles per DMA
    with every partition's bytes contiguous, as neuronx-cc lays constants out for their consumer."""
    shape = low.hbm.get(b.buf, {}).get("shape", [])
    if len(shape) != 2 or b.meta.dim() != 2 or b.meta.storage_offset() != 0:
        return None
    K, N = b.shape
    if K % PMAX or K // PMAX < 2 or N > 2 * MOVING_FMAX or K * N != shape[0] * shape[1]:
        return None
    dk = 1 if b.meta.stride()[0] == 1 and K > 1 and tuple(shape) == (N, K) else 0
    if dk == 0 and tuple(shape) != (K, N):
        return None
    return dk, K // PMAX


def _only_matmul_users(low: Lowerer, name: str) -> bool:
    for u in low.users.get(name, []):
        un = low.by_name[u]
        if un.op_class == "view" or low.folded_dequant(un) is not None:     # a quantized weight's cast: folded
            if not _only_matmul_users(low, u):
                return False
        elif un.op_class not in ("matmul", "conv") and un.target not in COMPILE_TIME_CHECKS:
            return False
    return True
