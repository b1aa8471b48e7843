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

import inspect
import os
import re
import sys
import threading
import time
import types

import torch
import torch._dynamo
import torch._guards
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._guards import CompileContext
from torch._subclasses.fake_tensor import unset_fake_temporarily

from neuron_stack.api import caller_source
from neuron_stack.compiler.cache import compile_cached
from neuron_stack.compiler.driver import compile_program, graph_hash
from neuron_stack.compiler.fallbacks import warn_fallbacks
from neuron_stack.frontend.export import backward_source, graph_to_program, is_user_file
from neuron_stack.frontend.flags import parse_flags
from neuron_stack.ir import Source
from neuron_stack.runtime.model import LoadedModel
from neuron_stack.runtime.recorder import record_dispatch

torch._dynamo.config.automatic_dynamic_shapes = False
torch._dynamo.config.fail_on_recompile_limit_hit = True


class RecompileLimitHit(torch._dynamo.exc.FailOnRecompileLimitHit):
    """Dynamo's recompile-limit failure, saying why it happened and what to change: pad or bucket
    the input that changed shape (for ``generate()``, a static KV cache), at the user's call line."""

    def __init__(self, *args):
        super().__init__(*args)
        self.args = (recompile_limit_message(),) if not args or "neuron_stack" not in str(args[0]) else args


def recompile_limit_message() -> str:
    """The one-line explanation of a recompile-limit failure for the function dynamo is compiling.

    Example: ``recompile_limit_message()  # "LlamaForCausalLM.forward was compiled 8 times ..."``.
    """
    frame = _frame_being_compiled()
    name = _graph_name_of(frame) if frame is not None else "the compiled function"
    with _lock:
        mine = [c for c in COMPILES if c["name"].startswith(name + "_")]
    reason = next((c["reason"] for c in reversed(mine) if c["reason"]), "").split("; ")
    reason = "; ".join(reason[:2]) + ("; ..." if len(reason) > 2 else "")
    site = _script_frame()
    where = f" (called from {os.path.basename(site.file)}:{site.line}: {site.code})" if site else ""
    limit = torch._dynamo.config.recompile_limit
    last = f"; last change: {reason}" if reason else ""
    return (f"neuron_stack: {name} was compiled {limit} times (torch._dynamo.config.recompile_limit), "
            f"once per new input shape{last}. A NeuronCore runs static shapes: pad "
            f"that input to a few fixed lengths (buckets), or for model.generate() pass "
            f"cache_implementation=\"static\" so every decode step has one shape{where}")


def _script_frame():
    """The innermost frame of the current stack in the user's own code (not an installed package)."""
    for f in inspect.stack()[1:]:
        if is_user_file(f.filename) and "site-packages" not in f.filename:
            return Source(os.path.abspath(f.filename), f.lineno, f.function,
                          (f.code_context or [""])[0].strip())
    return caller_source()


# dynamo raises the class it imported by name: ours, a subclass, keeps every `except` working
torch._dynamo.convert_frame.FailOnRecompileLimitHit = RecompileLimitHit

_lock = threading.Lock()
_frames: dict[tuple, dict] = {}      # (dynamo frame id, name) -> {"signature", "graphs": {kind: graph_id}}
#: Every compile this process made through the backend, in order (what ``compile_events()`` returns).
COMPILES: list[dict] = []


def user_name(source: str) -> str:
    """Dynamo's name for a graph input, spelled as the user wrote it.

    >>> user_name("L['kwargs']['input_ids']")
    'input_ids'
    >>> user_name("L['kwargs']['past_key_values'].layers[0].keys")
    'past_key_values.layers[0].keys'
    >>> user_name("L['self']._modules['lm_head']._parameters['weight']")
    'lm_head.weight'
    >>> user_name("L['x']")
    'x'
    """
    s = str(source)
    s = re.sub(r"^L\['(?:self|kwargs)'\]", "", s)
    s = re.sub(r"^L\['([^']+)'\]", r"\1", s)
    s = re.sub(r"\._(?:modules|parameters|buffers)\['([^']*)'\]", r".\1", s)
    s = re.sub(r"\['([A-Za-z_]\w*)'\]", r".\1", s)
    return s.lstrip(".")


def _input_name(node: torch.fx.Node) -> str:
    ga = node.meta.get("grapharg")
    src = ga.source.name if ga is not None and hasattr(ga, "source") else node.name
    src = src() if callable(src) else src
    return user_name(src)


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
        text = str(get_metrics_context()._metrics.get("recompile_reason") or "")
    except Exception:
        return ""
    # "0/1: kwargs['past_key_values'].layers[0].n == 6  # code  # file:line in fn\nUser stack..." -> one line
    first = re.sub(r"^\d+/\d+: ", "", (text.strip().splitlines() or [""])[0])
    named = re.sub(r"\b(?:kwargs|self)\['([A-Za-z_]\w*)'\]\.?", r"\1.", first)
    return named.replace(". ", " ").replace(".[", "[")


def _frame_being_compiled() -> tuple[types.CodeType, dict] | None:
    """The code and locals of the function dynamo is compiling: arguments of its ``convert_frame``
    ``_compile`` up our stack (private API: best effort, None when not found)."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_filename.endswith("convert_frame.py"):
            code, local = f.f_locals.get("code"), f.f_locals.get("locals")
            if isinstance(code, types.CodeType) and isinstance(local, dict):
                return code, local
        f = f.f_back
    return None


def _graph_name(gm: torch.fx.GraphModule) -> str:
    """The compiled function as the user knows it: ``LlamaForCausalLM.forward`` for a module's forward
    (even behind a decorator such as transformers' output wrappers), else ``<file stem>.<function>``."""
    frame = _frame_being_compiled()
    if frame is not None:
        return _graph_name_of(frame)
    for n in gm.graph.nodes:
        st = n.meta.get("stack_trace")
        if st:
            frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', st)
            if frames:
                f, fn = frames[0]
                return f"{os.path.splitext(os.path.basename(f))[0]}.{fn}"
    return "graph"


def _graph_name_of(frame: tuple[types.CodeType, dict]) -> str:
    """``Class.forward`` when the compiled function is a module's forward, else ``<file stem>.<function>``."""
    code, local = frame
    owner = local.get("self")
    if isinstance(owner, torch.nn.Module):
        return f"{type(owner).__name__}.forward"
    return f"{os.path.splitext(os.path.basename(code.co_filename))[0]}.{code.co_name}"


def _compiler(kind: str, ctx: dict):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        t0 = time.perf_counter_ns()
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        flags = ctx["flags"]
        # aot_autograd calls us under its fake mode and tracing context; the compiler and runtime work on
        # real tensors (hashing the graph's real constants under the fake mode fails, and torch.load of a
        # cached NEFF inside the tracing context makes every constant a meta tensor)
        with unset_fake_temporarily(), torch._guards.tracing(None):
            # aot_autograd compiles a static backward lazily, on its first run: the backward() call is live
            bw_line = backward_source() if kind == "backward" else None
            program = graph_to_program(gm, name=f"{ctx['name']}_{kind}", constants={}, input_names=names,
                                       backward_source=bw_line, call_site=ctx["source"])
            ghash = graph_hash(program)
            neff, hit, entry = compile_cached(ghash, flags,
                                              lambda: compile_program(program, flags, graph_hash_value=ghash),
                                              constants=program.constants)
        frame = ctx["frame"]
        prev = frame["graphs"].get(kind)
        info = {"kind": kind, "compile_wall_ns": time.perf_counter_ns() - t0, "cache_hit": hit,
                "cache_path": str(entry or ""), "source": ctx["source"],
                "recompile_of": prev if ctx["recompile"] else None,
                "recompile_reason": ctx["reason"] if ctx["recompile"] else ""}
        with unset_fake_temporarily(), torch._guards.tracing(None):
            model = LoadedModel(neff, info)
        frame["graphs"][kind] = model.graph_id
        warn_fallbacks(neff, ctx["source"])     # once per compiled graph (forward, backward, inference)
        with _lock:
            COMPILES.append({"name": program.name, "kind": kind, "graph_id": model.graph_id, "cache_hit": hit,
                             "recompile": ctx["recompile"], "reason": info["recompile_reason"],
                             "source": ctx["source"], "model": model, "compile_id": ctx["compile_id"]})

        def run(args):
            # dispatch: this call's host time outside the run (dynamo's guards, before it, are PyTorch's)
            t0 = time.perf_counter_ns()
            args = list(args)
            t1 = time.perf_counter_ns()
            outs = model.run(args)
            record_dispatch(model, t1 - t0, "compiled")
            return outs

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
    name = _graph_name(gm)
    with _lock:  # frame ids restart after torch._dynamo.reset(): the name keeps functions apart
        frame = _frames.setdefault((frame_id, name), {"signatures": [], "graphs": {}})
        recompile = bool(frame["signatures"])
        reason = ""
        if recompile:
            # a signature seen before means a non-shape guard failed (grad mode, a Python attribute...)
            seen = sig in frame["signatures"]
            reason = ("" if seen else diff_signatures(frame["signatures"][-1], sig)) or _dynamo_reason() \
                or "guard failure (no input changed shape)"
        frame["signatures"].append(sig)
    ctx = {"frame": frame, "recompile": recompile, "reason": reason, "source": caller_source(),
           "name": name, "flags": parse_flags(options.get("compiler_args")),
           "compile_id": str(cid) if cid is not None else ""}
    return aot_autograd(fw_compiler=_compiler("forward", ctx), bw_compiler=_compiler("backward", ctx),
                        inference_compiler=_compiler("inference", ctx),
                        decompositions=core_aten_decompositions())(gm, example_inputs)


def compile_events() -> list[dict]:
    """Every graph compiled through the backend in this process (name, kind, recompile, reason, source)."""
    with _lock:
        return [dict(c) for c in COMPILES]
