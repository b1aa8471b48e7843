"""Eager execution on the simulated NeuronCore: one op at a time, each compiled once into a small NEFF.

An ATen op on ``neuron`` tensors is, by kind:

- a view or metadata op (``view``, ``t``, ``detach``, ``expand``...): done on the value itself, no device work;
- a transfer (``.to("neuron")``, ``.cpu()``, ``.item()``, printing, ``copy_`` across host and device): the
  copy, charged PCIe time on the projected clock and recorded as every runtime transfer is (a ``host_transfer``
  event; ``nrt_tensor_write`` / ``nrt_tensor_read`` in the system profile);
- a random op (``normal_``, ``uniform_``...): drawn from the CPU generator, so ``torch.manual_seed`` gives
  the same numbers as on the CPU;
- anything else: a one-op FX graph, compiled by the same compiler (persistent cache, source line) into a
  NEFF, loaded once per signature (op, shapes, strides, dtypes, scalar arguments, call site, core) and run
  by the same runtime, so it is timed, recorded and shown like a compiled graph. An op the compiler
  cannot place on the device runs as the NEFF's CPU island (``cpu_fallback``, the user's line); one it
  cannot capture at all runs on the host and is counted the same way.

In-place ops run their functional form and copy the result back. Under tracing (dynamo, aot_autograd)
the values are fake tensors and every op simply runs on them: the compiled graph is one over the values.

>>> import torch, neuron_stack.eager as eager
>>> eager.register()
>>> x = torch.tensor([-1.0, 2.0]).to("neuron")
>>> torch.relu(x).cpu().tolist()
[0.0, 2.0]
>>> stats()["compiled_ops"] >= 1
True
"""
from __future__ import annotations

import math
import operator
import os
import threading
import time

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from neuron_stack.compiler.cache import compile_cached
from neuron_stack.compiler.driver import compile_program, graph_hash
from neuron_stack.compiler.fallbacks import warn_fallbacks, warn_host_op
from neuron_stack.device import clock
from neuron_stack.device.cost import pcie_ns
from neuron_stack.eager import provenance
from neuron_stack.eager.memory import MEMORY, _state, core_of, session, where
from neuron_stack.frontend.export import graph_to_program
from neuron_stack.frontend.flags import parse_flags
from neuron_stack.runtime.model import LoadedModel
from neuron_stack.runtime.recorder import record_dispatch, record_transfer

aten = torch.ops.aten
_HOST = object()          # cache marker: this signature runs on the host
_REAL = (torch.Tensor, torch.nn.Parameter)
_lock = threading.RLock()
_models: dict[tuple, object] = {}
_devices: dict[int, torch.device] = {}   # neuron:i, made once: every result's wrapper names its device
_warned: set[tuple] = set()   # (op, call site) of host ops already warned about
_stats = {"compiled_ops": 0, "executions": 0, "host_ops": 0, "transfers": 0, "transfer_bytes": 0,
          "transfer_ns": 0, "device_ns": 0, "dispatch_ns": 0}


class NeuronTensor(torch.Tensor):
    """A tensor on a simulated NeuronCore. ``elem`` holds its value (a CPU tensor standing for HBM)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int = 0):
        device = _devices.get(index) or _devices.setdefault(index, torch.device("neuron", index))
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=device, requires_grad=elem.requires_grad)

    def __init__(self, elem: torch.Tensor, index: int = 0):
        self.elem = elem
        MEMORY.track(self, index)

    def __repr__(self, *, tensor_contents=None) -> str:
        if type(self.elem) is torch.Tensor:     # printing reads the values to the host (not while tracing)
            _transfer(self, "to_host", self.device.index or 0)
        body = repr(self.elem).removeprefix("tensor(").rstrip(")")
        return f"tensor({body}, device='{self.device}')"

    # traceable wrapper subclass: dynamo and aot_autograd trace through it to graphs on ``elem``
    def __tensor_flatten__(self):
        return ["elem"], self.device.index or 0

    @staticmethod
    def __tensor_unflatten__(inner, index, outer_size, outer_stride):
        return NeuronTensor(inner["elem"], index)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return dispatch(func, args, kwargs or {})


def stats() -> dict:
    """Counters of this process's eager execution: compiled ops, executions, host ops, transfers and their
    PCIe bytes and time, simulated device time, and the host's dispatch time around the executions (ns).

    >>> sorted(stats())[:3]
    ['compiled_ops', 'device_ns', 'dispatch_ns']
    """
    with _lock:
        return dict(_stats)


def _unwrap(flat: list) -> tuple[int, list, bool]:
    """The device index of the first neuron tensor among ``flat`` (else the current one), the values (a
    neuron tensor's is its ``elem``), and whether one is being traced (fake or functional; a CPU Parameter,
    as ``Module.to`` copies it, is a real value). One loop: this runs for every op."""
    index, inner, traced = None, [], False
    for x in flat:
        if isinstance(x, NeuronTensor):
            if index is None:
                index = x.device.index or 0
            x = x.elem
        if isinstance(x, torch.Tensor) and type(x) not in _REAL:
            traced = True
        inner.append(x)
    return (_state["index"] if index is None else index), inner, traced


def _on_host(kwargs: dict) -> dict:
    """Device kwargs name the host: the value of a neuron tensor is a CPU tensor."""
    d = kwargs.get("device")
    if d is not None and torch.device(d).type == "neuron":
        kwargs = dict(kwargs, device=torch.device("cpu"))
    return kwargs


def _flatten(x, leaves: list):
    """Append the leaves of ``x`` (exact tuples, lists and dicts are containers) to ``leaves``; return its
    structure, hashable. torch's pytree does the same at ~10 us a call, paid several times per op.

    >>> leaves = []; _flatten(([1, 2], {"k": 3}), leaves), leaves
    ((<class 'tuple'>, ((<class 'list'>, (None, None)), (<class 'dict'>, ('k',), (None,)))), [1, 2, 3])
    """
    t = type(x)
    if t is tuple or t is list:
        return t, tuple([_flatten(v, leaves) for v in x])
    if t is dict:
        return dict, tuple(x), tuple([_flatten(v, leaves) for v in x.values()])
    leaves.append(x)
    return None


def _unflatten(spec, it):
    """The inverse of :func:`_flatten`: ``spec`` rebuilt with leaves from the iterator ``it``.

    >>> leaves = []; _unflatten(_flatten(((1, [2]), {"k": 3}), leaves), iter(leaves))
    ((1, [2]), {'k': 3})
    """
    if spec is None:
        return next(it)
    if spec[0] is dict:
        return dict(zip(spec[1], [_unflatten(s, it) for s in spec[2]]))
    return spec[0]([_unflatten(s, it) for s in spec[1]])


_VALUE, _TO_HOST_OP, _MUTABLE, _COMPUTE = range(4)
_kinds: dict = {}


def _kind(func) -> int:
    """What dispatch does with ``func`` (its schema and tags read once per op, not per call)."""
    kind = _kinds.get(func)
    if kind is None:
        kind = _kinds[func] = (
            _VALUE if func.is_view or func in _METADATA or torch.Tag.nondeterministic_seeded in func.tags
            else _TO_HOST_OP if func in _TO_HOST else _MUTABLE if func._schema.is_mutable else _COMPUTE)
    return kind


def dispatch(func, args: tuple, kwargs: dict):
    """Run one ATen op with ``neuron`` tensor arguments (called from ``__torch_dispatch__``)."""
    flat: list = []
    spec = _flatten((args, kwargs), flat)
    index, inner, traced = _unwrap(flat)
    if traced:
        a, k = _unflatten(spec, iter(inner))
        return _rewrap(func(*a, **_on_host(k)), inner, flat, index)
    provenance.enter()
    if func is aten._to_copy.default and torch.device(kwargs.get("device") or "neuron").type == "cpu":
        return _transfer(func(inner[0], **kwargs), "to_host", index)
    if func is aten.copy_.default:
        dst, src = args[0], args[1]
        if isinstance(dst, NeuronTensor) != isinstance(src, NeuronTensor):
            direction = "to_device" if isinstance(dst, NeuronTensor) else "to_host"
            (dst.elem if isinstance(dst, NeuronTensor) else dst).copy_(
                src.elem if isinstance(src, NeuronTensor) else src, *args[2:])
            _transfer(src, direction, index)
            return dst
    a, k = _unflatten(spec, iter(inner))
    k2 = _on_host(k)
    # the leaves and structure of (a, k), reused by the cache key unless a device kwarg now names the host
    known = (inner, spec) if k2 is k else None
    k = k2
    kind = _kind(func)
    if kind == _VALUE or not any(isinstance(x, torch.Tensor) for x in inner):
        return _rewrap(func(*a, **k), inner, flat, index)
    if kind == _TO_HOST_OP:        # .item(), bool(): the value crosses to the host
        _transfer(inner[0], "to_host", index)
        return func(*a, **k)
    if kind == _MUTABLE:
        return _mutate(func, args, a, k, inner, flat, index, known)
    return _rewrap(_execute(func, a, k, index, known), inner, flat, index)


def _mutate(func, args, a, k, inner, flat, index, known=None):
    """An in-place op: its functional form computed on the device, written back into ``self``."""
    schema = func._schema
    packet = getattr(aten, schema.name.split("::")[1].rstrip("_"), None)
    functional = getattr(packet, func._overloadname, None) if packet is not None else None
    first = schema.arguments[0]
    if functional is None or first.alias_info is None or not first.alias_info.is_write \
            or any(x.alias_info is not None and x.alias_info.is_write for x in schema.arguments[1:]):
        # out= variants and the like
        return _rewrap(_host_op(func, a, k, index, "an in-place op without a functional form"), inner, flat, index)
    out = _execute(functional, a, k, index, known)     # the functional form takes the same arguments
    targets = a[0] if isinstance(a[0], (list, tuple)) else [a[0]]
    results = out if isinstance(out, (list, tuple)) else [out]
    for t, r in zip(targets, results):
        t.copy_(r)
    return args[0]


def _rewrap(out, inner, flat, index):
    """Results back as device tensors; a result that *is* an input value is that input's wrapper."""
    if isinstance(out, (list, tuple)):
        return type(out)(_rewrap(o, inner, flat, index) for o in out)
    if not isinstance(out, torch.Tensor) or isinstance(out, NeuronTensor):
        return out
    for i, x in zip(flat, inner):
        if x is out and isinstance(i, NeuronTensor):
            return i
    return NeuronTensor(out, index)


def _transfer(t: torch.Tensor, direction: str, index: int):
    """Charge one host<->device copy of ``t`` (``direction`` ``to_device`` or ``to_host``): PCIe time on the
    projected clock, recorded as the runtime records every transfer (``record_transfer``)."""
    s, core = core_of(index)
    s.poll_capture()        # a torch.profiler window whose first step starts with a copy records it
    nbytes = t.numel() * t.element_size()
    ns = pcie_ns(s.profile, nbytes)
    start = clock.now_ns()
    clock.advance(0, ns)
    with _lock:
        _stats["transfers"] += 1
        _stats["transfer_bytes"] += nbytes
        _stats["transfer_ns"] += ns
    rec = s.recorder
    if rec is not None:
        with s.record_lock:
            if s.recorder is rec:
                src = where()
                # an eager copy names no NEFF tensor: "_unknown_", as the real runtime writes it
                record_transfer(rec, s.profile, start, core, direction, nbytes, "_unknown_",
                                source=f"{src.file}:{src.line}" if src else None, shape=list(t.shape), mode="eager")
    return t.elem if isinstance(t, NeuronTensor) else t


def _meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


# Ops whose value scalar is typed ``Scalar`` (no Tensor overload takes it): the one-op graph is this
# decomposition, rounding as CPU eager's kernel does (PointwiseOpsKernel: addcdiv is ``self + v * t1 / t2``;
# addcmul ``fma(v * t1, t2, self)``; add with alpha ``fma(other, alpha, self)``), so a lifted scalar gives
# the same bits: ``addcmul`` with ``value=1`` is that fused multiply-add (``1 * x`` is exact).
_SCALAR_ARG = {aten.addcdiv.default: "value", aten.addcmul.default: "value", aten.add.Tensor: "alpha",
               aten.sub.Tensor: "alpha", aten.lerp.Scalar: "weight"}
_DECOMPOSED = {
    aten.addcdiv.default: lambda x, t1, t2, v: aten.add.Tensor(x, aten.div.Tensor(aten.mul.Tensor(v, t1), t2)),
    aten.addcmul.default: lambda x, t1, t2, v: aten.addcmul.default(x, aten.mul.Tensor(v, t1), t2),
    aten.add.Tensor: lambda x, y, alpha: aten.addcmul.default(x, y, alpha),
    aten.sub.Tensor: lambda x, y, alpha: aten.addcmul.default(x, y, aten.neg.default(alpha)),
    aten.lerp.Scalar: lambda x, end, weight: aten.lerp.Tensor(x, end, weight)}
_LIFTABLE = (torch.float32, torch.float64)


def _lift(func, a: tuple, k: dict) -> tuple[tuple, dict]:
    """``(a, k)`` with the op's value scalars as 0-d tensors: inputs of its NEFF, not constants baked into it.

    A float in a ``Tensor`` argument (``x * 0.9``, ``x / bias_correction``) or the ``Scalar`` of a
    :data:`_SCALAR_ARG` op (``addcdiv``'s ``value``, ``add``'s ``alpha``) only flows into arithmetic, so an
    optimizer step whose step size changes runs the NEFF compiled at step 1, as a real kernel takes its scalars
    as arguments. Only when every tensor is fp32 (or every one fp64): the scalar as a tensor of that dtype
    rounds as CPU eager rounds it. Dims, sizes, booleans, ints and exponents stay in the signature.

    >>> _lift(aten.mul.Tensor, (torch.ones(2), 0.5), {})[0][1]
    tensor(0.5000)
    >>> _lift(aten.pow.Tensor_Scalar, (torch.ones(2), 2.0), {})[0][1]
    2.0
    """
    slots = _lift_slots(func)
    n = len(a)
    if not any(type(a[i] if i < n else k.get(name)) is float for i, name in slots):
        return a, k           # the common case: nothing to lift, answered without looking at dtypes
    leaves: list = []
    _flatten((a, k), leaves)
    dtypes = {x.dtype for x in leaves if isinstance(x, torch.Tensor)}
    if len(dtypes) != 1 or (dt := dtypes.pop()) not in _LIFTABLE:
        return a, k
    a = list(a)
    for i, name in slots:
        v = a[i] if i < n else k.get(name)
        if type(v) is float:
            t = _scalar(v, dt)
            if i < n:
                a[i] = t
            else:
                k = dict(k, **{name: t})
    return tuple(a), k


_scalars: dict = {}


def _scalar(v: float, dt: torch.dtype) -> torch.Tensor:
    """``v`` as a 0-d tensor of ``dt``, made once per value (an optimizer's step size, every step): a NEFF
    input only read, never written or handed back (:func:`_execute` clones an output that shares one).

    >>> _scalar(-0.0, torch.float32).item(), _scalar(0.0, torch.float32).item()
    (-0.0, 0.0)
    """
    key = (v, math.copysign(1.0, v), dt)      # -0.0 == 0.0, but they are different inputs
    t = _scalars.get(key)
    if t is None:
        if len(_scalars) >= 4096:              # an ever-changing scalar (a schedule) does not grow this
            _scalars.clear()
        t = _scalars[key] = torch.tensor(v, dtype=dt)
    return t


_slots: dict = {}


def _lift_slots(func) -> tuple:
    """(position, name) of the arguments of ``func`` a float may be lifted from: its :data:`_SCALAR_ARG`
    and its ``Tensor`` arguments (read from the schema once per op)."""
    slots = _slots.get(func)
    if slots is None:
        named = _SCALAR_ARG.get(func)
        slots = _slots[func] = tuple((i, arg.name) for i, arg in enumerate(func._schema.arguments)
                                     if arg.name == named or isinstance(arg.type, torch.TensorType))
    return slots


def _scalar_arg(func, a: tuple, k: dict):
    """The lifted ``Scalar`` argument of a :data:`_SCALAR_ARG` op (a 0-d tensor), else None."""
    named = _SCALAR_ARG.get(func)
    if named is None:
        return None
    i = next(i for i, x in enumerate(func._schema.arguments) if x.name == named)
    v = a[i] if i < len(a) else k.get(named)
    return v if isinstance(v, torch.Tensor) else None


def _signature(func, flat: list, spec, site, core) -> tuple:
    """The cache key of one op call: what its NEFF depends on (``flat``, ``spec``: its arguments flattened)."""
    leaves = tuple([(x.shape, x.stride(), x.dtype) if isinstance(x, torch.Tensor) else repr(x) for x in flat])
    return (func, leaves, spec, site.key(), core)


def _execute(func, a: tuple, k: dict, index: int, known: tuple | None = None):
    """Run ``func`` through its cached one-op NEFF (compiling it on first use) and return its results
    (``known``: the leaves and structure of ``(a, k)`` when the caller has them already)."""
    t0 = time.perf_counter_ns()
    s, core = core_of(index)
    site = provenance.site()
    la, lk = _lift(func, a, k)
    if known is not None and la is a and lk is k:
        flat, spec = known
    else:
        flat = []
        spec = _flatten((la, lk), flat)
    key = _signature(func, flat, spec, site, core)
    model = _models.get(key)        # one dict read: atomic, no lock
    if model is None:
        model = _compile(func, la, lk, site, core, key)
        t0 = time.perf_counter_ns()        # dispatch time is what every call pays, not the first compile
    if model is _HOST:
        return _host_op(func, a, k, index, None, site.source)
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    r0 = time.perf_counter_ns()
    outs = model.run(tensors)
    r1 = time.perf_counter_ns()
    ptrs = {x.untyped_storage().data_ptr() for x in tensors}
    # a device op writes a new buffer: never hand back storage an input owns
    outs = [o.clone() if o.untyped_storage().data_ptr() in ptrs else o for o in outs]
    host_ns = (time.perf_counter_ns() - t0) - (r1 - r0)
    with _lock:
        _stats["executions"] += 1
        _stats["device_ns"] += model.static_device_ns
        _stats["dispatch_ns"] += host_ns
    record_dispatch(model, host_ns, "eager")
    return outs[0] if model.out_spec.is_leaf() else tree_unflatten(outs, model.out_spec)


def _compile(func, a, k, site, core, key):
    """Compile ``func`` on these argument signatures into a NEFF and load it on ``core`` (or mark it host)."""
    t0 = time.perf_counter_ns()
    src = site.source
    flat, spec = tree_flatten((a, k))
    try:
        gm, phs, val = (_decomposed_graph if _scalar_arg(func, a, k) is not None else _graph)(func, flat, spec)
        # as a compiled graph's nodes: the (forward) line autograd records and the module stack
        line = site.fwd_source if site.backward else src
        for node in (n for n in gm.graph.nodes if n.op == "call_function"):
            if line is not None:
                node.meta["stack_trace"] = f'File "{line.file}", line {line.line}, in {line.function}\n'
            if site.module_path:
                node.meta["nn_module_stack"] = {"m": (site.module_path, site.module_type)}
        out_spec = tree_flatten(val)[1]
        name = "eager_" + str(func).removeprefix("aten.").replace(".", "_")
        program = graph_to_program(gm, name=name, constants={}, input_names=phs,
                                   backward_source=src if site.backward else None)
        flags = parse_flags(target=session().target)
        ghash = graph_hash(program)
        neff, hit, entry = compile_cached(ghash, flags, lambda: compile_program(program, flags,
                                                                                 graph_hash_value=ghash),
                                          constants=program.constants)
        model = LoadedModel(neff, {"kind": "eager", "cache_hit": hit, "cache_path": str(entry or ""),
                                   "compile_wall_ns": time.perf_counter_ns() - t0, "source": src}, core=core)
        model.out_spec = out_spec
        with _lock:
            _stats["compiled_ops"] += 1
    except Exception as exc:   # no meta kernel, a capture the compiler refuses: the host runs it
        model = _HOST
        reason = (f"not compiled ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})"
                  if str(exc) else f"not compiled ({type(exc).__name__})")
        _count_fallback(str(func), reason, src)
        warn_host_op(str(func), reason, src)
    with _lock:
        _models[key] = model
    if model is not _HOST:   # compiled once per signature, so warned once; after the try: a warning filter
        warn_fallbacks(model.neff, src)     # set to "error" raises here, not into the host fallback
    return model


def _graph(func, flat: list, spec):
    """The one-op FX graph of ``func`` on these argument leaves: (graph module, input names, result meta)."""
    g = torch.fx.Graph()
    leaves, phs = [], []
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor):
            ph = g.placeholder(f"arg{i}")
            ph.meta["val"] = _meta(x)
            phs.append(ph.name)
            leaves.append(ph)
        else:
            leaves.append(x)
    na, nk = tree_unflatten(leaves, spec)
    ma, mk = tree_unflatten([_meta(x) for x in flat], spec)
    val = func(*ma, **mk)
    node = g.call_function(func, tuple(na), dict(nk))
    node.meta["val"] = val
    vals = tree_flatten(val)[0]
    if not vals or not all(isinstance(v, torch.Tensor) for v in vals):
        raise TypeError("results that are not tensors")
    if isinstance(val, torch.Tensor):
        outs = [node]
    else:
        outs = []
        for i, v in enumerate(vals):
            item = g.call_function(operator.getitem, (node, i))
            item.meta["val"] = v
            outs.append(item)
    g.output(tuple(outs))
    return torch.fx.GraphModule(torch.nn.Module(), g), phs, val


def _decomposed_graph(func, flat: list, spec):
    """As :func:`_graph` for an op whose ``Scalar`` argument was lifted: the graph of its decomposition."""
    metas = [_meta(x) for x in flat if isinstance(x, torch.Tensor)]

    def op(*tensors):
        it = iter(tensors)
        a, k = tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in flat], spec)
        bound = dict(zip((x.name for x in func._schema.arguments), a), **k)
        return (_DECOMPOSED[func](*(bound[x.name] for x in func._schema.arguments if x.name in bound)),)

    gm = make_fx(op)(*metas)
    phs = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return gm, phs, op(*metas)[0]


def _count_fallback(op: str, reason: str, src) -> None:
    s = session()
    place = f"{os.path.basename(src.file)}:{src.line}" if src else ""
    s.live.count_event("cpu_fallback", reason=reason, source=place, op=op)
    rec = s.recorder
    if rec is not None:
        with s.record_lock:
            if s.recorder is rec:
                rec.event("cpu_fallback", op=op, reason=reason, source=f"{src.file}:{src.line}" if src else "",
                          mode="eager")


def _host_op(func, a, k, index, reason, src=None):
    """An op that runs on the host: its inputs cross PCIe down and its results back up."""
    src = src or where()
    if reason is not None:
        _count_fallback(str(func), reason, src)
        key = (func, (src.file, src.line) if src else None)
        with _lock:
            first = key not in _warned
            _warned.add(key)
        if first:                          # counted every run, warned once per op and line
            warn_host_op(str(func), reason, src)
    tensors = [x for x in tree_flatten((a, k))[0] if isinstance(x, torch.Tensor)]
    for t in tensors:
        _transfer(t, "to_host", index)
    out = func(*a, **k)
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            _transfer(t, "to_device", index)
    with _lock:
        _stats["host_ops"] += 1
    return out


_METADATA = {aten.detach.default, aten.alias.default, aten.lift_fresh.default, aten.set_.source_Tensor,
             aten.resize_.default, aten.empty_like.default, aten.new_empty.default,
             aten.new_empty_strided.default, aten.empty_strided.default, aten.empty.memory_format}
_TO_HOST = {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default}
