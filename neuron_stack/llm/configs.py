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
import math
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


class ConfigWarning(UserWarning):
    """A run the config allows but the user may not expect (:func:`run_warnings`); one line."""


class InferenceError(ValueError):
    """A configuration or input the inference library cannot use; the message names the fix (defined here,
    below both ``llm`` and ``inference``, so sampling, which both use, can raise it)."""


def load_config(spec):
    """A ``transformers`` config from a preset name, a directory or ``config.json`` path, or a config.

    Example: ``load_config("llama-3-70b")``, ``load_config("./my-model")``, ``load_config(LlamaConfig())``.
    """
    import transformers

    if isinstance(spec, transformers.PretrainedConfig):
        check_fields(spec.to_dict())
        return spec
    fields = raw_fields(spec)
    check_fields(fields)
    kind = fields.pop("model_type")
    try:
        cls = transformers.AutoConfig.for_model(kind).__class__
    except ValueError:
        raise ConfigError(
            f"model_type {kind!r} is not one transformers {transformers.__version__} knows"
        ) from None
    fields.pop("transformers_version", None)
    try:
        return cls(**fields)
    except Exception as exc:  # transformers' own (strict dataclass) validators: field and cause, one line
        if type(exc).__module__.split(".")[0] != "huggingface_hub":
            raise
        raise ConfigError(f"the model config is inconsistent: {' '.join(str(exc).split())}; fix config.json") \
            from None


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
#: decoders whose attention applies rotary position embeddings (which rotate pairs of head dimensions)
ROTARY_MODEL_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3"})


def _check(label: str, v, lo: int, hi: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"{label} = {v!r} is outside the physical range: give an integer from {lo:,} to {hi:,}")


def _nearest_divisor(n: int, near: int) -> int:
    """The divisor of ``n`` closest to ``near`` (the smaller on a tie): the fix a message suggests.

    >>> _nearest_divisor(32, 5), _nearest_divisor(4096, 30)
    (4, 32)
    """
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - near), d))


def _positive_number(fields: dict, name: str) -> None:
    v = fields.get(name)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
        raise ConfigError(f"config {name} = {v!r} must be a positive number: fix it in config.json")


def check_fields(fields: dict) -> None:
    """Refuse a config whose fields are out of range or inconsistent with one another, with one
    :class:`ConfigError` line naming the field and the fix; cheap (no ``transformers``), so every entry
    that takes a config runs it before any import or compile (:func:`load_config` does).

    ``fields``: the config as written (:func:`raw_fields`) or a config object's ``to_dict()``.

    >>> check_fields(raw_fields("llama-3-8b"))
    >>> check_fields({**raw_fields("llama-3-8b"), "num_key_value_heads": 5})
    Traceback (most recent call last):
    ...
    neuron_stack.llm.configs.ConfigError: config num_key_value_heads = 5 does not divide num_attention_heads = 32: ...
    """
    for name, (lo, hi, required) in CONFIG_RANGES.items():
        if fields.get(name) is None:
            if required:
                raise ConfigError(f"the model config has no {name}: add it to config.json (an integer from "
                                  f"{lo:,} to {hi:,})")
            continue
        _check(f"config {name}", fields[name], lo, hi)
    hidden, heads = fields["hidden_size"], fields["num_attention_heads"]
    if heads > hidden:
        _check("config num_attention_heads", heads, 1, hidden)
    kv = fields.get("num_key_value_heads") or heads
    _check("config num_key_value_heads", kv, 1, heads)
    if heads % kv:  # each KV head serves a whole group of query heads (GQA; transformers' repeat_kv)
        raise ConfigError(
            f"config num_key_value_heads = {kv} does not divide num_attention_heads = {heads}: each key-value "
            f"head serves a whole group of query heads; set num_key_value_heads to a divisor of {heads} "
            f"(e.g. {_nearest_divisor(heads, kv)})")
    # head_dim defaults to hidden_size // heads (a remainder would be dropped silently); Llama's config
    # requires the division even with an explicit head_dim (transformers' LlamaConfig.validate_architecture)
    if hidden % heads and (fields.get("head_dim") is None or fields.get("model_type") == "llama"):
        raise ConfigError(
            f"config num_attention_heads = {heads} does not divide hidden_size = {hidden}: set "
            f"num_attention_heads to a divisor of {hidden} (e.g. {_nearest_divisor(hidden, heads)})"
            + ("" if fields.get("model_type") == "llama" else ", or give head_dim"))
    head_dim = fields.get("head_dim") or hidden // heads
    if head_dim % 2 and fields.get("model_type") in ROTARY_MODEL_TYPES:
        raise ConfigError(
            f"config head_dim = {head_dim} (hidden_size / num_attention_heads unless given) is odd: rotary "
            "position embeddings rotate pairs of dimensions; give an even head_dim")
    layer_types = fields.get("layer_types")
    if layer_types is not None and len(layer_types) != fields["num_hidden_layers"]:
        raise ConfigError(
            f"config layer_types has {len(layer_types)} entries but num_hidden_layers = "
            f"{fields['num_hidden_layers']}: give one entry per layer")
    for name in ("rms_norm_eps", "layer_norm_eps", "rope_theta"):
        _positive_number(fields, name)
    if fields.get("sliding_window") is not None:
        _check("config sliding_window", fields["sliding_window"], 1, MAX_SEQUENCE)
    experts, per_token = fields.get("num_local_experts"), fields.get("num_experts_per_tok")
    if isinstance(experts, int) and isinstance(per_token, int) and not 1 <= per_token <= experts:
        raise ConfigError(f"config num_experts_per_tok = {per_token} must be from 1 to num_local_experts = "
                          f"{experts}: fix it in config.json")


def nxdi_head_counts(tp_degree: int, heads: int, kv_heads: int) -> tuple[int, int, str]:
    """Query and key-value heads per rank, and the GQA sharding NxDI picks, as NxDI shards attention
    (``modules/attention/gqa.py``: query heads padded up to a multiple of the TP degree; KV heads split
    when the TP degree divides them, replicated to one per rank when they divide the TP degree
    (``replicate-to-tp-degree``), else converted to one per query head (``convert-to-mha``, with a
    warning)).

    >>> nxdi_head_counts(32, 32, 8), nxdi_head_counts(8, 32, 8), nxdi_head_counts(12, 32, 8)
    ((1, 1, 'replicate-to-tp-degree'), (4, 1, 'split'), (3, 3, 'convert-to-mha'))
    """
    q_rank = math.ceil(heads / tp_degree)
    if kv_heads == heads:  # MHA: the KV heads are padded with the query heads
        return q_rank, q_rank, "mha"
    if kv_heads % tp_degree == 0:
        return q_rank, kv_heads // tp_degree, "split"
    if tp_degree % kv_heads == 0:
        return q_rank, 1, "replicate-to-tp-degree"
    return q_rank, q_rank, "convert-to-mha"


def run_warnings(fields: dict, *, tp_degree: int = 1, sequence_length: int | None = None) -> list[str]:
    """What a run of these sizes does that the user may not expect, one line each naming the field
    and the fix: a sequence past ``max_position_embeddings``, query heads NxDI pads to the TP degree,
    KV heads NxDI converts to MHA. Nothing is refused: NxDI runs all three.

    >>> run_warnings(raw_fields("llama-3-8b"), tp_degree=8, sequence_length=4096)
    []
    >>> run_warnings(raw_fields("llama-3-8b"), sequence_length=16384)
    ['sequence length 16384 is past the config max_position_embeddings = 8192: ...']
    """
    out = []
    limit = fields.get("max_position_embeddings")
    if sequence_length is not None and isinstance(limit, int) and sequence_length > limit:
        out.append(f"sequence length {sequence_length} is past the config max_position_embeddings = {limit}: "
                   "positions beyond it were not trained; use a sequence length up to "
                   f"{limit}, or a config whose max_position_embeddings (with rope scaling) covers it")
    heads = fields["num_attention_heads"]
    kv = fields.get("num_key_value_heads") or heads
    q_rank, kv_rank, how = nxdi_head_counts(tp_degree, heads, kv)
    if heads % tp_degree:
        out.append(f"TP degree {tp_degree} does not divide config num_attention_heads = {heads}: NxDI pads "
                   f"them to {q_rank * tp_degree} ({q_rank} a rank, {q_rank * tp_degree - heads} padding); "
                   f"use a TP degree that divides {heads}")
    if how == "convert-to-mha":
        out.append(f"TP degree {tp_degree} and config num_key_value_heads = {kv} do not divide one another: "
                   f"NxDI converts to MHA ({kv_rank} KV heads a rank, not 1: a KV cache {kv_rank}x larger); "
                   f"use a TP degree that divides {kv} or that {kv} divides")
    return out


def _fields(model) -> dict:
    return raw_fields(model) if isinstance(model, (str, os.PathLike)) else model.to_dict()


def check_model(model, *, tp_degree: int = 1, sequence_length: int | None = None) -> list[str]:
    """:func:`check_fields` of a preset, a config path or a config object, then the run's
    :func:`run_warnings`: what every entry that takes a model config runs before any compile.

    >>> check_model("llama-3-8b", tp_degree=12)[0]
    'TP degree 12 does not divide config num_attention_heads = 32: NxDI pads them to 36 (3 a rank, 4 padding); ...'
    """
    fields = _fields(model)
    check_fields(fields)
    return run_warnings(fields, tp_degree=tp_degree, sequence_length=sequence_length)


def warn_run(fields: dict, *, tp_degree: int = 1, sequence_length: int | None = None) -> None:
    """Issue :func:`run_warnings` as :class:`ConfigWarning` (the Python API's entries call it).

    Example: ``warn_run(config.to_dict(), tp_degree=12, sequence_length=16384)``.
    """
    import warnings

    for line in run_warnings(fields, tp_degree=tp_degree, sequence_length=sequence_length):
        warnings.warn(line, ConfigWarning, stacklevel=3)


def validate_projection(model, *, tp_degree: int = 1, batch_size: int = 1, sequence_length: int = 2048,
                        context_length: int | None = None, token_generation_buckets=None,
                        max_cores: int = 1 << 10) -> list[str]:
    """Check a projection's config fields (:func:`check_fields`) and sizes against physical ranges
    before any work, with one :class:`ConfigError` line naming the field and the fix (``neuron-llm
    project`` calls it); returns the run's warnings (:func:`run_warnings`).

    ``model``: a preset, a config path or a config object (a path's fields as written: a missing
    ``hidden_size`` is an error, not transformers' default 4096); ``max_cores``: the most NeuronCores
    of any instance, the bound of ``tp_degree``.

    >>> validate_projection("llama-3-8b", tp_degree=8, max_cores=64)
    []
    >>> validate_projection("llama-3-8b", tp_degree=10**15, max_cores=64)
    Traceback (most recent call last):
    ...
    neuron_stack.llm.configs.ConfigError: --tp = 1000000000000000 is outside the physical range: ... from 1 to 64
    """
    fields = _fields(model)
    check_fields(fields)  # the fields first: a bad field is named before a bad flag
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
    return run_warnings(fields, tp_degree=tp_degree, sequence_length=sequence_length)


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
