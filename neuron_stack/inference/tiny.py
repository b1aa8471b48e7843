"""A tiny random-weight Llama checkpoint (no download) to try the inference path end to end.

>>> path = save_tiny_llama("/tmp/tiny-llama")        # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

#: GQA (4 query heads, 2 KV heads), RoPE, RMSNorm, SiLU-gated MLP;
#: 259 ids = the byte tokenizer's 3 specials + 256 bytes.
TINY_LLAMA = dict(
    vocab_size=259,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def tiny_llama(seed: int = 0, **overrides):
    """The tiny Llama as a ``transformers`` model with seeded random weights."""
    import torch
    import transformers

    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TINY_LLAMA, **overrides})).eval()


def save_tiny_llama(path, seed: int = 0, **overrides) -> Path:
    """Write the tiny Llama (config.json + safetensors) to ``path``; returns the path."""
    out = Path(path)
    tiny_llama(seed, **overrides).save_pretrained(out)
    return out
