"""Sampling as vLLM does it: :class:`SamplingParams` with vLLM's names, defaults and validation messages
(``vllm/sampling_params.py``), and :func:`sample`, which turns one row of logits into a token.

Order, as vLLM's sampler: repetition / frequency / presence penalties on the logits (over the prompt and
the output so far), ``min_tokens`` masking of the stop tokens, then greedy argmax when ``temperature`` is
0, else temperature, ``top_k``, ``top_p``, ``min_p`` and a draw. A draw is vLLM's exponential race
(``probs / Exp(1)`` argmax, a sample from ``probs``) from the request's own generator, so a ``seed``
reproduces the tokens whatever else runs in the batch. Logprobs are of the raw logits (vLLM's default).

>>> import torch
>>> p = SamplingParams(temperature=0.8, top_k=3, seed=7)
>>> logits = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])
>>> sample(logits, p, [], [], p.generator()) == sample(logits, p, [], [], p.generator())
True
>>> sample(logits, SamplingParams(temperature=0), [], [], None)
4
>>> SamplingParams(temperature=-1)
Traceback (most recent call last):
...
neuron_stack.llm.configs.InferenceError: temperature must be non-negative, got -1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .configs import InferenceError

SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it is greedy
MAX_TEMP = 1e-2  # vLLM's _MAX_TEMP: a positive temperature below it is raised to it
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


@dataclass
class SamplingParams:
    """vLLM's sampling parameters (the subset a Neuron server honours); ``__post_init__`` validates."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    _stops: set[int] = field(default_factory=set, repr=False)  # stop ids + EOS, set by the engine

    def __post_init__(self):
        if self.seed == -1:
            self.seed = None
        self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))
        if self.logprobs is True:
            self.logprobs = 1
        self._verify()
        if 0 < self.temperature < MAX_TEMP:
            self.temperature = MAX_TEMP
        if self.temperature < SAMPLING_EPS:  # greedy: the filters mean nothing
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise InferenceError(f"n must be 1 when using greedy sampling, got {self.n}.")

    def _verify(self) -> None:
        def bad(msg):
            raise InferenceError(msg)

        if self.n < 1:
            bad(f"n must be at least 1, got {self.n}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not math.isfinite(self.repetition_penalty):
            bad(f"repetition_penalty must be a finite number, got {self.repetition_penalty}.")
        if self.repetition_penalty <= 0.0:
            bad(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        if not math.isfinite(self.temperature):
            bad(f"temperature must be a finite number, got {self.temperature}.")
        if self.temperature < 0.0:
            bad(f"temperature must be non-negative, got {self.temperature}.")
        if self.temperature > 2.0:
            bad(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            bad(f"top_p must be in (0, 1], got {self.top_p}.")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            bad(f"top_k must be an integer, got {type(self.top_k).__name__}")
        if self.top_k < -1:
            bad(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            bad(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            bad(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            bad(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}.")
        if self.logprobs is not None and self.logprobs != -1 and self.logprobs < 0:
            bad(f"logprobs must be non-negative or -1, got {self.logprobs}.")
        if self.logprobs is not None and self.logprobs > MAX_LOGPROBS:
            bad(f"Requested sample logprobs of {self.logprobs}, which is greater than max allowed: {MAX_LOGPROBS}")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            bad(f"stop_token_ids must contain only integers, got {self.stop_token_ids}.")
        if not all(isinstance(s, str) for s in self.stop) or any(not s for s in self.stop):
            bad("stop cannot contain an empty string.")

    def verify_vocab(self, vocab_size: int) -> None:
        """vLLM's ``_validate_stop_token_ids``: every stop id inside the vocabulary."""
        out = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        if out:
            raise InferenceError(
                f"token_id(s) {out} in stop_token_ids contain out-of-vocab token ids. Vocabulary size: {vocab_size}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that changes the argmax (what a graph's on-device argmax computes)."""
        return (
            self.greedy
            and self.repetition_penalty == 1.0
            and self.presence_penalty == self.frequency_penalty == 0.0
            and not self.min_tokens
        )

    def generator(self) -> torch.Generator | None:
        """The request's own generator when seeded (reproducible), else None (the global one)."""
        return None if self.seed is None else torch.Generator().manual_seed(self.seed)


def _penalised(logits: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    x = logits.float().clone()
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt) | set(output)), dtype=torch.long)
        v = x[seen]
        x[seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    if output and (p.frequency_penalty or p.presence_penalty):
        counts = torch.bincount(torch.tensor(output), minlength=x.shape[-1])[: x.shape[-1]].float()
        x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
    if len(output) < p.min_tokens and p._stops:
        x[torch.tensor(sorted(p._stops))] = float("-inf")
    return x


def sample(logits: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int], gen) -> int:
    """One token from one row of logits ``(vocab,)`` under ``p`` (see the module docstring)."""
    x = _penalised(logits, p, prompt, output)
    if p.greedy:
        return int(x.argmax())
    x = x / p.temperature
    if 0 < p.top_k < x.shape[-1]:
        x = x.masked_fill(x < torch.topk(x, p.top_k).values[-1], float("-inf"))
    if p.top_p < 1.0:
        srt, idx = torch.sort(x, descending=True)
        probs = srt.softmax(-1)
        drop = probs.cumsum(-1) - probs > p.top_p  # keep the smallest prefix reaching top_p
        x = x.scatter(-1, idx, srt.masked_fill(drop, float("-inf")))
    probs = x.softmax(-1)
    if p.min_p > 0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
    q = torch.empty_like(probs).exponential_(generator=gen)
    return int((probs / q).argmax())


def logprobs(logits: torch.Tensor, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """(the chosen token's logprob, the ``top`` most likely (id, logprob)) of the raw logits.

    >>> lp, best = logprobs(torch.tensor([0.0, 0.0]), 1, 1)
    >>> round(lp, 4), best[0][0]
    (-0.6931, 0)
    """
    lp = torch.log_softmax(logits.float(), -1)
    if top == -1:
        top = lp.shape[-1]
    vals, ids = torch.topk(lp, min(top, lp.shape[-1])) if top else (lp[:0], lp[:0].long())
    return float(lp[token]), list(zip(ids.tolist(), vals.tolist()))


def sample_rows(logits: torch.Tensor, p: SamplingParams, gen=None) -> list[int]:
    """One token per row of ``(batch, vocab)`` logits with the same parameters and no history (``generate``).

    >>> sample_rows(torch.tensor([[0.0, 9.0], [9.0, 0.0]]), SamplingParams(temperature=0))
    [1, 0]
    """
    return [sample(row, p, [], [], gen) for row in logits]
