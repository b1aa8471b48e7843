"""The offline tokenizer for random-weight models that ship none (nothing downloads).

A deterministic byte tokenizer: ids 0, 1, 2 are pad, BOS and EOS; a text's UTF-8 bytes are ids
``3 + byte``. With a vocabulary of at least 259 it is exact and reversible (the tiny Llama has 259);
with a smaller one bytes wrap modulo ``vocab_size - 3`` (still deterministic, no longer reversible).
A model directory holding its own tokenizer files (``tokenizer.json`` / ``tokenizer_config.json``) is
read instead, chat template included (:class:`HFTokenizer`, :func:`load_tokenizer`).

>>> tok = ByteTokenizer(259)
>>> tok.encode("hi"), tok.decode(tok.encode("hi é"))
([107, 108], 'hi é')
"""

from __future__ import annotations

from pathlib import Path

from .config import InferenceError

PAD, BOS, EOS = 0, 1, 2
MAX_TOKENIZER_FILE_BYTES = 64 << 20  # a tokenizer file larger than this is not one
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


class HFTokenizer:
    """A model directory's own tokenizer and chat template, read offline with ``transformers`` (as vLLM
    reads them): text with the tokenizer's special tokens, decoded without them; ``chat`` renders the
    model's chat template with the generation prompt."""

    def __init__(self, path):
        import transformers

        self.tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.eos_token_id, self.vocab_size = self.tok.eos_token_id, len(self.tok)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text))

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def decode_token(self, token: int) -> bytes:
        """One token's text; a partial UTF-8 character is spelled as the vocabulary spells the token."""
        text = self.decode([token])
        return (self.tok.convert_ids_to_tokens(token) if "\ufffd" in text else text).encode()

    def chat(self, messages: list[dict]) -> list[int]:
        if not self.tok.chat_template:
            raise InferenceError("the model's tokenizer has no chat_template: use /v1/completions with a prompt")
        out = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out if isinstance(out, list) else out["input_ids"])


def load_tokenizer(model_path, vocab_size: int):
    """The model directory's own tokenizer when it has tokenizer files (each under 64 MiB), else the byte
    tokenizer. Example: ``load_tokenizer("./tiny", 259).encode("hi")``.

    >>> load_tokenizer("/nonexistent", 259).encode("hi")
    [107, 108]
    """
    p = Path(model_path) if isinstance(model_path, (str, Path)) else None
    files = [p / n for n in ("tokenizer.json", "tokenizer_config.json")] if p is not None else []
    present = [f for f in files if f.is_file()]
    if not present:
        return ByteTokenizer(vocab_size)
    big = next((f for f in present if f.stat().st_size > MAX_TOKENIZER_FILE_BYTES), None)
    if big is not None:
        raise InferenceError(f"{big}: {big.stat().st_size} bytes is larger than any tokenizer file")
    return HFTokenizer(p)
