"""Timeline questions: level of detail, lanes, instructions and spans in a window, range aggregates.

All times here are absolute ns on the profile's projected clock; callers (the Explorer) shift them.

The one level-of-detail rule (:func:`lod_level`): a window cut into buckets of ``w`` ns reads the
``lod_busy`` pyramid level whose buckets are at most ``w / 16`` wide, and re-buckets it exactly
onto the caller's grid (a pyramid bucket cut by a grid edge is shared in proportion, so a cell is
off by at most 1/16 of a bucket at each edge); where no level is that fine it reads the raw
instructions, split exactly at every edge. The grid is always the one asked for.

>>> lod_level(width_ns=16 * 2**14, base=12, top=20)
14
>>> lod_level(width_ns=1000, base=12, top=20) is None
True

The one window rule (:func:`fit_window` over :func:`busy_extent`): a timeline opens on the busy
executions (from the first measured one, as many as keep the window at least ``FIT_MIN_BUSY`` busy,
plus ``FIT_MARGIN`` of their extent on each side), not on the whole session, where a profile's
compiles can be ten thousand times longer than its device work, nor on 38 executions of 20 µs
spread over 1.9 s of host work; a profile with no execution opens on the whole session.

>>> busy_extent([(0, 20), (20, 40), (1_000_000, 1_000_020)])
(0, 40)
>>> fit_window(2_000_000, 2_100_000, session=(0, 3_000_000))
(1998000, 2102000)
>>> fit_window(None, None, session=(0, 3_000_000))
(0, 3000000)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from traces.errors import TraceError
from traces.intervals import bucket_busy, longest_per_cell
from traces.vocab import HOST_TRANSFER_QUEUE

#: A zoomed-out query reads the pyramid level whose buckets are at most 1/16 of its own bucket.
LOD_OVERSAMPLE = 16
#: The fitted window's margin on each side, as a fraction of the executions' extent: enough to see
#: where the first execution starts and the last ends against the lanes' edges.
FIT_MARGIN = 0.02
#: The fitted window holds the most executions (from the first) that keep it at least this busy: ten
#: back-to-back steps stay together, one step per second of host work opens on the first step alone.
FIT_MIN_BUSY = 0.10
#: Executions the fit reads (in start order): a bound on the query, far more than a screen shows.
FIT_MAX_EXECUTIONS = 100_000

UTILIZATION_SCHEMA = pa.schema([("bucket", pa.int64()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                                ("core", pa.int32()), ("engine", pa.string()), ("busy_ns", pa.float64()),
                                ("utilization", pa.float64())])


def lod_level(width_ns: float, base: int, top: int) -> int | None:
    """The pyramid level a bucket of ``width_ns`` reads, or None for raw instructions (the one rule)."""
    if width_ns < LOD_OVERSAMPLE:
        return None
    level = min(top, math.floor(math.log2(width_ns / LOD_OVERSAMPLE)))
    return level if level >= base else None


def fit_window(first_start: int | None, last_end: int | None, session: tuple[int, int]) -> tuple[int, int]:
    """The window a timeline opens on: the executions with a margin, inside ``session`` (the one rule).

    ``first_start``/``last_end``: the first execution's start and the last one's end (None without
    executions: the whole ``session``). All absolute ns.
    """
    lo, hi = session
    if first_start is None or last_end is None:
        return lo, hi
    margin = max(1, round((last_end - first_start) * FIT_MARGIN))
    a, b = max(lo, first_start - margin), min(hi, last_end + margin)
    return (a, b) if b > a else (lo, hi)


def busy_extent(spans) -> tuple[int, int] | None:
    """``(start, end)`` of the busy executions: from the first of ``spans`` (``(start, end)`` pairs in start
    order), the most of them whose summed duration keeps the window at least ``FIT_MIN_BUSY`` busy (the
    one rule; None without spans). Example: ``busy_extent([(0, 20), (10**6, 10**6 + 20)]) == (0, 20)``."""
    if not spans:
        return None
    first = spans[0][0]
    best, busy, end = spans[0][1], 0, first
    for s, e in spans:
        busy += max(e - s, 0)
        end = max(end, e)
        if busy >= FIT_MIN_BUSY * max(end - first, 1):
            best = end
    return first, max(best, first + 1)


@dataclass(frozen=True)
class Bounds:
    """What a timeline spans: ``t0``/``t1`` cover executions, events and instructions (absolute ns);
    ``fit_t0``/``fit_t1`` is the window it opens on (:func:`fit_window`)."""

    t0: int
    t1: int
    instructions: int
    max_dur: int
    fit_t0: int
    fit_t1: int

    @property
    def span(self) -> int:
        return max(self.t1 - self.t0, 1)

    @property
    def fit(self) -> tuple[int, int]:
        return self.fit_t0, self.fit_t1


@dataclass(frozen=True)
class LaneCells:
    """Busy time per lane on an exact grid of ``buckets`` cells over ``[t0, t1)``.

    ``lanes``: Arrow table (core, engine, queue; queue only for DMA when ``by_queue``); ``busy``,
    ``count`` (instructions starting in the cell) and ``top_op`` (op of the longest instruction;
    -1 where unknown: the pyramid keeps no ops) are ``(lanes, buckets)`` numpy arrays; ``source``
    says what was read (``lod_busy level k`` or ``instructions``).
    """

    t0: int
    t1: int
    buckets: int
    lanes: pa.Table
    busy: np.ndarray
    count: np.ndarray
    top_op: np.ndarray
    source: str

    @property
    def width(self) -> float:
        return (self.t1 - self.t0) / self.buckets


def bounds(p) -> Bounds:
    """First and last recorded moment (executions, events, instructions) and instruction statistics."""
    row = p.sql("""
        SELECT min(s) AS t0, max(e) AS t1 FROM (
          SELECT min(start_ns) s, max(end_ns) e FROM executions
          UNION ALL SELECT min(ts_ns), max(ts_ns + greatest(coalesce(dur_ns, 0), 0)) FROM events
          UNION ALL SELECT min(start_ns), max(start_ns + dur_ns) FROM instructions)""").to_pylist()[0]
    stats = p.sql("SELECT count(*) AS n, coalesce(max(dur_ns), 0) AS maxdur FROM instructions").to_pylist()[0]
    t0 = int(row["t0"]) if row["t0"] is not None else 0
    t1 = max(int(row["t1"]) if row["t1"] is not None else t0, t0 + 1)
    fit = fit_window(*(busy_extent(execution_spans(p)) or (None, None)), (t0, t1))
    return Bounds(t0, t1, int(stats["n"]), int(stats["maxdur"]), *fit)


def execution_spans(p, graph_ids=None) -> list[tuple[int, int]]:
    """``(start_ns, end_ns)`` of the executions (of ``graph_ids`` when given) in start order: the measured
    ones when there are any (a warm-up's compile gap would hide the steps), at most ``FIT_MAX_EXECUTIONS``.
    Example: ``execution_spans(p, graph_ids=[3])[:1]``."""
    where, params = "", [FIT_MAX_EXECUTIONS]
    if graph_ids is not None:
        where, params = "WHERE list_contains(?, graph_id)", [[int(g) for g in graph_ids], FIT_MAX_EXECUTIONS]
    rows = p.sql(f"""SELECT start_ns, end_ns, coalesce(warmup, FALSE) AS warmup FROM executions {where}
                     ORDER BY warmup, start_ns LIMIT ?""", params).to_pylist()
    measured = [(r["start_ns"], r["end_ns"]) for r in rows if not r["warmup"]]
    return sorted(measured or [(r["start_ns"], r["end_ns"]) for r in rows])


def graph_fit(p, graph_ids) -> tuple[int, int] | None:
    """The window a timeline opens on for the executions of ``graph_ids`` (the one rule, :func:`busy_extent`
    then :func:`fit_window`), or None when none ran. Example: ``graph_fit(p, [3])``."""
    extent = busy_extent(execution_spans(p, graph_ids))
    if extent is None:
        return None
    b = p.timeline_bounds()
    return fit_window(*extent, (b.t0, b.t1))


def ops_extent(p, op_ids) -> tuple[int, int] | None:
    """``(first start, last end)`` ns of the instructions of ``op_ids`` in the measured executions (all of
    them when none is measured: a warm-up only run), or None when none ran.
    Example: ``ops_extent(p, [4, 5])``."""
    ids = [int(o) for o in op_ids]
    if not ids:
        return None
    rows = p.sql("""SELECT coalesce(x.warmup, FALSE) AS warmup, min(i.start_ns) AS a, max(i.start_ns + i.dur_ns) AS b
                    FROM instructions i LEFT JOIN executions x USING (exec_id)
                    WHERE list_contains($ids, i.op_id) GROUP BY 1 ORDER BY 1""", {"ids": ids}).to_pylist()
    return (rows[0]["a"], rows[0]["b"]) if rows else None


def lane_filter(core, engine) -> tuple[str, dict]:
    """SQL condition (parameters only) for ``core`` / ``engine``: one value or a list each."""
    where, params = "", {}
    if core is not None:
        cores = [core] if isinstance(core, int) else list(core)
        where += " AND list_contains($cores, core)"
        params["cores"] = [int(c) for c in cores]
    if engine is not None:
        engines = [engine] if isinstance(engine, str) else list(engine)
        where += " AND list_contains($engines, engine)"
        params["engines"] = [str(e) for e in engines]
    return where, params


def lane_cells(p, t0: int, t1: int, buckets: int, core=None, engine=None, by_queue: bool = True,
               dma_queues_only: bool = False) -> LaneCells:
    """Busy time, instruction count and top op per lane and bucket over ``[t0, t1)`` (see module doc).

    ``by_queue``: DMA (and, unless ``dma_queues_only``, every engine) split by queue.
    """
    rng = p.trace_range()
    queue_col = None
    if by_queue:
        queue_col = "CASE WHEN engine = 'dma' THEN queue END" if dma_queues_only else "queue"
    lane_cols = ["core", "engine"] + (["queue"] if by_queue else [])
    lane_exprs = ["core", "engine"] + ([f"{queue_col} AS queue"] if by_queue else [])
    key = f"hash(core, engine{', ' + queue_col if by_queue else ''})"
    schema = pa.schema([("core", pa.int32()), ("engine", pa.string())]
                       + ([("queue", pa.string())] if by_queue else []))
    empty = np.zeros((0, buckets))
    if rng is None:
        return LaneCells(t0, t1, buckets, schema.empty_table(), empty, empty, empty.astype(np.int64),
                         "instructions")
    width = (t1 - t0) / buckets
    meta = p.metadata()
    base, top = int(meta.get("lod_base_level", 0)), int(meta.get("lod_top_level", 0))
    level = lod_level(width, base, top)
    where, params = lane_filter(core, engine)
    lanes = p.sql(f"SELECT DISTINCT {', '.join(lane_exprs)}, {key} AS h FROM lod_busy "
                  f"WHERE level = $top {where} ORDER BY ALL", {**params, "top": top})
    if level is not None:
        # a pyramid bucket is clipped to the trace's extent first: no busy time lies outside it
        params.update(lvl=level, bw=1 << level, blo=t0 >> level, bhi=(t1 - 1) >> level,
                      tlo=rng[0], thi=rng[1])
        rows = p.sql(f"SELECT {key} AS h, greatest(bucket * $bw, $tlo) AS s, "
                     f"least((bucket + 1) * $bw, $thi) AS e, "
                     f"busy_ns AS busy, instructions AS n, -1::BIGINT AS op "
                     f"FROM lod_busy WHERE level = $lvl AND bucket BETWEEN $blo AND $bhi {where}", params)
        source = f"lod_busy level {level}"
    else:
        max_dur = int(meta.get("max_instruction_dur_ns") or 0)
        # the start_ns range alone selects candidates, so zone maps skip the other row groups
        params.update(t1=t1, lo=t0 - max_dur, t0=t0)
        rows = p.sql(f"SELECT {key} AS h, start_ns AS s, start_ns + dur_ns AS e, dur_ns AS busy, 1 AS n, "
                     f"coalesce(op_id, -1) AS op FROM instructions "
                     f"WHERE start_ns < $t1 AND start_ns >= $lo AND start_ns + dur_ns > $t0 {where}", params)
        source = "instructions"
    lane_h = lanes["h"].to_numpy()
    order = np.argsort(lane_h)
    h = rows["h"].to_numpy()
    if len(order):
        pos = np.minimum(np.searchsorted(lane_h[order], h), len(order) - 1)
        lane = np.where(lane_h[order][pos] == h, order[pos], -1)
    else:
        lane = np.full(len(h), -1)
    s, e = rows["s"].to_numpy() - t0, rows["e"].to_numpy() - t0
    n_lanes = lanes.num_rows
    busy = bucket_busy(lane, s, e, rows["busy"].to_numpy(), n_lanes, t1 - t0, buckets)
    # counts and top op: an instruction (or pyramid bucket) belongs to the cell where it starts
    cell = np.clip(np.floor(np.maximum(s, 0) / width), 0, buckets - 1).astype(np.int64)
    ok = (lane >= 0) & (e > 0) & (s < t1 - t0)
    flat = lane[ok] * buckets + cell[ok]
    count = np.bincount(flat, weights=rows["n"].to_numpy()[ok], minlength=n_lanes * buckets)
    count = count.reshape(n_lanes, buckets)
    top_op = np.full(n_lanes * buckets, -1, dtype=np.int64)
    if level is None:
        top_op = longest_per_cell(flat, rows["busy"].to_numpy()[ok], rows["op"].to_numpy()[ok], n_lanes * buckets)
    return LaneCells(t0, t1, buckets, lanes.select(lane_cols), busy, count.astype(np.int64),
                     top_op.reshape(n_lanes, buckets), source)


def utilization(p, t0=None, t1=None, buckets: int = 1000, core=None, engine=None,
                by_queue: bool = False) -> pa.Table:
    """See :meth:`traces.query.Profile.utilization`."""
    if not isinstance(buckets, int) or buckets < 1:
        raise TraceError(f"buckets must be a positive integer, not {buckets!r}")
    rng = p.trace_range()
    schema = UTILIZATION_SCHEMA
    if by_queue:
        schema = schema.insert(5, pa.field("queue", pa.string()))
    if rng is None:
        return schema.empty_table()
    t0 = rng[0] if t0 is None else int(t0)
    t1 = rng[1] if t1 is None else int(t1)
    if t1 <= t0:
        raise TraceError(f"empty time range [{t0}, {t1}): t1 must be greater than t0")
    if max(abs(t0), abs(t1)) >= 1 << 62:  # beyond year 2116 in ns: int64 arithmetic below would wrap
        raise TraceError(f"time range [{t0}, {t1}) lies beyond ±2**62 ns: pass times in ns on the profile's "
                         "clock (or re-finalise a damaged profile from its segments)")
    cells = lane_cells(p, t0, t1, buckets, core, engine, by_queue=by_queue)
    width = cells.width
    k = np.arange(buckets, dtype=np.int64)
    edges = t0 + np.floor(np.arange(buckets + 1) * width).astype(np.int64)
    edges[-1] = t1
    n = cells.lanes.num_rows
    columns = {"bucket": np.tile(k, n), "start_ns": np.tile(edges[:-1], n), "end_ns": np.tile(edges[1:], n)}
    for col in cells.lanes.column_names:
        columns[col] = pa.array(cells.lanes[col].to_numpy(zero_copy_only=False).repeat(buckets)
                                if n else [], type=schema.field(col).type)
    columns["busy_ns"] = cells.busy.reshape(-1)
    columns["utilization"] = cells.busy.reshape(-1) / width
    return pa.table({f.name: columns[f.name] for f in schema}, schema=schema)


def _window(t0: int, t1: int, max_dur: int) -> tuple[str, dict]:
    return ("start_ns < $t1 AND start_ns >= $lo AND start_ns + dur_ns > $t0",
            {"t0": int(t0), "t1": int(t1), "lo": int(t0) - int(max_dur)})


def window_count(p, t0: int, t1: int) -> int:
    """How many instructions overlap ``[t0, t1)``."""
    cond, params = _window(t0, t1, p.timeline_bounds().max_dur)
    return int(p.sql(f"SELECT count(*) AS n FROM instructions WHERE {cond}", params)["n"][0].as_py())


def window_instructions(p, t0: int, t1: int, limit: int) -> pa.Table:
    """At most ``limit`` instructions overlapping ``[t0, t1)`` in start order (the timeline's columns)."""
    cond, params = _window(t0, t1, p.timeline_bounds().max_dur)
    return p.sql(f"""SELECT start_ns, dur_ns, core, engine, queue, opcode, op_id, pc, flops, bytes_read,
                            bytes_written, sem_wait_ns
                     FROM instructions WHERE {cond} ORDER BY start_ns LIMIT $limit""",
                 {**params, "limit": int(limit)})


def selected_counts(p, t0: int, t1: int, buckets: int, op_ids) -> pa.Table:
    """Per lane (DMA by queue) and grid cell: how many instructions of ``op_ids`` start there."""
    cond, params = _window(t0, t1, p.timeline_bounds().max_dur)
    params.update(w=(t1 - t0) / buckets, nb=buckets - 1, ids=sorted(int(i) for i in op_ids))
    return p.sql(f"""SELECT core, engine, CASE WHEN engine = 'dma' THEN queue END AS queue,
                            least(greatest(CAST(floor((start_ns - $t0) / $w) AS BIGINT), 0), $nb) AS bucket,
                            count(*) AS n
                     FROM instructions WHERE {cond} AND list_contains($ids, op_id) GROUP BY ALL""", params)


def lanes(p) -> pa.Table:
    """Every (core, engine, DMA queue) lane with instructions, each executing core (engine NULL), and each
    core's host<->device copies (engine ``dma``, queue :data:`~traces.vocab.HOST_TRANSFER_QUEUE`)."""
    top = int(p.metadata().get("lod_top_level", 0) or 0)
    return p.sql("""SELECT DISTINCT core, engine, CASE WHEN engine = 'dma' THEN queue END AS queue
                    FROM lod_busy WHERE level = $top
                    UNION SELECT DISTINCT core, NULL, NULL FROM executions WHERE core IS NOT NULL
                    UNION SELECT DISTINCT core, 'dma', $hq FROM events
                          WHERE kind = 'host_transfer' AND core IS NOT NULL
                    ORDER BY ALL""", {"top": top, "hq": HOST_TRANSFER_QUEUE})


def spans(p, t0: int, t1: int, cap: int) -> tuple[pa.Table, pa.Table]:
    """Executions and host/compile events overlapping ``[t0, t1)``: at most ``cap`` of each, longest kept.
    An event's ``core`` places a ``host_transfer`` on that core's :data:`~traces.vocab.HOST_TRANSFER_QUEUE` lane."""
    params = {"t0": int(t0), "t1": int(t1), "cap": int(cap)}
    ex = p.sql("""
        SELECT e.core, e.start_ns, e.end_ns - e.start_ns AS dur, coalesce(g.name, 'graph') AS name,
               e.exec_id AS id, e.status, e.warmup, e.iteration, e.device_ns, e.graph_id
        FROM executions e LEFT JOIN graphs g USING (graph_id)
        WHERE e.start_ns < $t1 AND e.end_ns > $t0 ORDER BY e.end_ns - e.start_ns DESC LIMIT $cap""", params)
    ev = p.sql("""
        SELECT kind, ts_ns AS start_ns, greatest(coalesce(dur_ns, 0), 0) AS dur, op_id, graph_id, source_id,
               detail, core
        FROM events
        WHERE kind IN ('compile', 'recompile', 'cache_hit', 'cpu_fallback', 'host_transfer')
          AND ts_ns < $t1 AND ts_ns + greatest(coalesce(dur_ns, 0), 0) >= $t0
        ORDER BY dur_ns DESC LIMIT $cap""", params)
    return ex, ev


def span_count(p, t0: int, t1: int) -> int:
    """How many spans :func:`spans` would return without its cap (executions plus host/compile events)."""
    params = {"t0": int(t0), "t1": int(t1)}
    return int(p.sql("""
        SELECT (SELECT count(*) FROM executions WHERE start_ns < $t1 AND end_ns > $t0)
             + (SELECT count(*) FROM events
                WHERE kind IN ('compile', 'recompile', 'cache_hit', 'cpu_fallback', 'host_transfer')
                  AND ts_ns < $t1 AND ts_ns + greatest(coalesce(dur_ns, 0), 0) >= $t0) AS n""",
                     params).column(0)[0].as_py())


def instruction_at(p, core: int, engine: str, start_ns: int, pc: int | None = None) -> dict | None:
    """One instruction by lane and absolute start time (the row with ``pc`` first)."""
    # schema 1.1: an NKI kernel's instructions name their kernel line (absent in older profiles)
    nki = p.sql("""SELECT count(*) AS n FROM information_schema.columns
                   WHERE table_name = 'instructions' AND column_name = 'nki_source_location'""").column("n")[0].as_py()
    rows = p.sql(f"""SELECT start_ns, dur_ns, core, engine, queue, opcode, op_id, pc, flops, bytes_read,
                           bytes_written, sem_wait_ns{", nki_source_location" if nki else ""}
                    FROM instructions WHERE core = $core AND engine = $engine AND start_ns = $s
                    ORDER BY (pc = $pc) DESC LIMIT 1""",
                 {"core": int(core), "engine": str(engine), "s": int(start_ns), "pc": pc}).to_pylist()
    return rows[0] if rows else None


def range_by_lane(p, t0: int, t1: int) -> pa.Table:
    """Busy ns (clipped to ``[t0, t1)``) and instruction count per core × engine × DMA queue."""
    cond, params = _window(t0, t1, p.timeline_bounds().max_dur)
    return p.sql(f"""SELECT core, engine, CASE WHEN engine = 'dma' THEN queue END AS queue,
                            CAST(sum(least(start_ns + dur_ns, $t1) - greatest(start_ns, $t0)) AS BIGINT)
                                AS busy_ns,
                            count(*) AS instructions
                     FROM instructions WHERE {cond} GROUP BY ALL
                     ORDER BY busy_ns DESC, core, engine, queue""", params)


def range_by_op(p, t0: int, t1: int) -> pa.Table:
    """Busy ns (clipped to ``[t0, t1)``) and instruction count per op."""
    cond, params = _window(t0, t1, p.timeline_bounds().max_dur)
    return p.sql(f"""SELECT op_id,
                            CAST(sum(least(start_ns + dur_ns, $t1) - greatest(start_ns, $t0)) AS BIGINT) AS busy_ns,
                            count(*) AS instructions
                     FROM instructions WHERE {cond} GROUP BY ALL ORDER BY busy_ns DESC""", params)
