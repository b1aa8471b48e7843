"""Finalise: load a directory of segments into one ``profile.duckdb`` with its derived tables.

The database is built under a hidden temporary name in the same directory and renamed over
``profile.duckdb`` only when complete, so a reader holding the previous profile keeps a valid
file and a failed finalise (a full disk, a crash) leaves the previous profile as it was.
Segments are never deleted: they are the source of truth, so finalising again rebuilds the
same profile (plus whatever was appended since).

>>> import tempfile, traces
>>> d = tempfile.mkdtemp()
>>> traces.Writer(d, run={"run_id": "doc"}).close()
>>> finalize(d).name
'profile.duckdb'
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import logging
import math
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from traces import naming, profile_rest, profile_schema, table_docs
from traces.errors import TraceError
from traces.intervals import lod_pyramid, split_schedules, track_pyramid, union_active, valid_intervals
from traces.schema import RECORD_CONTEXT, SCHEMA_VERSION, TABLES
from traces.segments import list_segments, read_segment
from traces.summary_sql import DEVICE_NS_SQL, measured_condition, summary_sql
from traces.vocab import (
    CONCURRENT_ENGINES,
    DEVICE_ENGINES,
    ENGINES,
    FALLBACK_PLACEMENT,
)

log = logging.getLogger("traces")

PROFILE_NAME = "profile.duckdb"

#: Base level of the level-of-detail pyramid holds at most about this many buckets per lane.
LOD_BASE_BUCKETS = 1 << 16
#: The pyramid's top level holds at most about this many buckets per lane.
LOD_TOP_BUCKETS = 64
#: Smallest base bucket: 2**6 = 64 ns, about one short instruction.
LOD_MIN_LEVEL = 6


#: How duplicate rows (the same entity recorded by several processes or twice) collapse.
_LOAD_CLAUSE = {
    "runs": "QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY (status = 'running'), "
            "end_ns DESC NULLS LAST) = 1",
    "sources": "QUALIFY row_number() OVER (PARTITION BY source_id ORDER BY code NULLS LAST) = 1",
    "source_files": "QUALIFY row_number() OVER (PARTITION BY file ORDER BY text NULLS LAST) = 1",
    "graphs": "QUALIFY row_number() OVER (PARTITION BY graph_id) = 1",
    "ops": "QUALIFY row_number() OVER (PARTITION BY op_id) = 1",
    "executions": "QUALIFY row_number() OVER (PARTITION BY exec_id) = 1 ORDER BY start_ns",
    "events": "ORDER BY ts_ns",
    "memory": "ORDER BY ts_ns",
    "metadata": "ORDER BY key",
    "system_events": "ORDER BY ts_ns",
}

DERIVED_TABLES = ("exec_engine_summary", "opcode_summary", "op_summary", "source_summary", "lod_busy",
                  "summary", "summary_per_core", "system_tracks", "system_lod")
"""Tables finalise derives from the raw ones (columns in docs/trace_schema.md)."""


#: The System Trace's tracks: one per (run, source, NeuronCore, thread), the finest key every grouping
#: of the page is a function of; ``h`` is the key's hash, which a query matches events by. Also run
#: on the fly over a profile without the derived table (a Parquet export).
SYSTEM_TRACKS_SQL = """
    SELECT (row_number() OVER (ORDER BY source, run_id, core, thread_id) - 1)::INTEGER AS track,
           hash(run_id, source, core, thread_id) AS h, run_id, source, core, thread_id,
           count(*) AS events, coalesce(max(greatest(dur_ns, 0)), 0) AS max_dur_ns,
           min(ts_ns) AS first_ns, max(ts_ns + greatest(coalesce(dur_ns, 0), 0)) AS last_ns
    FROM system_events WHERE ts_ns IS NOT NULL GROUP BY run_id, source, core, thread_id"""
#: Below this many rows (all tables) a profile is written with 16 KiB DuckDB blocks (:func:`block_size`).
SMALL_PROFILE_ROWS = 1_000_000


def finalize(out_dir: str | os.PathLike, include_warmup: bool = False) -> Path:
    """Build ``out_dir/profile.duckdb`` from the segments in ``out_dir`` and return its path.

    Idempotent: finalising again rebuilds from the same segments. A truncated segment is
    skipped with a warning naming it. Works on the segments of a crashed run (its ``runs.status``
    becomes ``incomplete``). Warm-up executions are left out of the summaries unless
    ``include_warmup`` (recorded as metadata ``summary_includes_warmup``). Raises :class:`TraceError`
    (one line) on failure, leaving any previous profile intact. Example:
    ``traces.finalize("output/20260101T120000_train")``.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        what = "is not a directory" if out_dir.exists() else "does not exist"
        raise TraceError(f"trace directory {out_dir} {what}: pass the directory the run wrote its segments into")
    target = out_dir / PROFILE_NAME
    segments = list_segments(out_dir)
    if not segments:
        if target.exists():
            return target
        raise TraceError(f"{out_dir} holds no trace segments (*.arrow): record a run with "
                         "NEURON_RT_INSPECT_ENABLE=1 or `neuron-explorer inspect -- python script.py`")
    loaded: dict[str, list[pa.Table]] = {name: [] for name in TABLES}
    skipped: list[str] = []
    with _step(f"read {len(segments)} segments"):
        for path in segments:  # memory-mapped: reading costs nothing until DuckDB scans the rows
            got = read_segment(path)
            if got is None:
                skipped.append(path.name)
            else:
                loaded[got[0]].append(got[1])
    import duckdb

    tmp = out_dir / f".{PROFILE_NAME}.{os.getpid()}.tmp"
    kept = naming.kept_name(target)   # the user's view --display-name outlives a rebuild
    try:
        _build(tmp, loaded, segment_count=len(segments), skipped=skipped, include_warmup=include_warmup,
               extra_metadata=kept)
        os.replace(tmp, target)
    except (duckdb.Error, OSError) as exc:
        for junk in (tmp, Path(f"{tmp}.wal")):
            junk.unlink(missing_ok=True)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        io = isinstance(exc, (OSError, duckdb.IOException)) or any(
            s in reason for s in ("Could not write", "No space left", "File too large", "Disk quota"))
        fix = ("free disk space and run again" if io
               else "this is a neuron-stack bug: please report it with the output of NEURON_STACK_DEBUG=1")
        raise TraceError(f"could not finalise {out_dir}: {reason}; the previous profile is unchanged: {fix}") from None
    finally:
        del loaded
    return target


def _build(path: Path, loaded: dict[str, list[pa.Table]], *, segment_count: int, skipped: list[str],
           include_warmup: bool, extra_metadata: dict[str, str]) -> None:
    import duckdb

    path.unlink(missing_ok=True)
    rows = sum(t.num_rows for parts in loaded.values() for t in parts)
    con = duckdb.connect(str(path), config={"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                                            "default_block_size": block_size(rows)})
    pool = None
    try:
        # one transaction: every statement of the build would otherwise commit (and sync the WAL) on its own
        con.execute("BEGIN TRANSACTION")
        metadata = _merged_metadata(loaded.pop("metadata"))
        metadata.update({"schema_version": SCHEMA_VERSION, "segment_count": str(segment_count),
                         "skipped_segments": ",".join(skipped),
                         "summary_includes_warmup": str(bool(include_warmup)).lower(),
                         "finalized_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                         **extra_metadata})
        instructions = _time_ordered(loaded.pop("instructions"))
        # numpy work on the Arrow rows runs on a thread while DuckDB loads them (both release the GIL)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        intervals = pool.submit(_interval_work, instructions)
        for name, parts in loaded.items():
            _load(con, name, pa.concat_tables(parts) if parts else TABLES[name].empty_table())
        # Row groups follow the segments in time order, so each one's min/max start (its zone map)
        # is narrow and a window query skips the rest; a global sort would cost as much as the load.
        con.execute("SET preserve_insertion_order = false")
        _load(con, "instructions", instructions)
        con.execute("SET preserve_insertion_order = true")
        _close_open_runs(con)
        _load(con, "metadata", _kv(metadata))
        stats = _derive(con, intervals.result(), include_warmup)
        with _step("system_tracks and system_lod"):
            stats.update(_system_lod(con))
        con.register("_stats", _kv(stats))
        con.execute("INSERT INTO metadata SELECT * FROM _stats")
        con.unregister("_stats")
        with _step("real-name views"):
            _real_schema(con)
        with _step("commit and checkpoint"):
            con.execute("COMMIT")
            con.execute("CHECKPOINT")
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        con.close()


def block_size(rows: int) -> int:
    """The DuckDB block size of a profile of ``rows`` rows. Every table takes at least one block, so DuckDB's
    default 256 KiB made a 51-instruction profile 6 MB of mostly empty blocks; a small profile gets 16 KiB
    blocks (the smallest DuckDB allows), a large one keeps 256 KiB, whose longer column segments scan faster
    and whose partly filled last blocks are a small share of it.

    >>> block_size(5_000), block_size(50_000_000)
    (16384, 262144)
    """
    return 16384 if rows < SMALL_PROFILE_ROWS else 262144


def _real_schema(con) -> None:
    """The real Neuron Explorer tables (``Instruction``, ``SystemProfileEvents``, ...) as views over ours,
    and ``SchemaFields`` describing them, all from :mod:`traces.profile_schema`."""
    _load(con, "SchemaFields", profile_schema.schema_fields_table(_our_tables(con)))
    taken = {r[0].lower() for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
    summary = [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                         "'main' AND table_name = 'summary' ORDER BY ordinal_position").fetchall()]
    for statement in profile_schema.view_statements(taken, summary):
        con.execute(statement)
    for name in RECORD_CONTEXT:   # the compiler's records are real tables already: the real schema shows them too
        if name.lower() in taken:
            con.execute(profile_rest.record_view(name, profile_schema.SCHEMA))


def documented_tables() -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """Our tables as every finalised profile holds them, with column types and meanings (the rows
    ``SchemaFields`` has for them), read from an empty profile built in a temporary directory.
    Example: ``[t for t, _, _ in documented_tables()][:2]``."""
    import tempfile

    import duckdb

    from traces.writer import Writer

    with tempfile.TemporaryDirectory() as d:
        Writer(d, run={"run_id": "schema"}).close()
        with duckdb.connect(str(finalize(d)), read_only=True) as con:
            return _our_tables(con)


def _our_tables(con) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """Every table of ours in the profile, each column with its type and meaning (:mod:`traces.table_docs`;
    a column the page does not document says so, and ``tests/test_profile_schema.py`` fails on it)."""
    columns: dict[str, list] = {}
    for table, column, typ in con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = 'main' "
            "AND table_catalog = current_database() "
            "ORDER BY table_name, ordinal_position").fetchall():
        if table not in profile_schema.TABLES:
            columns.setdefault(table, []).append((column, typ))
    out = []
    for table, cols in columns.items():
        description, meanings = table_docs.describe(table) or ("(not documented)", {})
        out.append((table, description, [(c, t, meanings.get(c, "(not documented)")) for c, t in cols]))
    return out


def _load(con, name: str, rows: pa.Table, clause: str | None = None) -> None:
    con.register("_segment_rows", rows)
    try:
        with _step(f"load {name} ({rows.num_rows} rows)"):
            con.execute(f"CREATE TABLE {name} AS SELECT * FROM _segment_rows {clause or _LOAD_CLAUSE.get(name, '')}")
    finally:
        con.unregister("_segment_rows")


@contextlib.contextmanager
def _step(name: str):
    """Log how long a finalise step took (``logging.getLogger("traces").setLevel("DEBUG")`` shows it)."""
    t = time.perf_counter()
    yield
    log.debug("finalise: %s %.3f s", name, time.perf_counter() - t)


def _time_ordered(parts: list[pa.Table]) -> pa.Table:
    """Instruction segments concatenated in order of their first start (no copy of the rows)."""
    if not parts:
        return TABLES["instructions"].empty_table()
    firsts = [pc.min(p["start_ns"]).as_py() for p in parts]
    order = sorted(range(len(parts)), key=lambda i: (firsts[i] is None, firsts[i] or 0))
    return pa.concat_tables([parts[i] for i in order])


def _kv(values: dict[str, str]) -> pa.Table:
    return pa.table({"key": list(values), "value": list(values.values())}, schema=TABLES["metadata"])


def _merged_metadata(parts: list[pa.Table]) -> dict[str, str]:
    """One value per key; where processes disagree the later segment wins (same run, later write)."""
    merged: dict[str, str] = {}
    for part in parts:
        merged.update(zip(part.column("key").to_pylist(), part.column("value").to_pylist()))
    return {k: v for k, v in merged.items() if k is not None and v is not None}


def _close_open_runs(con) -> None:
    """A run without an end row ended without closing its writer (killed, crashed, or still running)."""
    con.execute("""
        UPDATE runs SET status = 'incomplete',
            end_ns = coalesce((SELECT max(e.end_ns) FROM executions e WHERE e.run_id = runs.run_id), start_ns),
            wall_end_ns = coalesce((SELECT max(e.wall_end_ns) FROM executions e WHERE e.run_id = runs.run_id),
                                   wall_start_ns)
        WHERE status = 'running'""")


def _scalar(con, query: str, params=None):
    return con.execute(query, params or []).fetchall()[0][0]


def _interval_work(instructions: pa.Table) -> dict:
    """The pyramid and the interval unions, from the Arrow rows (see traces.intervals), and the rows split
    into repeated schedules (for :func:`_aggregate`, when every row has a valid interval)."""
    with _step("lod_busy and interval unions (numpy)"):
        valid = valid_intervals(instructions)
        if valid.num_rows:  # the span only sizes the pyramid's levels: max start + max duration will do
            lo, last = pc.min_max(valid["start_ns"]).values()
            lo, hi = lo.as_py(), last.as_py() + pc.max(valid["dur_ns"]).as_py()
            mean = pc.mean(valid["dur_ns"]).as_py()
        else:
            lo = hi = mean = None
        base, top = lod_levels(lo, hi, mean)
        schedules = split_schedules(valid)   # the executions of one schedule are computed once
        return {"base": base, "top": top, "lod": lod_pyramid(valid, base, top, schedules),
                "union": union_active(valid, CONCURRENT_ENGINES, schedules),
                "schedules": schedules if valid is instructions else None}


def _system_lod(con) -> dict[str, str]:
    """The System Trace's tracks and their level-of-detail pyramid (``traces.intervals.track_pyramid``),
    levels as the device timeline's (:func:`lod_levels`); returns the levels for the metadata."""
    con.execute(f"CREATE TABLE system_tracks AS {SYSTEM_TRACKS_SQL} ORDER BY track")
    rows = con.sql("""
        SELECT t.track, s.ts_ns, s.ts_ns + greatest(coalesce(s.dur_ns, 0), 0) AS end_ns
        FROM system_events AS s JOIN system_tracks AS t ON hash(s.run_id, s.source, s.core, s.thread_id) = t.h
        WHERE s.ts_ns IS NOT NULL""").to_arrow_table()
    lo = pc.min(rows["ts_ns"]).as_py() if rows.num_rows else None
    hi = pc.max(rows["end_ns"]).as_py() if rows.num_rows else None
    base, top = lod_levels(lo, hi)
    lod = track_pyramid(*(rows[c].to_numpy() for c in ("track", "ts_ns", "end_ns")), base, top)
    _load(con, "system_lod", lod)   # in (level, bucket) order: zone maps skip by bucket
    return {"system_lod_base_level": str(base), "system_lod_top_level": str(top)}


def _derive(con, work: dict, include_warmup: bool) -> dict[str, str]:
    """Create every derived table; return trace statistics for the metadata table."""
    lo, hi, max_dur, count = con.execute(
        "SELECT min(start_ns), max(start_ns + dur_ns), max(dur_ns), count(*) FROM instructions"
    ).fetchall()[0]
    # one aggregation of the instructions; everything per op, opcode, engine and execution derives from it
    with _step("aggregate instructions"):
        _aggregate(con, work["schedules"])
    with _step("exec_engine_summary"):
        _exec_engine_summary(con, work["union"])
    con.execute(f"CREATE TEMP VIEW measured AS SELECT * FROM executions WHERE {measured_condition(include_warmup)}")
    with _step("op, opcode and source summaries"):
        _op_and_source_summaries(con)
    with _step("lod_busy"):
        _load(con, "lod_busy", work["lod"])  # already in (level, bucket) order: zone maps skip by bucket
        lod = {"lod_base_level": work["base"], "lod_top_level": work["top"]}
    with _step("summary"):
        con.execute(f"CREATE TABLE summary AS {summary_sql(include_warmup)}")
        con.execute(f"CREATE TABLE summary_per_core AS {summary_sql(include_warmup, per_core=True)}")
    stats = {"instruction_count": count, "trace_start_ns": lo, "trace_end_ns": hi,
             "max_instruction_dur_ns": max_dur, **lod,
             "default_profile_name": naming.default_name(*con.execute(naming.NAME_SQL).fetchall()[0])}
    return {k: ("" if v is None else str(v)) for k, v in stats.items()}


#: What every (execution, op, engine, opcode) of the instructions adds up to; ``{src}``: the rows.
_AGGREGATE_SQL = """
    SELECT exec_id, op_id, engine, opcode, count(*) AS n, sum(dur_ns) AS busy, sum(flops) AS flops,
           sum(bytes_read) AS bytes_read, sum(bytes_written) AS bytes_written,
           sum(greatest(bytes_read, bytes_written)) AS transfer_bytes
    FROM {src} GROUP BY ALL"""


def _aggregate(con, schedules) -> None:
    """``exec_op_opcode``: one scan of the instructions, or with their repeated ``schedules``
    (:func:`traces.intervals.split_schedules` of every row) one per schedule, repeated per execution, and
    one over the other rows: the same rows either way."""
    if schedules is None or not schedules.groups:
        con.execute(f"CREATE TEMP TABLE exec_op_opcode AS {_AGGREGATE_SQL.format(src='instructions')}")
        return
    con.register("_rows", schedules.rest)
    con.execute(f"CREATE TEMP TABLE exec_op_opcode AS {_AGGREGATE_SQL.format(src='_rows')}")
    for g in schedules.groups:
        con.register("_rows", g.rows)
        con.execute(f"""INSERT INTO exec_op_opcode
            SELECT e.exec_id, a.* EXCLUDE (exec_id) FROM ({_AGGREGATE_SQL.format(src='_rows')}) AS a
            CROSS JOIN (SELECT unnest($ids::BIGINT[]) AS exec_id) AS e""", {"ids": g.exec_ids.tolist()})
    con.unregister("_rows")


def _exec_engine_summary(con, overlap: pa.Table) -> None:
    busy_cols = [e for e in ENGINES if f"{e}_busy_ns" in TABLES["executions"].names]
    unpivot = " UNION ALL ".join(f"SELECT exec_id, '{e}' AS engine, {e}_busy_ns AS busy_ns FROM executions"
                                 for e in busy_cols)
    con.register("overlap", overlap)  # union lengths of the concurrent engines (traces.intervals)
    con.execute(f"""
        CREATE TABLE exec_engine_summary AS
        WITH agg AS (
            SELECT exec_id, engine, sum(n)::BIGINT AS instruction_count, sum(busy)::BIGINT AS busy_ns,
                   sum(flops)::BIGINT AS flops, sum(bytes_read)::BIGINT AS bytes_read,
                   sum(bytes_written)::BIGINT AS bytes_written, sum(transfer_bytes)::BIGINT AS transfer_bytes
            FROM exec_op_opcode GROUP BY ALL)
        SELECT agg.*, coalesce(overlap.active_ns, agg.busy_ns) AS active_ns, 'instructions' AS origin
        FROM agg LEFT JOIN overlap USING (exec_id, engine)
        UNION ALL BY NAME
        -- executions recorded without per-instruction rows still count, from their busy columns
        SELECT exec_id, engine, busy_ns, busy_ns AS active_ns, 'executions' AS origin
        FROM ({unpivot})
        WHERE busy_ns > 0 AND exec_id NOT IN (SELECT exec_id FROM agg)
        ORDER BY exec_id, engine""")
    con.unregister("overlap")


def _op_and_source_summaries(con) -> None:
    per_engine = ",\n".join(f"sum(busy) FILTER (WHERE engine = '{e}')::BIGINT AS {e}_ns" for e in DEVICE_ENGINES)
    con.execute(f"""
        CREATE TABLE opcode_summary AS
        WITH total AS (SELECT sum({DEVICE_NS_SQL}) AS device_ns FROM measured)
        SELECT engine, opcode, sum(n)::BIGINT AS instruction_count, sum(busy)::BIGINT AS instruction_time_ns,
               sum(flops)::BIGINT AS flops, sum(transfer_bytes)::BIGINT AS transfer_bytes,
               100.0 * sum(busy) / nullif(any_value(total.device_ns), 0) AS active_time_percent
        FROM exec_op_opcode CROSS JOIN total WHERE exec_id IN (SELECT exec_id FROM measured)
        GROUP BY engine, opcode ORDER BY instruction_time_ns DESC""")
    con.execute(f"""
        CREATE TABLE op_summary AS
        WITH per_op AS (
            SELECT op_id, count(DISTINCT exec_id) AS calls,
                   (sum(n) FILTER (WHERE engine <> 'cpu'))::BIGINT AS instruction_count,
                   (sum(busy) FILTER (WHERE engine <> 'cpu'))::BIGINT AS device_ns, {per_engine},
                   (sum(busy) FILTER (WHERE engine = 'cpu'))::BIGINT AS host_ns,
                   sum(flops)::BIGINT AS instruction_flops, sum(bytes_read)::BIGINT AS bytes_read,
                   sum(bytes_written)::BIGINT AS bytes_written
            FROM exec_op_opcode WHERE exec_id IN (SELECT exec_id FROM measured) GROUP BY op_id),
        -- a CPU op's host time is recorded as a fallback event's duration or as its instructions on
        -- the 'cpu' engine (the runtime writes zero-length events): the same time, recorded twice
        fallback AS (
            SELECT op_id, count(*) AS cpu_calls, sum(dur_ns)::BIGINT AS cpu_ns
            FROM events WHERE kind = 'cpu_fallback' AND op_id IS NOT NULL GROUP BY op_id)
        SELECT coalesce(o.op_id, p.op_id) AS op_id, o.graph_id, g.name AS graph_name,
               coalesce(o.name, CASE WHEN p.op_id IS NULL THEN '(unattributed)' ELSE '(unknown op)' END) AS name,
               o.aten_op, o.op_class, o.placement, o.fallback_reason, o.fused_into, o.module_path,
               o.source_id, s.file, s.line, o.fwd_source_id,
               o.shape, o.dtype, o.flops AS model_flops, o.bytes AS model_bytes,
               coalesce(p.calls, 0) AS calls, coalesce(p.instruction_count, 0) AS instruction_count,
               coalesce(p.device_ns, 0) AS device_ns,
               {', '.join(f'coalesce(p.{e}_ns, 0) AS {e}_ns' for e in DEVICE_ENGINES)},
               coalesce(p.instruction_flops, 0) AS instruction_flops, coalesce(p.bytes_read, 0) AS bytes_read,
               coalesce(p.bytes_written, 0) AS bytes_written,
               coalesce(f.cpu_calls, 0) AS cpu_calls,
               greatest(coalesce(f.cpu_ns, 0), coalesce(p.host_ns, 0))::BIGINT AS cpu_ns
        FROM ops o
        FULL OUTER JOIN per_op p ON p.op_id IS NOT DISTINCT FROM o.op_id
        LEFT JOIN fallback f ON f.op_id = coalesce(o.op_id, p.op_id)
        LEFT JOIN graphs g ON g.graph_id = o.graph_id
        LEFT JOIN sources s ON s.source_id = o.source_id
        ORDER BY device_ns + cpu_ns DESC, op_id""")
    con.execute(f"""
        CREATE TABLE source_summary AS
        SELECT * FROM (
        SELECT o.source_id, any_value(s.file) AS file, any_value(s.line) AS line,
               any_value(s.function) AS function, any_value(s.code) AS code,
               sum(o.device_ns)::BIGINT AS device_ns, sum(o.instruction_count)::BIGINT AS instruction_count,
               count(*) AS op_count, string_agg(DISTINCT o.aten_op, ', ' ORDER BY o.aten_op) AS ops,
               count(*) FILTER (WHERE o.placement = '{FALLBACK_PLACEMENT}') AS fallback_count,
               sum(o.cpu_ns)::BIGINT AS cpu_ns, sum(o.instruction_flops)::BIGINT AS instruction_flops,
               count(DISTINCT o.graph_id) AS graph_count
        FROM op_summary o LEFT JOIN sources s ON s.source_id = o.source_id
        WHERE o.source_id IS NOT NULL
        GROUP BY o.source_id)
        ORDER BY device_ns + cpu_ns DESC, file, line""")


def lod_levels(lo: int | None, hi: int | None, mean_dur: float | None = None) -> tuple[int, int]:
    """(base, top) levels of the pyramid for a trace spanning ``[lo, hi)`` ns; level k buckets are 2**k ns.

    A base bucket is at least 16 mean instructions wide, so few instructions cross a bucket
    edge and the base level stays smaller than the instruction table.

    >>> lod_levels(0, 1_000_000_000, mean_dur=500)
    (14, 24)
    """
    span = max(1, (hi or 0) - (lo or 0))
    base = max(LOD_MIN_LEVEL, math.ceil(math.log2(span / LOD_BASE_BUCKETS)),
               math.ceil(math.log2(max(1.0, 16 * (mean_dur or 1)))))
    top = max(base, math.ceil(math.log2(span / LOD_TOP_BUCKETS)))
    return base, top
