"""Front end: capture a PyTorch model with ``torch.export``, decompose it to core ATen, and turn the
FX graph into the compiler's :class:`~neuron_stack.ir.Program`, keeping every op's user source line
and module path.

Source lines: non-strict ``torch.export`` keeps only frames of functions named ``forward``, so a
helper function in another file would be attributed to its caller (facts file §1.2). While we
export we swap in a frame filter that keeps every frame from the first ``forward`` inward; the
innermost frame outside torch (and outside this package and the standard library) is the op's source.

>>> import torch
>>> m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
>>> prog = capture(m, (torch.randn(2, 4),))
>>> [n.target for n in prog.nodes if n.is_compute]
['aten.permute.default', 'aten.addmm.default', 'aten.relu.default']
"""
from __future__ import annotations

import contextlib
import functools
import json
import linecache
import math
import operator
import os
import re
import sys
import sysconfig
import threading
import traceback
import warnings
import weakref
from typing import Any

import torch
import torch.fx
import torch.fx.proxy as proxy
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from neuron_stack.ir import Node, Program, Source, TensorSpec


class CaptureError(RuntimeError):
    """The model could not be captured; the message says why and what to change."""


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# frames inside torch, the standard library or neuron_stack itself (the package root) are not user code
_SKIP_DIRS = tuple(os.path.realpath(d) + os.sep for d in (
    os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)), sysconfig.get_paths()["stdlib"]))


@functools.lru_cache(maxsize=4096)
def is_user_file(path: str) -> bool:
    """True for a real file outside torch, this package and the standard library (site-packages count).

    Cached: every node's stack names the same few files, and realpath is a syscall per component.
    Example: ``is_user_file("/home/me/train.py")`` -> True.
    """
    if not path or path.startswith("<"):
        return False
    return not os.path.realpath(path).startswith(_SKIP_DIRS)


def user_stack(stack_trace: str | None) -> list[Source]:
    """The frames of ``stack_trace`` (traceback text) that are user code, outermost first.

    Example: ``user_stack('File "/m.py", line 3, in forward')`` -> ``[Source("/m.py", 3, "forward", ...)]``.
    """
    out: list[Source] = []
    for f, line, fn in _FRAME.findall(stack_trace or ""):
        # a generator expression runs in its own frame on its caller's line: one line, one frame
        if is_user_file(f) and not (out and (out[-1].file, out[-1].line) == (os.path.abspath(f), int(line))):
            out.append(_source(f, int(line), fn))
    return out


def user_frame(stack_trace: str | None) -> Source | None:
    """The innermost frame of ``stack_trace`` (traceback text) that is user code, or None.

    Example: ``user_frame('File "/m.py", line 3, in forward')`` -> ``Source("/m.py", 3, "forward", ...)``.
    """
    for f, line, fn in reversed(_FRAME.findall(stack_trace or "")):
        if is_user_file(f):
            return _source(f, int(line), fn)
    return None


def frame_source(f) -> Source:
    """The :class:`Source` of a live frame ``f``. Example: ``frame_source(sys._getframe())``."""
    return _source(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)


@functools.lru_cache(maxsize=4096)
def _source(file: str, line: int, function: str) -> Source:
    # cached: an eager op asks for its line on every call, and a training loop repeats a few lines
    path = os.path.abspath(file)
    return Source(path, line, function, linecache.getline(path, line).strip())


def backward_source() -> Source | None:
    """The user's line that called ``backward()`` (or ``torch.autograd.grad``) now running, or None.

    Autograd runs a device's backward on its own worker thread, whose stack holds no user code: the
    call is found on the thread waiting in autograd's engine (this thread first). With two threads in
    ``backward()`` at once the first found is taken. Example: ``backward_source()`` -> None outside backward.
    """
    frames = sys._current_frames()
    mine = frames.pop(threading.get_ident(), None)
    for f in ([mine] if mine is not None else []) + list(frames.values()):
        while f is not None and f.f_code.co_name != "_engine_run_backward":
            f = f.f_back
        while f is not None and not is_user_file(f.f_code.co_filename):
            f = f.f_back
        if f is not None:
            return frame_source(f)
    return None


@contextlib.contextmanager
def _full_stack_traces():
    """Keep every frame from the first ``forward`` inward while non-strict export records stacks."""
    original = proxy.TracerBase._filter_traceback_frames

    # imported here, not at the top: it pulls in sympy, which loading a NEFF never needs
    from torch.fx.experimental.symbolic_shapes import uninteresting_files

    def keep_all(self, summary):
        skip = uninteresting_files()
        frames = [f for f in summary if f.filename not in skip]
        first = next((i for i, f in enumerate(frames) if f.name == "forward"), None)
        return traceback.StackSummary.from_list(frames[first:] if first is not None else frames)

    proxy.TracerBase._filter_traceback_frames = keep_all
    try:
        yield
    finally:
        proxy.TracerBase._filter_traceback_frames = original


def _module_path(meta: dict) -> tuple[str, str]:
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    # Dynamo spells paths as L['self'].encoder.layer[0]; export as encoder.layer.0
    path = re.sub(r"^L\['[^']*'\]\.?", "", str(path))
    path = re.sub(r"\._modules\['([^']*)'\]", r".\1", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path).lstrip(".")
    cls = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
    return path, cls


def _spec(v: Any) -> TensorSpec | None:
    if isinstance(v, torch.Tensor):
        # Data-dependent (unbacked) sizes such as nonzero's row count are recorded as -1.
        shape = tuple(int(d) if isinstance(d, int) or not _symbolic(d) else -1 for d in v.shape)
        return TensorSpec(shape, str(v.dtype).removeprefix("torch."))
    return None


def _symbolic(d: Any) -> bool:
    try:
        int(d)
        return not isinstance(d, int) and not str(d).lstrip("-").isdigit()
    except Exception:
        return True


def _specs(val: Any) -> list[TensorSpec]:
    if isinstance(val, (tuple, list)):
        return [s for s in (_spec(v) for v in val) if s is not None]
    s = _spec(val)
    return [s] if s is not None else []


def target_name(target: Any) -> str:
    """A stable string for an FX call target: ``aten.addmm.default``, ``getitem``, ``operator.ge``."""
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    mod = getattr(target, "__module__", "") or ""
    mod = "operator" if mod == "_operator" else mod
    return f"{mod}.{getattr(target, '__name__', str(target))}"


def jsonify(a: Any) -> Any:
    """An FX argument as JSON-able data (see :class:`neuron_stack.ir.Node`)."""
    if isinstance(a, torch.fx.Node):
        return {"node": a.name}
    if isinstance(a, (bool, int, float, str)) or a is None:
        return a
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).removeprefix("torch.")}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.layout):
        return {"layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).removeprefix("torch.")}
    if isinstance(a, (list, tuple)):
        return [jsonify(x) for x in a]
    if isinstance(a, dict):
        return {"dict": {str(k): jsonify(v) for k, v in a.items()}}
    if isinstance(a, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise CaptureError(f"symbolic value {a} in the graph: neuron_stack compiles static shapes; "
                           "do not mark dimensions dynamic")
    raise CaptureError(f"cannot compile an argument of type {type(a).__name__}: neuron_stack graphs "
                       "take tensors, numbers, dtypes and lists of them")


def graph_to_program(gm: torch.fx.GraphModule, *, name: str, constants: dict[str, torch.Tensor],
                     input_names: list[str], placeholder_constants: dict[str, str] | None = None,
                     output_names: list[Any] | None = None, backward_source: Source | None = None,
                     call_site: Source | None = None) -> Program:
    """Convert a core-ATen FX graph to a :class:`Program`.

    ``placeholder_constants`` maps placeholder names that are really weights (export's lifted
    parameters) to keys of ``constants``; those become ``get_attr`` nodes. A backward graph passes
    ``backward_source``, the ``backward()`` line that runs it: that becomes every op's source, and the
    forward line autograd recorded for the op (its ``stack_trace``) its ``fwd_source``. ``call_site`` is
    the line of an op whose stack holds no user frame (a compiled ``nn.Sequential`` runs only torch's
    code): the user's call of the compiled function, the line eager execution gives the same op.
    Example: ``graph_to_program(gm, name="g", constants={}, input_names=["x"])``.
    """
    placeholder_constants = placeholder_constants or {}
    nodes: list[Node] = []
    out_struct: Any = None
    vals: dict[str, list[TensorSpec]] = {}
    for n in gm.graph.nodes:
        outs = _specs(n.meta.get("val", n.meta.get("example_value")))
        if n.op == "get_attr" and not outs:
            t = _resolve_attr(gm, n.target)
            outs = _specs(t)
        vals[n.name] = outs
        if n.op == "placeholder":
            if n.name in placeholder_constants:
                nodes.append(Node(n.name, "get_attr", args=[placeholder_constants[n.name]], outputs=outs,
                                  op_class="view"))
            else:
                nodes.append(Node(n.name, "placeholder", outputs=outs, op_class="view"))
            continue
        if n.op == "get_attr":
            key = str(n.target)
            constants.setdefault(key, _resolve_attr(gm, n.target))
            nodes.append(Node(n.name, "get_attr", args=[key], outputs=outs, op_class="view"))
            continue
        if n.op == "output":
            out_struct = jsonify(n.args[0])
            nodes.append(Node(n.name, "output", args=[out_struct], op_class="view"))
            continue
        if n.op != "call_function":
            raise CaptureError(f"unexpected FX node {n.op} {n.target}: neuron_stack compiles core-ATen graphs")
        if isinstance(n.target, torch._ops.HigherOrderOperator):
            raise CaptureError(f"{n.target.name()} (control flow) is not supported: the NeuronCore compiles "
                               "straight-line graphs; move the branch out of the model or use torch.where")
        args = jsonify(list(n.args))
        inputs = [s for a in n.all_input_nodes for s in vals.get(a.name, [])[:1]]
        if target_name(n.target) == "getitem":
            src = vals.get(n.args[0].name, [])
            inputs = src[n.args[1]:n.args[1] + 1] if isinstance(n.args[1], int) else []
        path, cls = _module_path(n.meta)
        stack = user_stack(n.meta.get("stack_trace"))
        src = stack[-1] if stack else call_site
        nodes.append(Node(decomposed_from=_decomposed_from(n), stack=[] if backward_source else stack,
            name=n.name, target=target_name(n.target), args=args, kwargs=jsonify(dict(n.kwargs))["dict"],
            inputs=inputs, outputs=outs, module_path=path, module_type=cls,
            source=backward_source or src, fwd_source=src if backward_source else None))
    return Program(name=name, nodes=nodes, input_names=input_names,
                   output_names=output_names if output_names is not None else out_struct,
                   constants=constants)


def _decomposed_from(n: torch.fx.Node) -> str:
    """The pre-decomposition op this node came from (``from_node`` provenance), if it differs."""
    src = (n.meta.get("from_node") or [None])[0]
    while src is not None and getattr(src, "from_node", None):
        src = src.from_node[0]
    t = str(getattr(src, "target", "") or "")
    return t if t.startswith("aten.") and t != target_name(n.target) else ""


def _resolve_attr(gm: torch.nn.Module, target: str) -> torch.Tensor:
    obj: Any = gm
    for part in str(target).split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, torch.Tensor):
        return obj
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # A graph constant is a real tensor; aot_autograd calls the dynamo backend under its fake mode,
    # which would refuse to detach a real tensor ("convert all Tensors to FakeTensors first").
    with unset_fake_temporarily():
        return obj.detach()


def _sdpa_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """SDPA's CPU kernel as core ATen, written the way a NeuronCore runs attention.

    - the softmax scale is applied to the query (``L`` rows) rather than, as torch's math
      decomposition does, half to the query and half to the transposed keys: in token generation
      that scaled the whole ``S``-long KV cache through a transposing copy every step;
      ``K^T`` goes straight into the matmul, which transposes on the Tensor Engine;
    - scores and softmax are computed in float32 (PSUM accumulates in fp32), the probabilities are
      cast back to the value dtype for the second matmul;
    - GQA key/value heads are repeated to the query heads (``repeat_interleave``, as the kernel does);
    - the output is a contiguous (N, H, L, E) tensor, the layout the kernel (and its meta function)
      returns: torch's decomposition returns (L, N, H, E) memory order, and code that ``.view``s the
      transposed output (GPT-2's attention) then fails to decompose (facts file §4).
    The second result stands in for the kernel's logsumexp, as in torch's decomposition (unused in
    inference).
    """
    torch._check(dropout_p == 0.0, lambda: "attention dropout must be off (model.eval()) to compile")
    n_q, n_kv = query.size(-3), key.size(-3)
    if n_q != n_kv:
        key = key.repeat_interleave(n_q // n_kv, dim=-3)
        value = value.repeat_interleave(n_q // n_kv, dim=-3)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    scores = torch.matmul(query * scale, key.transpose(-2, -1)).float()
    L, S = query.size(-2), key.size(-2)
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        attn_mask = _per_head_mask(attn_mask, scores)
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    probs = torch.softmax(scores, dim=-1)
    if is_causal or attn_mask is not None:   # a fully masked row (a padding query) gives 0, not NaN
        probs = torch.where(torch.isneginf(scores).all(-1, keepdim=True), 0.0, probs)
    out = torch.matmul(probs.to(value.dtype), value)
    return out.contiguous(), probs


def _per_head_mask(mask, scores):
    """A prompt's mask [B, 1, L, S] (one per sequence, shared by the heads) laid out per head when B > 1.

    The scores are one [B x H, L, S] batched matmul, whose tiles index (batch, head) as one dim; a mask
    shared by the heads of each sequence has no stride along that merged dim (stride 0 over heads, real
    over batch), so no tile of it lines up with a score tile and the whole fused attention (the mask
    and softmax on the scores in PSUM, :mod:`neuron_stack.compiler.lower.attention`) gave way to
    [B, H, L, S] fp32 scores passing through HBM once B > 1: a cliff in batch (BERT-base batch 16 took
    1.57x the time per sequence of batch 8). One copy of the boolean mask per head (B·H·L·S bytes,
    a quarter of one fp32 pass over the scores) keeps attention on chip at every batch size. Token
    generation (L < 128 queries, which the fused lowering does not take) keeps the shared mask."""
    if scores.dim() != 4 or mask.dim() != 4:
        return mask
    b, h, L = scores.shape[0], scores.shape[1], scores.shape[2]
    if b == 1 or h == 1 or mask.shape[0] != b or mask.shape[1] != 1 or L < 128:
        return mask     # one sequence, one head, a mask shared by the batch too, or token generation
    return mask.expand(scores.shape).contiguous()


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """``aten.scaled_dot_product_attention`` (what export keeps when a mask is given) as :func:`_sdpa_cpu`."""
    return _sdpa_cpu(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


def decompositions(table=None) -> dict:
    """The decomposition table to core ATen (``torch.export.default_decompositions()`` unless given)
    with attention decomposed by :func:`_sdpa_cpu` and ``aten.rms_norm`` kept whole: one row-wise
    lowering (``compiler/lower/rowwise.py``), as neuronx-cc runs NxDI's fused RmsNorm custom call, instead
    of a pass over HBM per op of its decomposition. Example: ``ep.run_decompositions(decompositions())``.

    >>> torch.ops.aten.rms_norm.default in decompositions()
    False
    """
    table = torch.export.default_decompositions() if table is None else table
    # CompositeImplicit: export keeps it pre-dispatch; run_decompositions splits it only if it is listed
    table.pop(torch.ops.aten.rms_norm.default, None)
    table[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default] = _sdpa_cpu
    table[torch.ops.aten.scaled_dot_product_attention.default] = _sdpa
    return table


def register_model_pytrees(model: Any, all_caches: bool = False) -> None:
    """Register the pytree flatten of a Hugging Face model's cache classes (``DynamicCache``,
    ``StaticCache``...), so a KV cache is captured as what it is: tensor inputs and outputs.

    Uses transformers' own registration (``register_cache_pytrees_for_model``); a no-op for other
    models. ``all_caches=True`` registers every transformers cache class without a model (loading a
    saved NEFF whose input spec names one). Example: ``register_model_pytrees(LlamaForCausalLM(cfg))``.
    """
    if not all_caches and not type(model).__module__.startswith("transformers."):
        return
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:  # an older transformers: caches stay unregistered, export names the class
        return
    # without a model, transformers registers every Cache subclass (and no model-specific class)
    register_cache_pytrees_for_model(object() if all_caches else model)


def export(model: torch.nn.Module, args: tuple, kwargs: dict | None = None):
    """``torch.export`` + ``run_decompositions`` to core ATen, with full user stack traces.

    Returns the decomposed ``ExportedProgram``. Raises :class:`CaptureError` with the export
    failure's first line. Example: ``ep = export(model, (x,))``.
    """
    with _full_stack_traces(), warnings.catch_warnings(), _quiet_torch_logs():
        warnings.simplefilter("ignore", FutureWarning)
        try:
            register_model_pytrees(model)
            ep = torch.export.export(model, args, kwargs or {}, strict=False)
            return ep.run_decompositions(decompositions())
        except CaptureError:
            raise
        except Exception as exc:  # export errors are long; the first line names the construct
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            where = _user_frame(exc)
            if type(exc).__name__ == "GuardOnDataDependentSymNode":
                raise CaptureError(
                    f"torch.export could not capture {type(model).__name__}: {where or 'its forward'} branches "
                    "on a tensor's value (data-dependent control flow, which one compiled graph cannot hold): "
                    "compute both sides and pick with torch.where, use torch.cond, or decide outside the "
                    "model") from exc
            at = f" (at {where})" if where else ""
            raise CaptureError(f"torch.export could not capture {type(model).__name__}{at}: {first}") from exc


@contextlib.contextmanager
def _quiet_torch_logs():
    """torch's own warnings while exporting (symbolic-shape notes, and the partial graph torch prints to
    stderr: two dozen lines before a data-dependent failure) stay out of the one-line error;
    ``NEURON_STACK_DEBUG=1`` keeps them."""
    import io
    import logging

    if os.environ.get("NEURON_STACK_DEBUG"):
        yield
        return
    before = logging.root.manager.disable
    logging.disable(max(before, logging.WARNING))
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(before)


def _user_frame(exc: BaseException) -> str | None:
    """``file:line `code``` of the innermost frame of the user's own code in ``exc``'s traceback."""
    skip = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)),
            sysconfig.get_paths()["stdlib"])
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(skip)
              and not f.filename.startswith("<")]
    if not frames:
        return None
    f = frames[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno} `{(f.line or '').strip()}`"


def capture(model: torch.nn.Module, example_inputs: Any, *, name: str | None = None) -> Program:
    """Export ``model`` on ``example_inputs`` (a tensor, a tuple of args, or a dict of kwargs) to a Program.

    Parameters and buffers become constants (inlined weights, as ``torch_neuronx.trace`` does).
    Example: ``capture(torch.nn.Linear(4, 2), (torch.randn(1, 4),))``.
    """
    if not isinstance(model, torch.nn.Module):
        model = _FunctionModule(model)
    args, kwargs = normalise_inputs(example_inputs)
    was_training = model.training
    ep = export(model, args, kwargs)
    model.train(was_training)
    return from_exported(ep, name or type(model).__name__, decompose=False)


#: id(parameter) -> its detached alias, while the parameter lives (weakref.finalize drops the entry).
_DETACHED: dict[int, torch.Tensor] = {}


def detached(t: torch.Tensor) -> torch.Tensor:
    """``t.detach()``, the same object for the same tensor on every capture in this process.

    A stable object lets the compiler remember its weight digest (``compiler.driver.tensor_digest``):
    a warm compile does not re-hash the model's weights.

    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> detached(w) is detached(w), detached(w).requires_grad
    (True, False)
    """
    if not t.requires_grad:
        return t
    d = _DETACHED.get(id(t))
    if d is None or d.data_ptr() != t.data_ptr():   # ``p.data = ...`` gives the parameter new storage
        if id(t) not in _DETACHED:
            weakref.finalize(t, _DETACHED.pop, id(t), None)
        d = _DETACHED[id(t)] = t.detach()
    return d


def from_exported(ep, name: str, decompose: bool = True) -> Program:
    """A Program from an ``ExportedProgram`` (decomposed to core ATen here if it is not yet).

    Example: ``from_exported(torch.export.load("model.pt2"), "model")``.
    """
    if decompose:
        with _full_stack_traces():
            ep = ep.run_decompositions(decompositions())
    sig = ep.graph_signature
    constants: dict[str, torch.Tensor] = {}
    placeholder_constants: dict[str, str] = {}
    input_names: list[str] = []
    for spec in sig.input_specs:
        pname = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            input_names.append(pname)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            t = ep.state_dict.get(spec.target) if spec.kind != InputKind.CONSTANT_TENSOR else None
            if t is None:
                t = ep.constants[spec.target]
            constants[pname] = detached(t)
            placeholder_constants[pname] = pname
        else:
            raise CaptureError(f"unsupported graph input kind {spec.kind.name}: neuron_stack takes tensors")
    user_outputs = [{"node": s.arg.name} if hasattr(s.arg, "name") else s.arg.value
                    for s in sig.output_specs if s.kind == OutputKind.USER_OUTPUT]
    # In-place updates of inputs (a static KV cache written at cache_position) come back as leading
    # outputs; NeuronModule copies them into the caller's tensors, as the model would have.
    mutations = [s for s in sig.output_specs if s.kind == OutputKind.USER_INPUT_MUTATION]
    mutated_inputs = [input_names.index(s.target) for s in mutations]
    user_outputs = [{"node": s.arg.name} for s in mutations] + user_outputs
    prog = graph_to_program(ep.graph_module, name=name, constants=constants,
                            input_names=input_names, placeholder_constants=placeholder_constants,
                            output_names=user_outputs)
    # The in/out pytree specs let NeuronModule accept and return the same structures as the model.
    prog.in_spec = ep.call_spec.in_spec
    prog.out_spec = ep.call_spec.out_spec
    try:
        prog.io_specs = {"in": pytree.treespec_dumps(ep.call_spec.in_spec),
                         "out": pytree.treespec_dumps(ep.call_spec.out_spec)}
    except Exception:  # custom pytree nodes without a serialized name: outputs load back as a tuple
        prog.io_specs = {}
    if mutated_inputs:
        prog.io_specs["mutated_inputs"] = json.dumps(mutated_inputs)
    return prog


class _FunctionModule(torch.nn.Module):
    """Lets ``trace`` accept a plain function, as ``torch_neuronx.trace`` does."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def normalise_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    """``example_inputs`` as ``(args, kwargs)``: a tensor -> ``((t,), {})``, a dict -> kwargs."""
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


def sources_in(program: Program) -> list[Source]:
    """Distinct sources of a program's nodes (their lines and their callers'), in first-use order."""
    seen: dict[tuple[str, int], Source] = {}
    for n in program.nodes:
        for s in [*n.stack, n.source]:
            if s is not None:
                seen.setdefault((s.file, s.line), s)
    return list(seen.values())


def file_texts(files: list[str]) -> dict[str, str]:
    """The text of each readable user file (the NEFF embeds them so profiles are self-contained)."""
    out = {}
    for f in dict.fromkeys(files):
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                out[f] = fh.read()
        except OSError:
            continue
    return out


__all__ = ["capture", "export", "graph_to_program", "user_frame", "is_user_file", "target_name", "jsonify",
           "CaptureError", "normalise_inputs", "sources_in", "file_texts"]
