"""Replay windows: what a finished profile recorded in one window of its projected clock.

``monitor.replay`` turns a :class:`ReplayWindow` into a neuron-monitor document; this module holds
every query behind it. An execution's busy part is ``[start, start + device time]``
(:data:`traces.summary_sql.DEVICE_NS_SQL`: host CPU-fallback time is not device time).

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=3, instructions=200)
>>> with traces.open(d) as p:
...     lo, hi = p.replay_span()
...     w = p.replay_window(lo, hi + 1)
>>> sum(r["n"] for r in w.finished) == 3
True
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from traces.errors import TraceError
from traces.intervals import union_by
from traces.summary_sql import DEVICE_NS_SQL
from traces.vocab import MONITOR_ENGINES

#: Engines a replay window reports: the monitor's, and the CC engine's collectives (the live monitor
#: reports them from each collective's busy time).
REPLAY_ENGINES = (*MONITOR_ENGINES, "cc")

#: Latency percentiles of neuron-monitor's ``latency_stats``: (name, quantile).
PERCENTILES = (("p0", 0.0), ("p1", 0.01), ("p25", 0.25), ("p50", 0.5), ("p75", 0.75), ("p99", 0.99),
               ("p100", 1.0))
#: Event kinds a replay counts per window.
COUNTED_EVENTS = ("recompile", "cpu_fallback", "compile", "cache_hit", "error")


@dataclass(frozen=True)
class ReplayWindow:
    """Rows of one window ``[t0, t1)``; each list holds dicts (small: one per run × core or kind).

    ``busy``: per (run_id, core) device-busy ns (the union of the executions' device intervals, as
    :func:`traces.q_figures.core_busy`), their device time (``device_ns``, overlaps counted twice),
    FLOPs and per-engine active ns (:data:`REPLAY_ENGINES`; DMA: the union of its queues) inside the window;
    ``finished``: executions ending in it per (run_id, status); ``latency``: per run_id the total and
    device latency percentiles (s); ``events``: per (run_id, kind) events in it (``recent``) with the
    last detail and source line so far; ``memory``: the last sample per (run_id, core, location,
    category) so far; ``loads``: model loads so far.
    """

    t0: int
    t1: int
    busy: list
    finished: list
    latency: dict
    events: list
    memory: list
    loads: list


def runs(p) -> list[dict]:
    """Recorded processes, each active from its first recorded moment (a compile or load may come
    before the run's own start stamp) to its end."""
    return p.sql("""
        WITH first AS (
          SELECT run_id, min(t) AS t FROM (
            SELECT run_id, min(ts_ns) AS t FROM events GROUP BY ALL
            UNION ALL SELECT run_id, min(start_ns) FROM executions GROUP BY ALL
            UNION ALL SELECT run_id, min(ts_ns) FROM memory GROUP BY ALL) GROUP BY ALL)
        SELECT r.run_id, r.pid, r.tag, r.command, r.host, r.target,
               least(r.start_ns, first.t) AS start_ns, r.end_ns
        FROM runs r LEFT JOIN first USING (run_id)
        ORDER BY least(r.start_ns, first.t) NULLS LAST, r.run_id""").to_pylist()


def span(p) -> tuple[int, int]:
    """``(first, last)`` recorded moment over executions, events and memory samples (ns)."""
    row = p.sql("""
        SELECT min(t0) AS t0, max(t1) AS t1 FROM (
          SELECT min(start_ns) AS t0, max(end_ns) AS t1 FROM executions
          UNION ALL SELECT min(ts_ns), max(ts_ns + coalesce(dur_ns, 0)) FROM events
          UNION ALL SELECT min(ts_ns), max(ts_ns) FROM memory)""").to_pylist()[0]
    if row["t0"] is None:
        raise TraceError(f"profile {p.path} recorded no executions, events or memory samples: "
                         "nothing to replay")
    return int(row["t0"]), int(row["t1"])


class _Recorded:
    """What a replay reads, loaded once (small tables: executions, counted events, memory, loads) and
    sorted by time, so each window is a few ``searchsorted`` calls instead of six queries."""

    def __init__(self, p):
        # an engine's active time as the Summary counts it (exec_engine_summary: the union of a DMA
        # engine's overlapping queues, not the sum of their durations, which can pass 100 %)
        engines = ", ".join(f"coalesce(sum(s.active_ns) FILTER (WHERE s.engine = '{e}'), 0)::DOUBLE AS {e}"
                            for e in REPLAY_ENGINES)
        ex = p.sql(f"""WITH act AS (SELECT exec_id, {engines} FROM exec_engine_summary s GROUP BY exec_id)
                       SELECT run_id, core, start_ns, end_ns, {DEVICE_NS_SQL} AS dev,
                              coalesce(flops, 0)::DOUBLE AS flops, coalesce(status, 'completed') AS status,
                              {", ".join(f"coalesce(act.{e}, 0) AS {e}" for e in REPLAY_ENGINES)}
                       FROM executions LEFT JOIN act USING (exec_id)
                       ORDER BY start_ns, exec_id""").to_pylist()
        self.execs = ex
        self.start = np.array([r["start_ns"] for r in ex], dtype=np.int64)
        self.max_dev = max((r["dev"] or 0 for r in ex), default=0)
        by_end = sorted(ex, key=lambda r: r["end_ns"])
        self.by_end = by_end
        self.end = np.array([r["end_ns"] for r in by_end], dtype=np.int64)
        # the source of an event as neuron-top shows it: file:line
        self.events = p.sql("""
            SELECT e.run_id, e.kind, e.ts_ns, e.detail,
                   CASE WHEN s.file IS NULL THEN NULL ELSE s.file || ':' || s.line END AS source
            FROM events e LEFT JOIN sources s USING (source_id)
            WHERE list_contains($kinds, e.kind) ORDER BY e.ts_ns""", {"kinds": list(COUNTED_EVENTS)}).to_pylist()
        self.event_ts = np.array([r["ts_ns"] for r in self.events], dtype=np.int64)
        # neuron-monitor's categories (the hbm_usage rows split the same device bytes by the profiler's types)
        self.memory = p.sql("""SELECT run_id, core, location, category, bytes, ts_ns FROM memory
                               WHERE ts_ns IS NOT NULL AND location IN ('device', 'host') ORDER BY ts_ns""").to_pylist()
        self.memory_ts = np.array([r["ts_ns"] for r in self.memory], dtype=np.int64)
        self.loads = p.sql("""SELECT run_id, core, graph_id, detail, ts_ns FROM events
                              WHERE kind = 'load' AND ts_ns IS NOT NULL ORDER BY ts_ns""").to_pylist()
        self.load_ts = np.array([r["ts_ns"] for r in self.loads], dtype=np.int64)


def _recorded(p) -> _Recorded:
    cached = getattr(p, "_replay_recorded", None)
    if cached is None:
        cached = p._replay_recorded = _Recorded(p)
    return cached


_PARTS = pa.schema([("run_id", pa.string()), ("core", pa.int64()), ("start_ns", pa.int64()), ("dur_ns", pa.int64())])


def window(p, t0: int, t1: int) -> ReplayWindow:
    """See :meth:`traces.query.Profile.replay_window`."""
    d, t0, t1 = _recorded(p), int(t0), int(t1)
    # executions overlapping [t0, t1): the device-busy part [start, start + device time] inside the
    # window, and the FLOPs and each engine's active time scaled by the same share; a core's busy time
    # is the union of those parts (a collective beside the next compute execution counts once)
    busy: dict[tuple, dict] = {}
    parts = {"run_id": [], "core": [], "start_ns": [], "dur_ns": []}
    lo, hi = np.searchsorted(d.start, t0 - d.max_dev, "left"), np.searchsorted(d.start, t1, "left")
    for r in d.execs[lo:hi]:
        dev = r["dev"] or 0
        s0, s1 = max(r["start_ns"], t0), min(r["start_ns"] + dev, t1)
        if dev <= 0 or s1 <= s0:
            continue
        key = (r["run_id"], -1 if r["core"] is None else r["core"])
        row = busy.setdefault(key, {"run_id": r["run_id"], "core": r["core"], "busy_ns": 0.0, "device_ns": 0.0,
                                    "flops": 0.0, **dict.fromkeys(REPLAY_ENGINES, 0.0)})
        share = (s1 - s0) / dev
        row["device_ns"] += s1 - s0
        row["flops"] += r["flops"] * share
        for e in REPLAY_ENGINES:
            row[e] += r[e] * share
        for k, v in zip(parts, (*key, s0, s1 - s0)):
            parts[k].append(v)
    for u in union_by(pa.table(parts, schema=_PARTS), ("run_id", "core")).to_pylist():
        busy[(u["run_id"], u["core"])]["busy_ns"] = float(u["active_ns"])
    ended = d.by_end[np.searchsorted(d.end, t0, "left"):np.searchsorted(d.end, t1, "left")]
    finished: dict[tuple, int] = {}
    per_run: dict[str, list] = {}
    for r in ended:
        finished[(r["run_id"], r["status"])] = finished.get((r["run_id"], r["status"]), 0) + 1
        per_run.setdefault(r["run_id"], []).append(r)
    quantiles = [q for _, q in PERCENTILES]   # linear interpolation, as SQL's quantile_cont
    latency = {run: {"run_id": run,
                     "total_latency": np.quantile([(r["end_ns"] - r["start_ns"]) / 1e9 for r in rs],
                                                  quantiles).tolist(),
                     "device_latency": np.quantile([(r["dev"] or 0) / 1e9 for r in rs], quantiles).tolist()}
               for run, rs in per_run.items()}
    events: dict[tuple, dict] = {}
    for r in d.events[:np.searchsorted(d.event_ts, t1, "left")]:   # in time order: the last one wins
        row = events.setdefault((r["run_id"], r["kind"]), {"run_id": r["run_id"], "kind": r["kind"], "recent": 0,
                                                           "detail": None, "source": None})
        row["recent"] += r["ts_ns"] >= t0
        row["detail"] = r["detail"] if r["detail"] is not None else row["detail"]
        row["source"] = r["source"] if r["source"] is not None else row["source"]
    memory: dict[tuple, dict] = {}
    for r in d.memory[:np.searchsorted(d.memory_ts, t1, "left")]:  # the last sample of each category
        if r["bytes"] is not None:
            memory[(r["run_id"], r["core"], r["location"], r["category"])] = r
    loads = d.loads[:np.searchsorted(d.load_ts, t1, "left")]
    return ReplayWindow(t0, t1, sorted(busy.values(), key=lambda r: (r["run_id"], r["core"] is None, r["core"])),
                        [{"run_id": k[0], "status": k[1], "n": n} for k, n in finished.items()], latency,
                        list(events.values()), list(memory.values()), list(loads))
