"""Exporters: Perfetto / Chrome trace JSON, a hive-partitioned Parquet dataset, CSV.

Each writes into a temporary name next to the output and renames it into place when complete,
so a failed export never leaves a half-written file under the requested name.

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=2, instructions=300)
>>> with traces.open(d) as p:
...     out = perfetto(p, d + "/trace.json")
>>> import json; doc = json.load(open(out))
>>> doc["displayTimeUnit"], any(e.get("args", {}).get("name") == "Tensor(nc0)" for e in doc["traceEvents"])
('ns', True)
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from traces import profile_schema
from traces.errors import TraceError
from traces.schema import TABLES
from traces.vocab import ENGINE_LABELS

#: Opcodes the real profiler draws on the TensorMatrix row (MultiplyMoving) rather than Tensor.
TENSOR_MATRIX_OPCODES = ("MATMUL",)

FORMATS = ("perfetto", "parquet", "csv", "json")

#: rows per table in a full-profile JSON (a bound: JSON is many times the size of the profile's columns)
JSON_MAX_ROWS = 1_000_000


def export(profile, fmt: str, out: str | os.PathLike, **options) -> Path:
    """Export ``profile`` in ``fmt`` (``perfetto``, ``parquet``, ``csv`` or ``json``) to ``out``; return the path.

    Example: ``export(p, "parquet", "trace_parquet")``.
    """
    writers = {"perfetto": perfetto, "parquet": parquet, "csv": csv, "json": full_json}
    if fmt not in writers:
        raise TraceError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")
    return writers[fmt](profile, out, **options)


def _track_sql(t: str = "") -> str:
    """SQL expression naming an instruction's track (``Tensor(nc0)``, ``qSyncIO0(nc0)``); ``t`` is
    the instructions table's alias with its dot."""
    # track names as the real Neuron Explorer shows them (reference §3.5): Tensor(nc0)...
    names = " ".join(f"WHEN '{e}' THEN '{n}'" for e, n in ENGINE_LABELS.items() if e != "dma")
    matrix = ", ".join(f"'{o}'" for o in TENSOR_MATRIX_OPCODES)
    return (f"(CASE WHEN {t}engine = 'dma' THEN coalesce({t}queue, 'DMA') "
            f"WHEN {t}engine = 'tensor' AND {t}opcode IN ({matrix}) THEN 'TensorMatrix' "
            f"ELSE coalesce(CASE {t}engine {names} END, {t}engine) END) "
            # physical core p > 0 of an LNC=2 logical core has its own engines (DMA queues carry it already)
            f"|| CASE WHEN {t}engine <> 'dma' AND {t}pcore > 0 THEN '.pc' || {t}pcore ELSE '' END "
            f"|| '(nc' || {t}core || ')'")


def _us(expr: str) -> str:
    """Exact decimal microseconds of a non-negative ns expression (ns precision, no float rounding)."""
    return f"(({expr}) // 1000)::VARCHAR || '.' || lpad((({expr}) % 1000)::VARCHAR, 3, '0')"


def perfetto(profile, out: str | os.PathLike, t0: int | None = None, t1: int | None = None) -> Path:
    """Write a Chrome/Perfetto trace JSON (opens in ui.perfetto.dev) and return its path.

    A process per NeuronCore (per run when several processes recorded), a thread per engine
    and DMA queue named as the real tool does (``Tensor(nc0)``, ``TensorMatrix(nc0)``,
    ``qSyncIO0(nc0)``), an ``Executions(nc0)`` track with one slice per NEFF run, and a host
    process per run with CPU fallbacks, compiles and recompiles. ``ts``/``dur`` are exact
    decimal microseconds from the first event (``otherData.origin_ns``), so ns precision is kept.
    The system profile (when recorded) adds a process per run with the real tool's track names and
    host→device flow arrows (:func:`_system_query`).
    ``t0``/``t1`` (projected-clock ns) restrict the export to a window. Example:
    ``perfetto(p, "trace.json", t0=lo, t1=lo + 1_000_000)``.
    """
    out = Path(out)
    params = _window_params(profile, t0, t1)
    multi = (profile.sql("SELECT count(*) AS n FROM runs").to_pylist()[0]["n"] or 0) > 1
    profile_lanes = _lanes_sql()
    queries = [_meta_query(profile_lanes, multi), _complete_json(exec_rows(profile_lanes)),
               _host_query(profile_lanes), _complete_json(instr_rows(profile_lanes))]
    if "system_events" in profile.tables():
        queries.append(_system_query(profile_lanes))
    meta = profile.metadata()
    other = {"origin_ns": str(params["origin"]), "clock": "projected", "schema_version": meta.get("schema_version"),
             "target": meta.get("target"), "is_simulation": meta.get("is_simulation", "true"),
             "source_profile": str(profile.path)}
    _write_events(profile, out, other, queries, params)
    return out


def _window_params(profile, t0: int | None, t1: int | None) -> dict:
    """The query parameters of a window: ``lo``/``hi`` (open bounds without one) and ``origin``, the first
    moment recorded in it (the zero of ``ts``)."""
    rng = profile.trace_range()
    lo = t0 if t0 is not None else None
    hi = t1 if t1 is not None else None
    params = {"lo": lo if lo is not None else -(2**62), "hi": hi if hi is not None else 2**62}
    system = "system_events" in profile.tables()
    sys_min = ", (SELECT min(ts_ns) FROM system_events WHERE ts_ns >= $lo AND ts_ns < $hi)" if system else ""
    origin_rows = profile.sql(f"""
        SELECT least((SELECT min(start_ns) FROM executions WHERE end_ns > $lo AND start_ns < $hi),
                     (SELECT min(ts_ns) FROM events WHERE ts_ns >= $lo AND ts_ns < $hi),
                     (SELECT min(start_ns) FROM instructions WHERE start_ns >= $lo AND start_ns < $hi)
                     {sys_min}) AS o""",
                              params).to_pylist()
    origin = origin_rows[0]["o"] if origin_rows and origin_rows[0]["o"] is not None else (rng or (0, 0))[0]
    if lo is not None:
        origin = max(origin, lo) if origin is not None else lo
    params["origin"] = int(origin)
    params["graph"] = None   # every graph (a device file keeps one)
    return params


def executed_graphs(profile, lo: int = -(2**62), hi: int = 2**62) -> list[int]:
    """The graphs executed in ``[lo, hi)`` (projected-clock ns), in id order: one device file each
    (``device_profile_model_<graph_id>.pftrace`` and ``.json``, as the real tool's one per compiled model).

    >>> import tempfile, traces, traces.synthetic
    >>> d = tempfile.mkdtemp()
    >>> _ = traces.synthetic.write_run(d, executions=2, instructions=40)
    >>> with traces.open(d) as p:
    ...     len(executed_graphs(p))
    1
    """
    return profile.sql("SELECT DISTINCT graph_id FROM executions WHERE end_ns > $lo AND start_ns < $hi "
                       "AND graph_id IS NOT NULL ORDER BY graph_id", {"lo": lo, "hi": hi}).column(0).to_pylist()


def _lanes_sql() -> str:
    """The CTEs every query shares: one pid per (run, core) lane group and one per run's host; tids per track
    within a pid. ``$graph`` (NULL for all) keeps one graph's executions and instructions."""
    track = _track_sql("i.")
    return f"""
        lanes AS (SELECT DISTINCT e.run_id, i.core, {track} AS track
                  FROM instructions i LEFT JOIN executions e USING (exec_id)
                  WHERE i.start_ns < $hi AND i.start_ns + i.dur_ns > $lo AND ($graph IS NULL OR e.graph_id = $graph)
                  UNION SELECT run_id, core, 'Executions(nc' || core || ')' FROM executions
                        WHERE end_ns > $lo AND start_ns < $hi AND ($graph IS NULL OR graph_id = $graph)),
        procs AS (SELECT run_id, core, row_number() OVER (ORDER BY run_id, core) AS pid
                  FROM (SELECT DISTINCT run_id, core FROM lanes)),
        threads AS (SELECT l.run_id, l.core, l.track, p.pid,
                           row_number() OVER (PARTITION BY p.pid ORDER BY
                               CASE WHEN l.track LIKE 'Executions%' THEN 0 WHEN l.track LIKE 'q%' THEN 2 ELSE 1 END,
                               l.track) AS tid
                    FROM lanes l JOIN procs p ON p.run_id IS NOT DISTINCT FROM l.run_id AND p.core = l.core),
        hosts AS (SELECT r.run_id, r.pid AS os_pid, r.tag, 1000000 + row_number() OVER (ORDER BY r.run_id) AS pid
                  FROM runs r)"""


def _meta_query(profile_lanes: str, multi: bool) -> str:
    """Process and thread names and sort indexes (a process per core, named by run when several recorded)."""
    proc_label = ("'NeuronCore nc' || p.core || coalesce(' · ' || r.tag, '')" if multi
                  else "'NeuronCore nc' || p.core")
    return f"""
        WITH {profile_lanes}
        SELECT '{{"ph":"M","name":"process_name","pid":' || p.pid || ',"args":{{"name":'
               || to_json({proc_label}) || '}}}}'
        FROM procs p LEFT JOIN runs r ON r.run_id = p.run_id
        UNION ALL
        SELECT '{{"ph":"M","name":"process_sort_index","pid":' || pid || ',"args":{{"sort_index":' || pid || '}}}}'
        FROM procs
        UNION ALL
        SELECT '{{"ph":"M","name":"thread_name","pid":' || pid || ',"tid":' || tid || ',"args":{{"name":'
               || to_json(track) || '}}}}' FROM threads
        UNION ALL
        SELECT '{{"ph":"M","name":"thread_sort_index","pid":' || pid || ',"tid":' || tid
               || ',"args":{{"sort_index":' || tid || '}}}}' FROM threads
        UNION ALL
        SELECT '{{"ph":"M","name":"process_name","pid":' || pid || ',"args":{{"name":'
               || to_json('Host ' || coalesce(tag, run_id) || ' (pid ' || coalesce(os_pid::VARCHAR, '?') || ')')
               || '}}}}'
        FROM hosts"""


def _complete_json(rows: str) -> str:
    """Chrome JSON complete events (``ph: X``) over a rows query's ``pid, tid, ts_ns, dur_ns, name, cat, args``."""
    return f"""
        SELECT '{{"ph":"X","pid":' || pid || ',"tid":' || tid || ',"ts":' || {_us('ts_ns - $origin')}
               || ',"dur":' || {_us('dur_ns')} || ',"name":' || to_json(name) || ',"cat":' || to_json(cat)
               || ',"args":' || to_json(args) || '}}' FROM ({rows})"""


def instr_rows(profile_lanes: str) -> str:
    """One row per instruction on its engine or DMA-queue track: ``pid, tid, ts_ns, dur_ns, name`` (the
    opcode), ``cat`` and ``args`` (op, source line, bytes, ...), read by the JSON and protobuf encoders."""
    track = _track_sql("i.")
    return f"""
        WITH {profile_lanes}
        SELECT t.pid, t.tid, i.start_ns AS ts_ns, i.dur_ns, i.opcode AS name, coalesce(o.aten_op, i.engine) AS cat,
               {{'op': o.aten_op, 'op_name': o.name, 'op_id': i.op_id::VARCHAR,
                 'exec_id': i.exec_id::VARCHAR, 'pc': i.pc, 'queue': i.queue, 'flops': i.flops,
                 'bytes_read': i.bytes_read, 'bytes_written': i.bytes_written, 'sem_wait_ns': i.sem_wait_ns,
                 'source': s.file || ':' || s.line}} AS args
        FROM instructions i LEFT JOIN executions e USING (exec_id)
        JOIN threads t ON t.run_id IS NOT DISTINCT FROM e.run_id AND t.core = i.core AND t.track = {track}
        LEFT JOIN ops o ON o.op_id = i.op_id LEFT JOIN sources s ON s.source_id = o.source_id
        WHERE i.start_ns < $hi AND i.start_ns + i.dur_ns > $lo AND i.start_ns >= $origin
          AND ($graph IS NULL OR e.graph_id = $graph)"""


def exec_rows(profile_lanes: str) -> str:
    """One row per NEFF execution on its core's ``Executions(ncN)`` track, as :func:`instr_rows`."""
    return f"""
        WITH {profile_lanes}
        SELECT t.pid, t.tid, x.start_ns AS ts_ns, greatest(x.end_ns - x.start_ns, 0) AS dur_ns,
               coalesce(g.name, 'execution') || CASE WHEN x.warmup THEN ' (warm-up)' ELSE '' END AS name,
               'execution' AS cat,
               {{'exec_id': x.exec_id::VARCHAR, 'graph_id': x.graph_id::VARCHAR, 'iteration': x.iteration,
                 'status': x.status, 'device_ns': x.device_ns, 'warmup': x.warmup}} AS args
        FROM executions x LEFT JOIN graphs g USING (graph_id)
        JOIN threads t ON t.run_id = x.run_id AND t.core = x.core AND t.track = 'Executions(nc' || x.core || ')'
        WHERE x.end_ns > $lo AND x.start_ns < $hi AND x.start_ns >= $origin
          AND ($graph IS NULL OR x.graph_id = $graph)"""


#: the host process's threads: (tid, name), events by kind (compiles and recompiles share one)
HOST_THREADS = ((1, "CPU fallbacks"), (2, "Compiles"), (3, "Events"))


def host_rows(profile_lanes: str) -> str:
    """The host side of each run (CPU fallbacks, compiles and other events) as rows ``pid`` (the run's host
    process), ``host`` (its name), ``tid`` (:data:`HOST_THREADS`), ``ts_ns, dur_ns, name, cat, args``."""
    return f"""
        WITH {profile_lanes}
        SELECT h.pid,
               'Host ' || coalesce(h.tag, h.run_id) || ' (pid ' || coalesce(h.os_pid::VARCHAR, '?') || ')' AS host,
               CASE ev.kind WHEN 'cpu_fallback' THEN 1 WHEN 'compile' THEN 2 WHEN 'recompile' THEN 2 ELSE 3 END AS tid,
               ev.ts_ns, coalesce(ev.dur_ns, 0) AS dur_ns,
               CASE WHEN ev.kind = 'cpu_fallback' THEN 'cpu_fallback ' || coalesce(o.aten_op, '')
                    ELSE ev.kind END AS name,
               ev.kind AS cat, {{'detail': ev.detail, 'core': ev.core, 'source': s.file || ':' || s.line}} AS args
        FROM events ev JOIN hosts h ON h.run_id = ev.run_id
        LEFT JOIN ops o ON o.op_id = ev.op_id LEFT JOIN sources s ON s.source_id = ev.source_id
        WHERE ev.ts_ns >= $lo AND ev.ts_ns < $hi AND ev.ts_ns >= $origin"""


def _host_query(profile_lanes: str) -> str:
    """The host process of each run as Chrome JSON: :func:`host_rows` on three named threads."""
    names = ", ".join(f"({tid}, '{label}')" for tid, label in HOST_THREADS)
    return f"""
        WITH {profile_lanes}
        SELECT '{{"ph":' || CASE WHEN dur_ns > 0 THEN '"X","dur":' || {_us('dur_ns')} ELSE '"i","s":"p"' END
               || ',"pid":' || pid || ',"tid":' || tid || ',"ts":' || {_us('ts_ns - $origin')}
               || ',"name":' || to_json(name) || ',"cat":' || to_json(cat) || ',"args":' || to_json(args) || '}}'
        FROM ({host_rows(profile_lanes)})
        UNION ALL
        SELECT '{{"ph":"M","name":"thread_name","pid":' || h.pid || ',"tid":' || k.tid || ',"args":{{"name":'
               || to_json(k.label) || '}}}}'
        FROM hosts h, (VALUES {names}) AS k(tid, label)"""


def _write_events(profile, out: Path, other: dict, queries: list[str], params: dict) -> None:
    """Stream the queries' JSON lines into ``out`` through a temporary file renamed into place."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write('{"displayTimeUnit":"ns","otherData":' + json.dumps(other) + ',"traceEvents":[\n')
            first = True
            for query in queries:
                used = {k: v for k, v in params.items() if f"${k}" in query}  # DuckDB refuses unused ones
                for batch in profile.batches(query, used):
                    lines = batch.column(0).to_pylist()
                    if not lines:
                        continue
                    f.write(("" if first else ",\n") + ",\n".join(lines))
                    first = False
            f.write("\n]}\n")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TraceError(f"cannot write {out}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _system_ctes(profile_lanes: str) -> str:
    """The system profile's CTEs: ``ev``, the window's events with their track (named as the real tool's,
    ``<instance>/PID:<pid>/neuron_rt/NC:0``), the real grouping fields (``host`` the instance, ``process_id``,
    ``thread_id``, ``core`` the lnc_idx, ``worker_gid``: ``SystemProfileEvents.worker_gid``'s formula over the whole
    profile) and a Chrome pid/tid per run and track."""
    gid = profile_schema.SYSTEM_PROFILE_EVENTS.field("worker_gid").ours
    track = ("coalesce(r.host, '?') || '/PID:' || coalesce(r.pid::VARCHAR, '?') || '/' || s.source || '/' || "
             "CASE WHEN s.source <> 'framework' AND s.core IS NOT NULL THEN 'NC:' || s.core "
             "ELSE 'TID:' || s.thread_id END")
    return f"""{profile_lanes},
        gids AS (SELECT DISTINCT r.node, r.host, s.core, {gid} AS worker_gid
                 FROM system_events s LEFT JOIN runs r USING (run_id)),
        sys AS (SELECT s.*, {track} AS track, r.host, r.pid AS process_id, g.worker_gid
                FROM system_events s LEFT JOIN runs r USING (run_id)
                LEFT JOIN gids g ON g.node IS NOT DISTINCT FROM r.node AND g.host IS NOT DISTINCT FROM r.host
                                    AND g.core = s.core
                WHERE s.ts_ns >= $lo AND s.ts_ns < $hi AND s.ts_ns >= $origin),
        sprocs AS (SELECT run_id, host, 2000000 + row_number() OVER (ORDER BY run_id) AS pid
                   FROM (SELECT DISTINCT run_id, host FROM sys)),
        sthreads AS (SELECT p.pid, x.run_id, x.track, row_number() OVER (PARTITION BY p.pid ORDER BY x.track) AS tid
                     FROM (SELECT DISTINCT run_id, track FROM sys) x JOIN sprocs p USING (run_id)),
        ev AS (SELECT sys.*, t.pid, t.tid FROM sys JOIN sthreads t USING (run_id, track))"""


def system_rows(profile_lanes: str) -> str:
    """The window's system events, one row each, with their track, grouping fields and flow id
    (:func:`_system_ctes`), for the protobuf encoder."""
    return f"""
        WITH {_system_ctes(profile_lanes)}
        SELECT ts_ns, greatest(dur_ns, 0) AS dur_ns, name, source, track, host, process_id, thread_id, core,
               worker_gid, exec_id, flow_id, detail FROM ev"""


def _system_query(profile_lanes: str) -> str:
    """The system profile as Perfetto tracks named as the real tool's (``<instance>/PID:<pid>/neuron_rt/NC:0``,
    ``.../framework/TID:<tid>``), one process per run, and flow arrows host → device: each ``nrt_execute``
    (``s``) through its ``nc_exec_running`` (``t``) to the execution on the device process (``f``)."""
    return f"""
        WITH {_system_ctes(profile_lanes)}
        SELECT '{{"ph":"M","name":"process_name","pid":' || pid || ',"args":{{"name":'
               || to_json('System ' || coalesce(host, run_id)) || '}}}}' FROM sprocs
        UNION ALL
        SELECT '{{"ph":"M","name":"thread_name","pid":' || pid || ',"tid":' || tid || ',"args":{{"name":'
               || to_json(track) || '}}}}' FROM sthreads
        UNION ALL
        SELECT '{{"ph":"X","pid":' || pid || ',"tid":' || tid || ',"ts":' || {_us('ts_ns - $origin')}
               || ',"dur":' || {_us('greatest(dur_ns, 0)')} || ',"name":' || to_json(name)
               || ',"cat":' || to_json(source) || ',"args":' || to_json({{'nc_idx': core, 'thread_id': thread_id,
                                                                         'exec_id': exec_id::VARCHAR,
                                                                         'flow_id': flow_id::VARCHAR,
                                                                         'detail': detail}}) || '}}'
        FROM ev
        UNION ALL
        SELECT '{{"ph":"' || CASE name WHEN 'nrt_execute' THEN 's' ELSE 't' END || '","id":' || flow_id
               || ',"pid":' || pid || ',"tid":' || tid || ',"ts":' || {_us('ts_ns - $origin')}
               || ',"name":"host→device","cat":"flow"}}'
        FROM ev WHERE flow_id IS NOT NULL AND name IN ('nrt_execute', 'nc_exec_running')
        UNION ALL
        SELECT '{{"ph":"f","bp":"e","id":' || ev.flow_id || ',"pid":' || t.pid || ',"tid":' || t.tid
               || ',"ts":' || {_us('x.start_ns - $origin')} || ',"name":"host→device","cat":"flow"}}'
        FROM ev JOIN executions x USING (exec_id)
        JOIN threads t ON t.run_id = x.run_id AND t.core = x.core AND t.track = 'Executions(nc' || x.core || ')'
        WHERE ev.name = 'nc_exec_running' AND ev.flow_id IS NOT NULL AND x.start_ns >= $origin"""


def _quoted(path: Path) -> str:
    # COPY ... TO takes its file name as a literal, not a parameter: quote it, doubling quotes
    return "'" + str(path).replace("'", "''") + "'"


def _into_new_dir(out: Path, fill) -> Path:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TraceError(f"{out} already exists: choose a new output directory or remove it first")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        fill(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TraceError(f"cannot write {out}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def parquet(profile, out: str | os.PathLike) -> Path:
    """Write a Parquet dataset: ``instructions/run_id=…/core=…/*.parquet`` (hive-partitioned)
    and one ``<table>.parquet`` per other table, raw and derived, plus the real Neuron Explorer's files
    (``Instruction.parquet``, ``Summary.parquet``, ``Metadata.parquet``, ``SystemProfileEvents.parquet``,
    ``SchemaFields.parquet``, ...: :mod:`traces.profile_schema`); return the directory.

    ``traces.open(out)`` (or DuckDB, Spark, Trino over the same files) answers the same queries
    as the original profile. Example: ``parquet(p, "trace_parquet")``.
    """
    def fill(tmp: Path) -> None:
        for name in profile.tables():
            if name == "instructions":
                cols = ", ".join(f"i.{c}" for c in TABLES["instructions"].names)
                profile.sql(f"COPY (SELECT {cols}, coalesce(e.run_id, 'unknown') AS run_id "
                            f"FROM instructions i LEFT JOIN executions e USING (exec_id) ORDER BY i.start_ns) "
                            f"TO {_quoted(tmp / 'instructions')} (FORMAT parquet, PARTITION_BY (run_id, core))")
            else:
                profile.sql(f"COPY {name} TO {_quoted(tmp / (name + '.parquet'))} (FORMAT parquet)")
        for name in profile.real_tables():   # the real tool's files: Instruction.parquet, Summary.parquet, ...
            real_table_files(profile, name, tmp, keep_empty=True)
    return _into_new_dir(Path(out), fill)


#: DuckDB's row group: the unit a Parquet file is cut at
ROW_GROUP = 122_880
#: a real table with more rows is split into files of about this many, ``X_0.parquet``, ``X_1.parquet``, ...
#: (the real tool splits "large tables" without saying where: eight row groups, about a million rows, keeps a
#: 10 M-instruction table in ten files that pandas or DuckDB read one at a time)
SPLIT_ROWS = 8 * ROW_GROUP


def real_table_files(profile, name: str, into: Path, split_rows: int = SPLIT_ROWS,
                     keep_empty: bool = False) -> int:
    """Write the real table ``name`` into the directory ``into`` as ``<name>.parquet``, or, past ``split_rows``
    rows (in whole row groups: a file may hold a few more), as ``<name>_0.parquet``, ``<name>_1.parquet``, ... (the real
    tool's layout); return its rows. An empty table writes no file unless ``keep_empty`` (the real tool writes a
    table only when the profile holds that kind of activity).

    >>> import tempfile, traces, traces.synthetic
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = traces.synthetic.write_run(d / "run", executions=1, instructions=5000)
    >>> with traces.open(d / "run") as p:
    ...     n = real_table_files(p, "Instruction", d, split_rows=2048)
    >>> n > 4096, (d / "Instruction_2.parquet").is_file(), (d / "Instruction.parquet").exists()
    (True, True, False)
    """
    if split_rows < 2048:
        raise TraceError(f"split_rows {split_rows}: give at least 2048 (one DuckDB vector)")
    group = min(ROW_GROUP, split_rows)
    parts = into / f".{name}.parts"
    shutil.rmtree(parts, ignore_errors=True)
    try:
        pattern = "'" + name.replace("'", "''") + "_{i}'"
        n = profile.sql(f'COPY (SELECT * FROM {profile_schema.SCHEMA}."{name}") TO {_quoted(parts)} '
                        f"(FORMAT parquet, ROW_GROUP_SIZE {int(group)}, "
                        f"ROW_GROUPS_PER_FILE {int(split_rows // group)}, FILENAME_PATTERN {pattern})"
                        ).column(0)[0].as_py()
        files = sorted(parts.glob("*.parquet"), key=lambda f: int(f.stem.rsplit("_", 1)[1]))
        if len(files) == 1 and (n or keep_empty):
            files[0].rename(into / f"{name}.parquet")
        elif n:
            for f in files:
                f.rename(into / f.name)
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    return int(n or 0)


def csv(profile, out: str | os.PathLike) -> Path:
    """Write one ``<table>.csv`` (with a header row) per table, raw and derived; return the directory.

    Example: ``csv(p, "trace_csv")``.
    """
    def fill(tmp: Path) -> None:
        for name in profile.tables():
            order = " ORDER BY start_ns" if name == "instructions" else ""
            profile.sql(f"COPY (SELECT * FROM {name}{order}) TO {_quoted(tmp / (name + '.csv'))} (HEADER)")
    return _into_new_dir(Path(out), fill)


def full_json(profile, out: str | os.PathLike, max_rows: int = JSON_MAX_ROWS) -> Path:
    """Write the whole profile as one JSON document (``export --format json``):
    ``{"format", "tables": {name: [row, ...]}, "truncated": [names]}`` with every real table
    (``Instruction``, ``Summary``, ``Metadata``, ``DmaPacket``, ...) under its real name, each at most
    ``max_rows`` rows (those cut are listed in ``truncated``). ``view --output-format json`` writes the real
    tool's files instead (:mod:`traces.json_files`). Returns the file.

    >>> import tempfile, traces, traces.synthetic
    >>> d = tempfile.mkdtemp()
    >>> _ = traces.synthetic.write_run(d, executions=1, instructions=50)
    >>> with traces.open(d) as p:
    ...     doc = json.load(open(full_json(p, d + "/profile.json", max_rows=10)))
    >>> len(doc["tables"]["Instruction"]), "Instruction" in doc["truncated"], "Summary" in doc["tables"]
    (10, True, True)
    """
    tables = [(name, "", {}) for name in profile.real_tables()]
    json_tables(profile, out, {"format": "neuron-explorer full-profile json"}, tables, max_rows)
    return Path(out)


def json_tables(profile, out: str | os.PathLike, head: dict, tables: list[tuple[str, str, dict]],
                max_rows: int = JSON_MAX_ROWS) -> tuple[dict[str, int], list[str]]:
    """Write the JSON document ``{**head, "tables": {name: [row, ...]}, "truncated": [names]}`` to ``out``
    (through a temporary file renamed into place): per ``(name, where, params)`` the real table ``name``'s rows
    that pass the SQL condition ``where`` ("" for all; its values in ``params``), at most ``max_rows`` each.
    Streamed table by table through DuckDB, so a large profile never sits in memory as Python objects.
    Returns the rows written per table and the names of the tables cut.
    Example: ``json_tables(p, "x.json", {}, [("Summary", "", {})])``.
    """
    out = Path(out)
    if max_rows < 1:
        raise TraceError(f"max_rows {max_rows}: give at least 1")
    tmp_dir = out.with_name(f".{out.name}.{os.getpid()}.parts")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    rows, cut = {}, []
    try:
        tmp_dir.mkdir(parents=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(head)[:-1] + (", " if head else "") + '"tables": {')
            for i, (name, where, params) in enumerate(tables):
                query = f'SELECT * FROM {profile_schema.SCHEMA}."{name}"' + (f" WHERE {where}" if where else "")
                n = profile.sql(f"SELECT count(*) AS n FROM ({query} LIMIT $n)",
                                {**params, "n": max_rows + 1}).column(0)[0].as_py()
                rows[name] = min(n, max_rows)
                if n > max_rows:
                    cut.append(name)
                part = tmp_dir / f"{i}.json"
                profile.sql(f"COPY ({query} LIMIT {int(max_rows)}) TO {_quoted(part)} (FORMAT json, ARRAY true)",
                            params or None)
                f.write(("" if i == 0 else ", ") + json.dumps(name) + ": ")
                with open(part, encoding="utf-8") as src:
                    shutil.copyfileobj(src, f)
                part.unlink()
            f.write('}, "truncated": ' + json.dumps(cut) + "}\n")
        os.replace(tmp, out)
    except OSError as exc:
        raise TraceError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        tmp.unlink(missing_ok=True)
    return rows, cut


#: the tables a window's CSV export holds, under the real tool's file names
WINDOW_TABLES = ("Instruction", "DmaPacket", "CcInstruction", "SemaphoreUpdate", "SbufAllocation")


def _window_queries(profile) -> dict:
    """Per CSV table: ``(query, time column, track column)`` over the window ``$t0 .. $t1``; each query's rows
    start with ``timeline_track`` where the event has one (SbufAllocation has none)."""
    have = {t.lower() for t in profile.tables()}
    track = _track_sql()
    q = {}
    if "instructions" in have:
        # compute engines here; the DMA queues' rows are DmaPacket.csv and the CC-core's CcInstruction.csv
        q["Instruction"] = (f"SELECT {track} AS timeline_track, * FROM main.instructions "
                            "WHERE engine NOT IN ('dma', 'cc') AND start_ns >= $t0 AND start_ns < $t1",
                            "start_ns", "timeline_track")
        q["CcInstruction"] = (f"SELECT {track} AS timeline_track, * FROM main.instructions "
                              "WHERE engine = 'cc' AND start_ns >= $t0 AND start_ns < $t1",
                              "start_ns", "timeline_track")
    if "DmaPacket" in profile.real_tables():
        q["DmaPacket"] = (f"""SELECT coalesce(queue_name, 'DMA') || '(nc' || nc_idx || ')' AS timeline_track, *
                              FROM {profile_schema.SCHEMA}."DmaPacket" WHERE start_ts >= $t0 AND start_ts < $t1""",
                          "start_ts", "timeline_track")
    if "semaphoreupdate" in have:
        q["SemaphoreUpdate"] = ("""SELECT queue || '(nc' || core || ')' AS timeline_track, * FROM main.SemaphoreUpdate
                                   WHERE timestamp >= $t0 AND timestamp < $t1""", "timestamp", "timeline_track")
    if "sbufallocation" in have:
        q["SbufAllocation"] = ("SELECT * FROM main.SbufAllocation WHERE start_ts < $t1 AND end_ts >= $t0",
                               "start_ts", None)
    return {name: q[name] for name in WINDOW_TABLES if name in q}


def window_tables(profile, t0: int, t1: int, max_rows: int = 1_000_000, sample: int | None = None) -> dict:
    """The rows of the time window ``[t0, t1)`` (absolute ns) per table, as the real Explorer's CSV export
    of the visible range: ``Instruction`` (compute-engine instructions starting in it), ``DmaPacket`` (DMA
    transfers), ``CcInstruction`` (the CC-core's collective instructions), ``SemaphoreUpdate`` (updates in it),
    each row first with its ``timeline_track``, and ``SbufAllocation`` (allocations overlapping it); each at most
    ``max_rows`` rows. ``sample`` = the timeline's buckets across the window: keep only the first event per
    track and bucket (the real tool's "Sample at the timeline's resolution", about what is drawn);
    ``None`` keeps every event. Returns ``{name: (pa.Table, truncated)}``; tables a profile lacks are left out.

    >>> import tempfile, traces, traces.synthetic
    >>> d = tempfile.mkdtemp()
    >>> _ = traces.synthetic.write_run(d, executions=1, instructions=50)
    >>> with traces.open(d) as p:
    ...     got = window_tables(p, 0, 2**62)
    ...     few = window_tables(p, 0, 2**62, sample=1)
    >>> got["Instruction"][0].column_names[0], got["DmaPacket"][0].num_rows > 0
    ('timeline_track', True)
    >>> few["DmaPacket"][0].num_rows == len(set(got["DmaPacket"][0].column("timeline_track").to_pylist()))
    True
    """
    if sample is not None and not 1 <= sample <= 100_000:
        raise TraceError(f"sample {sample}: give 1 to 100000 buckets, or None for every event")
    out = {}
    for name, (query, ts, track) in _window_queries(profile).items():
        if sample is not None and track:
            query = (f"SELECT * FROM ({query}) QUALIFY row_number() OVER (PARTITION BY {track}, "
                     f"({ts} - $t0) * $k // greatest($t1 - $t0, 1) ORDER BY {ts}) = 1")
        params = {"t0": int(t0), "t1": int(t1), "n": int(max_rows) + 1}
        if sample is not None and track:
            params["k"] = int(sample)
        t = profile.sql(f"SELECT * FROM ({query}) ORDER BY {ts} LIMIT $n", params)
        out[name] = (t.slice(0, max_rows), t.num_rows > max_rows)
    return out
