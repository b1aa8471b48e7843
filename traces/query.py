"""The read side: ``traces.open(path) -> Profile`` (opened by :mod:`traces.opening`), SQL plus helpers for the
common questions.

A finalised ``profile.duckdb`` is opened read-only, so any number of readers share it (DuckDB
lets several read-only processes in, but no reader while a read-write holder exists: this is
why only finalise ever writes a profile, under a temporary name). Every DuckDB error becomes a
one-line :class:`~traces.errors.TraceError`; values always travel as parameters.

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=2, instructions=400)
>>> with traces.open(d) as p:
...     round(p.summary()["total_time"] * 1e9) == p.sql("SELECT device_ns FROM executions").to_pylist()[0]["device_ns"]
True
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

import pyarrow as pa

from traces import (
    naming,
    profile_schema,
    q_figures,
    q_insights,
    q_operators,
    q_records,
    q_regions,
    q_serving,
    q_timeline,
)
from traces.console import UserResult, run_user_sql
from traces.errors import OutOfMemory, TraceError, one_line
from traces.q_figures import CaptureVerdict, Figures
from traces.query_pages import PageQueries
from traces.schema import SCHEMA_VERSION, TABLES
from traces.summary_sql import RECOMPILED_SQL, WINDOW_CTES, summary_sql

log = logging.getLogger("traces")


class Profile(PageQueries):
    """A read-only profile. Use as a context manager; safe to share between threads.

    Example::

        with traces.open("output/session/profile.duckdb") as p:
            print(p.summary()["mfu_estimated_percent"])
            p.sql("SELECT opcode, count(*) FROM instructions WHERE core = ? GROUP BY ALL", [0])
    """

    def __init__(self, con, path: Path):
        self._con = con
        self.path = Path(path)
        self._local = threading.local()
        self._meta: dict[str, str] | None = None

    # -- plumbing ------------------------------------------------------------------------------
    def _cursor(self):
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            if self._con is None:
                raise TraceError(f"profile {self.path} is closed: open it again with traces.open()")
            cur = self._local.cursor = self._con.cursor()
        return cur

    def sql(self, query: str, params=None) -> pa.Table:
        """Run one SQL statement; the result as a ``pyarrow.Table``. Values go in ``params``.

        ``params`` is a list for ``?`` / ``$1`` placeholders or a dict for ``$name`` ones.
        Example: ``p.sql("SELECT * FROM ops WHERE placement = ?", ["cpu_fallback"])``.
        """
        import duckdb

        try:
            rel = self._cursor().sql(query, params=params)
            return pa.table({}) if rel is None else rel.to_arrow_table()
        except duckdb.OutOfMemoryException as exc:
            raise OutOfMemory(f"SQL error: {one_line(exc)}") from None
        except duckdb.Error as exc:
            raise TraceError(f"SQL error: {one_line(exc)}") from None

    def batches(self, query: str, params=None, batch_size: int = 262_144):
        """Stream a large result as ``pyarrow.RecordBatch`` es (its own cursor: other queries may run
        meanwhile). Example: ``for b in p.batches("SELECT * FROM instructions"): ...``.
        """
        import duckdb

        if self._con is None:
            raise TraceError(f"profile {self.path} is closed: open it again with traces.open()")
        cur = self._con.cursor()
        try:
            rel = cur.sql(query, params=params)
            if rel is None:
                return
            yield from rel.to_arrow_reader(batch_size)
        except duckdb.Error as exc:
            raise TraceError(f"SQL error: {one_line(exc)}") from None
        finally:
            cur.close()

    def _rows(self, query: str, params=None) -> list[tuple]:
        import duckdb

        try:
            return self._cursor().execute(query, params or []).fetchall()
        except duckdb.Error as exc:
            raise TraceError(f"SQL error: {one_line(exc)}") from None

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> "Profile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_version(self) -> None:
        try:
            version = self.metadata().get("schema_version")
        except TraceError:
            raise TraceError(f"{self.path} is a DuckDB database but not a neuron_stack profile (it has no "
                             "metadata table)") from None
        major = int(str(version or "0").split(".")[0] or 0) if str(version or "0").split(".")[0].isdigit() else -1
        ours = int(SCHEMA_VERSION.split(".")[0])
        if major > ours:
            raise TraceError(f"profile {self.path} was written by schema {version}; this neuron-stack reads "
                             f"{ours}.x: upgrade neuron-stack")
        if major < ours:
            raise TraceError(f"profile {self.path} was written by schema {version or 'unknown'}, older than the "
                             f"{ours}.x this neuron-stack reads: finalise its segments again with "
                             "`neuron-explorer summary DIR`")

    # -- helpers -------------------------------------------------------------------------------
    def tables(self) -> list[str]:
        """Names of our tables (raw and derived) in this profile. Example: ``"lod_busy" in p.tables()``.
        The real Neuron Explorer's tables (``Instruction``...) are :meth:`real_tables`."""
        # ours are snake_case, or the compiler's records under their real names (TABLES); the real views CamelCase
        return sorted(n for (n,) in self._rows(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'")
            if n == n.lower() or n in TABLES)

    def real_tables(self) -> list[str]:
        """The real Neuron Explorer's tables this profile holds (``traces.profile_schema``: ``Instruction``,
        ``Summary``, ``Metadata``, ``SystemProfileEvents``...), in schema ``neuron_explorer``.
        Example: ``"Instruction" in p.real_tables()``."""
        return sorted(r[0] for r in self._rows(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ?", [profile_schema.SCHEMA]))

    def columns(self) -> pa.Table:
        """Every table's columns and types (``table_name, column_name, data_type``) with ``SchemaFields``'
        ``required, unit, example, description``, for a schema inspector.

        Example: ``p.columns().filter(pc.field("table_name") == "Flow")``.
        """
        return q_records.columns(self)

    def metadata(self) -> dict[str, str]:
        """The metadata table as a dict (device rates, versions, trace statistics).

        Example: ``p.metadata()["target"] == "trn1"``.
        """
        if self._meta is None:
            self._meta = dict(self._rows("SELECT key, value FROM metadata"))
        return self._meta

    def display_name(self) -> str | None:
        """The name this profile shows as (``traces.naming``): the user's ``view --display-name``, else
        the script and mode it recorded (``aws_train.py · compiled``). Example: ``p.display_name()``."""
        meta = self.metadata()
        if "default_profile_name" not in meta:   # finalised before names were recorded, or a bare dataset
            meta = {**meta, "default_profile_name": naming.default_name(*self._rows(naming.NAME_SQL)[0])}
        return naming.display_name(meta)

    def runs(self) -> pa.Table:
        """One row per recorded process run, oldest first. Example: ``p.runs().column("status")``."""
        return self.sql("SELECT * FROM runs ORDER BY wall_start_ns")

    def ranks(self) -> pa.Table:
        """Per (node, rank) of a multi-process job: executions, device time, and the time spent
        waiting in collectives. The straggler is the rank that waits least: the others wait for it.
        Example: ``p.ranks().column("cc_wait_ns")``.
        """
        return self.sql("""
            WITH e AS (SELECT r.node, r.rank, e.exec_id, e.device_ns FROM executions e JOIN runs r USING (run_id)),
                 w AS (SELECT exec_id, sum(sem_wait_ns) AS wait_ns FROM instructions WHERE engine = 'cc'
                       GROUP BY exec_id)
            SELECT e.node, e.rank, count(*) AS executions, CAST(sum(e.device_ns) AS BIGINT) AS device_ns,
                   CAST(coalesce(sum(w.wait_ns), 0) AS BIGINT) AS cc_wait_ns
            FROM e LEFT JOIN w USING (exec_id) GROUP BY ALL ORDER BY e.node, e.rank""")

    def _stored_summary(self, include_warmup: bool | None) -> bool:
        stored = self.metadata().get("summary_includes_warmup", "false") == "true"
        return include_warmup is None or bool(include_warmup) == stored

    def summary(self, include_warmup: bool | None = None, window: tuple[int, int] | None = None) -> dict:
        """The Summary metrics (real profiler names) as a dict.

        Warm-up executions are excluded unless the profile was finalised with them or
        ``include_warmup=True``. ``window`` (absolute ns): the same metrics over that range, instructions
        clipped to it. Example: ``p.summary()["tensor_engine_active_time_percent"]``.
        """
        if window:
            warm = bool(include_warmup) if include_warmup is not None else \
                self.metadata().get("summary_includes_warmup", "false") == "true"
            rows = self.sql(summary_sql(warm, window=True), q_figures.window_params(self, window)).to_pylist()
            return rows[0] if rows else {}
        query = "SELECT * FROM summary" if self._stored_summary(include_warmup) else summary_sql(include_warmup)
        rows = self.sql(query).to_pylist()
        return rows[0] if rows else {}

    def summary_per_core(self, include_warmup: bool | None = None) -> pa.Table:
        """The Summary metrics per ``(run_id, core)``. Example: ``p.summary_per_core().num_rows``."""
        if self._stored_summary(include_warmup):
            return self.sql("SELECT * FROM summary_per_core")
        return self.sql(summary_sql(include_warmup, per_core=True))

    def top_ops(self, n: int = 20) -> pa.Table:
        """The ``n`` ops with the most device plus CPU-fallback time (``op_summary``).

        Example: ``p.top_ops(5).column("aten_op").to_pylist()``.
        """
        return self.sql("SELECT * FROM op_summary ORDER BY device_ns + cpu_ns DESC, op_id LIMIT ?", [int(n)])

    def source_hotspots(self, n: int = 20) -> pa.Table:
        """The ``n`` source lines with the most device plus CPU-fallback time (``source_summary``).

        Example: ``p.source_hotspots(3).select(["file", "line", "device_ns"])``.
        """
        return self.sql("SELECT * FROM source_summary ORDER BY device_ns + cpu_ns DESC, file, line LIMIT ?",
                        [int(n)])

    def fallbacks(self) -> pa.Table:
        """Ops placed on the CPU: reason, call site, how often and how long they ran on the host.

        Example: ``p.fallbacks().column("aten_op").to_pylist() == ["aten.nonzero.default"]``.
        """
        return q_figures.fallbacks(self)

    def recompiles(self) -> pa.Table:
        """Graphs compiled again for a new input signature: old and new signature, reason, cost, and
        ``before_window`` (loaded before the recording window; the Summary's ``recompile_count`` counts
        the others).

        Example: ``p.recompiles().column("recompile_reason").to_pylist()``.
        """
        return self.sql(f"""
            WITH {WINDOW_CTES}
            SELECT g.graph_id, g.run_id, g.name, g.kind, g.recompile_of,
                   prev.input_signature AS previous_signature, g.input_signature, g.recompile_reason,
                   g.compile_wall_ns, g.compile_ns, g.cache_hit, g.source_id, s.file, s.line,
                   g.graph_id IN (SELECT graph_id FROM before_window) AS before_window
            FROM (SELECT * FROM graphs WHERE {RECOMPILED_SQL}) g
            LEFT JOIN graphs prev ON prev.graph_id = g.recompile_of LEFT JOIN sources s ON s.source_id = g.source_id
            ORDER BY g.compile_ns, g.graph_id""")

    def source_text(self, file: str) -> str | None:
        """The embedded text of a source file (the profile is self-contained), or None.

        Example: ``p.source_text("/home/me/model.py").splitlines()[87]``.
        """
        rows = self._rows("SELECT text FROM source_files WHERE file = ?", [file])
        return rows[0][0] if rows else None

    def instructions(self, t0: int, t1: int, core=None, engine=None, limit: int | None = None) -> pa.Table:
        """Instructions overlapping ``[t0, t1)`` ns (projected clock), in start order.

        Example: ``p.instructions(t, t + 10_000, core=0, engine="tensor")``.
        """
        max_dur = int(self.metadata().get("max_instruction_dur_ns") or 0)
        where, params = q_timeline.lane_filter(core, engine)
        params.update(t0=int(t0), t1=int(t1), lo=int(t0) - max_dur)
        query = (f"SELECT * FROM instructions WHERE start_ns < $t1 AND start_ns >= $lo "
                 f"AND start_ns + dur_ns > $t0 {where} ORDER BY start_ns")
        if limit is not None:
            query += " LIMIT $limit"
            params["limit"] = int(limit)
        return self.sql(query, params)

    def trace_range(self) -> tuple[int, int] | None:
        """``(first instruction start, last instruction end)`` in ns, or None without instructions."""
        meta = self.metadata()
        lo, hi = meta.get("trace_start_ns"), meta.get("trace_end_ns")
        return (int(lo), int(hi)) if lo and hi else None

    def utilization(self, t0: int | None = None, t1: int | None = None, buckets: int = 1000, core=None,
                    engine=None, by_queue: bool = False) -> pa.Table:
        """Busy time per core × engine (× queue with ``by_queue``) in ``buckets`` equal time buckets.

        One row per lane and bucket (zeros included): ``bucket, start_ns, end_ns, core, engine,
        [queue,] busy_ns, utilization`` where ``utilization = busy_ns / bucket width``. The dma
        engine sums its queues, so its utilization can exceed 1.0 (ask ``by_queue`` for lanes).
        The level of detail follows the one rule of :mod:`traces.q_timeline`. ``core`` / ``engine``
        take one value or a list. Example: ``p.utilization(buckets=200, engine=["tensor", "vector"])``.
        """
        return q_timeline.utilization(self, t0, t1, buckets, core, engine, by_queue)

    # -- the figures every tool shows (traces.q_figures) ---------------------------------------
    def annotations(self) -> list[dict]:
        """The user's notes on the timeline (``traces.annotate``): ``id``, ``start_ns``, ``end_ns``, ``kind``
        (point / range), ``text``, in time order. Example: ``[a["text"] for a in p.annotations()]``."""
        from traces import annotate
        return annotate.of(self)

    def figures(self, include_warmup: bool | None = None, window: tuple[int, int] | None = None) -> Figures:
        """The headline figures (device time, busy %, engine %, MFU, fallback host time, compiles...).

        ``neuron-explorer summary``, the Explorer and ``neuron-top --replay`` all show these. ``window``
        (absolute ns): the same figures over the executions overlapping it, the timeline's Current
        Selection (compile counts stay the profile's). Example: ``p.figures().device_busy_percent``.
        """
        return q_figures.figures(self, include_warmup, window)

    def capture_verdict(self) -> CaptureVerdict:
        """Whether this profile is complete: ``incomplete`` when executions used the device but no instruction
        row was recorded (a core filter excluding every core used, say), ``info`` when device rows were off
        by choice or the event cap dropped system events; ``lines`` say why and the fix. The Summary,
        ``neuron-explorer summary`` and the Explorer show it. Example: ``p.capture_verdict().status``."""
        return q_figures.capture_verdict(self)

    def ops(self) -> pa.Table:
        """Every op with its source line and graph name. Example: ``p.ops().num_rows``."""
        return q_figures.ops(self)

    def op_totals(self, include_warmup: bool | None = None) -> pa.Table:
        """Per op: device time (device engines only, per engine too), instructions, FLOPs, bytes, host
        time of a CPU op; over the executions the Summary counts, or ``include_warmup`` decides.
        Example: ``p.op_totals(include_warmup=True).column("device_ns")``."""
        return q_figures.op_totals(self, include_warmup)

    def layer_engine_time(self) -> pa.Table:
        """Per layer (module path): each device engine's active ns, a concurrent engine's (DMA, CC) as
        the union of the layer's intervals, so never above the profile's total; its first source line; its
        bandwidth-bound DMA time and transfer counts (:func:`traces.q_figures.dma_bandwidth_bound`).
        Example: ``p.layer_engine_time().column("dma_bandwidth_ns")``."""
        return q_figures.layer_engine_time(self)

    def regions(self, by: str = "layer") -> pa.Table:
        """Automatic regions by layer, NKI kernel or collective (span, busy per engine, HFU), measured executions
        (:func:`traces.q_regions.regions`). Example: ``p.regions("kernel").column("region").to_pylist()``."""
        return q_regions.regions(self, by)

    def region_durations(self, by: str = "layer") -> pa.Table:
        """Each region's duration over its occurrences (min, median, max).

        Example: ``p.region_durations().column("median_ns")``."""
        return q_regions.region_durations(self, by)

    def operator_table(self, include_warmup: bool | None = None) -> pa.Table:
        """The operator table: layer → op → opcode with device time, MFU, HFU, FLOPs, bytes moved, source
        line and first-execution span (:func:`traces.q_operators.operator_table`).

        Example: ``p.operator_table().filter(pc.equal(p.operator_table()["level"], "op"))``."""
        return q_operators.operator_table(self, include_warmup)

    # -- the real Summary's remaining figures (traces.q_insights) --------------------------------
    def nki_engine_stats(self) -> pa.Table:
        """Instructions per engine, source (nki / compiler) and opcode. Example: ``p.nki_engine_stats().num_rows``."""
        return q_insights.nki_engine_stats(self)

    def nki_coverage(self) -> dict:
        """Per engine: NKI and compiler instructions and ``nki_percent``. Example: ``p.nki_coverage()["vector"]``."""
        return q_insights.nki_coverage(self)

    def dma_utilization(self) -> pa.Table:
        """Per core and DMA queue: bytes, bandwidth and active %. Example: ``p.dma_utilization().num_rows``."""
        return q_insights.dma_utilization(self)

    def collective_ops(self) -> pa.Table:
        """Every collective with its group median and ``outlier``. Example: ``p.collective_ops().num_rows``."""
        return q_insights.collective_ops(self)

    def collective_stats(self) -> pa.Table:
        """Collective durations per operation as a box plot. Example: ``p.collective_stats().num_rows``."""
        return q_insights.collective_stats(self)

    def throttling(self) -> dict:
        """The Tensor Engine's throttling figures. Example: ``p.throttling()["active_throttled_percent"]``."""
        return q_insights.throttling(self)

    def hierarchy(self) -> pa.Table:
        """Device time per (op, opcode) of the measured executions. Example: ``p.hierarchy().num_rows``."""
        return q_figures.hierarchy(self)

    def graphs(self) -> pa.Table:
        """Every graph with call site, executions and first compile time. Example: ``p.graphs().num_rows``."""
        return q_figures.graphs(self)

    def source_files(self) -> list[str]:
        """Files whose text the profile embeds. Example: ``p.source_files()[0]``."""
        return [r[0] for r in self._rows("SELECT file FROM source_files ORDER BY file")]

    def idle_gap(self) -> dict | None:
        """The longest gap between two executions on one core (``prev_end``, ``start_ns``), or None."""
        return q_figures.idle_gap(self)

    def compiles_between(self, t0: int | None = None, t1: int | None = None) -> dict:
        """Compiles (graphs) and their time started in ``[t0, t1)``, default first to last execution."""
        return q_figures.compiles_between(self, t0, t1)

    def spill_traffic(self) -> dict:
        """Bytes and DMA ns of SBUF spill/reload traffic. Example: ``p.spill_traffic()["bytes"]``."""
        return q_figures.spill_traffic(self)

    # -- LLM serving (traces.q_serving) -----------------------------------------------------------
    def serving_requests(self) -> pa.Table:
        """Finished requests with queue/TTFT/TPOT/E2E (ns). Example: ``p.serving_requests().num_rows``."""
        return q_serving.requests(self)

    def serving_steps(self) -> pa.Table:
        """Engine steps (prefill/decode, bucket, slots, tokens). Example: ``p.serving_steps()["phase"]``."""
        return q_serving.steps(self)

    def serving_buckets(self) -> pa.Table:
        """Steps, tokens and device time per (phase, bucket). Example: ``p.serving_buckets().to_pylist()``."""
        return q_serving.bucket_use(self)

    def serving_request_time(self) -> list[dict]:
        """Per phase: device and request time per step (ns). Example: ``p.serving_request_time()[0]["added_ns"]``."""
        return q_serving.request_time(self)

    def serving_summary(self) -> dict:
        """Requests, output tokens/s, P50/P90/P99 TTFT/TPOT/E2E. Example: ``p.serving_summary()["ttft_p50_ns"]``."""
        return q_serving.summary(self)

    # -- user SQL (traces.console) -------------------------------------------------------------
    def user_sql(self, sql: str, params=None, *, select_only: bool = False, max_rows: int | None = None,
                 timeout_s: float | None = None, max_bytes: int | None = None) -> UserResult:
        """Run a user's own SQL, bounded; see :func:`traces.console.run_user_sql`.

        Example: ``p.user_sql("SELECT * FROM ops", select_only=True, max_rows=100).table``.
        """
        return run_user_sql(self, sql, params, select_only=select_only, max_rows=max_rows, timeout_s=timeout_s,
                            max_bytes=max_bytes)
