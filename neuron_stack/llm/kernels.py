"""The fused modules NxDI puts in a Hugging Face decoder before it is traced: its RMSNorm as one op.

NxDI builds every decoder norm from ``get_rmsnorm_cls()`` (aws-neuron/neuronx-distributed-inference,
``models/llama/modeling_llama.py``), which on Neuron returns ``CustomRMSNorm``
(``modules/custom_calls.py``): the hidden states cast to fp32, the ``RmsNorm`` custom call (target
``AwsNeuronRmsNorm``, one fused kernel in neuronx-cc) and the result cast back to the input dtype;
transformers-neuronx likewise called a fused ``rms_norm``. Hugging Face's own RMSNorm is six ops (cast,
pow, mean, add, rsqrt, mul) that the compiler sees one by one. :func:`fuse_rms_norms` swaps each for
:class:`FusedRMSNorm`, ``torch.nn.functional.rms_norm``: the front end keeps ``aten.rms_norm`` whole and
the compiler lowers it in one row-wise pass (``compiler/lower/rowwise.py``).

>>> import torch, transformers
>>> cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
...                                num_attention_heads=4, vocab_size=100)
>>> m = transformers.LlamaForCausalLM(cfg)
>>> fuse_rms_norms(m)
3
>>> type(m.model.norm).__name__
'FusedRMSNorm'
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

#: Hugging Face RMSNorm classes -> whether the weight is an offset from 1 (Gemma's ``x * (1 + w)``).
#: Each computes ``x * rsqrt(mean(x^2) + eps) * w`` over the last dim in fp32 (tests/test_rms_norm.py
#: checks every one transformers has against its original module).
RMS_NORMS = {
    "LlamaRMSNorm": False, "MistralRMSNorm": False, "MixtralRMSNorm": False, "Qwen2RMSNorm": False,
    "Qwen2MoeRMSNorm": False, "Qwen3RMSNorm": False, "Qwen3MoeRMSNorm": False, "Phi3RMSNorm": False,
    "GraniteRMSNorm": False, "Olmo2RMSNorm": False, "DeepseekV3RMSNorm": False,
    "GemmaRMSNorm": True, "Gemma2RMSNorm": True, "Gemma3RMSNorm": True,
}


class FusedRMSNorm(torch.nn.Module):
    """RMSNorm as one ``aten.rms_norm``: computed in fp32, returned in the input dtype (NxDI's
    ``CustomRMSNorm``). ``offset``: the weight is stored as ``w - 1`` (Gemma), applied as ``1 + w``.

    >>> n = FusedRMSNorm(torch.nn.Parameter(torch.ones(8)), 1e-6)
    >>> n(torch.ones(2, 8, dtype=torch.bfloat16)).dtype
    torch.bfloat16
    """

    def __init__(self, weight: torch.nn.Parameter, eps: float, offset: bool = False):
        super().__init__()
        self.weight, self.eps, self.offset = weight, eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float() + 1.0 if self.offset else self.weight
        return F.rms_norm(x, self.weight.shape, w, self.eps)


def fuse_rms_norms(model: torch.nn.Module) -> int:
    """Replace every RMSNorm of :data:`RMS_NORMS` in ``model`` (in place, weights shared) by a
    :class:`FusedRMSNorm`; returns how many. Example in the module docstring."""
    swaps = [(name, m) for name, m in model.named_modules() if name and type(m).__name__ in RMS_NORMS]
    for name, m in swaps:
        parent, _, attr = name.rpartition(".")
        eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
        fused = FusedRMSNorm(m.weight, eps, RMS_NORMS[type(m).__name__])
        setattr(model.get_submodule(parent) if parent else model, attr, fused)
    return len(swaps)
