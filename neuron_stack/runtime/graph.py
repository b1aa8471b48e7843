"""Executable graphs: each partition of a NEFF's program becomes a :class:`PartitionFn`, one generated
straight-line Python function built once at load, with constant folding and ``--auto-cast``
rounding; a CPU island's function also measures each op (``run_timed``).

The code is generated here rather than through ``torch.fx``: building a BERT-base GraphModule took
0.2-0.3 s of a 0.5 s load (issue 20), this takes a few milliseconds. Nothing of the NEFF is pasted
into the source: values are ``a<i>``/``v<i>``, ops ``f<i>`` and literals ``k<i>`` name objects in
the function's globals, so a crafted NEFF cannot inject code.

>>> from neuron_stack.ir import Node, Partition, Program, TensorSpec
>>> t = TensorSpec((2,), "float32")
>>> prog = Program("g", [Node("x", "placeholder", outputs=[t]),
...     Node("r", "aten.relu.default", [{"node": "x"}], inputs=[t], outputs=[t], partition=0)], ["x"], [{"node": "r"}])
>>> gm = build_graph_module(prog, Partition(0, "device", ("r",), ("x",), ("r",)))
>>> gm(torch.tensor([-1.0, 2.0]))
(tensor([0., 2.]),)
"""
from __future__ import annotations

import builtins
import functools
import keyword
import math
import operator
import re
import time
from typing import Any

import torch

from neuron_stack.ir import Partition, Program
from neuron_stack.runtime.errors import NeuronRuntimeError


@functools.cache
def resolve_target(name: str):
    """The callable of a Program node target: ``aten.addmm.default`` -> ``torch.ops.aten.addmm.default``."""
    if name == "getitem":
        return operator.getitem
    mod, _, attr = name.rpartition(".")
    if mod in ("operator", "_operator"):
        return getattr(operator, attr)
    if mod in ("math", "builtins"):
        return getattr(math if mod == "math" else builtins, attr)
    parts = name.split(".")
    if len(parts) >= 2 and hasattr(torch.ops, parts[0]):
        obj: Any = torch.ops
        for p in parts:
            obj = getattr(obj, p)
        return obj
    if mod.startswith("torch"):
        obj = torch
        for p in mod.split(".")[1:] + [attr]:
            obj = getattr(obj, p)
        return obj
    raise NeuronRuntimeError(f"unknown op {name!r} in the NEFF: recompile it with this neuron_stack")


def node_callable(n):
    """The callable computing node ``n``: its target's, or for an NKI kernel op whose kernel this process
    never registered (a saved NEFF run in a fresh process) the kernel's recorded instructions."""
    try:
        return resolve_target(n.target)
    except (AttributeError, RuntimeError):
        if n.kernel is None:
            raise
        return functools.partial(recorded_kernel, n.kernel)


def recorded_kernel(kernel: dict, *tensors: torch.Tensor):
    """Run an NKI kernel's recorded instructions (``Node.kernel``: HBM tensor metas, input and output
    names, NaN fills, instructions) in the ISA interpreter on ``tensors``; its outputs as tensors.

    >>> k = {"inputs": ["a"], "outputs": ["o"], "inits": [], "hbm": {"a": {"shape": [2], "dtype": "float32"},
    ...      "o": {"shape": [2], "dtype": "float32"}},
    ...      "instrs": [["DMA_DIRECT2D", {"dst": [{"m": "hbm", "b": "o", "dt": "float32", "o": 0, "ap": [[1, 2]]}],
    ...                                   "src": [{"m": "hbm", "b": "a", "dt": "float32", "o": 0, "ap": [[1, 2]]}]}]]}
    >>> recorded_kernel(k, torch.tensor([1.0, 2.0]))
    tensor([1., 2.])
    """
    import numpy as np

    from neuron_stack.isa.interp import Machine
    from neuron_stack.isa.memory import contiguous_strides
    m = Machine()
    for name, t in zip(kernel["inputs"], tensors):
        t = t.detach().cpu()
        m.mem.fill_buffer(name, kernel["hbm"][name], (t.float() if t.is_floating_point() else t).numpy())
    inits = kernel["inits"]
    j = 0
    for i, (opcode, operands) in enumerate(kernel["instrs"]):
        while j < len(inits) and inits[j][0] <= i:
            m.mem.view(inits[j][1])[...] = inits[j][2]
            j += 1
        m.step(opcode, operands)
    outs = []
    for name in kernel["outputs"]:
        meta = kernel["hbm"][name]
        op = {"m": "hbm", "b": name, "dt": meta["dtype"], "o": 0,
              "ap": [[s, n] for s, n in zip(contiguous_strides(meta["shape"]), meta["shape"])]}
        value = np.ascontiguousarray(m.mem.read(op).reshape(meta["shape"]))
        outs.append(torch.from_numpy(value).to(getattr(torch, meta["dtype"])))
    return outs[0] if len(outs) == 1 else tuple(outs)


def from_json(a: Any, env: dict) -> Any:
    """A node argument (JSON form, see :class:`neuron_stack.ir.Node`) with references looked up in ``env``.

    >>> from_json([{"node": "x"}, {"dtype": "float32"}, 2], {"x": "X"})
    ['X', torch.float32, 2]
    """
    if isinstance(a, list):
        return [from_json(x, env) for x in a]
    if isinstance(a, dict):
        if "node" in a and len(a) == 1:
            return env[a["node"]]
        if "dtype" in a and len(a) == 1:
            return getattr(torch, a["dtype"])
        if "device" in a and len(a) == 1:
            return torch.device(a["device"])
        if "layout" in a and len(a) == 1:
            return getattr(torch, a["layout"])
        if "memory_format" in a and len(a) == 1:
            return getattr(torch, a["memory_format"])
        if "dict" in a and len(a) == 1:
            return {k: from_json(v, env) for k, v in a["dict"].items()}
    return a


_CAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: The TensorE operands of matmul-class ops (argument positions), the only inputs ``--auto-cast
#: matmult`` rounds: bias and epilogue inputs stay fp32, as in the ISA lowering. Ops not listed
#: (mm, bmm, dot, attention...) have only operands.
MATMUL_OPERANDS = {"aten.addmm": (1, 2), "aten.baddbmm": (1, 2), "aten.addmv": (1, 2),
                   "aten.convolution": (0, 1), "aten.convolution_backward": (0, 1, 2)}


def round_to(x, dtype):
    """Round an fp32 tensor to ``dtype`` precision, keeping fp32 storage.

    This is --auto-cast: a bf16 matmul with fp32 (PSUM) accumulation equals an fp32 matmul of
    bf16-rounded inputs, because every bf16 x bf16 product is exact in fp32.

    >>> round_to(torch.tensor([1.0 + 2**-10]), torch.bfloat16)
    tensor([1.])
    """
    if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
        return x.to(dtype).to(torch.float32)
    return x


#: Deterministic ops without tensor inputs: a device graph computes them once, at load.
FOLDABLE_SOURCES = frozenset({"aten.arange", "aten.full", "aten.zeros", "aten.ones", "aten.scalar_tensor",
                              "aten.eye", "aten.linspace"})
_NEVER_FOLD = ("rand", "dropout", "bernoulli", "multinomial", "normal", "uniform", "exponential", "poisson", "empty")


def _foldable(n, values: dict) -> bool:
    """True if ``n`` depends on weights only (``permute(weight)``, ``arange``) and is deterministic."""
    deps = _known_refs([n.args, n.kwargs], values)
    if deps < 0:               # reads an activation: the common case, answered first
        return False
    never, source = _op_kind(n.target)
    return not never and (deps > 0 or source)


@functools.cache
def _op_kind(target: str) -> tuple[bool, bool]:
    """(never folded: in-place or random, a foldable source without inputs) of an op target."""
    packet = target.rsplit(".", 1)[0]
    op = packet.rsplit(".", 1)[-1]
    return op.endswith("_") or any(w in op for w in _NEVER_FOLD), packet in FOLDABLE_SOURCES


def _known_refs(a: Any, values: dict) -> int:
    """-1 if the argument structure ``a`` references a node not in ``values``, else how many it references.

    >>> _known_refs([{"node": "w"}, 2], {"w": 1}), _known_refs([{"node": "x"}], {})
    (1, -1)
    """
    if isinstance(a, list):
        total = 0
        for x in a:
            k = _known_refs(x, values)
            if k < 0:
                return -1
            total += k
        return total
    if isinstance(a, dict):
        if "node" in a and len(a) == 1:
            return 1 if a["node"] in values else -1
        return _known_refs(list(a.values()), values)
    return 0


class PartitionFn:
    """One partition as a Python function: ``fn(*inputs)`` returns its outputs; ``run_timed(*inputs)``
    returns ``(outputs, [(node name, host ns), ...])`` (CPU islands: each op is measured).
    ``code`` is the generated source, for reading. Example: ``build_graph_module(prog, part)(x)``."""

    def __init__(self, code: str, timed_code: str, namespace: dict):
        self.code = code
        self.forward = _compile(code, "forward", namespace)
        self._timed_code = timed_code
        self._namespace = namespace
        self._timed = None

    def __call__(self, *args):
        return self.forward(*args)

    def run_timed(self, *args) -> tuple[Any, list[tuple[str, int]]]:
        if self._timed is None:     # built on first use: only CPU islands are run this way
            self._timed = _compile(self._timed_code, "forward_timed", self._namespace)
        times: list[tuple[str, int]] = []
        return self._timed(times, *args), times


def _compile(code: str, name: str, namespace: dict):
    scope: dict = {}
    exec(compile(code, f"<neuron_stack partition {name}>", "exec"), namespace, scope)   # our own generated source
    return scope[name]


class _Codegen:
    """Python expressions for node arguments (JSON form) over named values and global constants."""

    def __init__(self, constants: dict):
        self.constants = constants                # node name -> tensor (weights and folded values)
        self.names: dict[str, str] = {}           # node name -> variable of its value
        self.values: set[str] = set()             # variables holding a graph value (fx's Nodes)
        self.ns: dict[str, Any] = {"_ns": time.perf_counter_ns}   # the function's globals
        self.const_var: dict[int, str] = {}       # id(object) -> its global name (ns keeps it alive)

    def const(self, value) -> str:
        """The global name of ``value``, one per object."""
        key = id(value)
        if key not in self.const_var:
            self.const_var[key] = self.global_("k", value)
        return self.const_var[key]

    def global_(self, prefix: str, value) -> str:
        name = f"{prefix}{len(self.ns)}"
        self.ns[name] = value
        return name

    def bind(self, node: str, var: str) -> str:
        self.names[node] = var
        self.values.add(var)
        return var

    def ref(self, name: str) -> str:
        if name in self.names:
            return self.names[name]
        if name in self.constants:
            return self.bind(name, self.const(self.constants[name]))
        raise KeyError(name)

    def expr(self, a: Any) -> str:
        """Source of the value ``from_json(a, env)`` would give."""
        if isinstance(a, list):
            return "[" + ", ".join(self.expr(x) for x in a) + "]"
        if isinstance(a, dict):
            if "node" in a and len(a) == 1:
                return self.ref(a["node"])
            if "dict" in a and len(a) == 1:
                return "{" + ", ".join(f"{self.const(k)}: {self.expr(v)}" for k, v in a["dict"].items()) + "}"
            return self.global_("k", from_json(a, {}))
        if a is None or isinstance(a, bool) or type(a) is int:
            return repr(a)
        return self.global_("k", a)              # floats (inf, nan), strings: never pasted into the source

    def call(self, fn: str, args: list[str], kwargs: dict[str, str]) -> str:
        parts = list(args)
        extra = {}
        for k, v in kwargs.items():
            if k.isidentifier() and not keyword.iskeyword(k):
                parts.append(f"{k}={v}")
            else:
                extra[k] = v
        if extra:
            parts.append("**{" + ", ".join(f"{self.const(k)}: {v}" for k, v in extra.items()) + "}")
        return f"{fn}({', '.join(parts)})"


def build_graph_module(program: Program, part: Partition, auto_cast: str = "none", cast_type: str = "bf16", *,
                       constants: dict | None = None, inputs: list[str] | None = None,
                       output=None) -> PartitionFn:
    """A :class:`PartitionFn` computing partition ``part`` of ``program``.

    Weights (``constants``: node name -> tensor) are globals of the function, so only activations are
    arguments: placeholders are ``inputs`` (default: the partition's non-constant inputs). It
    returns ``output`` (a JSON output structure, e.g. ``program.output_names``) or else the tuple
    of ``part.outputs``. In a device partition, ops that depend on weights only (the
    ``permute`` of a linear's weight, ``arange``) are computed here, once: constant folding. With
    ``--auto-cast`` a weight is rounded once here too, an activation once per execution however
    many matmuls read it. CPU islands keep every op, since each is measured.
    Example: ``build_graph_module(prog, prog.partitions[0], constants=prog.constants)``.
    """
    constants = dict(constants or {})      # plus the folded values, by node name
    by_name = {n.name: n for n in program.nodes}
    cg = _Codegen(constants)
    params = []
    for name in inputs if inputs is not None else [n for n in part.inputs if n not in constants]:
        params.append(cg.bind(name, f"a{len(params)}"))
    dtype = _CAST_DTYPES[cast_type]
    device = part.kind == "device"
    cast = device and auto_cast != "none"
    rounded: dict[str, str] = {}            # variable -> variable of its rounded value
    stmts: list[tuple[str, str, str]] = []  # (target variable, expression, node name or "")

    def rounded_value(var: str) -> str:
        if var not in rounded:
            value = cg.ns.get(var)
            if isinstance(value, torch.Tensor):    # a weight: round it now, once
                rounded[var] = cg.global_("k", round_to(value, dtype))
            else:
                rounded[var] = out = f"r{len(rounded)}"
                stmts.append((out, f"{cg.const(round_to)}({var}, {cg.const(dtype)})", ""))
        return rounded[var]

    for name in part.nodes:
        n = by_name[name]
        if device and _foldable(n, constants):
            with torch.no_grad():
                value = resolve_target(n.target)(*from_json(n.args, constants),
                                                 **{k: from_json(v, constants) for k, v in n.kwargs.items()})
            if isinstance(value, torch.Tensor):
                constants[name] = value   # a global constant where it is used
                continue
        args = [cg.expr(a) for a in n.args]
        kwargs = {k: cg.expr(v) for k, v in n.kwargs.items()}
        if cast and (n.op_class in ("matmul", "conv") or auto_cast == "all"):
            which = MATMUL_OPERANDS.get(n.target.rsplit(".", 1)[0]) if auto_cast == "matmult" else None
            args = [rounded_value(a) if a in cg.values and (which is None or i in which) else a
                    for i, a in enumerate(args)]
        expr = cg.call(cg.global_("f", node_callable(n)), args, kwargs)
        stmts.append((cg.bind(name, f"v{len(stmts)}"), expr, name))
    result = cg.expr(output) if output is not None else "(" + "".join(f"{cg.ref(o)}, " for o in part.outputs) + ")"
    return PartitionFn(*_sources(params, stmts, result, cg), cg.ns)


def _sources(params: list[str], stmts: list[tuple[str, str, str]], result: str, cg: _Codegen) -> tuple[str, str]:
    """The plain and the timed function. A value is dropped after its last use (as fx does), so
    activations are freed while the function runs."""
    last: dict[str, int] = {}
    for i, (_, expr, _) in enumerate(stmts):
        for tok in _tokens(expr):
            last[tok] = i
    keep = set(_tokens(result))
    free_after: dict[int, list[str]] = {}
    for var, i in last.items():
        if var not in keep and (var[0] in "avr") and var[1:].isdigit():
            free_after.setdefault(i, []).append(var)
    plain = [f"def forward({', '.join(params)}):"]
    timed = [f"def forward_timed(_times, {', '.join(params)}):"]
    for i, (var, expr, node) in enumerate(stmts):
        plain.append(f"    {var} = {expr}")
        if node:
            timed += ["    _t = _ns()", f"    {var} = {expr}", f"    _times.append(({cg.const(node)}, _ns() - _t))"]
        else:
            timed.append(f"    {var} = {expr}")
        if i in free_after:
            dead = "    " + " = ".join(free_after[i]) + " = None"
            plain.append(dead)
            timed.append(dead)
    plain.append(f"    return {result}")
    timed.append(f"    return {result}")
    return "\n".join(plain) + "\n", "\n".join(timed) + "\n"


def _tokens(expr: str) -> list[str]:
    """The generated names an expression reads."""
    return _TOKEN.findall(expr)


_TOKEN = re.compile(r"\b[avrk]\d+\b")
