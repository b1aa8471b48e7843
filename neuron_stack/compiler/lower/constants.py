"""Compile-time layout and dtype choices for weights, as neuronx-cc makes them: a weight used as a
matmul operand whose contraction dim is contiguous is stored transposed, a convolution weight as
[C, *K, O], and with ``--auto-cast`` in the cast type. Runs before any node is lowered.
"""
from __future__ import annotations

from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.matmul import matmul_operands
from neuron_stack.compiler.lower.registry import lowering_name, prepare_pass
from neuron_stack.compiler.lower.tiles import conv_weight_strides, is_ref


@prepare_pass
def prepare_constants(low: Lowerer) -> None:
    """Weights are laid out and cast at compile time, as neuronx-cc does: a weight used as a
    matmul operand whose contraction dim is contiguous is stored transposed (so tiles load with
    long contiguous rows), and with ``--auto-cast`` it is stored in the cast type."""
    low.const_strides.clear()
    low.const_dtype.clear()
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
        for v, want_contig_dim in ((a, -2), (b, -1)):
            if v.buf not in low.const_names or len(low.hbm.get(v.buf, {}).get("shape", [])) != 2:
                continue
            if v.meta.stride()[want_contig_dim] != 1 and v.meta.dim() >= 2:
                base = low.hbm[v.buf]["shape"]
                low.const_strides[v.buf] = (1, base[0])      # column-major storage
            if low.auto_cast in ("matmult", "all") and v.dtype == "float32" and _only_matmul_users(low, v.buf):
                low.const_dtype[v.buf] = low.cast_type
    # forget the views resolved while looking, so they are rebuilt over the chosen layouts
    low.values.clear()
    low.hbm.clear()
    low.inputs.clear()
    low.preparing = False


def _only_matmul_users(low: Lowerer, name: str) -> bool:
    for u in low.users.get(name, []):
        un = low.by_name[u]
        if un.op_class == "view":
            if not _only_matmul_users(low, u):
                return False
        elif un.op_class not in ("matmul", "conv"):
            return False
    return True
