"""``torch.compile(fn, backend="neuron")``: the dynamo backend (registered through the package's
``torch_dynamo_backends`` entry point).

Dynamo hands us a graph; aot_autograd decomposes it to core ATen and splits it into forward and
backward graphs (training) or one inference graph; each is compiled to a NEFF (through the
persistent cache) and runs on the simulated NeuronCore. Optimizer steps stay in eager code.

Neuron specialises on shapes, so importing this module sets, for the whole process,
``torch._dynamo.config.automatic_dynamic_shapes = False`` (every new input shape is a new static
graph, never a dynamic one) and ``fail_on_recompile_limit_hit = True`` (past
``torch._dynamo.config.recompile_limit`` graphs per function, dynamo raises instead of silently
running eager). Every compile after the first for a function is recorded as a *recompile* with
its reason: which input, which dimension, old -> new (or dynamo's guard failure when no shape
changed), and the user's source line that made the call.

>>> import torch
>>> f = torch.compile(lambda x: torch.relu(x) * 2, backend="neuron")      # doctest: +SKIP
>>> f(torch.tensor([-1.0, 3.0]))                                           # doctest: +SKIP
tensor([0., 6.])
"""
from __future__ import annotations

import os
import re
import threading
import time

import torch
import torch._dynamo
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._guards import CompileContext
from torch._subclasses.fake_tensor import unset_fake_temporarily

from neuron_stack.api import caller_source
from neuron_stack.compiler.cache import compile_cached
from neuron_stack.compiler.driver import compile_program, graph_hash
from neuron_stack.frontend.export import graph_to_program
from neuron_stack.frontend.flags import parse_flags
from neuron_stack.runtime.model import LoadedModel

torch._dynamo.config.automatic_dynamic_shapes = False
torch._dynamo.config.fail_on_recompile_limit_hit = True

_lock = threading.Lock()
_frames: dict[int, dict] = {}        # dynamo frame id -> {"signature", "graphs": {kind: graph_id}}
#: Every compile this process made through the backend, in order (what ``compile_events()`` returns).
COMPILES: list[dict] = []


def _input_name(node: torch.fx.Node) -> str:
    ga = node.meta.get("grapharg")
    src = ga.source.name if ga is not None and hasattr(ga, "source") else node.name
    src = src() if callable(src) else src
    m = re.fullmatch(r"L\['([^']+)'\]", str(src))
    return m.group(1) if m else str(src)


def _signature(gm: torch.fx.GraphModule, example_inputs) -> list[tuple[str, tuple, str]]:
    sig = []
    for node, v in zip([n for n in gm.graph.nodes if n.op == "placeholder"], example_inputs):
        if isinstance(v, torch.Tensor):
            sig.append((_input_name(node), tuple(int(d) for d in v.shape), str(v.dtype).removeprefix("torch.")))
        else:
            sig.append((_input_name(node), (), type(v).__name__))
    return sig


def diff_signatures(old: list, new: list) -> str:
    """The recompile reason: the first differing input, e.g. ``tensor 'x' dim 1: 57 -> 64``.

    >>> diff_signatures([("x", (2, 57), "float32")], [("x", (2, 64), "float32")])
    "tensor 'x' dim 1: 57 -> 64"
    """
    old_by = {n: (s, d) for n, s, d in old}
    reasons = []
    for name, shape, dtype in new:
        if name not in old_by:
            reasons.append(f"new input '{name}'")
            continue
        oshape, odtype = old_by[name]
        if odtype != dtype:
            reasons.append(f"tensor '{name}' dtype: {odtype} -> {dtype}")
        elif len(oshape) != len(shape):
            reasons.append(f"tensor '{name}' rank: {len(oshape)} -> {len(shape)}")
        else:
            for i, (a, b) in enumerate(zip(oshape, shape)):
                if a != b:
                    reasons.append(f"tensor '{name}' dim {i}: {a} -> {b}")
                    break
    return "; ".join(reasons)


def _dynamo_reason() -> str:
    try:  # dynamo's own guard-failure text (private API: best effort)
        from torch._dynamo.utils import get_metrics_context
        return str(get_metrics_context()._metrics.get("recompile_reason") or "")
    except Exception:
        return ""


def _graph_name(gm: torch.fx.GraphModule) -> str:
    """``<file stem>.<function>`` of the compiled frame (the outermost frame of any node's stack)."""
    for n in gm.graph.nodes:
        st = n.meta.get("stack_trace")
        if st:
            frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', st)
            if frames:
                f, fn = frames[0]
                return f"{os.path.splitext(os.path.basename(f))[0]}.{fn}"
    return "graph"


def _compiler(kind: str, ctx: dict):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        t0 = time.perf_counter_ns()
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        program = graph_to_program(gm, name=f"{ctx['name']}_{kind}", constants={}, input_names=names)
        flags = ctx["flags"]
        ghash = graph_hash(program)
        # aot_autograd calls us under its fake mode; the compiler and runtime work on real tensors
        with unset_fake_temporarily():
            neff, hit, entry = compile_cached(ghash, flags,
                                              lambda: compile_program(program, flags, graph_hash_value=ghash),
                                              constants=program.constants)
        frame = ctx["frame"]
        prev = frame["graphs"].get(kind)
        info = {"kind": kind, "compile_wall_ns": time.perf_counter_ns() - t0, "cache_hit": hit,
                "cache_path": str(entry or ""), "source": ctx["source"],
                "recompile_of": prev if ctx["recompile"] else None,
                "recompile_reason": ctx["reason"] if ctx["recompile"] else ""}
        with unset_fake_temporarily():
            model = LoadedModel(neff, info)
        frame["graphs"][kind] = model.graph_id
        with _lock:
            COMPILES.append({"name": program.name, "kind": kind, "graph_id": model.graph_id, "cache_hit": hit,
                             "recompile": ctx["recompile"], "reason": info["recompile_reason"],
                             "source": ctx["source"], "model": model, "compile_id": ctx["compile_id"]})

        def run(args):
            return model.run(list(args))

        run._boxed_call = True   # aot_autograd's calling convention: one list argument
        run.model = model
        return run

    return compile_graph


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, **options):
    """The ``"neuron"`` dynamo backend. ``options`` may hold ``compiler_args`` (neuronx-cc flags);
    ``NEURON_CC_FLAGS`` is read too. Example: ``torch.compile(model, backend="neuron")``."""
    cid = CompileContext.current_compile_id()
    frame_id = cid.frame_id if cid is not None else -1
    sig = _signature(gm, example_inputs)
    with _lock:
        frame = _frames.setdefault(frame_id, {"signatures": [], "graphs": {}})
        recompile = bool(frame["signatures"])
        reason = ""
        if recompile:
            # a signature seen before means a non-shape guard failed (grad mode, a Python attribute...)
            seen = sig in frame["signatures"]
            reason = ("" if seen else diff_signatures(frame["signatures"][-1], sig)) or _dynamo_reason() \
                or "guard failure (no input changed shape)"
        frame["signatures"].append(sig)
    ctx = {"frame": frame, "recompile": recompile, "reason": reason, "source": caller_source(),
           "name": _graph_name(gm), "flags": parse_flags(options.get("compiler_args")),
           "compile_id": str(cid) if cid is not None else ""}
    return aot_autograd(fw_compiler=_compiler("forward", ctx), bw_compiler=_compiler("backward", ctx),
                        inference_compiler=_compiler("inference", ctx),
                        decompositions=core_aten_decompositions())(gm, example_inputs)


def compile_events() -> list[dict]:
    """Every graph compiled through the backend in this process (name, kind, recompile, reason, source)."""
    with _lock:
        return [dict(c) for c in COMPILES]
