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

import copy
import ctypes
import gc
import inspect
import json
import math
import resource
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import pyarrow as pa

from neuron_stack.compiler.driver import INSTRUCTION_BYTES, RUNTIME_MEMORY_BYTES, compile_program
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import capture
from neuron_stack.frontend.flags import parse_flags
from neuron_stack.ir import Program, TensorSpec
from neuron_stack.llm.configs import DTYPES, ConfigError, load_config, nxdi_head_counts, require_positive, warn_run
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
    compile_layers: Callable | None = field(default=None, repr=False, compare=False)  # layers -> its NEFF

    @property
    def neffs(self) -> list:
        """The 1- and 2-layer NEFFs (numbers=none), compiled on first use: the projection keeps only
        their figures (a full-size prefill NEFF with its record tables takes gigabytes)."""
        return [self.compile_layers(1), self.compile_layers(2)]

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "compile_layers"}


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
    c.num_attention_heads, c.num_key_value_heads, _ = nxdi_head_counts(tp_degree, heads, kv)
    c.intermediate_size = math.ceil(c.intermediate_size / tp_degree)
    c.vocab_size = math.ceil(c.vocab_size / tp_degree)
    return c


def _meta_model(config, dtype: str, quantization: str | None = None):
    import torch
    import transformers

    from neuron_stack.llm.kernels import fuse_rms_norms

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    if quantization:
        quantize_decoder(model, quantization)
    fuse_rms_norms(model)      # NxDI's CustomRMSNorm: one fused op per norm (llm/kernels.py)
    return model.eval()


def _kv_geometry(config) -> tuple[int, int]:
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return kv, getattr(config, "head_dim", None) or config.hidden_size // heads


#: compiled sub-models of this process by everything that shapes them (config, layers, batch, tokens,
#: bucket, dtype, flags): whoever asks for a graph's NEFF again gets the same one. Few: a full-size
#: prefill NEFF takes gigabytes.
_GRAPHS: OrderedDict = OrderedDict()
_GRAPHS_MAX = 2
#: the figures a projection reads from each of those graphs (:func:`_figures`), by the same key: the
#: CLI, inference_demo, NeuronModelForCausalLM and the benches projecting the same settings compile once
_FIGURES: OrderedDict = OrderedDict()
_FIGURES_MAX = 256
#: captured token-generation graphs shared by a set of buckets (see :func:`_program`): a few hundred
#: nodes each, weights on the meta device
_TEMPLATES: OrderedDict = OrderedDict()
_TEMPLATES_MAX = 4


def _compile_graph(config, layers: int, batch: int, tokens: int, bucket: int, dtype: str, flags: dict,
                   quantization: str | None = None, family: tuple[int, ...] = (), sp: int = 1):
    """Capture and compile one sub-model with ``layers`` decoder layers on the meta device (cached).

    ``family``: the KV lengths of the sibling graphs of a decode step (``bucket`` among them), which
    share one capture (:func:`_program`); the NEFF is the same with or without it. ``sp``: the
    sequence-parallel degree of a context-encoding graph (1: off; :mod:`neuron_stack.llm.parallel`)."""
    key = _graph_key(config, layers, batch, tokens, bucket, dtype, flags, quantization, sp)
    if key in _GRAPHS:
        _GRAPHS.move_to_end(key)
        return _GRAPHS[key]
    neff = _GRAPHS[key] = compile_program(_program(config, layers, batch, tokens, bucket, dtype, quantization,
                                                   family, sp), flags)
    while len(_GRAPHS) > _GRAPHS_MAX:
        _GRAPHS.popitem(last=False)
    return neff


def _graph_key(config, layers, batch, tokens, bucket, dtype, flags, quantization, sp=1) -> tuple:
    return (config.to_json_string(use_diff=False), layers, batch, tokens, bucket, dtype,
            json.dumps(flags, sort_keys=True, default=str), quantization, sp)


@dataclass(frozen=True)
class _Figures:
    """What a projection reads from one compiled sub-model."""

    device_ns: int
    instructions: int
    memory: dict  # the program's memory plan (driver.memory_plan)
    active_ns: dict  # engine -> union of its busy intervals (_engine_active_ns)
    flops: int = 0  # the work the device time is for: what the monotone property tests bound it by
    hbm_bytes: int = 0  # read + written


def _figures(config, layers, batch, tokens, bucket, dtype, flags, quantization, family=(), sp=1) -> _Figures:
    """The figures of the sub-model :func:`_compile_graph` would compile, from a timings-only compile
    (``detail=False``) whose NEFF is dropped at once (cached: the figures are a few numbers)."""
    key = _graph_key(config, layers, batch, tokens, bucket, dtype, flags, quantization, sp)
    if key in _FIGURES:
        _FIGURES.move_to_end(key)
        return _FIGURES[key]
    neff = _GRAPHS.get(key)
    if neff is None:
        neff = compile_program(_program(config, layers, batch, tokens, bucket, dtype, quantization, family, sp),
                               flags, detail=False)
    scs = neff.schedules.values()
    fig = _FIGURES[key] = _Figures(sum(sc.device_ns for sc in scs), neff.program.stats["num_instructions"],
                                   neff.program.stats["memory"], _engine_active_ns(neff), sum(sc.flops for sc in scs),
                                   sum(sc.hbm_read_bytes + sc.hbm_write_bytes for sc in scs))
    while len(_FIGURES) > _FIGURES_MAX:
        _FIGURES.popitem(last=False)
    # the NEFF's tables (hundreds of MB on a long prefill): back to the OS before the next graph is
    # lowered (peak RSS), not when the collector and Arrow's allocator next happen to let them go
    del neff, scs
    gc.collect()
    pa.default_memory_pool().release_unused()
    _malloc_trim()
    return fig


def _malloc_trim() -> None:
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim``): the next, larger graph's
    lowering then grows from what is live, not on top of the last one's freed but still mapped pages."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc: nothing to trim
        pass


def _program(config, layers, batch, tokens, bucket, dtype, quantization, family=(), sp=1):
    """The captured sub-model at KV length ``bucket``, captured once for a whole ``family`` of lengths.

    Capturing (``torch.export`` and its decompositions) is most of a projection's time, and the
    graphs of one decode step at different KV lengths differ only in that length: in tensor shapes
    and in the integer arguments that size them (``arange``, ``expand``, ``view``). So the family's
    smallest and largest lengths are captured, and when substituting the length in the smallest's
    program gives exactly the largest's (every node, argument, shape, source line and I/O spec), the
    lengths between are derived the same way; otherwise (the length decides some structure, or it
    equals another dimension, e.g. the K/V width) each is captured."""
    family = tuple(sorted(set(family) | {bucket}))
    if len(family) < 3:
        return _capture(config, layers, batch, tokens, bucket, dtype, quantization, sp)
    key = (config.to_json_string(use_diff=False), layers, batch, tokens, dtype, quantization, family, sp)
    if key not in _TEMPLATES:
        small, large = (_capture(config, layers, batch, tokens, b, dtype, quantization, sp)
                        for b in (family[0], family[-1]))
        _TEMPLATES[key] = small, large, _same(rebucket(small, family[0], family[-1]), large)
        while len(_TEMPLATES) > _TEMPLATES_MAX:
            _TEMPLATES.popitem(last=False)
    _TEMPLATES.move_to_end(key)
    small, large, shared = _TEMPLATES[key]
    # copies: the compiler annotates the program it compiles
    if bucket == family[-1]:
        return rebucket(large, bucket, bucket)
    if bucket == family[0] or shared:
        return rebucket(small, family[0], bucket)
    return _capture(config, layers, batch, tokens, bucket, dtype, quantization, sp)


def rebucket(program: Program, old: int, new: int) -> Program:
    """A fresh copy of a captured (not yet compiled) ``program`` with the KV length ``old`` replaced by
    ``new`` in every tensor shape and integer argument (constants are shared: they do not change).

    >>> from neuron_stack.ir import Node, TensorSpec
    >>> p = Program("g", [Node("a", "aten.arange.start_step", [0, 256], outputs=[TensorSpec((256,), "int64")])],
    ...             [], [{"node": "a"}])
    >>> q = rebucket(p, 256, 512)
    >>> q.nodes[0].args, q.nodes[0].outputs[0].shape, p.nodes[0].args
    ([0, 512], (512,), [0, 256])
    """
    from torch.utils import _pytree as pytree

    def sub(a):
        if type(a) is int:  # not bool, not float: a length is an int
            return new if a == old else a
        if isinstance(a, list):
            return [sub(x) for x in a]
        if isinstance(a, tuple):
            return tuple(sub(x) for x in a)
        if isinstance(a, dict):
            return {k: sub(v) for k, v in a.items()}
        return a

    def specs(ss):
        return [TensorSpec(sub(s.shape), s.dtype) for s in ss]

    def tree(x):  # a dumped pytree spec: each "context" is a JSON text of its own (the cache's lengths)
        if isinstance(x, dict):
            return {k: json.dumps(sub(json.loads(v))) if k == "context" and isinstance(v, str) else tree(v)
                    for k, v in x.items()}
        return [tree(v) for v in x] if isinstance(x, list) else x

    nodes = [replace(n, args=sub(n.args), kwargs=sub(n.kwargs), inputs=specs(n.inputs), outputs=specs(n.outputs))
             for n in program.nodes]
    io = {k: json.dumps(tree(json.loads(v))) if k in ("in", "out") else v for k, v in program.io_specs.items()}
    out = Program(program.name, nodes, list(program.input_names), sub(program.output_names),
                  dict(program.constants), dict(program.flags), list(program.log), io)
    # the pytree specs capture attaches (frontend.export.from_exported), rebuilt from the new text
    for attr, k in (("in_spec", "in"), ("out_spec", "out")):
        if k in io:
            setattr(out, attr, pytree.treespec_loads(io[k]))
        elif hasattr(program, attr):
            setattr(out, attr, getattr(program, attr))
    return out


def _same(a: Program, b: Program) -> bool:
    """Two captured programs are the same graph: nodes, I/O, sources, constants' shapes, pytree specs."""
    shapes = [{k: (tuple(t.shape), t.dtype) for k, t in p.constants.items()} for p in (a, b)]
    specs = [(str(getattr(p, "in_spec", None)), str(getattr(p, "out_spec", None))) for p in (a, b)]
    return a.to_json() == b.to_json() and shapes[0] == shapes[1] and specs[0] == specs[1]


def _capture(config, layers, batch, tokens, bucket, dtype, quantization, sp=1) -> Program:
    """Build the sub-model on the meta device and capture it (``torch.export``): no weights, no numbers.
    ``sp`` > 1: a context-encoding graph sequence-parallel over ``sp`` ranks, its collectives in the graph."""
    import torch
    import transformers

    cfg = rank_config(config, 1, layers)
    model = _meta_model(cfg, dtype, quantization)
    if sp > 1:
        from neuron_stack.llm.parallel import sequence_parallel

        sequence_parallel(model, sp)
    cache = transformers.StaticCache(config=cfg, max_cache_len=bucket)
    kv, head_dim = _kv_geometry(cfg)
    meta = torch.device("meta")
    cache.early_initialization(
        batch_size=batch, num_heads=kv, head_dim=head_dim, dtype=getattr(torch, dtype), device=meta
    )
    ids = torch.zeros((batch, tokens), dtype=torch.long, device=meta)
    pos = torch.arange(tokens, device=meta) if tokens > 1 else torch.full((1,), bucket - 1, device=meta)
    if tokens > 1:
        from neuron_stack.llm.prefill import context_encoding_cache

        context_encoding_cache(cache)
    # a context-encoding call computes the logits of the prompt's last position only (NxDI
    # ``model_base.py``: ``torch.gather`` of the hidden state at ``max(position_ids)`` before ``lm_head``)
    keeps = "logits_to_keep" in inspect.signature(model.forward).parameters
    last = {"logits_to_keep": 1} if tokens > 1 and keeps else {}
    return capture(
        model,
        {"input_ids": ids, "past_key_values": cache, "cache_position": pos, **last},
        name=f"{type(model).__name__}_{layers}layer",
    )


def _engine_active_ns(neff) -> dict[str, int]:
    """Per engine, the union of its instructions' [start, end) over the NEFF's partitions (a DMA
    engine's 16 queues overlap one another: their sum would exceed the elapsed time)."""
    from neuron_stack.compiler.schedule import union_ns

    out: dict[str, int] = {}
    for sc in neff.schedules.values():
        # the engine column as codes into its few names: no Python string per instruction
        eng = sc.table.column("engine").combine_chunks().dictionary_encode()
        codes = eng.indices.to_numpy(zero_copy_only=False)
        start, dur = sc.table.column("rel_start_ns").to_numpy(), sc.table.column("dur_ns").to_numpy()
        for c, e in enumerate(eng.dictionary.to_pylist()):
            m = codes == c
            out[e] = out.get(e, 0) + union_ns(start[m], dur[m])
    return out


def _collectives_ns(config, tp: int, batch: int, tokens: int, dtype: str, profile,
                    sequence_parallel: bool = False) -> int:
    """Per call: two all-reduces of the hidden state per layer, one all-gather of the last logits. A
    sequence-parallel graph holds its layers' collectives (the schedule times them): only the logits'."""
    if tp == 1:
        return 0
    group = Group.on_cores(range(tp))
    per_layer = 0 if sequence_parallel else \
        2 * plan("all_reduce", batch * tokens * config.hidden_size, dtype, group, profile).dur_ns
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
    sequence_parallel: bool = False,
) -> Projection:
    """Project a decoder LLM (a preset name, a config directory or a transformers config) with no weights.

    ``sequence_length``: the KV cache length (prompt + generated tokens); ``context_length``: the
    prompt bucket of the context-encoding graph (default ``min(128, sequence_length)``);
    ``token_generation_buckets``: KV lengths of the decode graphs (default ``[sequence_length]``);
    ``instance_type`` (e.g. ``inf2.xlarge``) picks the device profile, else ``target``'s default instance;
    ``quantization_dtype`` (``int8``, or ``fp8`` on trn2): weight-only quantization of the decoder layers
    (:mod:`neuron_stack.llm.quantize`); ``sequence_parallel``: NxDI's ``sequence_parallel_enabled``, the
    context-encoding graph's hidden state sharded on the sequence over the TP ranks, its collectives
    in the graph (:mod:`neuron_stack.llm.parallel`; the prompt bucket padded up to a multiple of ``tp_degree``).
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
    for kind, tokens, bucket in plans:
        g0 = time.perf_counter()
        family = tuple(buckets) if kind == "token_generation" else ()
        g_sp = sp if kind == "context_encoding" else 1  # token generation never runs sequence parallel
        # the in-graph collectives are timed over the TP group (compiler/lower/data.py lower_collective)
        g_flags = {**flags, "world_size": tp_degree} if g_sp > 1 else flags
        one, two = (_figures(rank, n, batch_size, tokens, bucket, dtype, g_flags, quantization, family, g_sp)
                    for n in (1, 2))
        t1, t2 = one.device_ns, two.device_ns
        i1, i2 = one.instructions, two.instructions
        # neither term of t1 + (L - 1) * layer may be negative: a layer costs at most the whole
        # one-layer graph (the rest of it, embedding and LM head, is then the base)
        layer_ns, layer_instr = min(max(0, t2 - t1), t1), max(0, i2 - i1)
        coll = _collectives_ns(config, tp_degree, batch_size, tokens, dtype, profile, g_sp > 1)
        instructions = i1 + (layers - 1) * layer_instr
        a1, a2 = one.active_ns, two.active_ns
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
                partial(_compile_graph, rank, batch=batch_size, tokens=tokens, bucket=bucket, dtype=dtype,
                        flags=g_flags, quantization=quantization, family=family, sp=g_sp),
            )
        )
        code_bytes += instructions * INSTRUCTION_BYTES  # each bucket is its own NEFF
        mem = one.memory
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
        sequence_parallel=sp > 1,
    )
