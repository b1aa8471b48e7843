"""The CPU-fallback warning: a compiled graph that runs part of the model on the host says so, once.

The real stack logs its partitioning when it cuts a graph into NeuronCore subgraphs and CPU islands;
a fallback here is never silent either. :func:`warn_fallbacks` issues one :class:`CPUFallbackWarning`
per compiled graph that falls back (``neuron_stack.trace``, each ``torch.compile(backend="neuron")``
graph, each eager ``neuron``-device op signature): how many ops, which, the user's lines, and the
share of a run the cost model can see at compile time (the device partitions and the PCIe transfers
at the seams; the host ops' own time is only known once they run, so the share is a lower bound).

Silence it with ``NEURON_CPU_FALLBACK_WARNING=0`` or the ``warnings`` module::

    warnings.filterwarnings("ignore", category=neuron_stack.CPUFallbackWarning)

>>> from neuron_stack.ir import Node, Source
>>> n = Node("s", "aten.sort.default", placement="cpu_fallback", fallback_reason="forced",
...          source=Source("/u/model.py", 12, "forward", "s.sort()"))
>>> print(describe("Ranker", [n], 20, device_ns=8000, transfer_ns=2000, transfers=2))
neuron_stack: CPU fallback in graph 'Ranker': 1 of 20 ops run on the host CPU, not the NeuronCore:
  model.py:12  s.sort()
      aten.sort.default: forced
  per run, estimated by the cost model: 8 µs on the NeuronCore + 2 µs for 2 host<->device transfers, so at least 20%
  of each run is off the NeuronCore (the host ops' own time is measured when they run: neuron-explorer summary)
  silence: NEURON_CPU_FALLBACK_WARNING=0, or warnings.filterwarnings('ignore', category=neuron_stack.CPUFallbackWarning)
"""
from __future__ import annotations

import os
import warnings

from neuron_stack.device.cost import pcie_ns
from neuron_stack.device.profiles import get_profile
from neuron_stack.ir import Node, Source
from traces.timefmt import fmt_ns
from traces.vocab import FALLBACK_PLACEMENT

#: Set to ``0`` to silence every CPU-fallback warning of the process.
ENV = "NEURON_CPU_FALLBACK_WARNING"
#: Source lines listed before "and N more lines": a warning stays readable.
MAX_LISTED = 8


class CPUFallbackWarning(UserWarning):
    """Part of a compiled graph runs on the host CPU (silenced by a ``warnings`` filter or ``ENV=0``)."""


def enabled() -> bool:
    """False when ``NEURON_CPU_FALLBACK_WARNING`` is ``0`` (or ``false``/``off``/``no``)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def _line(src: Source | None) -> str:
    if src is None:
        return "  (no source line)"
    code = " ".join(src.code.split("#", 1)[0].split())[:70]
    return f"  {os.path.basename(src.file)}:{src.line}" + (f"  {code}" if code else "")


def describe(graph: str, nodes: list[Node], num_ops: int, device_ns: int | None = None,
             transfer_ns: int = 0, transfers: int = 0) -> str:
    """The warning's text for ``nodes`` (the graph's fallback ops) out of ``num_ops``, grouped by the user's
    line, then by reason; ``device_ns`` None: no device partition. Example in the module doc."""
    by_line: dict[tuple, dict[str, dict[str, int]]] = {}     # (file, line) -> reason -> op -> count
    sources: dict[tuple, Source | None] = {}
    for n in nodes:
        key = (n.source.file, n.source.line) if n.source else ("", 0)
        sources.setdefault(key, n.source)
        ops = by_line.setdefault(key, {}).setdefault(n.fallback_reason or "not supported on the NeuronCore", {})
        ops[n.target] = ops.get(n.target, 0) + 1
    lines = [f"neuron_stack: CPU fallback in graph '{graph}': {len(nodes)} of {num_ops} ops run on the host CPU, "
             "not the NeuronCore:"]
    for key in list(by_line)[:MAX_LISTED]:
        lines.append(_line(sources[key]))
        for reason, ops in by_line[key].items():
            names = ", ".join(op + (f" x{c}" if c > 1 else "") for op, c in ops.items())
            lines.append(f"      {names}: {reason}")
    if len(by_line) > MAX_LISTED:
        lines.append(f"  ... and {len(by_line) - MAX_LISTED} more lines (neuron-cc analyze lists them all)")
    if device_ns is None:
        lines.append("  no part of this graph runs on the NeuronCore")
    else:
        share = transfer_ns / (device_ns + transfer_ns) if device_ns + transfer_ns else 0.0
        lines.append(f"  per run, estimated by the cost model: {fmt_ns(device_ns)} on the NeuronCore + "
                     f"{fmt_ns(transfer_ns)} for {transfers} host<->device transfers, so at least {share:.0%}")
        lines.append("  of each run is off the NeuronCore (the host ops' own time is measured when they run: "
                     "neuron-explorer summary)")
    lines.append(f"  silence: {ENV}=0, or warnings.filterwarnings('ignore', "
                 "category=neuron_stack.CPUFallbackWarning)")
    return "\n".join(lines)


def warn_fallbacks(neff, where: Source | None = None) -> bool:
    """Warn once for ``neff`` (a compiled graph) if any of its ops run on the host; True if it warned.

    ``where``: the user's call site the warning is attributed to (the ``trace`` or model call).
    Example: ``warn_fallbacks(nm.neff, caller_source())``.
    """
    program = neff.program
    nodes = [n for n in program.nodes if n.is_compute and n.placement == FALLBACK_PLACEMENT]
    if not nodes or not enabled():
        return False
    profile = get_profile(neff.header.get("target", "trn1"))
    seams = [t for p in program.partitions for t in p.transfers]
    text = describe(program.name, nodes, sum(n.is_compute for n in program.nodes),
                    device_ns=sum(s.device_ns for s in neff.schedules.values()) if neff.schedules else None,
                    transfer_ns=sum(pcie_ns(profile, t.bytes) for t in seams), transfers=len(seams))
    _warn(text, where or nodes[0].source)
    return True


def warn_host_op(op: str, reason: str, where: Source | None) -> bool:
    """Warn for one eager op the compiler could not capture at all (it runs on the host); True if it warned.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     _ = warn_host_op("aten.foo.default", "no meta kernel", Source("/u/a.py", 3, "f"))
    >>> w[0].category.__name__, w[0].filename, w[0].lineno
    ('CPUFallbackWarning', '/u/a.py', 3)
    """
    if not enabled():
        return False
    text = describe(f"eager {op}", [Node(op, op, placement=FALLBACK_PLACEMENT, fallback_reason=reason,
                                         source=where)], 1, device_ns=None)
    _warn(text, where)
    return True


def _warn(text: str, where: Source | None) -> None:
    # attributed to the user's line, as Python prints it: "model.py:12: CPUFallbackWarning: ..."; no
    # registry, so the caller's once-per-graph rule decides, not Python's once-per-location default
    if where is not None:
        warnings.warn_explicit(text, CPUFallbackWarning, where.file, where.line, module="neuron_stack")
    else:
        warnings.warn(text, CPUFallbackWarning, stacklevel=3)
