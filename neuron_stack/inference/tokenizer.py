"""The offline tokenizer for random-weight models that ship none (nothing downloads).

A deterministic byte tokenizer: ids 0, 1, 2 are pad, BOS and EOS; a text's UTF-8 bytes are ids
``3 + byte``. With a vocabulary of at least 259 it is exact and reversible (the tiny Llama has 259);
with a smaller one bytes wrap modulo ``vocab_size - 3`` (still deterministic, no longer reversible).
A model directory holding a ``tokenizer.json`` is not read by this class: pass token ids instead.

>>> tok = ByteTokenizer(259)
>>> tok.encode("hi"), tok.decode(tok.encode("hi é"))
([107, 108], 'hi é')
"""

from __future__ import annotations

PAD, BOS, EOS = 0, 1, 2
SPECIALS = 3


class ByteTokenizer:
    """text <-> ids as described above; ``chat(messages)`` renders an OpenAI message list to ids."""

    pad_token_id, bos_token_id, eos_token_id = PAD, BOS, EOS

    def __init__(self, vocab_size: int):
        if vocab_size <= SPECIALS:
            raise ValueError(
                f"vocab_size {vocab_size} is too small for the byte tokenizer (needs > {SPECIALS})"
            )
        self.vocab_size = vocab_size
        self.span = min(256, vocab_size - SPECIALS)

    def encode(self, text: str) -> list[int]:
        return [SPECIALS + b % self.span for b in text.encode("utf-8")]

    def decode(self, ids) -> str:
        return bytes(i - SPECIALS for i in ids if SPECIALS <= i < SPECIALS + self.span).decode(
            "utf-8", "replace"
        )

    def decode_token(self, token: int) -> bytes:
        """The bytes of one token (streaming joins bytes so multi-byte characters arrive whole)."""
        return bytes([token - SPECIALS]) if SPECIALS <= token < SPECIALS + self.span else b""

    def chat(self, messages: list[dict]) -> list[int]:
        """A plain chat template: ``role: content`` lines, then ``assistant:``."""
        text = "".join(f"{m.get('role', 'user')}: {m.get('content', '')}\n" for m in messages) + "assistant:"
        return self.encode(text)
