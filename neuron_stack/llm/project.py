"""Projection mode: how fast a decoder LLM runs and whether it fits, from its config alone.

The model is built on the ``meta`` device (shapes, no weights), captured and compiled by the normal
front end and compiler: every op is lowered to instructions and scheduled by the cost model, but no
number is ever computed (the NEFF's ``numbers`` is ``none``). Two sub-models are compiled, as Neuron
serving stacks do (reference §2.3): context encoding (the prompt, ``context_length`` tokens) and token
generation (one token per sequence, attending over a static KV cache of each bucket length).

Decoder layers are identical, so we do not compile 32 or 80 of them. Each sub-model is compiled with
one and with two decoder layers; a layer costs ``t2 - t1`` (which includes how much of one layer
overlaps the next), and the whole model ``t1 + (L - 1) * (t2 - t1)``. The real neuronx-cc compiles
the whole graph, and its instruction stream per layer is the same one repeated (same shapes, same
tiling): only addresses differ. What the repetition misses is scheduling freedom across more than one
layer boundary, which a straight-line decoder does not have (each layer needs the previous one's
output).

Tensor parallelism (``tp_degree``) shards each rank as NxDI does (reference §2.5): query heads and
the MLP intermediate split over ranks (query heads padded up to a multiple of the KV heads per rank),
KV heads split when there are at least ``tp_degree`` of them, else replicated (one per rank), the
embedding and LM head split on the vocabulary. Each layer adds two all-reduces of the hidden state
(after attention and after the MLP), costed by :mod:`neuron_stack.runtime.collectives`; the step ends
with an all-gather of the last token's logits.

>>> p = project("llama-2-7b", tp_degree=8, sequence_length=256, context_length=128)   # doctest: +SKIP
>>> p.fits, p.graphs[1].device_ns > 0                                                   # doctest: +SKIP
(True, True)
"""

from __future__ import annotations

import copy
import json
import math
import resource
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from neuron_stack.compiler.driver import INSTRUCTION_BYTES, RUNTIME_MEMORY_BYTES, compile_program
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import capture
from neuron_stack.frontend.flags import parse_flags
from neuron_stack.llm.configs import DTYPES, ConfigError, load_config, require_positive
from neuron_stack.llm.quantize import FP8_TARGETS, QUANT_DTYPES, quantize_decoder
from neuron_stack.runtime.collectives import Group, plan
from neuron_stack.runtime.cores import INSTANCE_TYPES


@dataclass
class GraphProjection:
    """One compiled sub-model (one NEFF per bucket): its per-layer and whole-model device time per call."""

    name: str  # context_encoding | token_generation
    bucket: int  # KV cache length the graph attends over
    active_tokens: int  # tokens per sequence per call
    layer_ns: int  # one decoder layer (marginal: t2 - t1)
    base_ns: int  # embedding, final norm, LM head and I/O (t1 - layer)
    collective_ns: int  # all tensor-parallel collectives of one call
    device_ns: int  # the whole model, one call, per rank
    layer_instructions: int
    instructions: int  # whole model
    compile_s: float
    layer_busy_ns: dict = field(default_factory=dict)  # engine -> busy ns of one layer
    neffs: list = field(default_factory=list, repr=False)  # the 1- and 2-layer NEFFs (numbers=none)

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "neffs"}


@dataclass
class Projection:
    """The answer to "how fast, and does it fit": per-core HBM, per-call latency, per-layer latency."""

    model: str
    target: str
    instance_type: str
    tp_degree: int
    batch_size: int
    sequence_length: int
    context_length: int
    dtype: str
    num_layers: int
    graphs: list[GraphProjection]
    memory: dict[str, int]  # bytes per core by category
    hbm_per_core: int  # the device profile's
    instance_cores: int
    compile_s: float = 0.0
    peak_rss_bytes: int = 0
    quantization: str | None = None  # decoder weights' dtype when quantized (int8, float8_e4m3fn)

    @property
    def hbm_used(self) -> int:
        return sum(self.memory.values())

    @property
    def fits(self) -> bool:
        """True when each rank's bytes fit one core's HBM and the instance has ``tp_degree`` cores."""
        return self.hbm_used <= self.hbm_per_core and self.tp_degree <= self.instance_cores

    def verdict(self) -> str:
        """One line: fits or not, and why (the evidence)."""
        gib = 2**30
        head = (
            f"{self.model} on {self.instance_type} with TP={self.tp_degree}: "
            f"{self.hbm_used / gib:.2f} GiB per core of {self.hbm_per_core / gib:.0f} GiB HBM"
        )
        if self.tp_degree > self.instance_cores:
            return (
                f"{head}: does NOT fit: TP={self.tp_degree} needs more than the {self.instance_cores} cores"
            )
        if self.hbm_used > self.hbm_per_core:
            return (
                f"{head}: does NOT fit: shard over more cores (a larger TP), or use a smaller batch or "
                f"sequence length"
            )
        return f"{head}: fits ({100 * self.hbm_used / self.hbm_per_core:.0f}% of HBM)"

    def report(self) -> str:
        """The projection as text: verdict, HBM per core by category, latency per sub-model and bucket."""
        mib = 2**20
        lines = [
            self.verdict(),
            "",
            f"shapes: batch {self.batch_size}, context {self.context_length}, "
            f"sequence {self.sequence_length}, "
            f"{self.num_layers} layers, {self.dtype}"
            + (f", {self.quantization} decoder weights" if self.quantization else "")
            + f", target {self.target} (numbers=none: no weights, "
            "nothing executed)",
            "",
            "HBM per core:",
        ]
        for k, v in self.memory.items():
            lines.append(f"  {k:<12} {v / mib:12.1f} MiB")
        lines.append(f"  {'total':<12} {self.hbm_used / mib:12.1f} MiB of {self.hbm_per_core / mib:.0f} MiB")
        lines += [
            "",
            f"{'sub-model':<18} {'bucket':>7} {'tokens':>6} {'per layer':>10} {'collectives':>11} "
            f"{'whole model':>12} {'instructions':>13}",
        ]
        for g in self.graphs:
            lines.append(
                f"{g.name:<18} {g.bucket:>7} {g.active_tokens:>6} {g.layer_ns / 1e3:>8.1f}us "
                f"{g.collective_ns / 1e3:>9.1f}us {g.device_ns / 1e6:>10.2f}ms {g.instructions:>13,}"
            )
        lines += ["", "one layer's schedule, busy time per engine:"]
        for g in self.graphs:
            eng = ", ".join(f"{e} {v / 1e3:.1f}us" for e, v in g.layer_busy_ns.items())
            lines.append(f"  {g.name} ({g.bucket}): {eng}")
        lines += [
            "",
            f"compiled in {self.compile_s:.1f} s, peak RSS {self.peak_rss_bytes / mib:.0f} MiB "
            "(one and two decoder layers per sub-model; layers are identical)",
        ]
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "graphs"}
        d.update(
            graphs=[g.to_json() for g in self.graphs],
            hbm_used=self.hbm_used,
            fits=self.fits,
            verdict=self.verdict(),
        )
        return d


def rank_config(config, tp_degree: int, num_layers: int | None = None):
    """The config of one tensor-parallel rank (heads, intermediate size and vocabulary sharded).

    >>> from transformers import LlamaConfig
    >>> c = rank_config(LlamaConfig(num_attention_heads=32, num_key_value_heads=8, hidden_size=4096,
    ...                             intermediate_size=14336, vocab_size=128256), 32)
    >>> c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size
    (1, 1, 128, 448)
    """
    c = copy.deepcopy(config)
    if num_layers is not None:
        c.num_hidden_layers = num_layers
        if getattr(c, "layer_types", None):
            c.layer_types = list(c.layer_types)[:num_layers]
    if tp_degree == 1:
        return c
    for attr in ("num_attention_heads", "intermediate_size", "vocab_size", "hidden_size"):
        if not isinstance(getattr(c, attr, None), int):
            raise ConfigError(
                f"tensor parallelism needs {attr} in the config ({type(config).__name__} has none): "
                "project it with tp_degree=1"
            )
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    c.head_dim = getattr(config, "head_dim", None) or c.hidden_size // heads
    kv_rank = math.ceil(kv / tp_degree) if kv >= tp_degree else 1  # REPLICATE_TO_TP_DEGREE
    q_rank = math.ceil(math.ceil(heads / tp_degree) / kv_rank) * kv_rank
    c.num_attention_heads, c.num_key_value_heads = q_rank, kv_rank
    c.intermediate_size = math.ceil(c.intermediate_size / tp_degree)
    c.vocab_size = math.ceil(c.vocab_size / tp_degree)
    return c


def _meta_model(config, dtype: str, quantization: str | None = None):
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    if quantization:
        quantize_decoder(model, quantization)
    return model.eval()


def _kv_geometry(config) -> tuple[int, int]:
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return kv, getattr(config, "head_dim", None) or config.hidden_size // heads


#: compiled sub-models of this process by everything that shapes them (config, layers, batch, tokens,
#: bucket, dtype, flags): the CLI, inference_demo, NeuronModelForCausalLM and the benches asking for
#: the same graph get the same NEFF, once. Small: a full-size graph's NEFF is tens of MB.
_GRAPHS: OrderedDict = OrderedDict()
_GRAPHS_MAX = 6


def _compile_graph(config, layers: int, batch: int, tokens: int, bucket: int, dtype: str, flags: dict,
                   quantization: str | None = None):
    """Capture and compile one sub-model with ``layers`` decoder layers on the meta device (cached)."""
    key = (config.to_json_string(use_diff=False), layers, batch, tokens, bucket, dtype,
           json.dumps(flags, sort_keys=True, default=str), quantization)
    if key in _GRAPHS:
        _GRAPHS.move_to_end(key)
        return _GRAPHS[key]
    neff = _GRAPHS[key] = _compile_graph_uncached(config, layers, batch, tokens, bucket, dtype, flags,
                                                  quantization)
    while len(_GRAPHS) > _GRAPHS_MAX:
        _GRAPHS.popitem(last=False)
    return neff


def _compile_graph_uncached(config, layers, batch, tokens, bucket, dtype, flags, quantization):
    import torch
    import transformers

    cfg = rank_config(config, 1, layers)
    model = _meta_model(cfg, dtype, quantization)
    cache = transformers.StaticCache(config=cfg, max_cache_len=bucket)
    kv, head_dim = _kv_geometry(cfg)
    meta = torch.device("meta")
    cache.early_initialization(
        batch_size=batch, num_heads=kv, head_dim=head_dim, dtype=getattr(torch, dtype), device=meta
    )
    ids = torch.zeros((batch, tokens), dtype=torch.long, device=meta)
    pos = torch.arange(tokens, device=meta) if tokens > 1 else torch.full((1,), bucket - 1, device=meta)
    program = capture(
        model,
        {"input_ids": ids, "past_key_values": cache, "cache_position": pos},
        name=f"{type(model).__name__}_{layers}layer",
    )
    return compile_program(program, flags)


def _engine_active_ns(neff) -> dict[str, int]:
    """Per engine, the union of its instructions' [start, end) over the NEFF's partitions (a DMA
    engine's 16 queues overlap one another: their sum would exceed the elapsed time)."""
    import numpy as np

    from neuron_stack.compiler.schedule import union_ns

    out: dict[str, int] = {}
    for sc in neff.schedules.values():
        eng = np.array(sc.table.column("engine").to_pylist(), dtype=object)
        start, dur = sc.table.column("rel_start_ns").to_numpy(), sc.table.column("dur_ns").to_numpy()
        for e in set(eng.tolist()):
            m = eng == e
            out[e] = out.get(e, 0) + union_ns(start[m], dur[m])
    return out


def _collectives_ns(config, tp: int, batch: int, tokens: int, dtype: str, profile) -> int:
    """Per call: two all-reduces of the hidden state per layer, one all-gather of the last logits."""
    if tp == 1:
        return 0
    group = Group.on_cores(range(tp))
    per_layer = 2 * plan("all_reduce", batch * tokens * config.hidden_size, dtype, group, profile).dur_ns
    logits = plan("all_gather", batch * math.ceil(config.vocab_size / tp), dtype, group, profile).dur_ns
    return config.num_hidden_layers * per_layer + logits


def _instance(instance_type: str | None, target: str):
    if instance_type is None:
        instance_type = get_profile(target).instance_type
    if instance_type not in INSTANCE_TYPES:
        raise ConfigError(f"unknown instance type {instance_type!r}: use one of {', '.join(INSTANCE_TYPES)}")
    prof_name, chips, _, _ = INSTANCE_TYPES[instance_type]
    profile = get_profile(prof_name)
    return instance_type, profile, chips * profile.cores_per_chip


def project(
    model,
    *,
    batch_size: int = 1,
    sequence_length: int = 2048,
    context_length: int | None = None,
    tp_degree: int = 1,
    dtype: str = "bf16",
    instance_type: str | None = None,
    target: str = "trn1",
    token_generation_buckets: list[int] | None = None,
    compiler_args=None,
    quantization_dtype: str | None = None,
) -> Projection:
    """Project a decoder LLM (a preset name, a config directory or a transformers config) with no weights.

    ``sequence_length``: the KV cache length (prompt + generated tokens); ``context_length``: the
    prompt bucket of the context-encoding graph (default ``min(128, sequence_length)``);
    ``token_generation_buckets``: KV lengths of the decode graphs (default ``[sequence_length]``);
    ``instance_type`` (e.g. ``inf2.xlarge``) picks the device profile, else ``target``'s default instance;
    ``quantization_dtype`` (``int8``, or ``fp8`` on trn2): weight-only quantization of the decoder layers
    (:mod:`neuron_stack.llm.quantize`).
    Example: ``print(project("llama-3-8b", tp_degree=8, instance_type="trn1.32xlarge").report())``.
    """
    t0 = time.perf_counter()
    name = model if isinstance(model, str) else type(model).__name__
    config = load_config(model)
    if str(dtype).lower() not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of bf16, fp16, fp32")
    dtype = DTYPES[str(dtype).lower()]
    quantization = None
    if quantization_dtype:
        quantization = QUANT_DTYPES.get(str(quantization_dtype).lower())
        if quantization is None:
            raise ConfigError(f"quantization dtype {quantization_dtype!r} is not one of int8, fp8")
    require_positive(batch_size=batch_size, sequence_length=sequence_length, tp_degree=tp_degree)
    context_length = context_length or min(128, sequence_length)
    buckets = sorted(set(token_generation_buckets or [sequence_length]))
    if context_length > sequence_length or buckets[-1] > sequence_length:
        raise ConfigError(
            f"context length {context_length} and token-generation buckets {buckets} must not "
            f"exceed sequence_length {sequence_length}"
        )
    instance_type, profile, cores = _instance(instance_type, target)
    if quantization and quantization != "int8" and profile.name not in FP8_TARGETS:
        raise ConfigError(f"fp8 weights need a trn2 Tensor Engine; {profile.name} takes int8 (or no quantization)")
    flags = parse_flags(compiler_args, target=profile.name)
    layers = int(config.num_hidden_layers)
    rank = rank_config(config, tp_degree)

    graphs = []
    # the prefill graph of a context bucket attends over that bucket and writes the KV cache at its
    # positions (NxDI's context-encoding model): its work does not depend on the cache length
    plans = [("context_encoding", context_length, context_length)] + [
        ("token_generation", 1, b) for b in buckets
    ]
    code_bytes, act_bytes, scratch = 0, 0, 0
    kv, head_dim = _kv_geometry(rank)
    elt = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    for kind, tokens, bucket in plans:
        g0 = time.perf_counter()
        one = _compile_graph(rank, 1, batch_size, tokens, bucket, dtype, flags, quantization)
        two = _compile_graph(rank, 2, batch_size, tokens, bucket, dtype, flags, quantization)
        t1, t2 = (sum(sc.device_ns for sc in n.schedules.values()) for n in (one, two))
        i1, i2 = one.program.stats["num_instructions"], two.program.stats["num_instructions"]
        # neither term of t1 + (L - 1) * layer may be negative: a layer costs at most the whole
        # one-layer graph (the rest of it, embedding and LM head, is then the base)
        layer_ns, layer_instr = min(max(0, t2 - t1), t1), max(0, i2 - i1)
        coll = _collectives_ns(config, tp_degree, batch_size, tokens, dtype, profile)
        instructions = i1 + (layers - 1) * layer_instr
        a1, a2 = _engine_active_ns(one), _engine_active_ns(two)
        # an engine's time in one layer: the union of its busy intervals (its queues overlap), which
        # a layer's extra latency bounds
        busy = {e: min(layer_ns, max(0, a2.get(e, 0) - a1.get(e, 0))) for e in a1.keys() | a2.keys()}
        graphs.append(
            GraphProjection(
                kind,
                bucket,
                tokens,
                layer_ns,
                t1 - layer_ns,
                coll,
                t1 + (layers - 1) * layer_ns + coll,
                layer_instr,
                instructions,
                time.perf_counter() - g0,
                {e: v for e, v in sorted(busy.items()) if v > 0},
                [one, two],
            )
        )
        code_bytes += instructions * INSTRUCTION_BYTES  # each bucket is its own NEFF
        mem = one.program.stats["memory"]
        cache_1layer = 2 * batch_size * kv * bucket * head_dim * elt
        act_bytes = max(act_bytes, mem["tensors"] - cache_1layer)
        scratch = max(scratch, mem["model_shared_scratchpad"])

    meta = _meta_model(rank, dtype, quantization)
    stored = set(meta.state_dict())  # parameters and persistent buffers (quantized weights, scales)
    weights = sum(t.numel() * t.element_size() for k, t in [*meta.named_parameters(), *meta.named_buffers()]
                  if k in stored)
    memory = {
        "weights": weights,
        "kv_cache": 2 * layers * batch_size * kv * sequence_length * head_dim * elt,
        "activations": act_bytes,
        "scratchpad": scratch,
        "code": code_bytes,
        "runtime": RUNTIME_MEMORY_BYTES,
    }
    return Projection(
        model=name,
        target=profile.name,
        instance_type=instance_type,
        tp_degree=tp_degree,
        batch_size=batch_size,
        sequence_length=sequence_length,
        context_length=context_length,
        dtype=dtype,
        num_layers=layers,
        graphs=graphs,
        memory=memory,
        hbm_per_core=profile.hbm_bytes_per_core,
        instance_cores=cores,
        compile_s=time.perf_counter() - t0,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        quantization=quantization,
    )
