"""The sub-models a projection compiles: a rank's config, its meta-device model, the captured graph per KV
bucket (one capture shared by a family of buckets: :func:`rebucket`) and the figures read from each
timings-only compile, cached per process by everything that shapes them (:mod:`neuron_stack.llm.project`
uses them; docs/llm.md "Fast enough to iterate").

>>> from transformers import LlamaConfig
>>> rank_config(LlamaConfig(num_attention_heads=32, num_key_value_heads=8, hidden_size=4096,
...                         intermediate_size=14336, vocab_size=128256), 8).num_attention_heads
4
"""

from __future__ import annotations

import copy
import ctypes
import gc
import inspect
import json
import math
import re
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from neuron_stack.compiler.driver import compile_program
from neuron_stack.frontend.export import capture
from neuron_stack.ir import Program, TensorSpec
from neuron_stack.llm.configs import ConfigError, nxdi_head_counts
from neuron_stack.llm.kcache import LONG_CACHE
from neuron_stack.llm.quantize import quantize_decoder


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
    return (_sub_config_key(config, layers), layers, batch, tokens, bucket, dtype,
            json.dumps(flags, sort_keys=True, default=str), quantization, sp)


def _sub_config_key(config, layers: int) -> str:
    """The config of the ``layers``-layer sub-model (:func:`_capture` builds from nothing else), as text: a
    32-layer and an 80-layer model with the same layer shapes compile the same one- and two-layer graphs."""
    return rank_config(config, 1, layers).to_json_string(use_diff=False)


@dataclass(frozen=True)
class _Figures:
    """What a projection reads from one compiled sub-model."""

    device_ns: int
    instructions: int
    memory: dict  # the program's memory plan (driver.memory_plan)
    active_ns: dict  # engine -> union of its busy intervals (_engine_active_ns)
    flops: int = 0  # the work the device time is for: what the monotone property tests bound it by
    hbm_bytes: int = 0  # read + written
    layer_ends_ns: tuple = ()  # when each decoder layer's last instruction ends (_layer_ends_ns)
    dma_ns: int = 0  # every DMA's transfer time summed over the queues (_engine_active_ns)


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
                                   sum(sc.hbm_read_bytes + sc.hbm_write_bytes for sc in scs), _layer_ends_ns(neff),
                                   _dma_transfer_ns(neff))
    while len(_FIGURES) > _FIGURES_MAX:
        _FIGURES.popitem(last=False)
    # the NEFF's tables (hundreds of MB on a long prefill): back to the OS before the next graph is
    # lowered (peak RSS), not when the collector and Arrow's allocator next happen to let them go. Reference
    # counting frees a NEFF held in no cycle; a full collection (0.2 s over torch's heap) only if it is still here
    alive = weakref.ref(neff)
    del neff, scs
    if alive() is not None:
        gc.collect()
    pa.default_memory_pool().release_unused()
    _malloc_trim()
    return fig


def _layer_ends_ns(neff) -> tuple[int, ...]:
    """When each decoder layer's last instruction ends (by the module path of the op it lowers,
    ``model.layers.<i>``), in a one-partition graph; ``()`` when the graph has more partitions.

    The period between two layers' ends is what one more layer adds in steady state: the next layer's
    weights stream while this one computes, as in every layer of the whole model. ``t2 - t1`` would also
    hold how differently the LM head's weight stream overlaps one layer or two (the list scheduler places
    those independent loads wherever slots are free), which moved by tens of microseconds from one KV
    length to the next and, times ``L - 1``, made decode faster at a longer cache."""
    if len(neff.schedules) != 1:
        return ()
    layer_of = {}
    for n in neff.program.nodes:
        m = _LAYER.search(n.module_path or "")
        if m:
            layer_of[n.name] = int(m.group(1))
    sc = next(iter(neff.schedules.values()))
    node = sc.table.column("node").combine_chunks().dictionary_encode()
    end = sc.table.column("rel_start_ns").to_numpy() + sc.table.column("dur_ns").to_numpy()
    codes = node.indices.to_numpy(zero_copy_only=False)
    last = np.zeros(len(node.dictionary), dtype=np.int64)
    np.maximum.at(last, codes, end)            # each node's last instruction end, in one pass
    ends: dict[int, int] = {}
    for c, name in enumerate(node.dictionary.to_pylist()):
        layer = layer_of.get(name, layer_of.get(str(name).split(".")[0]))
        if layer is not None:
            ends[layer] = max(ends.get(layer, 0), int(last[c]))
    return tuple(ends[k] for k in sorted(ends))


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


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
    smallest and largest lengths are captured, and when substituting the length in one end's program
    gives exactly the other's (every node, argument, shape, source line and I/O spec), the lengths between
    are derived from that end. The largest is tried first: the usual smallest bucket, 128, is also the head
    width, which a substitution from it would change too. When neither end passes (the length decides some
    structure, or both ends equal other dimensions) each is captured."""
    # a cache of LONG_CACHE keys or more is laid out otherwise (K transposed, :func:`_capture`): a family
    # spanning both layouts is two families, each of its own layout
    family = tuple(sorted(b for b in set(family) | {bucket} if (b >= LONG_CACHE) == (bucket >= LONG_CACHE)))
    if len(family) < 3:
        return _capture(config, layers, batch, tokens, bucket, dtype, quantization, sp)
    key = (_sub_config_key(config, layers), layers, batch, tokens, dtype, quantization, family, sp)
    if key not in _TEMPLATES:
        lo, hi = family[0], family[-1]
        small, large = (_capture(config, layers, batch, tokens, b, dtype, quantization, sp) for b in (lo, hi))
        template = ((large, hi) if _same(rebucket(large, hi, lo), small) else
                    (small, lo) if _same(rebucket(small, lo, hi), large) else None)
        _TEMPLATES[key] = small, large, template
        while len(_TEMPLATES) > _TEMPLATES_MAX:
            _TEMPLATES.popitem(last=False)
    _TEMPLATES.move_to_end(key)
    small, large, template = _TEMPLATES[key]
    # copies: the compiler annotates the program it compiles
    if bucket == family[-1]:
        return rebucket(large, bucket, bucket)
    if bucket == family[0]:
        return rebucket(small, bucket, bucket)
    if template is not None:
        return rebucket(*template, bucket)
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
    elif bucket >= LONG_CACHE:   # NxDI's k_cache_transposed: each key lane read as one run (llm/kcache.py)
        from neuron_stack.llm.kcache import transposed_k_cache

        transposed_k_cache(cache)
    # a context-encoding call computes the logits of the prompt's last position only (NxDI
    # ``model_base.py``: ``torch.gather`` of the hidden state at ``max(position_ids)`` before ``lm_head``)
    keeps = "logits_to_keep" in inspect.signature(model.forward).parameters
    last = {"logits_to_keep": 1} if tokens > 1 and keeps else {}
    return capture(
        model,
        {"input_ids": ids, "past_key_values": cache, "cache_position": pos, **last},
        name=f"{type(model).__name__}_{layers}layer",
    )


def _dma_transfer_ns(neff) -> int:
    """Every DMA instruction's transfer time, summed over the queues that run them (the fixed latency before
    a transfer moves data is not in it: the queue moves other transfers meanwhile). Divided by the queues, it
    is how long the graph's HBM traffic keeps the DMA engines busy however well it is spread."""
    out = 0
    for sc in neff.schedules.values():
        eng = sc.table.column("engine").combine_chunks().dictionary_encode()
        names = eng.dictionary.to_pylist()
        if "dma" in names:
            out += int(sc.table.column("dur_ns").to_numpy()[eng.indices.to_numpy(zero_copy_only=False)
                                                              == names.index("dma")].sum())
    return out


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
