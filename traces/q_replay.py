"""Replay windows: what a finished profile recorded in one window of its projected clock.

``monitor.replay`` turns a :class:`ReplayWindow` into a neuron-monitor document; this module holds
every query behind it. An execution's busy part is ``[start, start + device time]``
(:data:`traces.store.DEVICE_NS_SQL`: host CPU-fallback time is not device time).

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

from traces.errors import TraceError
from traces.store import DEVICE_NS_SQL
from traces.vocab import MONITOR_ENGINES, busy_column

#: Latency percentiles of neuron-monitor's ``latency_stats``: (name, quantile).
PERCENTILES = (("p0", 0.0), ("p1", 0.01), ("p25", 0.25), ("p50", 0.5), ("p75", 0.75), ("p99", 0.99),
               ("p100", 1.0))
#: Event kinds a replay counts per window.
COUNTED_EVENTS = ("recompile", "cpu_fallback", "compile", "cache_hit", "error")


@dataclass(frozen=True)
class ReplayWindow:
    """Rows of one window ``[t0, t1)``; each list holds dicts (small: one per run × core or kind).

    ``busy``: per (run_id, core) device-busy ns, FLOPs and per-engine busy ns inside the window;
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


_ENGINE_COLS = ", ".join(f"coalesce({busy_column(e)}, 0) AS {e}" for e in MONITOR_ENGINES)
_ENGINE_SUMS = ", ".join(f"sum({e} * ov / dev) AS {e}" for e in MONITOR_ENGINES)
# Executions overlapping [t0, t1): the device-busy part [start, start + device time] inside the
# window, and the FLOPs and each engine's busy time scaled by the same share.
_BUSY_SQL = f"""
WITH d AS (SELECT *, {DEVICE_NS_SQL} AS dev FROM executions),
w AS (
  SELECT run_id, core, flops, dev,
         greatest(0, least(start_ns + dev, $t1) - greatest(start_ns, $t0))::DOUBLE AS ov, {_ENGINE_COLS}
  FROM d WHERE start_ns < $t1 AND start_ns + dev > $t0 AND dev > 0
)
SELECT run_id, core, sum(ov) AS busy_ns, sum(coalesce(flops, 0) * ov / dev) AS flops, {_ENGINE_SUMS}
FROM w GROUP BY run_id, core ORDER BY run_id, core
"""

_QUANTILES = [q for _, q in PERCENTILES]


def window(p, t0: int, t1: int) -> ReplayWindow:
    """See :meth:`traces.query.Profile.replay_window`."""
    params = {"t0": int(t0), "t1": int(t1)}
    busy = p.sql(_BUSY_SQL, params).to_pylist()
    finished = p.sql("""SELECT run_id, coalesce(status, 'completed') AS status, count(*) AS n
                        FROM executions WHERE end_ns >= $t0 AND end_ns < $t1 GROUP BY ALL""",
                     params).to_pylist()
    latency = {r["run_id"]: r for r in p.sql(f"""
        SELECT run_id, quantile_cont((end_ns - start_ns) / 1e9, {_QUANTILES}) AS total_latency,
               quantile_cont({DEVICE_NS_SQL} / 1e9, {_QUANTILES}) AS device_latency
        FROM executions WHERE end_ns >= $t0 AND end_ns < $t1 GROUP BY run_id""", params).to_pylist()}
    events = p.sql("""
        SELECT e.run_id, e.kind, count(*) FILTER (WHERE e.ts_ns >= $t0) AS recent,
               arg_max(e.detail, e.ts_ns) AS detail,
               arg_max(CASE WHEN s.file IS NULL THEN NULL ELSE s.file || ':' || s.line END, e.ts_ns) AS source
        FROM events e LEFT JOIN sources s USING (source_id)
        WHERE e.ts_ns < $t1 AND list_contains($kinds, e.kind) GROUP BY ALL""",
                   {**params, "kinds": list(COUNTED_EVENTS)}).to_pylist()
    memory = p.sql("""SELECT run_id, core, location, category, arg_max(bytes, ts_ns) AS bytes
                      FROM memory WHERE ts_ns < $t1 GROUP BY ALL""", {"t1": int(t1)}).to_pylist()
    loads = p.sql("""SELECT run_id, core, graph_id, detail, ts_ns FROM events
                     WHERE kind = 'load' AND ts_ns < $t1 ORDER BY ts_ns""", {"t1": int(t1)}).to_pylist()
    return ReplayWindow(int(t0), int(t1), busy, finished, latency, events, memory, loads)
