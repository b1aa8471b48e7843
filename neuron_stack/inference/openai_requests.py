"""The OpenAI request bodies the server accepts, parsed as vLLM parses them: prompts (text, token ids, chat
messages through the tokenizer's template) and :class:`~neuron_stack.llm.sampling.SamplingParams` with vLLM's
names, defaults, bounds and error messages; a bad field is an :class:`InferenceError` naming it.

>>> from neuron_stack.inference.tokenizer import ByteTokenizer
>>> r = Requests(ByteTokenizer(512), seq_len=64, model_name="m")
>>> r.prompts({"prompt": ["ab", [5, 6]]}, chat=False)
[[100, 101], [5, 6]]
>>> r.params({"max_tokens": 8, "temperature": 0}, chat=False, n_prompt=2).max_tokens
8
"""
from __future__ import annotations

import json

from neuron_stack.llm.sampling import SamplingParams

from .config import InferenceError

MAX_MESSAGES = 256
MAX_PROMPTS = 64  # prompts × n per completion request
ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 413: "RequestEntityTooLarge", 504: "TimeoutError"}


def error(status: int, message: str, param: str | None = None):
    """vLLM's error response: ``{"error": {"message", "type", "param", "code"}}`` with that status."""
    from fastapi.responses import JSONResponse

    kind = ERROR_TYPES.get(status, "InternalServerError")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


def _int(body: dict, key: str, default, lo: int, hi: int):
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InferenceError(f"{key} must be an integer from {lo} to {hi}, not {v!r}")
    return v


def _num(body: dict, key: str, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InferenceError(f"{key} must be a number, not {v!r}")
    return float(v)


def _text(content) -> str:
    """A message's content: a string, or text parts joined by newlines (vLLM's rendering)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str) for c in content
    ):
        return "\n".join(c["text"] for c in content)
    raise InferenceError("message content must be a string or a list of {'type': 'text', 'text': ...} parts")


class Requests:
    """Parses one model's requests: ``tokenizer`` encodes prompts, ``seq_len`` bounds ``max_tokens``, a
    ``model`` field other than ``model_name`` is a :class:`LookupError` (404)."""

    def __init__(self, tokenizer, seq_len: int, model_name: str):
        self.tokenizer, self.seq_len, self.model_name = tokenizer, seq_len, model_name

    async def parse(self, request) -> dict:
        """The request's JSON object (``InferenceError`` if it is not one, ``LookupError`` for another model)."""
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InferenceError(f"the request body is not JSON ({exc})") from None
        if not isinstance(body, dict):
            raise InferenceError("the request body must be a JSON object")
        name = body.get("model")
        if name is not None and name != self.model_name:
            raise LookupError(f"The model `{name}` does not exist.")
        return body

    def chat_ids(self, msgs) -> list[int]:
        """Chat ``messages`` through the tokenizer's template."""
        if not isinstance(msgs, list) or not msgs or len(msgs) > MAX_MESSAGES or not all(
            isinstance(m, dict) for m in msgs
        ):
            raise InferenceError(f"messages must be a list of 1 to {MAX_MESSAGES} message objects")
        return self.tokenizer.chat([{"role": m.get("role", "user"), "content": _text(m.get("content", ""))}
                                    for m in msgs])

    def one_prompt(self, p) -> list[int]:
        """A prompt: text or a list of token ids."""
        if isinstance(p, str) and p:
            return self.tokenizer.encode(p)
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            return p
        raise InferenceError("prompt must be a non-empty string or a list of token ids (or a list of those)")

    def prompts(self, body: dict, chat: bool) -> list[list[int]]:
        """The request's prompts as token ids (a completion's ``prompt`` may be several)."""
        if chat:
            return [self.chat_ids(body.get("messages"))]
        p = body.get("prompt")
        many = isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p)
        out = [self.one_prompt(x) for x in p] if many else [self.one_prompt(p)]
        return out

    def params(self, body: dict, chat: bool, n_prompt: int) -> SamplingParams:
        """The request's sampling fields as vLLM reads them (chat: ``top_logprobs``, ``max_completion_tokens`` and
        the rest of the context as the default length)."""
        if body.get("stream_options") is not None and not body.get("stream"):
            raise InferenceError("Stream options can only be defined when `stream=True`.")
        if body.get("suffix") is not None:
            raise InferenceError("suffix is not currently supported")
        if chat:
            top = _int(body, "top_logprobs", None, 0, 20)
            if top is not None and not body.get("logprobs"):
                raise InferenceError("when using `top_logprobs`, `logprobs` must be set to true.")
            logprobs = (top or 0) if body.get("logprobs") else None
            key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
            default = self.seq_len - n_prompt  # vLLM: the rest of the context
        else:
            logprobs, key, default = _int(body, "logprobs", None, 0, 20), "max_tokens", 16
        stop_ = body.get("stop")
        if stop_ is not None and not isinstance(stop_, (str, list)):
            raise InferenceError("stop must be a string or a list of strings")
        return SamplingParams(
            n=_int(body, "n", 1, 1, MAX_PROMPTS),
            presence_penalty=_num(body, "presence_penalty", 0.0),
            frequency_penalty=_num(body, "frequency_penalty", 0.0),
            repetition_penalty=_num(body, "repetition_penalty", 1.0),
            temperature=_num(body, "temperature", 1.0),
            top_p=_num(body, "top_p", 1.0),
            top_k=_int(body, "top_k", 0, -1, 1 << 30),
            min_p=_num(body, "min_p", 0.0),
            seed=_int(body, "seed", None, -(1 << 63), (1 << 63) - 1),
            stop=stop_,
            stop_token_ids=body.get("stop_token_ids"),
            ignore_eos=bool(body.get("ignore_eos")),
            max_tokens=_int(body, key, max(default, 1), 1, self.seq_len),
            min_tokens=_int(body, "min_tokens", 0, 0, self.seq_len),
            logprobs=logprobs,
            include_stop_str_in_output=bool(body.get("include_stop_str_in_output")),
        )
