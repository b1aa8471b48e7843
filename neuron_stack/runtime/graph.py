"""Executable graphs: each partition of a NEFF's program becomes a ``torch.fx.GraphModule`` (generated
Python, built once at load), with constant folding and ``--auto-cast`` rounding; CPU islands run
through :class:`TimedInterpreter`, which measures each op.

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
import math
import operator
import time
from typing import Any

import torch
import torch.fx

from neuron_stack.compiler.partition import refs
from neuron_stack.ir import Partition, Program
from neuron_stack.runtime.errors import NeuronRuntimeError


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


class _Env(dict):
    """Node name -> FX node; a weight is fetched (``get_attr``) the first time it is referenced."""

    def __init__(self, graph: torch.fx.Graph, root: torch.nn.Module, constants: dict):
        super().__init__()
        self.graph, self.root, self.constants = graph, root, constants
        self.const_names: dict[torch.fx.Node, str] = {}

    def __missing__(self, name: str) -> torch.fx.Node:
        if name not in self.constants:
            raise KeyError(name)
        attr = f"_const_{len(self.const_names)}"
        self.root.register_buffer(attr, self.constants[name], persistent=False)
        node = self[name] = self.graph.get_attr(attr)
        self.const_names[node] = name
        return node


#: Deterministic ops without tensor inputs: a device graph computes them once, at load.
FOLDABLE_SOURCES = frozenset({"aten.arange", "aten.full", "aten.zeros", "aten.ones", "aten.scalar_tensor",
                              "aten.eye", "aten.linspace"})
_NEVER_FOLD = ("rand", "dropout", "bernoulli", "multinomial", "normal", "uniform", "exponential", "poisson", "empty")


def _foldable(n, values: dict) -> bool:
    """True if ``n`` depends on weights only (``permute(weight)``, ``arange``) and is deterministic."""
    packet = n.target.rsplit(".", 1)[0]
    op = packet.rsplit(".", 1)[-1]
    if op.endswith("_") or any(w in op for w in _NEVER_FOLD):
        return False
    deps = list(refs([n.args, n.kwargs]))
    return all(d in values for d in deps) if deps else packet in FOLDABLE_SOURCES


def build_graph_module(program: Program, part: Partition, auto_cast: str = "none", cast_type: str = "bf16", *,
                       constants: dict | None = None, inputs: list[str] | None = None,
                       output=None) -> torch.fx.GraphModule:
    """A GraphModule computing partition ``part`` of ``program``.

    Weights (``constants``: node name -> tensor) live in the module, so only activations are
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
    g = torch.fx.Graph()
    root = torch.nn.Module()
    env = _Env(g, root, constants)
    for name in inputs if inputs is not None else [n for n in part.inputs if n not in constants]:
        env[name] = g.placeholder(name)
    dtype = _CAST_DTYPES[cast_type]
    device = part.kind == "device"
    cast = device and auto_cast != "none"
    rounded: dict[torch.fx.Node, torch.fx.Node] = {}

    def rounded_value(a: torch.fx.Node) -> torch.fx.Node:
        if a not in rounded:
            if a in env.const_names:   # a weight: round it now, once
                attr = f"{a.target}_{cast_type}"
                root.register_buffer(attr, round_to(constants[env.const_names[a]], dtype), persistent=False)
                rounded[a] = g.get_attr(attr)
            else:
                rounded[a] = g.call_function(round_to, (a, dtype))
        return rounded[a]

    for name in part.nodes:
        n = by_name[name]
        if device and _foldable(n, constants):
            with torch.no_grad():
                value = resolve_target(n.target)(*from_json(n.args, constants),
                                                 **{k: from_json(v, constants) for k, v in n.kwargs.items()})
            if isinstance(value, torch.Tensor):
                constants[name] = value   # fetched (get_attr) where it is used
                continue
        args = from_json(n.args, env)
        kwargs = {k: from_json(v, env) for k, v in n.kwargs.items()}
        if cast and (n.op_class in ("matmul", "conv") or auto_cast == "all"):
            which = MATMUL_OPERANDS.get(n.target.rsplit(".", 1)[0]) if auto_cast == "matmult" else None
            args = [rounded_value(a) if isinstance(a, torch.fx.Node) and (which is None or i in which) else a
                    for i, a in enumerate(args)]
        out = g.call_function(resolve_target(n.target), tuple(args), kwargs)
        out.name = name
        env[name] = out
    g.output(from_json(output, env) if output is not None else tuple(env[o] for o in part.outputs))
    return torch.fx.GraphModule(root, g)


class TimedInterpreter(torch.fx.Interpreter):
    """Runs a CPU island op by op and measures each op's host time (ns)."""

    def __init__(self, gm):
        super().__init__(gm)
        self.times: list[tuple[str, int]] = []

    def run_node(self, n):
        if n.op != "call_function":
            return super().run_node(n)
        t0 = time.perf_counter_ns()
        out = super().run_node(n)
        self.times.append((n.name, time.perf_counter_ns() - t0))
        return out
