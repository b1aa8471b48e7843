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
>>> [(p["kind"], p["nodes"]) for p in partition(Program("g", nodes, ["x"], [{"node": "b"}])).partitions]
[('device', ['a']), ('cpu', ['b'])]
"""
from __future__ import annotations

from typing import Any, Iterator

from neuron_stack.ir import Program
from neuron_stack.compiler.legalize import nbytes


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
    """Set ``Node.partition`` and ``program.partitions`` in place; log each partition and seam.

    Each partition is ``{"index", "kind": "device"|"cpu", "nodes", "inputs", "outputs", "transfers"}``
    where ``transfers`` lists ``{"value", "direction": "to_host"|"to_device", "bytes"}``.
    Example: ``partition(legalize(prog)).partitions[0]["kind"]``.
    """
    by_name = {n.name: n for n in program.nodes}
    parts: list[dict] = []
    for n in program.nodes:
        if not n.is_op:
            continue
        kind = "cpu" if n.placement == "cpu_fallback" else "device"
        if n.op_class == "view" and parts:
            kind = parts[-1]["kind"]          # metadata-only ops never open a partition
        if not parts or parts[-1]["kind"] != kind:
            parts.append({"index": len(parts), "kind": kind, "nodes": []})
        n.partition = parts[-1]["index"]
        parts[-1]["nodes"].append(n.name)

    owner = {n.name: n.partition for n in program.nodes if n.is_op}
    used_later: dict[str, set[int]] = {}
    for n in program.nodes:
        consumer = n.partition if n.is_op else (len(parts) if n.target == "output" else None)
        if consumer is None:
            continue
        for r in refs(n.args) if n.target == "output" else refs([n.args, n.kwargs]):
            used_later.setdefault(r, set()).add(consumer)
    for p in parts:
        members = set(p["nodes"])
        inputs: list[str] = []
        for name in p["nodes"]:
            n = by_name[name]
            for r in refs([n.args, n.kwargs]):
                if r not in members and r not in inputs:
                    inputs.append(r)
        p["inputs"] = inputs
        p["outputs"] = [m for m in p["nodes"] if any(c != p["index"] for c in used_later.get(m, ()))]
        p["transfers"] = []
        for r in inputs:
            src = owner.get(r)
            if src is not None and parts[src]["kind"] != p["kind"]:
                direction = "to_host" if p["kind"] == "cpu" else "to_device"
                size = sum(nbytes(s) for s in by_name[r].outputs)
                p["transfers"].append({"value": r, "direction": direction, "bytes": size})
        seams = ", ".join(f"{t['value']} {t['direction']} {t['bytes']} B" for t in p["transfers"])
        program.log.append(f"partition: #{p['index']} {p['kind']} {len(p['nodes'])} ops, "
                           f"{len(inputs)} inputs, {len(p['outputs'])} outputs"
                           + (f"; host<->device transfers: {seams}" if seams else ""))
    program.partitions = parts
    return program


# -- the graph partitioner's checks (torch_neuronx.PartitionerConfig) ------------------------------

class PartitionerError(ValueError):
    """A model that does not meet its ``partitioner_config``; one line naming the figure and the fix."""


#: Symbolic-shape bookkeeping export adds around data-dependent ops: not operators of the model.
SHAPE_BOOKKEEPING = frozenset({"aten::sym_size", "aten::sym_numel", "aten::sym_stride", "aten::_assert_scalar",
                               "aten::_assert_async", "aten::sym_constrain_range_for_size",
                               "aten::_assert_tensor_metadata"})


def support_op_name(n) -> str | None:
    """The ``aten::name`` a node counts as in the support share, or None (Python scalar ops such as
    ``operator.add`` and shape bookkeeping do not count, as in ``torch_neuronx.analyze``)."""
    from neuron_stack.compiler.legalize import aten_name

    if not n.is_compute:
        return None
    name = aten_name(n.target)
    return name if name.startswith("aten::") and name not in SHAPE_BOOKKEEPING else None


def support_counts(program: Program) -> dict[str, list[int]]:
    """``{"aten::addmm": [on_device, on_cpu], ...}`` over the model's ATen ops as currently placed.

    >>> from neuron_stack.ir import Node, Program
    >>> support_counts(Program("g", [Node("r", "aten.relu.default"), Node("a", "operator.add")], [], []))
    {'aten::relu': [1, 0]}
    """
    counts: dict[str, list[int]] = {}
    for n in program.nodes:
        name = support_op_name(n)
        if name is not None:
            counts.setdefault(name, [0, 0])[n.placement != "device"] += 1
    return dict(sorted(counts.items()))


def support_share(counts: dict[str, list[int]], ignored=frozenset()) -> tuple[float, int, int]:
    """``(percent, supported, total)`` of ops the NeuronCore supports, ``ignored`` ops left out
    (``analyze``'s ``additional_ignored_ops``). Example: ``support_share({"aten::sort": [0, 1]})``
    -> ``(0.0, 0, 1)``."""
    supported = sum(c[0] for op, c in counts.items() if op not in ignored)
    total = sum(c[0] + c[1] for op, c in counts.items() if op not in ignored)
    return (100.0 * supported / total if total else 100.0), supported, total


def describe_support(counts: dict[str, list[int]], ignored=frozenset()) -> tuple[float, str]:
    """``(percent, "model support percentage of 81.82% (9 of 11 ops supported; unsupported: ...)")``."""
    pct, supported, total = support_share(counts, ignored)
    unsupported = ", ".join(f"{op} x{c[1]}" if c[1] > 1 else op for op, c in counts.items()
                            if c[1] and op not in ignored)
    return pct, f"model support percentage of {pct:.2f}% ({supported} of {total} ops supported" + (
        f"; unsupported: {unsupported})" if unsupported else ")")


def check_partitioner_config(program: Program, config) -> str:
    """Apply a ``PartitionerConfig``'s limits to a compiled program, as ``torch_neuronx`` does.

    The support share is that of ``analyze`` (before ``ops_to_partition``; stored by the compiler in
    ``program.stats["support"]``). A fully supported model with nothing forced to the CPU is one
    graph and is not checked further; otherwise the share must reach
    ``model_support_percentage_threshold`` (and exceed 2%), every subgraph (device or CPU) must hold
    at least ``min_subgraph_size`` ops and there may be at most ``max_subgraph_count`` subgraphs.
    Returns a one-line summary; raises :class:`PartitionerError`.
    Example: ``check_partitioner_config(neff.program, PartitionerConfig(max_subgraph_count=3))``.
    """
    counts = program.stats.get("support") or support_counts(program)
    ignored = set((config.analyze_parameters or {}).get("additional_ignored_ops") or ())
    pct, share = describe_support(counts, ignored)
    forced = bool(config.ops_to_partition)
    if abs(pct - 100.0) < 1e-4 and not forced:
        return f"partitioner: {share}: the whole model is one NeuronCore graph"
    if pct <= 2:
        raise PartitionerError(f"{share} is very close to 0%: aborting the trace; nothing worth running on the "
                               "NeuronCore (run the model on the CPU, or replace the unsupported ops)")
    threshold = 100.0 * config.model_support_percentage_threshold
    if pct < threshold:
        raise PartitionerError(f"{share} is below partitioner_config.model_support_percentage_threshold "
                               f"of {threshold:.2f}%: replace the unsupported ops, or lower the threshold")
    parts = program.partitions
    if config.min_subgraph_size != -1:
        by_name = {n.name: n for n in program.nodes}
        for p in parts:
            size = sum(support_op_name(by_name[n]) is not None for n in p["nodes"])
            if size < config.min_subgraph_size:
                kind = "NEURON" if p["kind"] == "device" else "CPU"
                raise PartitionerError(
                    f"the partitioner created a {kind} subgraph (#{p['index']}) with {size} operators, less than "
                    f"partitioner_config.min_subgraph_size of {config.min_subgraph_size}: lower min_subgraph_size, "
                    "or move neighbouring ops with ops_to_partition so the subgraphs merge")
    if config.max_subgraph_count != -1 and len(parts) > config.max_subgraph_count:
        layout = " | ".join(f"{'NEURON' if p['kind'] == 'device' else 'CPU'}" for p in parts)
        raise PartitionerError(
            f"the partitioner found {len(parts)} subgraphs ({layout}), more than "
            f"partitioner_config.max_subgraph_count of {config.max_subgraph_count}: raise max_subgraph_count, "
            "or force the ops between the CPU islands to the CPU with ops_to_partition")
    return (f"partitioner: {share} >= threshold {threshold:.2f}%; {len(parts)} subgraphs "
            f"(min size {config.min_subgraph_size}, max count {config.max_subgraph_count})")
