"""Weight-only quantization as NxDI names it (``quantized=True``, ``quantization_dtype`` ``"int8"``, or fp8
on trn2; ``quantization_type="per_channel_symmetric"``): each decoder-layer linear keeps its weight as
int8 (or fp8) with one scale per output channel; activations stay in the model's dtype.

The module computes ``linear(x, W_q.to(x.dtype)) * scale``, which equals a matmul with the dequantized
weight, as NxDI's quantized layers do in the traced graph (neuronx_distributed ``quantization/dequantize.py``).
The compiler folds the conversion into the matmul (:meth:`Lowerer.folded_dequant`): each weight tile is
read from HBM as stored (half the bytes of bf16) and converted to the matmul dtype by its own DMA
(``neuron_stack.compiler.lower.quantized``); the scale multiplies the output as its PSUM evacuation, or in
a decode step once the output is in the lane layout. Where that pays, and what bounds a step when it does
not, the projection says per graph (``GraphProjection.hbm_bound``, ``bound_by``).
The LM head and embeddings stay unquantized.

>>> import torch
>>> lin = torch.nn.Linear(8, 4, bias=False)
>>> q = QuantizedLinear.from_linear(lin, "int8")
>>> q.weight.dtype, q.weight.numel() * q.weight.element_size() == lin.weight.numel()
(torch.int8, True)
>>> bool((q(torch.ones(1, 8)) - lin(torch.ones(1, 8))).abs().max() < 0.05)
True
"""

from __future__ import annotations

import torch

#: user spellings -> torch dtype names (NxDI ``quantization_dtype``)
QUANT_DTYPES = {"int8": "int8", "fp8": "float8_e4m3fn", "f8e4m3": "float8_e4m3fn"}
#: targets whose Tensor Engine takes fp8 (reference conventions §5.1: NC-v3 158 FP8 TFLOPS)
FP8_TARGETS = ("trn2",)
_QMAX = {"int8": 127.0, "float8_e4m3fn": 448.0}


class QuantizedLinear(torch.nn.Module):
    """A bias-free linear with a quantized weight ``[out, in]`` and a per-output-channel scale."""

    def __init__(self, in_features: int, out_features: int, dtype: str, scale_dtype, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=getattr(torch, dtype),
                                                   device=device))
        self.register_buffer("scale", torch.ones(out_features, dtype=scale_dtype, device=device))

    @classmethod
    def from_linear(cls, lin: torch.nn.Linear, dtype: str) -> QuantizedLinear:
        """Per-channel symmetric quantization of ``lin``'s weight (meta weights stay meta)."""
        w = lin.weight
        q = cls(lin.in_features, lin.out_features, QUANT_DTYPES.get(dtype, dtype), w.dtype, device=w.device)
        if w.device.type != "meta":
            qmax = _QMAX[str(q.weight.dtype).removeprefix("torch.")]
            scale = (w.detach().float().abs().amax(dim=1) / qmax).clamp(min=1e-12)
            wq = w.detach().float() / scale[:, None]
            q.weight.copy_((wq.round().clamp(-qmax, qmax) if q.weight.dtype == torch.int8 else wq).to(q.weight.dtype))
            q.scale.copy_(scale.to(q.scale.dtype))
        return q

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight.to(x.dtype)) * self.scale


def quantize_decoder(model, dtype: str):
    """Replace every ``nn.Linear`` inside the decoder layers of ``model`` by a :class:`QuantizedLinear`
    (in place; returns ``model``). Example: ``quantize_decoder(llama, "int8")``."""
    for layer in model.model.layers:
        for name, mod in list(layer.named_modules()):
            if isinstance(mod, torch.nn.Linear) and mod.bias is None:
                parent = layer.get_submodule(name.rsplit(".", 1)[0]) if "." in name else layer
                setattr(parent, name.rsplit(".", 1)[-1], QuantizedLinear.from_linear(mod, dtype))
    return model
