"""The system profile, as the Explorer's System Trace page and the Perfetto export read it: framework,
runtime (``neuron_rt``) and hardware (``neuron_hw``) events with their instance / process / thread /
core ids, filtered by core, event type and instance (``view --system-trace-filter-*``), and the host
CPU, host memory and HBM series over time. Reads our raw tables (``system_events``, ``runs``,
``cpu_usage``, ``host_memory``, ``memory``), so a Parquet export answers too.

>>> import tempfile, traces
>>> d = tempfile.mkdtemp()
>>> with traces.Writer(d, run={"run_id": "r", "host": "i-1", "pid": 7}) as w:
...     w.append("system_events", {"ts_ns": [10], "dur_ns": [5], "name": ["nrt_execute"], "source": ["neuron_rt"],
...                                 "thread_id": [7], "core": [0]}, run_id="r")
>>> with traces.open(traces.finalize(d)) as p:
...     ev, more = events(p)
...     ev.column("instance_id").to_pylist(), more, facets(p)["names"]
(['i-1'], 0, ['nrt_execute'])
"""
from __future__ import annotations

import pyarrow as pa

#: At most this many events go to a page at once (the rest are counted, and a filter narrows them).
EVENT_CAP = 20_000

_EVENTS = """
SELECT s.name, s.ts_ns AS start_ns, s.dur_ns, s.source, r.host AS instance_id, r.pid AS process_id, s.thread_id,
       s.core AS nc_idx, s.exec_id, s.flow_id, s.detail, r.rank, r.node
FROM system_events AS s LEFT JOIN runs AS r USING (run_id)
WHERE ($cores IS NULL OR list_contains($cores, s.core))
  AND ($names IS NULL OR list_contains($names, s.name))
  AND ($instances IS NULL OR list_contains($instances, r.host))
"""


def _has(p) -> bool:
    return "system_events" in p.tables()


def events(p, cores: list[int] | None = None, names: list[str] | None = None,
           instances: list[str] | None = None, limit: int = EVENT_CAP) -> tuple[pa.Table, int]:
    """System events in time order (projected-clock ns) matching the filters (``None``: all), at most
    ``limit`` of them, and how many more matched."""
    if not _has(p):
        return pa.table({}), 0
    params = {"cores": cores or None, "names": names or None, "instances": instances or None}
    total = p.sql(f"SELECT count(*) AS n FROM ({_EVENTS})", params).column("n")[0].as_py()
    rows = p.sql(f"{_EVENTS} ORDER BY s.ts_ns LIMIT {int(limit)}", params)
    return rows, max(total - rows.num_rows, 0)


def facets(p) -> dict:
    """What the filters can choose: cores, event names, instances and sources present."""
    if not _has(p):
        return {"cores": [], "names": [], "instances": [], "sources": []}
    row = p.sql("SELECT list(DISTINCT s.core ORDER BY s.core) FILTER (WHERE s.core IS NOT NULL) AS cores, "
                "list(DISTINCT s.name ORDER BY s.name) AS names, "
                "list(DISTINCT r.host ORDER BY r.host) FILTER (WHERE r.host IS NOT NULL) AS instances, "
                "list(DISTINCT s.source ORDER BY s.source) AS sources "
                "FROM system_events AS s LEFT JOIN runs AS r USING (run_id)").to_pylist()[0]
    return {k: v or [] for k, v in row.items()}


def host_series(p) -> dict[str, pa.Table]:
    """``cpu``: average host CPU utilisation (%) over time; ``memory``: host memory used (bytes, %);
    ``hbm``: device memory in use (bytes, all cores) after each allocation change."""
    tables = set(p.tables())
    out = {"cpu": pa.table({}), "memory": pa.table({}), "hbm": pa.table({})}
    if "cpu_usage" in tables:
        out["cpu"] = p.sql("SELECT ts_ns, avg(util_percent) AS util_percent FROM cpu_usage "
                           "WHERE cpu_id = 'average' GROUP BY ts_ns ORDER BY ts_ns")
    if "host_memory" in tables:
        out["memory"] = p.sql("SELECT ts_ns, sum(used_bytes)::BIGINT AS used_bytes, max(used_percent) AS used_percent "
                              "FROM host_memory GROUP BY ts_ns ORDER BY ts_ns")
    if "memory" in tables:
        # memory rows hold each (core, category)'s bytes at a moment: the total moves by their changes
        out["hbm"] = p.sql("""
            WITH d AS (SELECT ts_ns, bytes - coalesce(lag(bytes) OVER (PARTITION BY run_id, core, category
                                                                      ORDER BY ts_ns), 0) AS delta
                       FROM memory WHERE location = 'device')
            SELECT ts_ns, (sum(sum(delta)) OVER (ORDER BY ts_ns))::BIGINT AS hbm_bytes FROM d
            GROUP BY ts_ns ORDER BY ts_ns""")
    return out


def execution_window(p, exec_id: int) -> tuple[int, int] | None:
    """``(start_ns, end_ns)`` of one execution (projected clock): the device timeline window an
    ``nc_exec_running`` event opens."""
    rows = p.sql("SELECT start_ns, end_ns FROM executions WHERE exec_id = ?", [int(exec_id)]).to_pylist()
    return (rows[0]["start_ns"], rows[0]["end_ns"]) if rows else None
