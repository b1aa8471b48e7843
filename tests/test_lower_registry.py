"""The lowering registry: every op finds its lowering by table lookup, most specific key first."""
from __future__ import annotations

import pytest

import neuron_stack.compiler.lower  # noqa: F401  (registers every lowering)
from neuron_stack.compiler.lower import registry


@pytest.mark.parametrize("target, op_class, name", [
    ("aten.addmm.default", "matmul", "matmul"),
    ("aten.linear.default", "matmul", "custom"),             # a matmul-class op with no tiled lowering
    ("aten.convolution.default", "conv", "conv"),
    ("aten.max_pool2d_with_indices.default", "reduction", "pool"),   # pooling, whatever its class
    ("aten._native_batch_norm_legit_no_training.default", "normalization", "batch_norm"),
    ("aten.relu.default", "activation", "elementwise"),
    ("aten.add.Tensor", "elementwise", "elementwise"),
    ("aten._softmax.default", "softmax", "rowwise"),
    ("aten.sum.dim_IntList", "reduction", "rowwise"),
    ("aten.sum.dim_IntList", "data_movement", "custom"),     # row-wise only in its classes
    ("aten.embedding.default", "gather", "embedding"),
    ("aten.arange.start", "gather", "iota"),
    ("aten.cat.default", "data_movement", "copy"),
    ("aten.sort.default", "data_movement", "custom"),
    ("_c10d_functional.all_reduce.default", "collective", "collective"),
])
def test_lookup_picks_the_most_specific_lowering(target, op_class, name):
    assert registry.lowering_name(target, op_class) == name


def test_every_lowering_is_a_registered_function_and_keys_are_unique():
    # "nki" is registered by the NKI front end (neuron_stack.nki.lowering) once it has been imported
    names = {e.name for e in registry.LOWERINGS.values()} - {"nki"}
    assert names == {"matmul", "conv", "pool", "batch_norm", "elementwise", "rowwise", "embedding", "iota",
                     "copy", "collective", "custom"}
    assert registry.named("copy").fn.__name__ == "lower_copy"
    with pytest.raises(ValueError, match="already lowered by 'matmul'"):
        registry.lowering("again", ops=("mm",), op_classes=("matmul",))(lambda low, n: None)
    assert registry.lowering_name("aten.mm.default", "matmul") == "matmul"   # the failed one left no trace


def test_a_fused_elementwise_node_lowered_alone_skips_chain_detection():
    entry = registry.lookup("aten.relu.default", "activation")
    assert entry.alone is not None and entry.alone is not entry.fn
