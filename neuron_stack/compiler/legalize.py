"""Pass 1, legalize: give every node an op class from the operator-support table, or send it to the
CPU with the reason; compute its FLOPs and bytes.

Forced CPU placement (``PartitionerConfig.ops_to_partition``), data-dependent shapes (a ``-1``
dimension anywhere in a node's inputs or outputs) and boolean-mask indexing are decided here too.

>>> from neuron_stack.ir import Node, Program, TensorSpec
>>> x = Node("x", "placeholder", outputs=[TensorSpec((4,), "float32")])
>>> nz = Node("nz", "aten.nonzero.default", [{"node": "x"}], inputs=[TensorSpec((4,), "float32")],
...           outputs=[TensorSpec((-1, 1), "int64")])
>>> p = legalize(Program("g", [x, nz], ["x"], ["nz"]))
>>> p.node("nz").placement, p.node("nz").op_class
('cpu_fallback', 'cpu')
"""
from __future__ import annotations

from neuron_stack.compiler.operators import BOOL_INDEX_REASON, lookup, packet
from neuron_stack.ir import Node, Program, TensorSpec
from traces.vocab import FALLBACK_PLACEMENT

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4,
               "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "float8_e4m3fn": 1}


def nbytes(spec: TensorSpec) -> int:
    """Bytes of a tensor spec (unknown, data-dependent dims count as 0)."""
    return max(spec.numel, 0) * DTYPE_BYTES.get(spec.dtype, 4) if -1 not in spec.shape else 0


def aten_name(target: str) -> str:
    """``aten.sort.default`` -> ``aten::sort`` (the spelling of ``ops_to_partition`` and ``analyze``)."""
    p = packet(target)
    return p.replace(".", "::", 1) if p.startswith("aten.") else p


def _flops(n: Node) -> int:
    out = n.outputs[0].numel if n.outputs and -1 not in n.outputs[0].shape else 0
    ins = [s for s in n.inputs if -1 not in s.shape]
    if n.op_class == "matmul" and len(ins) >= 2:
        a = ins[-2]                          # addmm(bias, a, b), mm(a, b), bmm(a, b)
        k = a.shape[-1] if a.shape else 1
        return 2 * out * k
    if n.op_class == "conv" and len(ins) >= 2 and n.target.startswith("aten.convolution.default"):
        w = ins[1]
        per_out = 1
        for d in w.shape[1:]:
            per_out *= d
        return 2 * out * per_out
    if n.op_class in ("reduction",):
        return max(ins[0].numel if ins else 0, out)
    if n.op_class in ("softmax", "normalization"):
        return 5 * max(ins[0].numel if ins else 0, out)
    if n.op_class in ("elementwise", "activation"):
        return out
    return 0


def legalize(program: Program, partitioner_config=None) -> Program:
    """Annotate ``program``'s nodes in place (op_class, placement, fallback_reason, flops, bytes).

    ``partitioner_config`` is a :class:`neuron_stack.PartitionerConfig` (or anything with an
    ``ops_to_partition`` set of ``aten::name`` strings) forcing those ops to the CPU.
    Example: ``legalize(prog, PartitionerConfig(ops_to_partition={"aten::sort"}))``.
    """
    forced = set(getattr(partitioner_config, "ops_to_partition", None) or ())
    log = program.log
    for n in program.nodes:
        if not n.is_op:
            n.op_class = "view"
            continue
        op_class, note = lookup(n.target)
        reason = note if op_class == "cpu" else ""
        name = aten_name(n.target)
        if name in forced:
            op_class, reason = "cpu", f"{name} is in partitioner_config.ops_to_partition: forced to the host CPU"
        elif op_class != "cpu" and any(-1 in s.shape for s in n.inputs + n.outputs):
            op_class, reason = "cpu", "consumes a data-dependent shape: a NeuronCore graph needs static shapes"
        elif op_class != "cpu" and packet(n.target) == "aten.index" and _bool_index(n, program):
            op_class, reason = "cpu", BOOL_INDEX_REASON
        n.op_class = op_class
        n.placement = FALLBACK_PLACEMENT if op_class == "cpu" else "device"
        n.fallback_reason = reason
        n.flops = _flops(n)
        n.bytes = sum(nbytes(s) for s in n.inputs) + sum(nbytes(s) for s in n.outputs)
        where = f" [{n.source.file.rsplit('/', 1)[-1]}:{n.source.line}]" if n.source else ""
        decomp = f" (decomposed from {n.decomposed_from})" if n.decomposed_from else ""
        if op_class == "cpu":
            log.append(f"legalize: {n.name} {n.target}{decomp} -> CPU fallback: {reason}{where}")
        else:
            log.append(f"legalize: {n.name} {n.target}{decomp} -> {op_class}: {note}{where}")
    return program


def _bool_index(n: Node, program: Program) -> bool:
    """``x[mask]``: aten.index.Tensor with a bool index tensor has a data-dependent shape."""
    indices = n.args[1] if len(n.args) > 1 else []
    for ref in indices or []:
        if isinstance(ref, dict) and "node" in ref:
            outs = program.node(ref["node"]).outputs
            if outs and outs[0].dtype in ("bool", "uint8"):
                return True
    return False
