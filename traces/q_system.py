"""The system profile, as the Explorer's System Trace page and the Perfetto export read it: framework,
runtime (``neuron_rt``) and hardware (``neuron_hw``) events with their instance / process / thread /
core ids, filtered by core, event type and instance (``view --system-trace-filter-*``), and the host
CPU, host memory and HBM series over time.

The System Trace's level of detail (:func:`window`): events lie on tracks, one per run, source,
NeuronCore and thread (``system_tracks``); per track, a window's events are sent one by one when
there are at most :data:`PER_TRACK` of them, else the track's busy time and event count per cell,
read from the ``system_lod`` pyramid that finalise derives (``traces.intervals.track_pyramid``) by
the device timeline's rule (``q_timeline.lod_level``). Without the derived tables (a Parquet export)
the same answers come from the raw tables (``system_events``, ``runs``, ``cpu_usage``,
``host_memory``, ``memory``).

>>> import tempfile, traces
>>> d = tempfile.mkdtemp()
>>> with traces.Writer(d, run={"run_id": "r", "host": "i-1", "pid": 7}) as w:
...     w.append("system_events", {"ts_ns": [10], "dur_ns": [5], "name": ["nrt_execute"], "source": ["neuron_rt"],
...                                 "thread_id": [7], "core": [0]}, run_id="r")
>>> with traces.open(traces.finalize(d)) as p:
...     w = window(p, 0, 100, buckets=10)
...     w.events.column("instance_id").to_pylist(), w.summarised, w.count.tolist(), facets(p)["names"]
(['i-1'], 0, [[0, 1, 0, 0, 0, 0, 0, 0, 0, 0]], ['nrt_execute'])
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from traces.intervals import bucket_busy, merge_intervals
from traces.q_timeline import lod_level
from traces.store import SYSTEM_TRACKS_SQL

#: A track's events in a window are sent one by one only when it holds at most this many; else
#: the track is drawn as cells. Each track has its own budget: no track starves another.
PER_TRACK = 1000

def _has(p) -> bool:
    return "system_events" in _tables(p)


def _tables(p) -> set[str]:
    """The profile's tables, asked once (a profile never changes)."""
    if getattr(p, "_system_tables", None) is None:
        p._system_tables = set(p.tables())
    return p._system_tables


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
    ``hbm``: device memory in use (bytes, all cores) after each allocation change; ``hbm_category``: the same
    by category (``memory.category``: tensors, constants, model_code, ...; columns ts_ns, category, hbm_bytes),
    the real System Trace's HBM by category."""
    tables = set(p.tables())
    out = {"cpu": pa.table({}), "memory": pa.table({}), "hbm": pa.table({}), "hbm_category": pa.table({})}
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
        out["hbm_category"] = p.sql("""
            WITH d AS (SELECT ts_ns, category, bytes - coalesce(lag(bytes) OVER (PARTITION BY run_id, core, category
                                                                                ORDER BY ts_ns), 0) AS delta
                       FROM memory WHERE location = 'device')
            SELECT ts_ns, category, (sum(sum(delta)) OVER (PARTITION BY category ORDER BY ts_ns))::BIGINT AS hbm_bytes
            FROM d GROUP BY ts_ns, category ORDER BY category, ts_ns""")
    return out


def execution_window(p, exec_id: int) -> tuple[int, int] | None:
    """``(start_ns, end_ns)`` of one execution (projected clock): the device timeline window an
    ``nc_exec_running`` event opens."""
    rows = p.sql("SELECT start_ns, end_ns FROM executions WHERE exec_id = ?", [int(exec_id)]).to_pylist()
    return (rows[0]["start_ns"], rows[0]["end_ns"]) if rows else None


_TRACK_COLS = """t.track, t.h, r.host AS instance_id, r.pid AS process_id, t.source, t.core AS nc_idx, t.thread_id,
                 t.events AS total_events, t.max_dur_ns, t.first_ns, t.last_ns"""


def tracks(p, cores: list[int] | None = None, names: list[str] | None = None,
           instances: list[str] | None = None) -> pa.Table:
    """The System Trace's tracks (one per run, source, NeuronCore and thread) that the filters keep, with
    their instance and process, event count, longest event and extent; read from ``system_tracks``
    (derived at finalise) or, in a profile without it, computed on the fly."""
    if not _has(p):
        return pa.table({})
    return p.sql(f"""
        SELECT {_TRACK_COLS} FROM {_source(p)} AS t LEFT JOIN runs AS r USING (run_id)
        WHERE ($cores IS NULL OR list_contains($cores, t.core))
          AND ($instances IS NULL OR list_contains($instances, r.host))
          AND ($names IS NULL OR t.h IN (SELECT DISTINCT hash(run_id, source, core, thread_id) FROM system_events
                                         WHERE list_contains($names, name)))
        ORDER BY t.track""", {"cores": cores or None, "names": names or None, "instances": instances or None})


def extent(p) -> tuple[int, int] | None:
    """First start and last end of the system events (absolute ns), or None without any."""
    t = tracks(p)
    if not t.num_rows:
        return None
    return int(min(t["first_ns"].to_pylist())), max(int(max(t["last_ns"].to_pylist())),
                                                    int(min(t["first_ns"].to_pylist())) + 1)


@dataclass(frozen=True)
class SystemWindow:
    """What the System Trace draws for ``[t0, t1)`` (absolute ns) on a grid of ``buckets`` cells.

    ``tracks``: the filtered tracks (:func:`tracks`) plus ``events`` (how many of its events overlap
    the window; from the pyramid, to its bucket, at most 1/16 of a cell) and ``exact`` (drawn one by
    one: at most ``per_track``); ``busy`` (ns the track's events cover, nesting counted once) and
    ``count`` (events starting in the cell; cell 0 for those that started before the window)
    are ``(tracks, buckets)`` arrays; ``events``: the exact tracks' events overlapping the window, in
    time order (the columns of :func:`events` plus ``track``); ``source``: what the cells were read
    from (``system_lod level k`` or ``system_events``).
    """

    t0: int
    t1: int
    buckets: int
    tracks: pa.Table
    busy: np.ndarray
    count: np.ndarray
    events: pa.Table
    source: str

    @property
    def width(self) -> float:
        return (self.t1 - self.t0) / self.buckets

    @property
    def summarised(self) -> int:
        """Events in the window on tracks drawn as cells, not one by one."""
        n, exact = self.tracks["events"].to_numpy(), self.tracks["exact"].to_numpy(zero_copy_only=False)
        return int(n[~exact].sum()) if len(n) else 0


def window(p, t0: int, t1: int, buckets: int, cores: list[int] | None = None, names: list[str] | None = None,
           instances: list[str] | None = None, per_track: int = PER_TRACK) -> SystemWindow:
    """The System Trace's level of detail for ``[t0, t1)``: per track, its events one by one when the
    window holds at most ``per_track`` of them, else busy and count cells on an exact grid of
    ``buckets``. Cells come from the ``system_lod`` pyramid level whose buckets are at most 1/16 of
    a cell (the device timeline's rule, ``q_timeline.lod_level``), else (a finer window, an event-type
    filter, a profile without the pyramid) from the events themselves.

    Example: ``w = p.system_window(t0, t1, 600); w.tracks, w.events, w.summarised``.
    """
    t0, t1, buckets = int(t0), int(t1), max(int(buckets), 1)
    tr = tracks(p, cores, names, instances)
    n_tracks = tr.num_rows
    empty = np.zeros((n_tracks, buckets))
    if not n_tracks or t1 <= t0:
        if n_tracks:
            tr = tr.append_column("events", pa.array(np.zeros(n_tracks, np.int64)))
            tr = tr.append_column("exact", pa.array(np.ones(n_tracks, bool)))
        return SystemWindow(t0, t1, buckets, tr, empty, empty.astype(np.int64), pa.table({}), "system_events")
    meta = p.metadata()
    level = None
    if not names and "system_lod" in _tables(p) and meta.get("system_lod_base_level"):
        level = lod_level((t1 - t0) / buckets, int(meta["system_lod_base_level"]), int(meta["system_lod_top_level"]))
    ids = tr["track"].to_numpy()
    row_of = np.full(int(ids.max()) + 1, -1)
    row_of[ids] = np.arange(n_tracks)
    if level is not None:
        rows = p.sql("""SELECT track, bucket, busy_ns, events FROM system_lod
                        WHERE level = $lvl AND bucket BETWEEN $blo AND $bhi AND list_contains($tracks, track)""",
                     {"tracks": ids.tolist(), "lvl": level, "blo": t0 >> level, "bhi": (t1 - 1) >> level})
        lane = row_of[rows["track"].to_numpy()]
        s = (rows["bucket"].to_numpy() << level) - t0
        e = s + (1 << level)
        # a pyramid bucket's busy time is spread evenly over it: a cell is off by at most 1/16 at an edge
        busy = bucket_busy(lane, s, e, rows["busy_ns"].to_numpy().astype(float), n_tracks, t1 - t0, buckets)
        n = rows["events"].to_numpy()
        source = f"system_lod level {level}"
    else:
        rows = _overlapping(p, tr, t0, t1, names, "t.track, s.ts_ns, s.ts_ns + greatest(coalesce(s.dur_ns, 0), 0) AS e")
        lane = row_of[rows["track"].to_numpy()]
        s, e = rows["ts_ns"].to_numpy() - t0, rows["e"].to_numpy() - t0
        mt, ms, me = merge_intervals(lane, s, e)   # a thread's nested spans cover their time once
        busy = bucket_busy(mt, ms, me, (me - ms).astype(float), n_tracks, t1 - t0, buckets)
        n = np.ones(rows.num_rows, np.int64)
        source = "system_events"
    # an event (or pyramid bucket) is counted in the cell where it starts (cell 0 if before the window)
    cell = np.clip(np.floor(np.maximum(s, 0) / ((t1 - t0) / buckets)), 0, buckets - 1).astype(np.int64)
    ok = (lane >= 0) & (s < t1 - t0)   # the queries above read only what overlaps the window
    count = np.bincount(lane[ok] * buckets + cell[ok], weights=n[ok], minlength=n_tracks * buckets)
    count = np.rint(count).astype(np.int64).reshape(n_tracks, buckets)
    exact = count.sum(axis=1) <= per_track
    tr = tr.append_column("events", pa.array(count.sum(axis=1))).append_column("exact", pa.array(exact))
    ev = _exact(p, tr.filter(pa.array(exact)), t0, t1, names, per_track)
    return SystemWindow(t0, t1, buckets, tr, busy, count, ev, source)


def _source(p) -> str:
    return "system_tracks" if "system_tracks" in _tables(p) else f"({SYSTEM_TRACKS_SQL})"


def _overlapping(p, tr: pa.Table, t0: int, t1: int, names, columns: str, limit: int | None = None) -> pa.Table:
    """``columns`` of the events of tracks ``tr`` overlapping ``[t0, t1)`` (``t``: the track, ``s``: the
    event, ``r``: its run); with ``limit``, the first ``limit`` per track."""
    # events are stored in start order: the start bound alone lets zone maps skip the row groups after t1
    # (and before t0 less the tracks' longest event)
    lo = t0 - int(max(tr["max_dur_ns"].to_pylist() or [0]))
    cap = "QUALIFY row_number() OVER (PARTITION BY t.track ORDER BY s.ts_ns) <= $limit" if limit else ""
    return p.sql(f"""
        SELECT {columns} FROM system_events AS s
        JOIN {_source(p)} AS t ON hash(s.run_id, s.source, s.core, s.thread_id) = t.h
        LEFT JOIN runs AS r ON r.run_id = s.run_id
        WHERE list_contains($tracks, t.track) AND s.ts_ns < $t1 AND s.ts_ns >= $lo
          AND s.ts_ns + greatest(coalesce(s.dur_ns, 0), 0) >= $t0
          AND ($names IS NULL OR list_contains($names, s.name)) {cap}""",
                 {"tracks": tr["track"].to_pylist(), "t0": t0, "t1": t1, "lo": lo,
                  "names": names or None, **({"limit": int(limit)} if limit else {})})


def _exact(p, tr: pa.Table, t0: int, t1: int, names, per_track: int) -> pa.Table:
    """The events of tracks ``tr`` overlapping the window, at most ``per_track`` each, in time order."""
    if not tr.num_rows:
        return pa.table({})
    cols = ("t.track, s.name, s.ts_ns AS start_ns, s.dur_ns, s.source, r.host AS instance_id, r.pid AS process_id, "
            "s.thread_id, s.core AS nc_idx, s.exec_id, s.flow_id, s.detail IS NOT NULL AS has_detail")
    rows = _overlapping(p, tr, t0, t1, names, cols, per_track)
    return rows.sort_by([("start_ns", "ascending")]) if rows.num_rows else rows


def event_at(p, track: int, start_ns: int, name: str) -> dict | None:
    """One event of the System Trace by track, start (absolute ns) and name, with its ``detail``
    (the columns of :func:`events` plus ``track``), or None."""
    rows = p.sql(f"""
        SELECT t.track, s.name, s.ts_ns AS start_ns, s.dur_ns, s.source, r.host AS instance_id,
               r.pid AS process_id, s.thread_id, s.core AS nc_idx, s.exec_id, s.flow_id, s.detail
        FROM system_events AS s JOIN {_source(p)} AS t ON hash(s.run_id, s.source, s.core, s.thread_id) = t.h
        LEFT JOIN runs AS r ON r.run_id = s.run_id
        WHERE t.track = $track AND s.ts_ns = $ts AND s.name = $name LIMIT 1""",
                 {"track": int(track), "ts": int(start_ns), "name": str(name)}).to_pylist() if _has(p) else []
    return rows[0] if rows else None
