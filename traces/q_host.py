"""The host side of a profile, and the gap between two: how many executions of how many graphs (fusion),
device time, the host's dispatch time around the executions, host↔device transfers.

It answers "what does compile buy me" for the same script run eager and compiled: eager runs one
execution per op, each dispatched by the host; compiled runs one per graph. Every execution counts here,
warm-ups included (each pays its dispatch and its transfers). Device time is the executions' device time
(:data:`traces.summary_sql.DEVICE_NS_SQL`, as :func:`traces.q_figures.figures` with warm-ups); dispatch time is
host time (``dispatch`` events, measured) and transfer time is PCIe time (``host_transfer`` events, one per
host↔device copy, the same copies as the system profile's ``nrt_tensor_write`` / ``nrt_tensor_read``): the
three are reported side by side, never added.

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=3, instructions=300)
>>> with traces.open(d) as p:
...     h = host_figures(p)
>>> h.executions, h.graphs, h.device_ns > 0, h.dispatch_ns
(3, 1, True, 0)
>>> why(h, h, "A", "B")[0]
'A ran 3 executions of 1 graph, 5.0 ops per execution; B the same'
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from traces.summary_sql import DEVICE_NS_SQL
from traces.timefmt import fmt_ns


@dataclass(frozen=True)
class HostFigures:
    """``executions`` (warm-ups included) of ``graphs`` distinct graphs; ``eager_executions``: those of
    one-op eager graphs (``graphs.kind = 'eager'``); ``ops_per_execution``: graph ops per execution
    (fusion; 1.0 for op-by-op); ``device_ns``: their device time; ``dispatches``, ``dispatch_ns``,
    ``dispatch_median_ns``: the host's dispatch time around them; ``transfers``, ``transfer_bytes``,
    ``transfer_ns``: host↔device copies and their PCIe time; ``writes``, ``write_bytes``: those to the device
    (``nrt_tensor_write``; the rest are reads)."""

    executions: int
    eager_executions: int
    graphs: int
    ops_per_execution: float
    device_ns: int
    dispatches: int
    dispatch_ns: int
    dispatch_median_ns: int
    transfers: int
    transfer_bytes: int
    transfer_ns: int
    writes: int = 0
    write_bytes: int = 0

    def as_dict(self) -> dict:
        """Plain JSON-able dict. Example: ``json.dumps(host_figures(p).as_dict())``."""
        return asdict(self)


def host_figures(p) -> HostFigures:
    """The host-side figures of profile ``p`` (a :class:`traces.Profile`); see :class:`HostFigures`."""
    ex = p.sql(f"""SELECT count(*) AS n, count(DISTINCT e.graph_id) AS graphs,
                          count(*) FILTER (WHERE g.kind = 'eager') AS eager,
                          coalesce(avg(g.num_ops), 0) AS ops, CAST(coalesce(sum({DEVICE_NS_SQL}), 0) AS BIGINT) AS dev
                   FROM executions e LEFT JOIN (SELECT DISTINCT graph_id, kind, num_ops FROM graphs) g
                        USING (graph_id)""").to_pylist()[0]
    ev = p.sql("""SELECT count(*) FILTER (WHERE kind = 'dispatch') AS dispatches,
                         CAST(coalesce(sum(dur_ns) FILTER (WHERE kind = 'dispatch'), 0) AS BIGINT) AS dispatch_ns,
                         CAST(coalesce(median(dur_ns) FILTER (WHERE kind = 'dispatch'), 0) AS BIGINT) AS med,
                         count(*) FILTER (WHERE kind = 'host_transfer') AS transfers,
                         CAST(coalesce(sum(CAST(detail::JSON->>'bytes' AS BIGINT))
                                       FILTER (WHERE kind = 'host_transfer'), 0) AS BIGINT) AS bytes,
                         CAST(coalesce(sum(dur_ns) FILTER (WHERE kind = 'host_transfer'), 0) AS BIGINT) AS tns,
                         count(*) FILTER (WHERE kind = 'host_transfer' AND detail::JSON->>'direction' = 'to_device')
                             AS writes,
                         CAST(coalesce(sum(CAST(detail::JSON->>'bytes' AS BIGINT))
                                       FILTER (WHERE kind = 'host_transfer'
                                                 AND detail::JSON->>'direction' = 'to_device'), 0) AS BIGINT) AS wb
                  FROM events WHERE kind IN ('dispatch', 'host_transfer')""").to_pylist()[0]
    return HostFigures(executions=ex["n"], eager_executions=ex["eager"], graphs=ex["graphs"],
                       ops_per_execution=round(float(ex["ops"]), 2), device_ns=ex["dev"],
                       dispatches=ev["dispatches"], dispatch_ns=ev["dispatch_ns"], dispatch_median_ns=ev["med"],
                       transfers=ev["transfers"], transfer_bytes=ev["bytes"], transfer_ns=ev["tns"],
                       writes=ev["writes"], write_bytes=ev["wb"])


def _bytes(n: int) -> str:
    return f"{n} B" if n < 1000 else f"{n / 1e3:.1f} KB" if n < 1e6 else f"{n / 1e6:.1f} MB"


def _runs(h: HostFigures) -> str:
    n = f"{h.executions} execution{'s' * (h.executions != 1)} of {h.graphs}"
    if h.ops_per_execution == 1.0:
        return f"{n} one-op graph{'s' * (h.graphs != 1)}"
    return f"{n} graph{'s' * (h.graphs != 1)}, {h.ops_per_execution:.1f} ops per execution"


def _dispatch(h: HostFigures) -> str:
    if not h.dispatches:   # a profile recorded before dispatch events existed, or no execution
        return "not recorded"
    return f"{h.dispatches} × {fmt_ns(h.dispatch_median_ns)} median ({fmt_ns(h.dispatch_ns)} total)"


def _transfers(h: HostFigures) -> str:
    """``26 (173.2 KB, 39.2 µs PCIe; 14 writes 98.3 KB, 12 reads 74.9 KB)``."""
    reads = h.transfers - h.writes
    split = (f"; {h.writes} write{'s' * (h.writes != 1)} {_bytes(h.write_bytes)}, {reads} read{'s' * (reads != 1)} "
             f"{_bytes(h.transfer_bytes - h.write_bytes)}" if h.transfers else "")
    return f"{h.transfers} ({_bytes(h.transfer_bytes)}, {fmt_ns(h.transfer_ns)} PCIe{split})"


def why(a: HostFigures, b: HostFigures, name_a: str = "A", name_b: str = "B") -> list[str]:
    """The gap between two profiles in words, one sentence each: fusion, device time, host dispatch,
    transfers. Example: ``why(host_figures(p), host_figures(q), "eager", "compiled")``."""
    if (a.executions, a.graphs, a.ops_per_execution) == (b.executions, b.graphs, b.ops_per_execution):
        runs = f"{name_a} ran {_runs(a)}; {name_b} the same"
    else:
        runs = f"{name_a} ran {_runs(a)}; {name_b} ran {_runs(b)}"
        lo, hi = sorted((a, b), key=lambda h: h.ops_per_execution)
        if lo.ops_per_execution and hi.ops_per_execution > lo.ops_per_execution:
            ratio = hi.ops_per_execution / lo.ops_per_execution
            runs += (f" (fusion: {name_a if hi is a else name_b} runs {ratio:.1f}× the ops per execution, "
                     f"{abs(a.executions - b.executions)} "
                     f"{'fewer' if hi.executions < lo.executions else 'more'} executions)")
    lines = [runs, f"device time {fmt_ns(a.device_ns)} → {fmt_ns(b.device_ns)}"]
    lines.append(f"host dispatch {_dispatch(a)} → {_dispatch(b)}" if a.dispatches or b.dispatches
                 else "no host dispatch recorded")
    same_t = (a.transfers, a.transfer_bytes, a.transfer_ns, a.writes, a.write_bytes) == \
        (b.transfers, b.transfer_bytes, b.transfer_ns, b.writes, b.write_bytes)
    lines.append(f"transfers unchanged: {_transfers(a)}" if same_t
                 else f"transfers {_transfers(a)} → {_transfers(b)}")
    return lines


def names(a: HostFigures, b: HostFigures) -> tuple[str, str]:
    """What to call the two sides: ``eager`` (every execution an eager op) and ``compiled``, or A and B
    when both are the same kind. Example: ``names(host_figures(p), host_figures(q))`` -> ('eager', 'compiled')."""
    def kind(h):
        return "eager" if h.executions and h.eager_executions == h.executions else "compiled"
    ka, kb = kind(a), kind(b)
    return (ka, kb) if ka != kb else ("A", "B")
