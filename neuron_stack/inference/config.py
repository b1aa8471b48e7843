"""NxD-Inference-shaped configuration (ours): ``NeuronConfig``, ``OnDeviceSamplingConfig``,
``InferenceConfig``, ``load_pretrained_config``, and the bucket helpers ``generate_buckets`` /
``get_target_bucket``. Names and defaults follow NxDI's ``models/config.py`` and
``modules/autobucketing.py`` (reference §2.1, §2.4); this is our code, not NxDI.

>>> nc = NeuronConfig(batch_size=2, seq_len=640, enable_bucketing=True)
>>> nc.token_generation_buckets
[128, 256, 640]
>>> get_target_bucket([128, 256, 640], 200)
256
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from neuron_stack.llm.configs import InferenceError  # noqa: F401  (inference's error, raised by llm.sampling too)

DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "float32": "float32",
    "fp32": "float32",
}



def generate_buckets(lo: int, hi: int) -> list[int]:
    """NxDI's ``generate_buckets``: powers of two from ``lo`` (rounded down to one) below ``hi``, then ``hi``.

    >>> generate_buckets(128, 640), generate_buckets(128, 128), generate_buckets(128, 2048)
    ([128, 256, 640], [128], [128, 256, 512, 1024, 2048])
    """
    lo = min(lo, hi)
    if lo == hi:
        return [hi]
    return [2**i for i in range(int(math.log2(lo)), round(math.log2(hi)))] + [hi]


def get_target_bucket(
    buckets: list[int], length: int, strategy: str = "first_fit", *, what: str = "max_context_length"
) -> int:
    """The bucket a ``length``-token input runs in: ``first_fit`` (smallest bucket >= length, NxDI's
    default), ``second_fit`` (the next one up, else the largest) or ``max``.

    Too long is NxDI's error. Example: ``get_target_bucket([128, 256], 129) == 256``.
    """
    if length > buckets[-1]:
        raise InferenceError(
            f"Inputs supplied ({length}) are longer than {what} ({buckets[-1]}): shorten the "
            f"prompt or compile with a larger {what}"
        )
    if strategy == "max":
        return buckets[-1]
    i = next(i for i, b in enumerate(buckets) if b >= length)
    if strategy == "second_fit":
        return buckets[min(i + 1, len(buckets) - 1)]
    if strategy != "first_fit":
        raise InferenceError(f"bucket strategy {strategy!r} is not one of first_fit, second_fit, max")
    return buckets[i]


@dataclass
class OnDeviceSamplingConfig:
    """Sampling inside the token-generation graph (NxDI's fields). Greedy (``top_k=1``) is computed by
    the graph itself (an argmax, so only token ids leave the device); other settings sample on the host
    from the graph's logits with these parameters."""

    do_sample: bool = False
    top_k: int = 1
    top_p: float = 1.0
    temperature: float = 1.0
    dynamic: bool = False
    deterministic: bool = False
    global_topk: int = 256


def _positive(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InferenceError(f"NeuronConfig.{name} must be a positive integer, not {v!r}")
    return v


@dataclass
class NeuronConfig:
    """Compile-time shapes and features of a Neuron causal LM, NxDI's names and defaults.

    ``seq_len`` is the KV cache length (prompt + generated); ``max_context_length`` the longest prompt;
    bucketing off compiles one context-encoding NEFF (``[max_context_length]``) and one token-generation
    NEFF (``[seq_len]``); on, ``generate_buckets(128, max)`` each unless lists are given.
    Example: ``NeuronConfig(tp_degree=1, batch_size=4, seq_len=256, is_continuous_batching=True)``.
    """

    tp_degree: int = 1
    batch_size: int = 1
    ctx_batch_size: int | None = None
    tkg_batch_size: int | None = None
    max_batch_size: int | None = None
    seq_len: int = 128
    max_context_length: int | None = None
    max_new_tokens: int | None = None
    torch_dtype: str = "float32"
    padding_side: str = "right"
    enable_bucketing: bool = False
    buckets: list[int] | None = None
    context_encoding_buckets: list[int] | None = None
    token_generation_buckets: list[int] | None = None
    bucket_strategy: str = "first_fit"
    is_continuous_batching: bool = False
    on_device_sampling_config: OnDeviceSamplingConfig | dict | None = None
    allow_input_truncation: bool = False
    speculation_length: int = 0
    sequence_parallel_enabled: bool = False  # context encoding only (projection: neuron_stack.llm.parallel)
    target: str = "trn1"
    instance_type: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("tp_degree", "batch_size", "seq_len"):
            _positive(name, getattr(self, name))
        self.max_context_length = _positive("max_context_length", self.max_context_length or self.seq_len)
        if self.max_context_length > self.seq_len:
            raise InferenceError(
                f"max_context_length ({self.max_context_length}) exceeds seq_len ({self.seq_len}): "
                "the KV cache must hold the whole prompt"
            )
        if self.max_new_tokens is None and self.seq_len > self.max_context_length:
            self.max_new_tokens = self.seq_len - self.max_context_length
        for name in ("ctx_batch_size", "tkg_batch_size", "max_batch_size"):
            setattr(self, name, _positive(name, getattr(self, name) or self.batch_size))
        if self.is_continuous_batching and self.ctx_batch_size != 1:
            # vLLM's default for NxDI: one prompt per context-encoding call, written into its slot
            self.ctx_batch_size = 1
        dtype = DTYPES.get(str(self.torch_dtype).removeprefix("torch."))
        if dtype is None:
            raise InferenceError(f"torch_dtype {self.torch_dtype!r} is not one of bfloat16, float16, float32")
        self.torch_dtype = dtype
        if isinstance(self.on_device_sampling_config, dict):
            self.on_device_sampling_config = OnDeviceSamplingConfig(**self.on_device_sampling_config)
        if self.padding_side != "right":
            raise InferenceError("padding_side must be 'right' (the cache positions of a prompt start at 0)")
        if self.buckets is not None and not (self.context_encoding_buckets or self.token_generation_buckets):
            self.context_encoding_buckets = [b for b in self.buckets if b <= self.max_context_length]
            self.token_generation_buckets = list(self.buckets)
        self.context_encoding_buckets = self._buckets(
            self.context_encoding_buckets, self.max_context_length, "context_encoding_buckets"
        )
        self.token_generation_buckets = self._buckets(
            self.token_generation_buckets, self.seq_len, "token_generation_buckets"
        )
        get_target_bucket([1], 1, self.bucket_strategy)  # refuse an unknown strategy now
        if isinstance(self.speculation_length, bool) or not isinstance(self.speculation_length, int) or not (
            0 <= self.speculation_length < self.seq_len
        ):
            raise InferenceError(
                f"NeuronConfig.speculation_length must be an integer from 0 to seq_len - 1, "
                f"not {self.speculation_length!r}"
            )

    def _buckets(self, given, hi: int, name: str) -> list[int]:
        if given:
            out = sorted({_positive(name, int(b)) for b in given})
            if out[-1] != hi:
                raise InferenceError(
                    f"{name} {out}: the largest must equal {hi} (the longest input it serves)"
                )
            return out
        return generate_buckets(128, hi) if self.enable_bucketing else [hi]

    @property
    def kv_cache_batch_size(self) -> int:
        return self.max_batch_size

    @property
    def max_length(self) -> int:
        return self.seq_len

    def to_json(self) -> dict:
        d = asdict(self)
        return d


@dataclass
class InferenceConfig:
    """The model's HF config plus its ``neuron_config`` (NxDI's ``InferenceConfig(neuron_config,
    load_config=load_pretrained_config(path))``). Attribute reads fall through to the HF config."""

    neuron_config: NeuronConfig
    load_config: object = None
    hf_config: object = None

    def __post_init__(self):
        if self.hf_config is None:
            if self.load_config is None:
                raise InferenceError("InferenceConfig needs load_config=load_pretrained_config(model_path)")
            self.hf_config = self.load_config() if callable(self.load_config) else self.load_config
        from neuron_stack.llm.configs import warn_run

        warn_run(self.hf_config.to_dict(), tp_degree=self.neuron_config.tp_degree,
                 sequence_length=self.neuron_config.seq_len)

    def __getattr__(self, name):
        if name in ("hf_config", "neuron_config", "load_config"):
            raise AttributeError(name)
        return getattr(self.hf_config, name)


def load_pretrained_config(model_path):
    """A loader for ``InferenceConfig(load_config=...)``: the HF config of a directory, config.json, preset
    name or config object (nothing downloads). Example: ``load_pretrained_config("./tiny-llama")()``."""
    from neuron_stack.llm.configs import ConfigError, load_config

    def load():
        try:
            return load_config(model_path)
        except ConfigError as exc:
            raise InferenceError(str(exc)) from None

    return load


def save_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))
