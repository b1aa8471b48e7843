"""The compiler's graph IR: what the front end produces, the passes annotate and the NEFF stores.

A :class:`Program` is a flat, topologically ordered list of :class:`Node` records plus its
constants (weights). It is plain data (JSON-able apart from the constant tensors), so a NEFF can
store it without pickle and the runtime can rebuild an executable graph from it.

>>> n = Node(name="addmm", target="aten.addmm.default", args=[{"node": "b"}, {"node": "x"}, {"node": "w"}],
...          outputs=[TensorSpec((2, 8), "float32")])
>>> n.is_compute
True
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

# Op classes (legalize assigns one per node). "view" ops are metadata only: no device work.
OP_CLASSES = ("matmul", "conv", "elementwise", "activation", "reduction", "normalization", "softmax",
              "data_movement", "gather", "view", "collective", "nki", "cpu")


@dataclass
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without prefix: "float32", "bfloat16", "int64", "bool"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class Source:
    file: str       # absolute path of the user's file
    line: int
    function: str
    code: str = ""


@dataclass
class Node:
    """One graph node.

    ``args``/``kwargs`` are JSON-able: numbers, bools, None, strings, lists, ``{"node": name}``
    for a reference to another node's value, ``{"dtype": "float32"}``, ``{"device": "cpu"}``,
    ``{"layout": ...}``/``{"memory_format": ...}`` for the torch enums.
    """

    name: str
    target: str                               # "aten.addmm.default"; "placeholder", "get_attr", "output", "getitem"
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    inputs: list[TensorSpec] = field(default_factory=list)   # tensor arguments, in argument order
    outputs: list[TensorSpec] = field(default_factory=list)
    op_class: str = ""                         # one of OP_CLASSES (set by legalize)
    placement: str = "device"                  # "device" | "cpu_fallback"
    fallback_reason: str = ""
    fused_into: str | None = None              # name of the node this one is fused into (set by fuse)
    module_path: str = ""                      # innermost nn.Module path, e.g. "encoder.layer.0.attention"
    module_type: str = ""                      # its class, e.g. "torch.nn.modules.linear.Linear"
    source: Source | None = None               # innermost frame in user code (a backward op: the backward() call)
    fwd_source: Source | None = None           # a backward op: the forward line it differentiates (autograd's record)
    stack: list[Source] = field(default_factory=list)  # the user's frames, outermost first, ending at ``source``
    flops: int = 0
    bytes: int = 0                             # bytes read + written by the op, unfused
    partition: int = -1                        # index of the device subgraph / CPU island (set by partition)
    decomposed_from: str = ""                  # the ATen op run_decompositions produced this node from
    # an NKI kernel op (op_class "nki"): the kernel traced into ISA instructions, so a process that never
    # imported the kernel's module computes its numbers from the NEFF (runtime.graph.recorded_kernel)
    kernel: dict | None = None

    @property
    def is_compute(self) -> bool:
        return self.target not in ("placeholder", "get_attr", "output", "getitem")

    @property
    def is_op(self) -> bool:
        """Any graph operation, ``getitem`` included (everything but inputs, weights and the output)."""
        return self.target not in ("placeholder", "get_attr", "output")


@dataclass(frozen=True)
class Transfer:
    """A value crossing between a device partition and a CPU island (charged over PCIe)."""

    value: str                                 # the node whose output crosses
    direction: str                             # "to_host" | "to_device"
    bytes: int


@dataclass(frozen=True)
class Partition:
    """One device subgraph or CPU island, as the partition pass cuts it (pass 2).

    >>> Partition(0, "device", ("relu",), ("x",), ("relu",)).kind
    'device'
    """

    index: int
    kind: str                                  # "device" | "cpu"
    nodes: tuple[str, ...]                     # member node names, in program order
    inputs: tuple[str, ...] = ()               # values it reads from outside (placeholders, weights, others)
    outputs: tuple[str, ...] = ()              # members read by other partitions or the program output
    transfers: tuple[Transfer, ...] = ()       # inputs produced on the other side of the host/device seam

    @classmethod
    def from_json(cls, d: dict) -> "Partition":
        """Inverse of ``dataclasses.asdict`` (what a NEFF's ``program.json`` stores)."""
        return cls(index=d["index"], kind=d["kind"], nodes=tuple(d["nodes"]), inputs=tuple(d.get("inputs", ())),
                   outputs=tuple(d.get("outputs", ())),
                   transfers=tuple(Transfer(**t) for t in d.get("transfers", ())))


def asdict_value(v: Any) -> Any:
    """``dataclasses.asdict`` for a field value that may be a dataclass or a list of them.

    >>> asdict_value([TensorSpec((2,), "float32")])
    [{'shape': (2,), 'dtype': 'float32'}]
    """
    # asdict's result without its deep copy of every leaf: the IR's leaves are immutable JSON values, and the
    # copies were most of a BERT-base graph hash (every cache hit computes one)
    t = type(v)
    names = _FIELD_NAMES.get(t)
    if names is None and is_dataclass(v) and not isinstance(v, type):
        names = _FIELD_NAMES[t] = tuple(f.name for f in fields(v))
    if names is not None:
        return {name: asdict_value(getattr(v, name)) for name in names}
    if t is list or t is tuple:
        return t([asdict_value(x) for x in v])
    if isinstance(v, (list, tuple)):
        return t(asdict_value(x) for x in v)
    if isinstance(v, dict):
        return {k: asdict_value(x) for k, x in v.items()}
    return v


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclass
class Program:
    """A compiled graph: nodes in topological order, named inputs/outputs and constants."""

    name: str
    nodes: list[Node]
    input_names: list[str]                     # placeholder node names, in call order
    output_names: list[Any]                    # output structure: names or nested lists of names
    constants: dict[str, Any] = field(default_factory=dict)   # name -> torch.Tensor (weights, buffers)
    flags: dict[str, Any] = field(default_factory=dict)       # the compile flags that produced it
    log: list[str] = field(default_factory=list)              # the verbose compile log, one decision a line
    # Added by the compiler engineer (additive):
    io_specs: dict[str, str] = field(default_factory=dict)    # pytree specs of inputs/outputs (treespec_dumps)
    partitions: list[Partition] = field(default_factory=list)  # set by the partition pass
    stats: dict[str, Any] = field(default_factory=dict)       # compile-time figures (memory, counts)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def to_json(self) -> dict:
        """Everything but the constant tensors, as JSON-able data."""
        # field by field: ``asdict(self)`` would deep-copy every weight tensor only to drop them
        d = {f.name: asdict_value(getattr(self, f.name)) for f in fields(self) if f.name != "constants"}
        d["constant_names"] = sorted(self.constants)
        return d

    @classmethod
    def from_json(cls, d: dict, constants: dict[str, Any] | None = None) -> "Program":
        """Inverse of :meth:`to_json`; ``constants`` supplies the tensors.

        >>> p = Program("g", [Node("x", "placeholder", outputs=[TensorSpec((2,), "float32")])], ["x"], ["x"])
        >>> Program.from_json(p.to_json()).nodes[0].outputs[0].shape
        (2,)
        """
        def spec(s):
            return TensorSpec(tuple(s["shape"]), s["dtype"])

        nodes = []
        for n in d["nodes"]:
            n = dict(n)
            n["inputs"] = [spec(s) for s in n.get("inputs", [])]
            n["outputs"] = [spec(s) for s in n.get("outputs", [])]
            n["source"] = Source(**n["source"]) if n.get("source") else None
            n["fwd_source"] = Source(**n["fwd_source"]) if n.get("fwd_source") else None
            n["stack"] = [Source(**f) for f in n.get("stack") or ()]
            nodes.append(Node(**n))
        fields = {k: d[k] for k in ("name", "input_names", "output_names", "flags", "log", "io_specs",
                                    "stats") if k in d}
        parts = [Partition.from_json(p) for p in d.get("partitions", [])]
        return cls(nodes=nodes, constants=dict(constants or {}), partitions=parts, **fields)


@contextlib.contextmanager
def paused_gc():
    """Run the block with CPython's cyclic garbage collector off (restored after).

    The passes allocate hundreds of thousands of small, acyclic objects (instructions, operand
    dicts); each allocation burst triggers collections, and every few an old-generation one that
    walks torch's whole heap. That was 35-45% of a BERT-base compile's CPU time (issue 20); loading
    a NEFF (the program's nodes) pays the same way. Nothing here relies on the collector: reference
    counting frees it all, and any cycle is collected once it is back on.
    Example: ``with paused_gc(): compile_program(prog, flags)``.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
