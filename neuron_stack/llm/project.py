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
with an all-gather of the last token's logits. With ``sequence_parallel`` the context-encoding graph
holds its layers' all-gathers and reduce-scatters itself (:mod:`neuron_stack.llm.parallel`), timed by
the schedule.

>>> p = project("llama-2-7b", tp_degree=8, sequence_length=256, context_length=128)   # doctest: +SKIP
>>> p.fits, p.graphs[1].device_ns > 0                                                   # doctest: +SKIP
(True, True)
"""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from neuron_stack.compiler.driver import INSTRUCTION_BYTES, RUNTIME_MEMORY_BYTES
from neuron_stack.compiler.lower.resident import LANE_MIN_RUN
from neuron_stack.compiler.lower.tiles import PMAX
from neuron_stack.device.collective_cost import RELEASES
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.flags import parse_flags
from neuron_stack.llm.configs import DTYPES, ConfigError, load_config, require_positive, warn_run
from neuron_stack.llm.graphs import (  # noqa: F401  (rebucket, _program: the module's public seams, as before)
    _compile_graph,
    _figures,
    _kv_geometry,
    _meta_model,
    _program,
    rank_config,
    rebucket,
)
from neuron_stack.llm.quantize import FP8_TARGETS, QUANT_DTYPES
from neuron_stack.llm.request import added_ns, call_components
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
    compile_layers: Callable | None = field(default=None, repr=False, compare=False)  # layers -> its NEFF
    #: what a request waits for around the call (launch, copies over the host link; llm/request.py)
    request_components: list = field(default_factory=list)
    #: one layer's DMA transfers summed over the queues, divided by the core's queues: the layer's time were
    #: its HBM traffic (weights, KV cache, activations) all that bounds it (:attr:`hbm_bound`)
    layer_dma_queue_ns: int = 0

    @property
    def hbm_bound(self) -> bool:
        """Whether the layer is bound by its HBM traffic: its DMA transfers, spread over the core's queues, fill
        at least 90% of its period (a weight stream is cut into pieces over the 16 queues and never spreads
        perfectly). Not the DMA engine's busy time (``layer_busy_ns["dma"]``), which one slow transfer keeps
        "busy" with 15 queues idle: at batch 8 each of a decode step's scores' passes through HBM is one
        transfer of 1,024 short descriptors.

        >>> GraphProjection("token_generation", 128, 1, 1000, 0, 0, 0, 0, 0, 0.0, layer_dma_queue_ns=950).hbm_bound
        True
        """
        return self.layer_dma_queue_ns >= 0.9 * self.layer_ns

    @property
    def bound_by(self) -> str:
        """What bounds one layer, as the report says it: its HBM traffic (:attr:`hbm_bound`), else a compute
        engine busy through 90% of it, else the chain of dependent instructions (no engine busy through it).

        >>> g = GraphProjection("token_generation", 128, 1, 1000, 0, 0, 0, 0, 0, 0.0, {"vector": 600, "dma": 990})
        >>> g.bound_by
        'the chain of dependent instructions (no engine busy through the layer)'
        """
        if self.hbm_bound:
            return "HBM-bound: the DMA queues"
        busiest = max((v, e) for e, v in self.layer_busy_ns.items() if e != "dma") if self.layer_busy_ns else (0, "")
        if busiest[0] >= 0.9 * self.layer_ns:
            return f"the {busiest[1]} engine"
        return "the chain of dependent instructions (no engine busy through the layer)"

    @property
    def request_ns(self) -> int:
        """One call as a request sees it: device time plus the components device time does not hold."""
        return self.device_ns + added_ns(self.request_components)

    @property
    def neffs(self) -> list:
        """The 1- and 2-layer NEFFs (numbers=none), compiled on first use: the projection keeps only
        their figures (a full-size prefill NEFF with its record tables takes gigabytes)."""
        return [self.compile_layers(1), self.compile_layers(2)]

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("compile_layers", "request_components")}
        return {**d, "request_ns": self.request_ns, "hbm_bound": self.hbm_bound, "bound_by": self.bound_by,
                "request_components": [c.to_json() for c in self.request_components]}


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
    sequence_parallel: bool = False  # the context-encoding graph's (NxDI's sequence_parallel_enabled)
    on_device_sampling: bool = False  # NxDI's on_device_sampling_config: ids, not logits, to the host
    neuron_release: str = "latest"  # the runtime release whose collective algorithms cost the collectives

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
            + (", sequence-parallel context encoding" if self.sequence_parallel else "")
            + (f", Neuron {self.neuron_release} runtime's collectives" if self.neuron_release != "latest" else "")
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
            f"{'device':>10} {'request':>10} {'instructions':>13}",
        ]
        for g in self.graphs:
            lines.append(
                f"{g.name:<18} {g.bucket:>7} {g.active_tokens:>6} {g.layer_ns / 1e3:>8.1f}us "
                f"{g.collective_ns / 1e3:>9.1f}us {g.device_ns / 1e6:>8.2f}ms {g.request_ns / 1e6:>8.2f}ms "
                f"{g.instructions:>13,}"
            )
        lines += ["", "request time per call = device time + (per component, "
                  + ("sampled ids" if self.on_device_sampling else "logits") + " to the host):"]
        for c in self.graphs[0].request_components if self.graphs else []:
            per = ", ".join(f"{next(x.ns for x in g.request_components if x.name == c.name) / 1e3:.1f}"
                            for g in self.graphs)
            lines.append(f"  {c.name:<17} {per} us{'  (in device time)' if c.in_device_time else ''}: {c.source}")
        lines.append("  not modelled: host CPU sampling and input preparation, the framework's per-step Python")
        lines += ["", "one layer's schedule, busy time per engine:"]
        for g in self.graphs:
            eng = ", ".join(f"{e} {v / 1e3:.1f}us" for e, v in g.layer_busy_ns.items())
            share = g.layer_dma_queue_ns / max(1, g.layer_ns)
            lines.append(f"  {g.name} ({g.bucket}): {eng}; DMA queues {share:.0%} of the layer; bound by "
                         f"{g.bound_by}")
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


def kv_length(bucket: int) -> int:
    """The KV length a decode graph of ``bucket`` attends over. Where a row of scores over the cache takes the
    lane layout (partition ``p`` holding positions ``p * S / 128 ...``: at least ``LANE_MIN_RUN`` positions
    a partition, ``compiler/lower/resident.py``; NxDI's tiled KV layout ``(B, H, 128, S / 128, D)``,
    reference §2.5), the bucket is padded up to a multiple of the 128 partitions, the padding masked. Over
    an odd length the row fell back to one partition, and its mask, softmax and casts ran ``S`` elements on
    one lane: a 3000-token cache cost more than a 4096-token one. Shorter rows take the row layout at every
    length, so they stay as they are.

    >>> kv_length(512), kv_length(900), kv_length(2048), kv_length(2112), kv_length(3000)
    (512, 1024, 2048, 2176, 3072)
    """
    if bucket <= PMAX * (LANE_MIN_RUN - 1):
        return bucket
    return -(-bucket // PMAX) * PMAX


def _collectives_ns(config, tp: int, batch: int, tokens: int, dtype: str, profile,
                    sequence_parallel: bool = False, release: str = "latest") -> int:
    """Per call: two all-reduces of the hidden state per layer, one all-gather of the last logits, with runtime
    ``release``'s algorithms. A sequence-parallel graph holds its layers' collectives (the schedule times
    them): only the logits'."""
    if tp == 1:
        return 0
    group = Group.on_cores(range(tp))
    per_layer = 0 if sequence_parallel else \
        2 * plan("all_reduce", batch * tokens * config.hidden_size, dtype, group, profile, release).dur_ns
    logits = plan("all_gather", batch * math.ceil(config.vocab_size / tp), dtype, group, profile, release).dur_ns
    return config.num_hidden_layers * per_layer + logits


def _instance(instance_type: str | None, target: str):
    if instance_type is None:
        instance_type = get_profile(target).instance_type
    if instance_type not in INSTANCE_TYPES:
        raise ConfigError(f"unknown instance type {instance_type!r}: use one of {', '.join(INSTANCE_TYPES)}")
    prof_name, chips, _, _ = INSTANCE_TYPES[instance_type]
    profile = get_profile(prof_name)
    return instance_type, profile, chips * profile.cores_per_chip


def _checked_choices(dtype, quantization_dtype, neuron_release) -> tuple[str, str | None]:
    """The torch dtype name and the quantization of ``project``'s choices, or a one-line ConfigError."""
    if str(dtype).lower() not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of bf16, fp16, fp32")
    quantization = None
    if quantization_dtype:
        quantization = QUANT_DTYPES.get(str(quantization_dtype).lower())
        if quantization is None:
            raise ConfigError(f"quantization dtype {quantization_dtype!r} is not one of int8, fp8")
    if neuron_release not in RELEASES:
        raise ConfigError(f"neuron release {neuron_release!r} is not one of {', '.join(RELEASES)}")
    return DTYPES[str(dtype).lower()], quantization


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
    sequence_parallel: bool = False,
    on_device_sampling: bool = False,
    neuron_release: str = "latest",
) -> Projection:
    """Project a decoder LLM (a preset name, a config directory or a transformers config) with no weights.

    ``sequence_length``: the KV cache length (prompt + generated tokens); ``context_length``: the
    prompt bucket of the context-encoding graph (default ``min(128, sequence_length)``);
    ``token_generation_buckets``: KV lengths of the decode graphs (default ``[sequence_length]``);
    ``instance_type`` (e.g. ``inf2.xlarge``) picks the device profile, else ``target``'s default instance;
    ``quantization_dtype`` (``int8``, or ``fp8`` on trn2): weight-only quantization of the decoder layers
    (:mod:`neuron_stack.llm.quantize`); ``sequence_parallel``: NxDI's ``sequence_parallel_enabled``, the
    context-encoding graph's hidden state sharded on the sequence over the TP ranks, its collectives
    in the graph (:mod:`neuron_stack.llm.parallel`; the prompt bucket padded up to a multiple of ``tp_degree``);
    ``on_device_sampling``: NxDI's ``on_device_sampling_config``, the sampled ids (not the logits) go to the
    host (request time, :mod:`neuron_stack.llm.request`); ``neuron_release``: the Neuron runtime release whose
    collective algorithms cost the TP collectives, ``latest`` (the collectives pages: Mesh, RDH, KangaRing by
    size) or ``2.18`` (Ring, as the runtime that ran AWS's transformers-neuronx rows had;
    :mod:`neuron_stack.device.collective_cost`).
    Example: ``print(project("llama-3-8b", tp_degree=8, instance_type="trn1.32xlarge").report())``.
    """
    t0 = time.perf_counter()
    name = model if isinstance(model, str) else type(model).__name__
    config = load_config(model)
    dtype, quantization = _checked_choices(dtype, quantization_dtype, neuron_release)
    require_positive(batch_size=batch_size, sequence_length=sequence_length, tp_degree=tp_degree)
    warn_run(config.to_dict(), tp_degree=tp_degree, sequence_length=sequence_length)
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
    sp = tp_degree if sequence_parallel else 1
    cte_tokens = math.ceil(context_length / sp) * sp
    if cte_tokens > sequence_length:
        raise ConfigError(
            f"sequence parallelism pads the context bucket {context_length} to {cte_tokens} (a multiple of "
            f"tp_degree {tp_degree}), more than sequence_length {sequence_length}: use a context length that "
            f"is a multiple of {tp_degree}, a longer sequence, or no sequence parallelism"
        )

    graphs = []
    # the prefill graph of a context bucket attends over that bucket and writes the KV cache at its
    # positions (NxDI's context-encoding model): its work does not depend on the cache length
    # sequence parallel: NxDI's context-encoding graph needs its bucket a multiple of tp
    # (model_base.validate_sequence_parallel); the prompt is padded up to it as to any bucket
    plans = [("context_encoding", cte_tokens, cte_tokens)] + [
        ("token_generation", 1, b) for b in buckets
    ]
    code_bytes, act_bytes, scratch = 0, 0, 0
    kv, head_dim = _kv_geometry(rank)
    elt = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    shape = dict(config=config, rank=rank, batch=batch_size, dtype=dtype, flags=flags, quantization=quantization,
                 profile=profile, tp=tp_degree, on_device_sampling=on_device_sampling, release=neuron_release)
    for kind, tokens, bucket in plans:
        family = tuple(sorted({kv_length(b) for b in buckets})) if kind == "token_generation" else ()
        g, one = _graph(kind, tokens, bucket, family, sp if kind == "context_encoding" else 1, **shape)
        graphs.append(g)
        code_bytes += g.instructions * INSTRUCTION_BYTES  # each bucket is its own NEFF
        cache_1layer = 2 * batch_size * kv * (kv_length(bucket) if tokens == 1 else bucket) * head_dim * elt
        act_bytes = max(act_bytes, one.memory["tensors"] - cache_1layer)
        scratch = max(scratch, one.memory["model_shared_scratchpad"])

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
        sequence_parallel=sp > 1,
        on_device_sampling=on_device_sampling,
        neuron_release=neuron_release,
    )


def _graph(kind, tokens, bucket, family, g_sp, *, config, rank, batch, dtype, flags, quantization, profile, tp,
           on_device_sampling, release="latest"):
    """One sub-model at one bucket: compiled with one and two decoder layers, extrapolated to the model's
    layers, its collectives and request components added. Returns it and the one-layer graph's figures."""
    g0 = time.perf_counter()
    layers = int(config.num_hidden_layers)
    # the in-graph collectives are timed over the TP group (compiler/lower/data.py lower_collective)
    g_flags = {**flags, "world_size": tp} if g_sp > 1 else flags
    kv = kv_length(bucket) if tokens == 1 else bucket
    one, two = (_figures(rank, n, batch, tokens, kv, dtype, g_flags, quantization, family, g_sp) for n in (1, 2))
    t1, t2 = one.device_ns, two.device_ns
    # one more layer costs the period between the two layers' ends in the two-layer graph (steady state:
    # its weights stream while the previous layer computes); t2 - t1 where the layers are not found
    ends = two.layer_ends_ns
    marginal = ends[1] - ends[0] if len(ends) == 2 else t2 - t1
    # neither term of t1 + (L - 1) * layer may be negative: a layer costs at most the whole
    # one-layer graph (the rest of it, embedding and LM head, is then the base)
    layer_ns, layer_instr = min(max(0, marginal), t1), max(0, two.instructions - one.instructions)
    coll = _collectives_ns(config, tp, batch, tokens, dtype, profile, g_sp > 1, release)
    # an engine's time in one layer: the union of its busy intervals (its queues overlap), which
    # a layer's extra latency bounds
    a1, a2 = one.active_ns, two.active_ns
    busy = {e: min(layer_ns, max(0, a2.get(e, 0) - a1.get(e, 0))) for e in a1.keys() | a2.keys()}
    elt = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    request = call_components(profile, batch=batch, tokens=tokens, bucket=bucket, vocab=int(config.vocab_size),
                              dtype_bytes=elt, on_device_sampling=on_device_sampling, collective_ns=coll)
    g = GraphProjection(
        kind, bucket, tokens, layer_ns, t1 - layer_ns, coll, t1 + (layers - 1) * layer_ns + coll, layer_instr,
        one.instructions + (layers - 1) * layer_instr, time.perf_counter() - g0,
        {e: v for e, v in sorted(busy.items()) if v > 0},
        partial(_compile_graph, rank, batch=batch, tokens=tokens, bucket=kv, dtype=dtype, flags=g_flags,
                quantization=quantization, family=family, sp=g_sp),
        request,
        max(0, two.dma_ns - one.dma_ns) // profile.dma_queues,
    )
    return g, one
