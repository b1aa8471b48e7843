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


#: a small chat template for the tiny model's tokenizer (Zephyr-style role tags)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _byte_level_tokenizer():
    """A byte-level BPE tokenizer with no merges whose ids are the byte tokenizer's (0/1/2 specials,
    ``3 + byte``), built offline, with :data:`CHAT_TEMPLATE`."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # GPT-2's printable stand-ins for the 256 bytes (what byte-level BPE vocabularies spell bytes with)
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    char = {b: chr(b if b in keep else next(extra)) for b in range(256)}
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{char[b]: 3 + b for b in range(256)}}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>", chat_template=CHAT_TEMPLATE
    )


def save_tiny_llama(path, seed: int = 0, with_tokenizer: bool = False, **overrides) -> Path:
    """Write the tiny Llama (config.json + safetensors; with ``with_tokenizer`` also a byte-level tokenizer
    and chat template) to ``path``; returns the path."""
    out = Path(path)
    tiny_llama(seed, **overrides).save_pretrained(out)
    if with_tokenizer:
        _byte_level_tokenizer().save_pretrained(out)
    return out
