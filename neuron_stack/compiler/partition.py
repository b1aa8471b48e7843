"""Pass 2, partition: cut the node list into device subgraphs and CPU islands.

Walking the (topologically ordered) nodes, a new partition starts whenever placement switches
between the NeuronCore and the host; view ops stay with the partition they sit in. Each partition
records the values it takes in and gives out; a value crossing between a device partition and a
CPU island is a host<->device transfer (``transfers``) the runtime charges over PCIe.

>>> from neuron_stack.ir import Node, Program, TensorSpec
>>> t = TensorSpec((4,), "float32")
>>> nodes = [Node("x", "placeholder", outputs=[t]),
...          Node("a", "aten.relu.default", [{"node": "x"}], inputs=[t], outputs=[t], op_class="activation"),
...          Node("b", "aten.sort.default", [{"node": "a"}], inputs=[t], outputs=[t], op_class="cpu",
...               placement="cpu_fallback"),
...          Node("o", "output", [[{"node": "b"}]])]
>>> [(p.kind, p.nodes) for p in partition(Program("g", nodes, ["x"], [{"node": "b"}])).partitions]
[('device', ('a',)), ('cpu', ('b',))]
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from neuron_stack.compiler.legalize import nbytes
from neuron_stack.ir import Partition, Program, Transfer
from traces.vocab import FALLBACK_PLACEMENT


def refs(value: Any) -> Iterator[str]:
    """Names of the nodes referenced anywhere in a JSON-able argument structure."""
    if isinstance(value, dict):
        if "node" in value and len(value) == 1:
            yield value["node"]
        else:
            for v in value.values():
                yield from refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from refs(v)


def partition(program: Program) -> Program:
    """Set ``Node.partition`` and ``program.partitions`` (:class:`~neuron_stack.ir.Partition`) in
    place; log each partition and its host<->device seams.

    Example: ``partition(legalize(prog)).partitions[0].kind``.
    """
    by_name = {n.name: n for n in program.nodes}
    cuts: list[tuple[str, list[str]]] = []     # (kind, member names), in program order
    for n in program.nodes:
        if not n.is_op:
            continue
        kind = "cpu" if n.placement == FALLBACK_PLACEMENT else "device"
        if n.op_class == "view" and cuts:
            kind = cuts[-1][0]                 # metadata-only ops never open a partition
        if not cuts or cuts[-1][0] != kind:
            cuts.append((kind, []))
        n.partition = len(cuts) - 1
        cuts[-1][1].append(n.name)

    owner = {n.name: n.partition for n in program.nodes if n.is_op}
    used_later: dict[str, set[int]] = {}
    for n in program.nodes:
        consumer = n.partition if n.is_op else (len(cuts) if n.target == "output" else None)
        if consumer is None:
            continue
        for r in refs(n.args) if n.target == "output" else refs([n.args, n.kwargs]):
            used_later.setdefault(r, set()).add(consumer)
    parts: list[Partition] = []
    for index, (kind, names) in enumerate(cuts):
        members = set(names)
        inputs: list[str] = []
        for name in names:
            n = by_name[name]
            for r in refs([n.args, n.kwargs]):
                if r not in members and r not in inputs:
                    inputs.append(r)
        outputs = [m for m in names if any(c != index for c in used_later.get(m, ()))]
        transfers = []
        for r in inputs:
            src = owner.get(r)
            if src is not None and cuts[src][0] != kind:
                direction = "to_host" if kind == "cpu" else "to_device"
                transfers.append(Transfer(r, direction, sum(nbytes(s) for s in by_name[r].outputs)))
        p = Partition(index, kind, tuple(names), tuple(inputs), tuple(outputs), tuple(transfers))
        parts.append(p)
        seams = ", ".join(f"{t.value} {t.direction} {t.bytes} B" for t in p.transfers)
        program.log.append(f"partition: #{index} {kind} {len(names)} ops, "
                           f"{len(inputs)} inputs, {len(outputs)} outputs"
                           + (f"; host<->device transfers: {seams}" if seams else ""))
    program.partitions = parts
    return program
