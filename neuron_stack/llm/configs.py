"""Model configs for projections: presets of published architectures, a directory's ``config.json``, or
a ``transformers`` config object. Nothing downloads.

The presets copy the architecture fields of the models' published ``config.json`` files (Hugging Face
``meta-llama/Meta-Llama-3-8B``, ``meta-llama/Meta-Llama-3-70B``, ``meta-llama/Llama-2-7b-hf``,
``meta-llama/Llama-3.3-70B-Instruct``, ``meta-llama/Llama-3.1-405B``); only the
shapes matter here, there are no weights.

>>> load_config("llama-3-8b").num_hidden_layers
32
"""

from __future__ import annotations

import json
import os
from pathlib import Path

#: Published architecture fields (config.json of each model on the Hugging Face hub), one row a model;
#: None: the published file has no such field (transformers' default applies). All are Llama models
#: with ``rms_norm_eps`` 1e-5.
_PRESET_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rope_theta")
_PRESET_ROWS = {
    #              vocab   hidden inter  layers heads kv  max_pos rope_theta
    "llama-3-8b":  (128256, 4096, 14336, 32,    32,   8,  8192,   500000.0),
    "llama-3-70b": (128256, 8192, 28672, 80,    64,   8,  8192,   500000.0),
    "llama-2-7b":  (32000,  4096, 11008, 32,    32,   32, 4096,   None),
    "llama-3.3-70b": (128256, 8192, 28672, 80,  64,   8,  131072, 500000.0),
    "llama-3.1-405b": (128256, 16384, 53248, 126, 128, 8, 131072, 500000.0),
}
PRESETS: dict[str, dict] = {
    name: {"model_type": "llama", **{f: v for f, v in zip(_PRESET_FIELDS, row) if v is not None},
           "rms_norm_eps": 1e-5}
    for name, row in _PRESET_ROWS.items()
}
#: dtype spellings a user may pass (``dtype=``, ``auto_cast_type=``) -> the torch dtype name.
DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}
#: config.json is JSON of a few kilobytes; a bigger file is not a model config.
MAX_CONFIG_BYTES = 1 << 20


class ConfigError(ValueError):
    """A model config that cannot be read; the message names the problem and the fix."""


class InferenceError(ValueError):
    """A configuration or input the inference library cannot use; the message names the fix (defined here,
    below both ``llm`` and ``inference``, so sampling, which both use, can raise it)."""


def load_config(spec):
    """A ``transformers`` config from a preset name, a directory or ``config.json`` path, or a config.

    Example: ``load_config("llama-3-70b")``, ``load_config("./my-model")``, ``load_config(LlamaConfig())``.
    """
    import transformers

    if isinstance(spec, transformers.PretrainedConfig):
        return spec
    fields = raw_fields(spec)
    kind = fields.pop("model_type")
    try:
        cls = transformers.AutoConfig.for_model(kind).__class__
    except ValueError:
        raise ConfigError(
            f"model_type {kind!r} is not one transformers {transformers.__version__} knows"
        ) from None
    fields.pop("transformers_version", None)
    return cls(**fields)


def raw_fields(spec) -> dict:
    """The fields of a preset or a ``config.json`` (a directory or the file) as written, before
    ``transformers`` fills in its defaults; cheap (no ``transformers`` import).

    >>> raw_fields("llama-2-7b")["num_key_value_heads"]
    32
    """
    if isinstance(spec, (str, os.PathLike)) and str(spec).lower() in PRESETS:
        return dict(PRESETS[str(spec).lower()])
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"{spec}: no such model config: give a directory with config.json, a config.json "
            f"file, or a preset ({', '.join(PRESETS)})"
        )
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{path}: {path.stat().st_size} bytes is too big for a config.json "
            f"(limit {MAX_CONFIG_BYTES}); point at the model's config.json"
        )
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply for a config.json; point at the model's config.json") \
            from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{path}: not valid JSON ({exc}); fix the file or point at the model's config.json"
        ) from None
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise ConfigError(f"{path}: no model_type field: not a transformers config.json")
    return fields


#: Physical ranges of a decoder's config fields: positive, at most ten times the largest published model
#: (Llama-3.1-405B: hidden 16384, intermediate 53248, 126 layers, 128 heads; Gemma 3: vocabulary 262144;
#: Llama 4 Scout: 10M positions). Anything past these is a typo, and would only exhaust memory or time.
#: None: optional (absent means transformers' own rule, e.g. key-value heads = attention heads).
CONFIG_RANGES = {
    "hidden_size": (1, 163_840, True),
    "num_hidden_layers": (1, 1_260, True),
    "num_attention_heads": (1, 1_280, True),
    "intermediate_size": (1, 532_480, True),
    "vocab_size": (1, 2_621_440, True),
    "num_key_value_heads": (1, 1_280, False),
    "head_dim": (1, 2_560, False),
    "max_position_embeddings": (1, 100_000_000, False),
}
#: The same for the run's own sizes (batch, sequence length, buckets): ten times the largest served.
MAX_BATCH = 4_096
MAX_SEQUENCE = 100_000_000
MAX_BUCKETS = 64


def _check(label: str, v, lo: int, hi: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"{label} = {v!r} is outside the physical range: give an integer from {lo:,} to {hi:,}")


def validate_projection(model, *, tp_degree: int = 1, batch_size: int = 1, sequence_length: int = 2048,
                        context_length: int | None = None, token_generation_buckets=None,
                        max_cores: int = 1 << 10) -> None:
    """Check a projection's config fields and sizes against physical ranges before any work, with one
    :class:`ConfigError` line naming the field and the allowed range (``neuron-llm project`` calls it).

    ``model``: a preset or config path (its fields as written: a missing ``hidden_size`` is an error,
    not transformers' default 4096); ``max_cores``: the most NeuronCores of any instance, the bound of
    ``tp_degree``.

    >>> validate_projection("llama-3-8b", tp_degree=8, max_cores=64)
    >>> validate_projection("llama-3-8b", tp_degree=10**15, max_cores=64)
    Traceback (most recent call last):
    ...
    neuron_stack.llm.configs.ConfigError: --tp = 1000000000000000 is outside the physical range: ... from 1 to 64
    """
    fields = raw_fields(model) if isinstance(model, (str, os.PathLike)) else model.to_dict()
    for name, (lo, hi, required) in CONFIG_RANGES.items():
        if fields.get(name) is None:
            if required:
                raise ConfigError(f"the model config has no {name}: add it to config.json (an integer from "
                                  f"{lo:,} to {hi:,})")
            continue
        _check(f"config {name}", fields[name], lo, hi)
    heads = fields["num_attention_heads"]
    if heads > fields["hidden_size"]:
        _check("config num_attention_heads", heads, 1, fields["hidden_size"])
    if fields.get("num_key_value_heads") is not None:
        _check("config num_key_value_heads", fields["num_key_value_heads"], 1, heads)
    _check("--tp", tp_degree, 1, max_cores)
    _check("--batch-size", batch_size, 1, MAX_BATCH)
    _check("--sequence-length", sequence_length, 1, MAX_SEQUENCE)
    if context_length is not None:
        _check("--context-length", context_length, 1, sequence_length)
    if token_generation_buckets is not None:
        if not 1 <= len(token_generation_buckets) <= MAX_BUCKETS:
            raise ConfigError(f"--tkg-buckets: give from 1 to {MAX_BUCKETS} buckets")
        for b in token_generation_buckets:
            _check("--tkg-buckets", b, 1, sequence_length)


def require_positive(**sizes) -> None:
    """Refuse the first size that is not a positive integer (a bool is not one), naming it.

    Example: ``require_positive(batch_size=1, sequence_length=0)`` raises
    ``ConfigError("sequence_length must be a positive integer, not 0")``.
    """
    for label, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{label} must be a positive integer, not {v!r}")


def has_weights(path) -> bool:
    """True when ``path`` is a model directory holding weight files (safetensors or PyTorch bin).

    Example: ``has_weights("./saved-llama")`` -> True after ``model.save_pretrained("./saved-llama")``.
    """
    p = Path(path)
    if not p.is_dir():
        return False
    return any(p.glob("*.safetensors")) or any(p.glob("pytorch_model*.bin"))
