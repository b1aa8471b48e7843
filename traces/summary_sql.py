"""The Summary's SQL: one formula per metric, run by finalise (``summary``, ``summary_per_core``), by the
query layer over Parquet exports and datasets, and by Spark (``traces/spark_summary.py``); and the
conditions every figure shares (device time, measured executions, recompiles, the recording window).

>>> "recompile_count" in summary_sql()
True
"""
from __future__ import annotations

from traces.vocab import CONCURRENT_ENGINES, SUMMARY_ENGINE_PREFIX

#: Device time of one execution: its span minus the host (CPU-fallback) time inside it, never more
#: than the recorded device makespan. The runtime records ``device_ns`` as the whole span, host
#: time included, while other writers record the device part alone; this is right for both.
DEVICE_NS_SQL = ("least(coalesce(device_ns, end_ns - start_ns), "
                 "greatest(end_ns - start_ns - coalesce(cpu_fallback_ns, 0), 0))")

#: SQL condition on ``executions``: the execution overlaps the window ``[$w0, $w1)`` (absolute ns, named
#: parameters): a timeline selection's figures are the Summary's over the executions it touches.
WINDOW_CONDITION = "start_ns < $w1 AND end_ns > $w0"


def measured_condition(include_warmup: bool, window: bool = False) -> str:
    """SQL condition on ``executions``: the ones the summaries count (warm-ups excluded, unless every
    execution is a warm-up, or ``include_warmup``); with ``window``, only those overlapping ``[$w0, $w1)``
    (:data:`WINDOW_CONDITION`). Example: ``f"... WHERE {measured_condition(False)}"``."""
    cond = "TRUE" if include_warmup else ("NOT coalesce(warmup, FALSE) OR NOT EXISTS "
                                          "(SELECT 1 FROM executions WHERE NOT coalesce(warmup, FALSE))")
    return f"({cond}) AND {WINDOW_CONDITION}" if window else cond


def _dma_split(name: str, where: str) -> str:
    """``<name>_dma_packet_count``, ``<name>_dma_size`` and their percentages, over ``opcode_summary``."""
    d = "FROM opcode_summary WHERE engine = 'dma'"
    return f"""(SELECT coalesce(sum(instruction_count), 0) {d} AND {where})::BIGINT AS {name}_dma_packet_count,
        (SELECT coalesce(sum(transfer_bytes), 0) {d} AND {where})::BIGINT AS {name}_dma_size,
        (SELECT 100.0 * coalesce(sum(instruction_count) FILTER (WHERE {where}), 0) / nullif(sum(instruction_count), 0)
            {d}) AS {name}_dma_packet_percent,
        (SELECT 100.0 * coalesce(sum(transfer_bytes) FILTER (WHERE {where}), 0) / nullif(sum(transfer_bytes), 0) {d})
            AS {name}_dma_size_percent"""


#: A window's rows, clipped to ``[$w0, $w1)``, under the names the Summary reads (``clip_executions`` for
#: ``executions``, ``clip_engines`` for ``exec_engine_summary``). An execution inside the window counts whole
#: (its stored rows); one the window's edge cuts counts its instructions' part inside (``f``), their FLOPs and
#: bytes pro rata, and keeps the share of its model FLOPs that its Tensor Engine instructions' FLOPs have
#: inside (of its HBM bytes, its DMA bytes' share; without instruction rows, its time share); a concurrent
#: engine's active time is the union of its clipped intervals, as finalise's (``union_active``). Only the
#: cut executions' instructions are read: those starting in ``[$e0, $e1]`` or ``[$e2, $e3]``, the spans of the
#: executions across each edge (:func:`window_params`), so a selection costs about its two edges. Over a
#: window holding everything every figure is the Summary's (a test says so).
_CONCURRENT = ", ".join(f"'{e}'" for e in CONCURRENT_ENGINES)
CLIP_CTES = f"""cut_x AS (
        SELECT exec_id, (least(end_ns, $w1) - greatest(start_ns, $w0)) / (end_ns - start_ns) AS t FROM executions
        WHERE {WINDOW_CONDITION} AND (start_ns < $w0 OR end_ns > $w1) AND end_ns > start_ns),
    clip_i AS (
        SELECT exec_id, engine, greatest(start_ns, $w0) AS s, least(start_ns + dur_ns, $w1) AS e, dur_ns, flops,
               bytes_read, bytes_written, greatest(bytes_read, bytes_written) AS transfer_bytes,
               CASE WHEN dur_ns > 0 THEN (least(start_ns + dur_ns, $w1) - greatest(start_ns, $w0)) / dur_ns
                    ELSE 1.0 END AS f
        FROM instructions
        WHERE (start_ns BETWEEN $e0 AND $e1 OR start_ns BETWEEN $e2 AND $e3) AND exec_id IN (SELECT exec_id FROM cut_x)
          AND start_ns < $w1 AND (start_ns + dur_ns > $w0 OR (dur_ns <= 0 AND start_ns >= $w0))),
    clip_share AS (
        SELECT exec_id, sum(flops * f) FILTER (WHERE engine = 'tensor') AS tf,
               sum(bytes_read * f) FILTER (WHERE engine = 'dma') AS dr,
               sum(bytes_written * f) FILTER (WHERE engine = 'dma') AS dw FROM clip_i GROUP BY exec_id),
    clip_executions AS (
        SELECT x.* REPLACE (greatest(x.start_ns, $w0) AS start_ns, least(x.end_ns, $w1) AS end_ns,
                            x.device_ns * x.t AS device_ns, x.cpu_fallback_ns * x.t AS cpu_fallback_ns,
                            x.flops * x.sf AS flops, x.transpose_flops * x.sf AS transpose_flops,
                            x.hbm_read_bytes * x.sr AS hbm_read_bytes,
                            x.spill_reload_bytes * x.sr AS spill_reload_bytes,
                            x.hbm_write_bytes * x.sw AS hbm_write_bytes, x.spill_save_bytes * x.sw AS spill_save_bytes)
        FROM (SELECT e.*, coalesce(cx.t, 1.0) AS t, cx.exec_id IS NOT NULL AS cut,
                     CASE WHEN cx.exec_id IS NULL THEN 1.0 ELSE coalesce(c.tf / nullif(te.flops, 0),
                          CASE WHEN te.flops > 0 THEN 0 END, cx.t) END AS sf,
                     CASE WHEN cx.exec_id IS NULL THEN 1.0 ELSE coalesce(c.dr / nullif(de.bytes_read, 0),
                          CASE WHEN de.bytes_read > 0 THEN 0 END, cx.t) END AS sr,
                     CASE WHEN cx.exec_id IS NULL THEN 1.0 ELSE coalesce(c.dw / nullif(de.bytes_written, 0),
                          CASE WHEN de.bytes_written > 0 THEN 0 END, cx.t) END AS sw
              FROM executions e LEFT JOIN cut_x cx USING (exec_id) LEFT JOIN clip_share c USING (exec_id)
              LEFT JOIN exec_engine_summary te ON te.exec_id = e.exec_id AND te.engine = 'tensor'
              LEFT JOIN exec_engine_summary de ON de.exec_id = e.exec_id AND de.engine = 'dma'
              WHERE {WINDOW_CONDITION}) AS x),
    clip_active AS (
        SELECT exec_id, engine, sum(greatest(e - greatest(s, coalesce(pm, s)), 0)) AS active_ns
        FROM (SELECT exec_id, engine, s, e, max(e) OVER (PARTITION BY exec_id, engine ORDER BY s, e
                                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pm
              FROM clip_i WHERE engine IN ({_CONCURRENT}) AND e >= s) GROUP BY ALL),
    clip_engines AS (
        SELECT s.* FROM exec_engine_summary s JOIN clip_executions x USING (exec_id) WHERE NOT x.cut
        UNION ALL BY NAME
        SELECT g.*, coalesce(a.active_ns, g.busy_ns) AS active_ns, 'instructions' AS origin
        FROM (SELECT exec_id, engine, count(*) AS instruction_count, sum(dur_ns * f) AS busy_ns,
                     sum(flops * f) AS flops, sum(bytes_read * f) AS bytes_read,
                     sum(bytes_written * f) AS bytes_written, sum(transfer_bytes * f) AS transfer_bytes
              FROM clip_i GROUP BY ALL) AS g LEFT JOIN clip_active AS a USING (exec_id, engine)
        UNION ALL BY NAME
        SELECT s.* REPLACE (s.busy_ns * x.t AS busy_ns, s.active_ns * x.t AS active_ns)
        FROM exec_engine_summary s JOIN clip_executions x USING (exec_id) WHERE x.cut AND s.origin = 'executions')"""

#: The executions across each edge of a window (``$w0``, ``$w1``): the instant span of their starts and ends,
#: the extra parameters :data:`CLIP_CTES` reads (``$e0``..``$e3``).
EDGES_SQL = """SELECT coalesce(min(start_ns) FILTER (WHERE start_ns < $w0), 0) AS e0,
                      coalesce(max(end_ns) FILTER (WHERE start_ns < $w0), -1) AS e1,
                      coalesce(min(start_ns) FILTER (WHERE end_ns > $w1), 0) AS e2,
                      coalesce(max(end_ns) FILTER (WHERE end_ns > $w1), -1) AS e3
               FROM executions WHERE start_ns < $w1 AND end_ns > $w0 AND (start_ns < $w0 OR end_ns > $w1)"""


#: SQL condition on ``graphs``: the graph is a recompile (of a known graph, or with the reason dynamo gave).
RECOMPILED_SQL = "recompile_of IS NOT NULL OR coalesce(recompile_reason, '') <> ''"

#: The recording window's compile-related events and the graphs loaded before it, as two CTEs
#: (``window_events``, ``before_window``) every compile figure reads. A run's window is
#: ``[runs.start_ns, runs.end_ns]``: its recorder's first and last moment (from its first execution when
#: that is earlier: an execution is only recorded inside the window). An event is inside when it
#: ends at or after the start (a compile that finished in the window began a little before its load,
#: which is what the recorder saw) and starts before the end (a crashed run's end is its last
#: execution, so it has no end bound). A graph is *before the window* when no load, compile, cache-hit
#: or recompile event of it is inside: a capture that starts later describes the graphs already
#: loaded (their compile time and recompile marks are on the graph row) without their history.
WINDOW_CTES = """window_runs AS (
        SELECT r.run_id, least(r.start_ns, x.first_ns) AS start_ns, r.end_ns, r.status
        FROM runs r LEFT JOIN (SELECT run_id, min(start_ns) AS first_ns FROM executions GROUP BY run_id) x
        USING (run_id)),
    window_events AS (
        SELECT e.kind, e.graph_id, coalesce(e.dur_ns, 0) AS dur_ns
        FROM events e LEFT JOIN window_runs r USING (run_id)
        WHERE e.kind IN ('compile', 'recompile', 'cache_hit', 'load')
          AND (r.start_ns IS NULL OR e.ts_ns + coalesce(e.dur_ns, 0) >= r.start_ns)
          AND (r.end_ns IS NULL OR r.status = 'incomplete' OR e.ts_ns <= r.end_ns)),
    before_window AS (SELECT * FROM graphs WHERE graph_id NOT IN
                      (SELECT graph_id FROM window_events WHERE graph_id IS NOT NULL))"""


#: The whole-profile columns (one row only): CPU fallbacks, graphs, recompiles, cache hits and compiles inside
#: the recording window, and what happened before it.
_EVENT_COLUMNS = f""",
    (SELECT count(*) FROM events WHERE kind = 'cpu_fallback') AS cpu_fallback_count,
    (SELECT count(*) FROM ops WHERE placement = 'cpu_fallback') AS cpu_fallback_op_count,
    (SELECT count(*) FROM graphs) AS graph_count,
    (SELECT count(*) FROM graphs WHERE ({RECOMPILED_SQL})
                                   AND graph_id IN (SELECT graph_id FROM window_events)) AS recompile_count,
    (SELECT count(*) FROM window_events WHERE kind = 'cache_hit') AS cache_hit_count,
    (SELECT count(*) FROM window_events WHERE kind = 'compile') AS compile_count,
    (SELECT coalesce(sum(dur_ns), 0) FROM window_events WHERE kind = 'compile') / 1e9 AS compile_time,
    (SELECT count(*) FROM before_window) AS before_window_graph_count,
    (SELECT count(*) FROM before_window WHERE {RECOMPILED_SQL}) AS before_window_recompile_count,
    (SELECT count(*) FROM before_window WHERE cache_hit) AS before_window_cache_hit_count,
    (SELECT count(*) FROM before_window WHERE NOT coalesce(cache_hit, FALSE) AND compile_wall_ns > 0)
        AS before_window_compile_count,
    (SELECT coalesce(sum(compile_wall_ns), 0) FROM before_window WHERE NOT coalesce(cache_hit, FALSE)) / 1e9
        AS before_window_compile_time"""


def summary_sql(include_warmup: bool = False, per_core: bool = False, window: bool = False) -> str:
    """SQL for the Summary metrics under the real profiler's names (docs/trace_schema.md, "summary").

    One row overall, or one per ``(run_id, core)`` with ``per_core``. With ``window`` every figure is over
    ``[$w0, $w1)`` (named parameters; a timeline selection): the executions and instructions clipped to it
    (:data:`CLIP_CTES`), and the CPU-fallback events overlapping it.
    Reads only small tables (``executions``, ``exec_engine_summary``, ...): cheap on a finalised profile.
    Example: ``profile.sql(summary_sql(include_warmup=True))``.
    """
    keys = "run_id, core" if per_core else ""
    sel_keys = f"{keys}, " if keys else ""
    join = "USING (run_id, core)" if per_core else "ON TRUE"
    engine_cols = []
    for engine, name in SUMMARY_ENGINE_PREFIX.items():
        engine_cols += [
            f"coalesce(sum(instruction_count) FILTER (WHERE engine = '{engine}'), 0)::BIGINT"
            f" AS {name}_instruction_count",
            f"coalesce(sum(busy_ns) FILTER (WHERE engine = '{engine}'), 0) / 1e9 AS {name}_instruction_time",
            f"coalesce(sum(active_ns) FILTER (WHERE engine = '{engine}'), 0) AS {engine}_active_ns"]
    event_cols = "" if per_core else _EVENT_COLUMNS
    # compiler-generated descriptors are static DMA; an indirect (gather) DMA's descriptors are written
    # at run time by GpSimd software: software-dynamic (the real Summary's split; no hardware DGE modelled)
    dma_cols = "" if per_core else f""",
        {_dma_split("static", "opcode <> 'DMA_INDIRECT'")},
        {_dma_split("software_dynamic", "opcode = 'DMA_INDIRECT'")}"""
    fb_window = "AND ts_ns < $w1 AND ts_ns + coalesce(dur_ns, 0) > $w0" if window else ""
    engine_out = []
    for engine, name in SUMMARY_ENGINE_PREFIX.items():
        engine_out += [f"eng.{name}_instruction_count", f"eng.{name}_instruction_time",
                       f"eng.{engine}_active_ns / 1e9 AS {name}_active_time",
                       f"100.0 * eng.{engine}_active_ns / nullif(ex.device_ns, 0) AS {name}_active_time_percent"]
    execs, engines = ("clip_executions", "clip_engines") if window else ("executions", "exec_engine_summary")
    return f"""
    WITH {WINDOW_CTES},{(CLIP_CTES + ",") if window else ""}
    md AS (SELECT try_cast(max(value) FILTER (WHERE key = 'tensor_engine_peak_bf16_flops') AS DOUBLE) AS peak,
                  -- one HBM stack's bandwidth in GB/s = bytes per ns (the real hbm_max_bandwidth)
                  try_cast(max(value) FILTER (WHERE key = 'hbm_ddr_bandwidth') AS DOUBLE) AS hbm_bw,
                  try_cast(max(value) FILTER (WHERE key = 'neuroncore_clock_freq') AS DOUBLE) AS clock_ghz
           FROM metadata),
    -- each run's own target's peak (a process's trn2 and trn1 sessions differ), recorded per target
    tp AS (SELECT r.run_id, try_cast(max(m.value) AS DOUBLE) AS peak FROM runs r JOIN metadata m
           ON m.key = 'target.' || r.target || '.tensor_engine_peak_bf16_flops' GROUP BY r.run_id),
    -- a core is a core of one host: two hosts' core 0 are two cores (a multi-host dataset)
    rh AS (SELECT run_id, max(host) AS core_host FROM runs GROUP BY run_id),
    meas AS (SELECT executions.*, coalesce(tp.peak, (SELECT peak FROM md)) AS target_peak, rh.core_host
             FROM {execs} AS executions LEFT JOIN tp USING (run_id) LEFT JOIN rh USING (run_id)
             WHERE {measured_condition(include_warmup, window)}),
    ex AS (SELECT {sel_keys}count(*) AS execution_count,
                  sum({DEVICE_NS_SQL})::BIGINT AS device_ns,
                  sum(({DEVICE_NS_SQL}) * target_peak) AS peak_device_ns,
                  min(target_peak) AS peak_lo, max(target_peak) AS peak_hi,
                  sum(end_ns - start_ns)::BIGINT AS exec_ns, coalesce(sum(flops), 0)::BIGINT AS model_flops,
                  coalesce(sum(hbm_read_bytes), 0)::BIGINT AS hbm_read_bytes,
                  coalesce(sum(hbm_write_bytes), 0)::BIGINT AS hbm_write_bytes,
                  coalesce(sum(cpu_fallback_ns), 0) AS cpu_fallback_ns,
                  coalesce(sum(spill_save_bytes), 0)::BIGINT AS spill_save_bytes,
                  coalesce(sum(spill_reload_bytes), 0)::BIGINT AS spill_reload_bytes,
                  coalesce(sum(transpose_flops), 0)::BIGINT AS transpose_flops,
                  count(DISTINCT CASE WHEN core IS NOT NULL
                        THEN concat(coalesce(core_host, ''), ':', CAST(core AS STRING)) END) AS core_count,
                  count(DISTINCT run_id) AS run_count,
                  bool_or(coalesce(warmup, FALSE)) AS warmup_included
           FROM meas {'GROUP BY ' + keys if keys else ''}),
    eng AS (SELECT {sel_keys}{', '.join(engine_cols)},
                   coalesce(sum(active_ns) FILTER (WHERE engine = 'dma'), 0) AS dma_active_ns,
                   coalesce(sum(instruction_count) FILTER (WHERE engine = 'dma'), 0)::BIGINT AS dma_transfer_count,
                   coalesce(sum(transfer_bytes) FILTER (WHERE engine = 'dma'), 0)::BIGINT AS dma_transfer_total_bytes,
                   coalesce(sum(active_ns) FILTER (WHERE engine = 'cc'), 0) AS cc_active_ns,
                   coalesce(sum(instruction_count) FILTER (WHERE engine = 'cc'), 0)::BIGINT AS cc_op_count,
                   coalesce(sum(s.flops) FILTER (WHERE engine = 'tensor'), 0)::BIGINT AS tensor_flops,
                   coalesce(sum(instruction_count), 0)::BIGINT AS event_count,
                   count(*) FILTER (WHERE origin = 'instructions') > 0 AS has_instructions
            FROM {engines} AS s JOIN meas USING (exec_id) {'GROUP BY ' + keys if keys else ''}),
    -- CPU-fallback host time is recorded per execution or as fallback events' durations (or both: the
    -- same time twice), so the figure is the larger of the two, never their sum
    fb AS (SELECT {sel_keys}coalesce(sum(dur_ns), 0) AS event_ns FROM events
           WHERE kind = 'cpu_fallback' {fb_window} {'GROUP BY ' + keys if keys else ''}),
    pk AS (SELECT {sel_keys}coalesce(CASE WHEN peak_lo = peak_hi THEN peak_lo
                                          ELSE peak_device_ns / nullif(device_ns, 0) END,
                                     (SELECT peak FROM md)) AS peak FROM ex)
    SELECT {', '.join('ex.' + k.strip() for k in keys.split(',')) + ', ' if keys else ''}
        ex.device_ns / 1e9 AS total_time,
        ex.exec_ns / 1e9 AS total_exec_time,
        ex.execution_count, ex.warmup_included, ex.core_count, ex.run_count,
        round(ex.device_ns * md.clock_ghz)::BIGINT AS neuroncore_cycle_count,
        {', '.join(engine_out)},
        eng.dma_active_ns / 1e9 AS dma_active_time,
        100.0 * eng.dma_active_ns / nullif(ex.device_ns, 0) AS dma_active_time_percent,
        eng.dma_transfer_count, eng.dma_transfer_total_bytes,
        eng.dma_transfer_total_bytes / nullif(eng.dma_transfer_count, 0) AS dma_transfer_average_bytes,
        eng.cc_active_ns / 1e9 AS cc_op_active_time,
        100.0 * eng.cc_active_ns / nullif(ex.device_ns, 0) AS cc_op_active_time_percent, eng.cc_op_count,
        ex.model_flops,
        CASE WHEN eng.has_instructions THEN eng.tensor_flops ELSE ex.model_flops END AS hardware_flops,
        pk.peak AS tensor_engine_peak_bf16_flops,
        100.0 * ex.model_flops / nullif(pk.peak * ex.device_ns / 1e9, 0) AS mfu_estimated_percent,
        100.0 * (CASE WHEN eng.has_instructions THEN eng.tensor_flops ELSE ex.model_flops END)
            / nullif(pk.peak * ex.device_ns / 1e9, 0) AS hfu_estimated_percent,
        ex.hbm_read_bytes, ex.hbm_write_bytes,
        (CASE WHEN eng.has_instructions THEN eng.tensor_flops ELSE ex.model_flops END)
            / nullif(ex.hbm_read_bytes + ex.hbm_write_bytes, 0) AS mm_arithmetic_intensity,
        greatest(ex.cpu_fallback_ns, coalesce(fb.event_ns, 0)) / 1e9 AS cpu_fallback_time,
        ex.spill_save_bytes, ex.spill_reload_bytes, ex.transpose_flops,
        md.hbm_bw * ex.device_ns AS total_bandwidth_available,
        100.0 * (ex.hbm_read_bytes + ex.hbm_write_bytes) / nullif(md.hbm_bw * ex.device_ns, 0)
            AS mbu_estimated_percent,
        100.0 * (ex.hbm_read_bytes - ex.spill_reload_bytes) / nullif(ex.hbm_read_bytes, 0) AS useful_read_percent,
        eng.event_count{event_cols}{dma_cols}
    FROM ex LEFT JOIN eng {join} LEFT JOIN fb {join} LEFT JOIN pk {join} CROSS JOIN md
    {'ORDER BY ' + keys if keys else ''}"""
