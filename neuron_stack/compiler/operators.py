"""The operator-support table: every core ATen op we know -> NeuronCore op class, or CPU with a reason.

Data, one place. Keys are ATen overload packets (``aten.addmm``: every overload of ``addmm``);
a key with an overload (``aten.index.Tensor``) wins over its packet. Values are
``(op_class, note)``: ``op_class`` is one of :data:`neuron_stack.ir.OP_CLASSES`; for ``cpu`` the
note is the fallback reason shown to the user, otherwise it names the engine work it lowers to.
Ops missing from the table fall back to the CPU ("no NeuronCore lowering").

>>> lookup("aten.addmm.default")
('matmul', 'TensorE MATMUL with bias epilogue')
>>> lookup("aten.nonzero.default")[0]
'cpu'
>>> lookup("aten.rms_norm.default")[0]
'normalization'
>>> lookup("aten.fft_fft.default")[1]
'no NeuronCore lowering for aten.fft_fft: runs on the host CPU'
"""
from __future__ import annotations

_DATA_DEP = "data-dependent output shape: a NeuronCore graph needs static shapes, so it runs on the host CPU"

_MATMUL = {
    "aten.mm": "TensorE MATMUL", "aten.addmm": "TensorE MATMUL with bias epilogue",
    "aten.bmm": "TensorE MATMUL per batch", "aten.baddbmm": "TensorE MATMUL per batch with epilogue",
    "aten.dot": "TensorE MATMUL", "aten.mv": "TensorE MATMUL", "aten.addmv": "TensorE MATMUL",
    "aten._scaled_dot_product_flash_attention_for_cpu": "TensorE MATMUL + ScalarE softmax",
    "aten.scaled_dot_product_attention": "TensorE MATMUL + ScalarE softmax (fused attention)",
}
_CONV = {
    "aten.convolution": "TensorE MATMUL over im2col tiles",
    "aten.convolution_backward": "TensorE MATMUL over im2col tiles",
}
_ELEMENTWISE = [
    "add", "sub", "mul", "div", "neg", "abs", "pow", "maximum", "minimum", "clamp", "clamp_min",
    "clamp_max", "where", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not", "bitwise_xor", "sign",
    "floor", "ceil", "round", "trunc", "remainder", "fmod", "masked_fill", "fill", "lerp", "addcmul",
    "addcdiv", "isnan", "isinf", "sgn", "copysign", "hypot", "atan2", "rsub", "frac", "triu", "tril",
    "square", "floor_divide", "bitwise_left_shift", "bitwise_right_shift", "nan_to_num",
    "native_dropout_backward", "mse_loss", "mse_loss_backward",
]
_ACTIVATION = [
    "relu", "gelu", "tanh", "sigmoid", "silu", "exp", "exp2", "log", "log2", "log10", "log1p",
    "expm1", "erf", "erfinv", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
    "acosh", "atanh", "rsqrt", "sqrt", "reciprocal", "elu", "leaky_relu", "hardtanh", "hardsigmoid",
    "hardswish", "softplus", "mish", "gelu_backward", "threshold_backward", "sigmoid_backward",
    "tanh_backward", "silu_backward", "elu_backward", "leaky_relu_backward", "hardtanh_backward",
    "softplus_backward", "relu6", "logit", "glu",
]
_REDUCTION = [
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "any", "all", "prod", "var",
    "var_mean", "std", "logsumexp", "cumsum", "cumprod", "norm", "linalg_vector_norm",
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward",
    "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "adaptive_avg_pool2d", "avg_pool1d",
    "max_pool3d_with_indices", "nll_loss_forward", "nll_loss_backward",
]
_SOFTMAX = ["_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"]
_NORMALIZATION = [
    "native_layer_norm", "native_layer_norm_backward", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit_functional", "_native_batch_norm_legit", "native_batch_norm_backward",
    "native_group_norm", "native_group_norm_backward", "_fused_rms_norm",
]
_DATA_MOVEMENT = [
    "cat", "stack", "constant_pad_nd", "clone", "copy", "_to_copy", "repeat", "flip", "roll",
    "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter", "reflection_pad2d",
    "replication_pad2d", "upsample_nearest2d", "upsample_bilinear2d", "_upsample_nearest_exact2d",
    "pixel_shuffle", "native_dropout", "bernoulli", "rand", "randn", "rand_like", "randn_like",
    "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "empty", "empty_like",
    "empty_strided", "new_zeros", "new_ones", "new_full", "new_empty", "new_empty_strided",
    "scalar_tensor", "lift_fresh_copy", "_assert_tensor_metadata", "masked_fill_",
]
_GATHER = {
    "aten.embedding": "GpSimd gather of table rows (DMA descriptors)",
    "aten.embedding_dense_backward": "GpSimd scatter-add of gradient rows",
    "aten.gather": "GpSimd gather", "aten.scatter": "GpSimd scatter", "aten.scatter_add": "GpSimd scatter",
    "aten.scatter_reduce": "GpSimd scatter", "aten.index_select": "GpSimd gather",
    "aten.index": "GpSimd gather (integer indices)", "aten.index_put": "GpSimd scatter",
    "aten.index_add": "GpSimd scatter-add", "aten.arange": "GpSimd IOTA", "aten.iota": "GpSimd IOTA",
    "aten.sort": "GpSimd sort network", "aten.topk": "GpSimd top-k (MAX8 + MATCH_REPLACE)",
    "aten.one_hot": "GpSimd IOTA + compare", "aten.masked_scatter": "GpSimd scatter",
}
_VIEW = [
    "view", "_unsafe_view", "reshape", "permute", "expand", "squeeze", "unsqueeze", "select",
    "slice", "t", "transpose", "alias", "as_strided", "detach", "split", "split_with_sizes",
    "unbind", "narrow", "view_as_real", "view_as_complex", "unfold", "diagonal", "expand_copy",
    "view_copy", "permute_copy", "unsqueeze_copy", "squeeze_copy", "t_copy", "transpose_copy",
    "alias_copy", "split_copy", "chunk", "movedim", "flatten", "unflatten",
]
_COLLECTIVE = {
    "_c10d_functional.all_reduce": "CC all-reduce: the runtime's algorithm for its size over NeuronLink",
    "_c10d_functional.all_gather_into_tensor": "CC all-gather: the runtime's algorithm for its size over NeuronLink",
    "_c10d_functional.reduce_scatter_tensor": "CC reduce-scatter: the runtime's algorithm for its size over NeuronLink",
    "_c10d_functional.wait_tensor": "CC semaphore wait",
}
_CPU = {
    "aten.nonzero": _DATA_DEP, "aten.masked_select": _DATA_DEP, "aten._unique2": _DATA_DEP,
    "aten.unique_dim": _DATA_DEP, "aten.unique_consecutive": _DATA_DEP, "aten.unique": _DATA_DEP,
    "aten.nonzero_static": _DATA_DEP, "aten.repeat_interleave": _DATA_DEP,
    "aten.sym_size": "shape arithmetic on a data-dependent size: runs on the host",
    "aten.sym_numel": "shape arithmetic on a data-dependent size: runs on the host",
    "aten._assert_scalar": "runtime shape assertion: runs on the host",
    "aten.sym_constrain_range_for_size": "runtime shape assertion: runs on the host",
    "aten._local_scalar_dense": "reads a device value into Python (.item()): runs on the host",
    "aten.multinomial": "sampling with a data-dependent loop: runs on the host CPU",
    "aten._fft_r2c": "FFT has no NeuronCore lowering: runs on the host CPU",
    "aten._fft_c2c": "FFT has no NeuronCore lowering: runs on the host CPU",
    "aten._fft_c2r": "FFT has no NeuronCore lowering: runs on the host CPU",
    "aten.linalg_eigh": "eigendecomposition has no NeuronCore lowering: runs on the host CPU",
    "aten._linalg_svd": "SVD has no NeuronCore lowering: runs on the host CPU",
    "aten.linalg_inv_ex": "matrix inverse has no NeuronCore lowering: runs on the host CPU",
}

#: Packet or overload name -> (op_class, note).
TABLE: dict[str, tuple[str, str]] = {}
TABLE.update({k: ("matmul", v) for k, v in _MATMUL.items()})
TABLE.update({k: ("conv", v) for k, v in _CONV.items()})
TABLE.update({f"aten.{k}": ("elementwise", "VectorE TENSOR_TENSOR / TENSOR_SCALAR") for k in _ELEMENTWISE})
TABLE.update({f"aten.{k}": ("activation", "ScalarE ACTIVATE (lookup-table function)") for k in _ACTIVATION})
TABLE.update({f"aten.{k}": ("reduction", "VectorE REDUCE along the free axis") for k in _REDUCTION})
TABLE.update({f"aten.{k}": ("softmax", "VectorE max/sum REDUCE + ScalarE exp") for k in _SOFTMAX})
TABLE.update({f"aten.{k}": ("normalization", "VectorE BN_STATS/BN_AGGR + ScalarE") for k in _NORMALIZATION})
TABLE["aten.rms_norm"] = ("normalization", "ScalarE square with accumulate + VectorE rstd and scale, one pass")
TABLE.update({f"aten.{k}": ("data_movement", "DMA copy / VectorE tensor_copy") for k in _DATA_MOVEMENT})
TABLE.update({k: ("gather", v) for k, v in _GATHER.items()})
TABLE.update({f"aten.{k}": ("view", "metadata only: no device work") for k in _VIEW})
TABLE.update({k: ("collective", v) for k, v in _COLLECTIVE.items()})
TABLE.update({k: ("cpu", v) for k, v in _CPU.items()})

#: Python-level nodes of FX graphs (not ATen) and how they run.
PYTHON_NODES = {
    "getitem": ("view", "tuple element of a multi-output op: no device work"),
}
_SYMBOLIC_PY = "shape arithmetic on a data-dependent size: runs on the host"

BOOL_INDEX_REASON = ("boolean-mask indexing has a data-dependent output shape: a NeuronCore graph "
                     "needs static shapes, so it runs on the host CPU")


def packet(target: str) -> str:
    """``aten.addmm.default`` -> ``aten.addmm``; other names are returned unchanged."""
    parts = target.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 else target


def lookup(target: str) -> tuple[str, str]:
    """(op_class, note-or-fallback-reason) for an FX target name such as ``aten.addmm.default``.

    Example: ``lookup("aten.gelu.default") == ("activation", ...)``.
    """
    if target in TABLE:
        return TABLE[target]
    if target.startswith("nki."):       # torch.ops.nki.*: an NKI kernel (neuron_stack.nki), its own lowering
        return ("nki", "NKI kernel: lowered to the kernel's own instructions")
    if target in PYTHON_NODES:
        return PYTHON_NODES[target]
    if target.startswith(("operator.", "_operator.", "math.", "torch.sym_", "torch._sym_")):
        return ("cpu", _SYMBOLIC_PY)
    p = packet(target)
    if p in TABLE:
        return TABLE[p]
    return ("cpu", f"no NeuronCore lowering for {p}: runs on the host CPU")


def supported_operators() -> list[tuple[str, str, str]]:
    """Every table entry as ``(aten_name, op_class, note)``, sorted: what ``neuron-cc list-operators`` prints."""
    return sorted((k, c, n) for k, (c, n) in TABLE.items())
