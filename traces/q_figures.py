"""The figures a user sees, each computed once: the headline :class:`Figures`, op and line totals,
the hierarchy, fallbacks, graphs and recompiles, and the evidence behind the recommendations.

Device time and host (CPU-fallback) time never mix: an op's ``device_ns`` sums its device-engine
instructions only, its host time is ``host_ns``; an execution's device time is
:data:`traces.summary_sql.DEVICE_NS_SQL`.

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=3, instructions=300)
>>> with traces.open(d) as p:
...     f = p.figures()
>>> f.device_ns > 0 and f.fallback_host_ns > 0 and 0 < f.device_busy_percent <= 100
True
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from traces.intervals import union_by
from traces.monitor_figures import target_block
from traces.summary_sql import DEVICE_NS_SQL, EDGES_SQL, RECOMPILED_SQL, WINDOW_CTES, measured_condition
from traces.timefmt import fmt_ns
from traces.vocab import CONCURRENT_ENGINES, DEVICE_ENGINES, FALLBACK_PLACEMENT, SUMMARY_ENGINE_PREFIX


@dataclass(frozen=True)
class Figures:
    """The headline numbers of a profile; every tool shows these, from this one computation.

    ``device_ns``: device time of the measured executions summed over cores (host time excluded);
    ``step_ns``: that plus ``fallback_host_ns`` (the executions' time with their host work counted once);
    ``device_busy_percent``: the time each core was busy, over (first start → last end of those
    executions) × cores; a core's busy time is the union of its executions' device intervals, so an
    all-reduce overlapping the next compute execution on the same core counts once and the figure
    never exceeds 100 %;
    ``engine_percent``: per device engine, active time over ``device_ns``; ``mfu_percent``: model
    FLOPs over the Tensor Engine's BF16 peak for ``device_ns``; ``collective_ns``: time the CC engine
    ran collectives (the union of its queues), part of ``device_ns``; ``fallback_host_ns``: host time of
    CPU-fallback ops in those executions; ``compiles``, ``recompiles``, ``cache_hits``, ``compile_ns``:
    what happened inside the recording window (:data:`traces.summary_sql.WINDOW_CTES`: compile and cache-hit
    events, recompiled graphs loaded in it; cache hits and collectives are not compiled); ``graphs``: every
    graph the profile describes, those loaded before the window too; ``before_window``: ``graphs``,
    ``compiles``, ``recompiles``, ``cache_hits``, ``compile_ns`` of the graphs loaded before the window
    (a capture that started later), shown labelled by :meth:`before_window_text`. ``mbu_percent`` and
    ``total_bandwidth_available`` (bytes),
    ``useful_read_percent``, the spill bytes and FLOPs are the Summary's ``mbu_estimated_percent``,
    … columns; ``flops_breakdown`` splits the Tensor Engine's peak FLOPs over ``device_ns`` in percent:
    ``model_flops`` (= MFU), ``transpose_flops``, ``active_flops`` (active but not doing either) and
    ``idle`` (engine inactive); ``bandwidth_breakdown``: :func:`bandwidth_breakdown`; ``dma_split``: DMA
    bytes per descriptor source (``static``, ``software_dynamic``).
    """

    executions: int
    warmup_executions: int
    cores: int
    device_ns: int
    step_ns: int
    span_ns: int
    device_busy_percent: float
    engine_percent: dict
    mfu_percent: float
    model_flops: int
    hbm_read_bytes: int
    hbm_write_bytes: int
    collective_ns: int
    fallback_ops: int
    fallback_calls: int
    fallback_host_ns: int
    graphs: int
    compiles: int
    recompiles: int
    cache_hits: int
    compile_ns: int
    instructions: int
    # memory bandwidth and the Tensor Engine's FLOPs, under the real Summary's names (see ``figures``)
    mbu_percent: float = 0.0
    total_bandwidth_available: float = 0.0
    useful_read_percent: float = 0.0
    spill_save_bytes: int = 0
    spill_reload_bytes: int = 0
    hardware_flops: int = 0
    transpose_flops: int = 0
    flops_breakdown: dict = field(default_factory=dict)
    bandwidth_breakdown: dict = field(default_factory=dict)
    dma_split: dict = field(default_factory=dict)
    before_window: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """Plain JSON-able dict. Example: ``json.dumps(p.figures().as_dict())``."""
        return asdict(self)

    def before_window_text(self) -> str:
        """What happened before the recording window, labelled so ('' when nothing did): the compiles
        and recompiles of the graphs a later capture found already loaded.

        >>> Figures(**{**dict.fromkeys(Figures.__dataclass_fields__, 0), "before_window": {
        ...     "graphs": 9, "compiles": 7, "recompiles": 1, "cache_hits": 2, "compile_ns": 1_363_000_000}}
        ...     ).before_window_text()
        'before this window: 9 graphs loaded, 7 compiles (1 recompile, 2 cache hits), 1.36 s'
        """
        b = self.before_window or {}
        if not b.get("graphs"):
            return ""
        s = "" if b["recompiles"] == 1 else "s"
        return (f"before this window: {b['graphs']} graphs loaded, {b['compiles']} compiles "
                f"({b['recompiles']} recompile{s}, {b['cache_hits']} cache hits), {fmt_ns(b['compile_ns'])}")


def _int(v) -> int:
    return int(round(v)) if v is not None else 0


def figures(p, include_warmup: bool | None = None, window: tuple[int, int] | None = None) -> Figures:
    """See :meth:`traces.query.Profile.figures`."""
    warm = bool(include_warmup) if include_warmup is not None else \
        p.metadata().get("summary_includes_warmup", "false") == "true"
    params = {"w0": int(window[0]), "w1": int(window[1])} if window else None
    s = p.summary(include_warmup, window)
    ex = p.sql(f"""SELECT count(*) FILTER (WHERE coalesce(warmup, FALSE)) AS warmup,
                          coalesce({"least(max(end_ns), $w1) - greatest(min(start_ns), $w0)" if window else
                                    "max(end_ns) - min(start_ns)"}, 0) AS span,
                          count(DISTINCT (coalesce(target, ''), core)) AS cores
                   FROM executions LEFT JOIN (SELECT run_id, target FROM runs) USING (run_id)
                   WHERE {measured_condition(warm, bool(window))}""", params).to_pylist()[0]
    device_ns = _int((s.get("total_time") or 0) * 1e9)
    cores = int(ex["cores"] or 0)
    span = int(ex["span"] or 0)
    engines = {e: float(s.get(f"{prefix}_active_time_percent") or 0.0)
               for e, prefix in SUMMARY_ENGINE_PREFIX.items()}
    engines["dma"] = float(s.get("dma_active_time_percent") or 0.0)
    engines["cc"] = float(s.get("cc_op_active_time_percent") or 0.0)
    graphs, hits = int(s.get("graph_count") or 0), int(s.get("cache_hit_count") or 0)
    return Figures(
        executions=int(s.get("execution_count") or 0), warmup_executions=int(ex["warmup"] or 0), cores=cores,
        device_ns=device_ns, step_ns=device_ns + _int((s.get("cpu_fallback_time") or 0) * 1e9), span_ns=span,
        device_busy_percent=100.0 * busy_ns(p, warm, window) / (span * max(cores, 1)) if span else 0.0,
        engine_percent=engines, mfu_percent=float(s.get("mfu_estimated_percent") or 0.0),
        model_flops=int(s.get("model_flops") or 0), hbm_read_bytes=int(s.get("hbm_read_bytes") or 0),
        hbm_write_bytes=int(s.get("hbm_write_bytes") or 0),
        collective_ns=_int((s.get("cc_op_active_time") or 0) * 1e9),
        fallback_ops=int(s.get("cpu_fallback_op_count") or 0),
        fallback_calls=int(s.get("cpu_fallback_count") or 0),
        fallback_host_ns=_int((s.get("cpu_fallback_time") or 0) * 1e9),
        graphs=graphs, compiles=int(s.get("compile_count") or 0),
        recompiles=int(s.get("recompile_count") or 0), cache_hits=hits,
        compile_ns=_int((s.get("compile_time") or 0) * 1e9),
        instructions=(p.window_count(*window) if window else int(p.metadata().get("instruction_count") or 0)),
        mbu_percent=float(s.get("mbu_estimated_percent") or 0.0),
        total_bandwidth_available=float(s.get("total_bandwidth_available") or 0.0),
        useful_read_percent=float(s.get("useful_read_percent") or 0.0),
        spill_save_bytes=int(s.get("spill_save_bytes") or 0), spill_reload_bytes=int(s.get("spill_reload_bytes") or 0),
        hardware_flops=int(s.get("hardware_flops") or 0), transpose_flops=int(s.get("transpose_flops") or 0),
        flops_breakdown=flops_breakdown(s), bandwidth_breakdown=bandwidth_breakdown(s),
        dma_split={k: int(s.get(f"{k}_dma_size") or 0) for k in ("static", "software_dynamic")},
        before_window={"graphs": int(s.get("before_window_graph_count") or 0),
                       "compiles": int(s.get("before_window_compile_count") or 0),
                       "recompiles": int(s.get("before_window_recompile_count") or 0),
                       "cache_hits": int(s.get("before_window_cache_hit_count") or 0),
                       "compile_ns": _int((s.get("before_window_compile_time") or 0) * 1e9)})


@dataclass(frozen=True)
class CaptureVerdict:
    """Whether a profile holds the device rows of the device work it recorded, in one line per finding.

    ``status``: ``complete``; ``incomplete`` (executions used the device and no instruction row was recorded:
    a core filter excluded every core used, say); ``info`` (device rows deliberately off, or system events
    dropped by the per-core cap). ``lines``: what happened and the fix, from the recorder's metadata
    (``device_rows_note``, ``system_events_note``). ``device_executions``: executions that used the device.
    """
    status: str
    lines: tuple[str, ...]
    device_executions: int

    def as_dict(self) -> dict:
        """Plain JSON-able dict. Example: ``p.capture_verdict().as_dict()["status"]``."""
        return dict(asdict(self), lines=list(self.lines))


def capture_verdict(p) -> CaptureVerdict:
    """See :meth:`traces.query.Profile.capture_verdict`."""
    md = p.metadata()
    [(used, rows)] = p._rows("SELECT (SELECT count(*) FROM executions WHERE device_ns > 0), "
                             "EXISTS (SELECT 1 FROM instructions WHERE engine <> 'cpu')")
    status, lines = "complete", []
    if used and not rows:
        status = "info" if md.get("device_rows") == "off" else "incomplete"
        lines.append(md.get("device_rows_note") or
                     f"no device rows: {used} executions used the device and none recorded its instructions; "
                     "record with ProfileMode.DEVICE or NEURON_RT_INSPECT_DEVICE_PROFILE=session")
    if md.get("system_events_note"):
        status = "info" if status == "complete" else status
        lines.append(md["system_events_note"])
    return CaptureVerdict(status, tuple(lines), int(used))


def bandwidth_breakdown(s: dict) -> dict:
    """The real Summary's memory-bandwidth doughnut in percent of ``total_bandwidth_available``: HBM reads
    and writes without spill traffic, spill reloads and saves, and the unused rest.

    >>> bandwidth_breakdown({"total_bandwidth_available": 1000, "hbm_read_bytes": 300, "hbm_write_bytes": 100,
    ...                      "spill_reload_bytes": 100, "spill_save_bytes": 0})["unused"]
    60.0
    """
    avail = float(s.get("total_bandwidth_available") or 0.0)
    reload, save = int(s.get("spill_reload_bytes") or 0), int(s.get("spill_save_bytes") or 0)
    parts = {"HBM read": int(s.get("hbm_read_bytes") or 0) - reload,
             "HBM write": int(s.get("hbm_write_bytes") or 0) - save,
             "SBUF spill reload": reload, "SBUF spill save": save}
    out = {k: 100.0 * max(v, 0) / avail if avail else 0.0 for k, v in parts.items()}
    out["unused"] = max(100.0 - sum(out.values()), 0.0)
    return out


def flops_breakdown(s: dict) -> dict:
    """The Tensor Engine's peak FLOPs over the device time, in percent, as the real Summary's FLOPs chart:
    ``model_flops`` (MFU), ``transpose_flops``, ``active_flops`` (the engine active but doing neither:
    small tiles, pipeline bubbles) and ``idle``; they add up to 100. Throttled FLOPs are not split out
    (the cost model's trn2 throttling lengthens MATMULs; it is not recorded per instruction).

    >>> flops_breakdown({"mfu_estimated_percent": 20.0, "transpose_flops": 10, "tensor_engine_peak_bf16_flops": 100,
    ...                  "total_time": 1.0, "tensor_engine_active_time_percent": 50.0})
    {'model_flops': 20.0, 'transpose_flops': 10.0, 'active_flops': 20.0, 'idle': 50.0}
    """
    cap = float(s.get("tensor_engine_peak_bf16_flops") or 0.0) * float(s.get("total_time") or 0.0)
    model = float(s.get("mfu_estimated_percent") or 0.0)
    transpose = 100.0 * float(s.get("transpose_flops") or 0) / cap if cap else 0.0
    active = min(max(float(s.get("tensor_engine_active_time_percent") or 0.0), 0.0), 100.0)
    return {"model_flops": model, "transpose_flops": transpose,
            "active_flops": max(active - model - transpose, 0.0), "idle": 100.0 - active}


def window_params(p, window: tuple[int, int]) -> dict:
    """The named parameters of ``summary_sql(window=True)`` for ``window`` (absolute ns): ``w0``, ``w1`` and
    the spans of the executions its edges cut (``summary_sql.EDGES_SQL``). Example: ``window_params(p, (0, 9))``."""
    w = {"w0": int(window[0]), "w1": int(window[1])}
    return {**w, **p.sql(EDGES_SQL, w).to_pylist()[0]}


def busy_ns(p, include_warmup: bool = False, window: tuple[int, int] | None = None) -> int:
    """Device-busy ns summed over cores: :func:`core_busy`'s total."""
    return int(pc.sum(core_busy(p, include_warmup, window)["active_ns"]).as_py() or 0)


def core_busy(p, include_warmup: bool = False, window: tuple[int, int] | None = None) -> pa.Table:
    """Per (``target``, ``core``): the union of the measured executions' device intervals (``active_ns``).

    An execution's device interval is ``[start, start + device time)`` (its host time, wherever it
    fell, left out); executions that overlap on one core (a collective beside the next compute
    execution) count their overlap once, so a core is never busier than the time that passed. A core
    is one of its target's instance: a process's trn1 core 0 and inf2 core 0 are two cores. ``window``
    (absolute ns): those intervals clipped to it.
    """
    params = {"w0": int(window[0]), "w1": int(window[1])} if window else None
    clip = ("greatest(e.start_ns, $w0) AS start_ns, least(e.start_ns + e.dur_ns, $w1) - greatest(e.start_ns, $w0)"
            " AS dur_ns") if window else "e.start_ns, e.dur_ns"
    rows = p.sql(f"""SELECT coalesce(r.target, '') AS target, coalesce(e.core, -1) AS core, {clip}
                     FROM (SELECT run_id, core, start_ns, ({DEVICE_NS_SQL})::BIGINT AS dur_ns FROM executions
                           WHERE {measured_condition(include_warmup, bool(window))}) e
                     LEFT JOIN runs r USING (run_id)""", params)
    return union_by(rows, ("target", "core"))


def targets(p, include_warmup: bool | None = None) -> list[dict]:
    """Per target (a process's trn1 and inf2 sessions run on two simulated instances): ``target`` and
    :func:`traces.monitor_figures.target_block` over the measured executions: its instance type, cores, runtime
    reservation per core (the last sample), its own Tensor Engine peak, model FLOPs, device time and MFU.
    Every tool shows a multi-target process's targets from this (live documents from the same block).

    >>> import tempfile, traces, traces.synthetic
    >>> d = tempfile.mkdtemp()
    >>> _ = traces.synthetic.write_run(d, executions=2, instructions=100)
    >>> with traces.open(d) as p:
    ...     (t,), mfu = targets(p), p.figures().mfu_percent
    >>> t["target"], t["instance_type"], t["mfu_percent"] == mfu
    ('trn1', 'trn1.32xlarge', True)
    """
    warm = bool(include_warmup) if include_warmup is not None else \
        p.metadata().get("summary_includes_warmup", "false") == "true"
    meta = p.metadata()
    ex = {r["target"]: r for r in p.sql(f"""
        SELECT coalesce(r.target, '') AS target, coalesce(sum(e.flops), 0)::DOUBLE AS flops,
               coalesce(sum(e.dev), 0)::BIGINT AS device_ns, list(DISTINCT e.core) AS cores
        FROM (SELECT run_id, core, flops, ({DEVICE_NS_SQL}) AS dev FROM executions
              WHERE {measured_condition(warm)}) e LEFT JOIN runs r USING (run_id) GROUP BY ALL""").to_pylist()}
    memory: dict[str, dict] = {}
    for r in p.sql("""SELECT coalesce(r.target, '') AS target, m.core, arg_max(m.bytes, m.ts_ns) AS bytes
                      FROM memory m LEFT JOIN runs r USING (run_id)
                      WHERE m.category = 'runtime_memory' AND m.location = 'device' AND m.core IS NOT NULL
                      GROUP BY ALL""").to_pylist():
        memory.setdefault(r["target"], {})[r["core"]] = r["bytes"] or 0
    names = dict.fromkeys([r["target"] or "" for r in p.sql("SELECT target FROM runs ORDER BY start_ns").to_pylist()])
    out = []
    for t in [*names, *(t for t in {**ex, **memory} if t not in names)]:
        own = t == meta.get("target")   # the unprefixed metadata is this target's (older profiles: only them)
        e = ex.get(t, {})
        peak = meta.get(f"target.{t}.tensor_engine_peak_bf16_flops") or \
            (meta.get("tensor_engine_peak_bf16_flops") if own else None)
        out.append({"target": t, **target_block(
            meta.get(f"target.{t}.instance_type") or (meta.get("instance_type", "") if own else ""),
            [c for c in e.get("cores") or [] if c is not None] + list(memory.get(t, {})), memory.get(t, {}),
            float(peak or 0.0), e.get("flops", 0), e.get("device_ns", 0))})
    return out


def ops(p) -> pa.Table:
    """Every op with its source line and graph name (one row per graph node), and a backward op's
    forward line (``fwd_source_id``, ``fwd_file``, ``fwd_line``; NULL for forward ops)."""
    # schema 1.5: a backward op's forward line (absent in older profiles)
    fwd = p.sql("""SELECT count(*) AS n FROM information_schema.columns
                   WHERE table_name = 'ops' AND column_name = 'fwd_source_id'""").column("n")[0].as_py()
    return p.sql(f"""
        SELECT o.op_id, o.graph_id, o.name, o.aten_op, o.op_class, o.placement, o.fallback_reason,
               o.fused_into, coalesce(o.module_path, '') AS module_path, o.source_id, o.shape, o.dtype,
               o.flops, o.bytes, s.file, s.line, s.function, s.code, g.name AS graph,
               {"o.fwd_source_id" if fwd else "CAST(NULL AS BIGINT)"} AS fwd_source_id, f.file AS fwd_file,
               f.line AS fwd_line
        FROM ops o LEFT JOIN sources s USING (source_id) LEFT JOIN graphs g USING (graph_id)
             LEFT JOIN sources f ON {"f.source_id = o.fwd_source_id" if fwd else "false"}
        ORDER BY o.op_id""")


def op_totals(p, include_warmup: bool | None = None) -> pa.Table:
    """Per op (measured executions): device time and its per-engine split, instructions, FLOPs, bytes,
    and host time (``host_ns``) and calls of a CPU-fallback op. Read from ``op_summary``, or, with
    ``include_warmup`` given, computed the same way over the executions that choice counts (a diff counts
    every execution of both profiles)."""
    cols = ", ".join(f"{e}_ns" for e in DEVICE_ENGINES)
    if include_warmup is None:
        return p.sql(f"""SELECT op_id, device_ns, instruction_count, instruction_flops,
                                bytes_read + bytes_written AS bytes, cpu_calls AS host_calls, cpu_ns AS host_ns,
                                {cols}
                         FROM op_summary WHERE op_id IS NOT NULL""")
    per_engine = ", ".join(f"(sum(dur_ns) FILTER (WHERE engine = '{e}'))::BIGINT AS {e}_ns" for e in DEVICE_ENGINES)
    # op_summary's formulas (traces/store.py), over the chosen executions instead of the finalised ones
    return p.sql(f"""
        WITH per_op AS (
            SELECT op_id, (count(*) FILTER (WHERE engine <> 'cpu'))::BIGINT AS instruction_count,
                   (sum(dur_ns) FILTER (WHERE engine <> 'cpu'))::BIGINT AS device_ns, {per_engine},
                   (sum(dur_ns) FILTER (WHERE engine = 'cpu'))::BIGINT AS host_ns,
                   sum(flops)::BIGINT AS instruction_flops, (sum(bytes_read) + sum(bytes_written))::BIGINT AS bytes
            FROM instructions
            WHERE op_id IS NOT NULL
              AND exec_id IN (SELECT exec_id FROM executions WHERE {measured_condition(include_warmup)})
            GROUP BY op_id),
        fallback AS (SELECT op_id, count(*) AS cpu_calls, sum(dur_ns)::BIGINT AS cpu_ns
                     FROM events WHERE kind = 'cpu_fallback' AND op_id IS NOT NULL GROUP BY op_id)
        SELECT coalesce(o.op_id, f.op_id) AS op_id, coalesce(o.device_ns, 0) AS device_ns,
               coalesce(o.instruction_count, 0) AS instruction_count,
               coalesce(o.instruction_flops, 0) AS instruction_flops, coalesce(o.bytes, 0) AS bytes,
               coalesce(f.cpu_calls, 0) AS host_calls,
               greatest(coalesce(f.cpu_ns, 0), coalesce(o.host_ns, 0))::BIGINT AS host_ns,
               {', '.join(f'coalesce(o.{e}_ns, 0) AS {e}_ns' for e in DEVICE_ENGINES)}
        FROM per_op o FULL OUTER JOIN fallback f ON f.op_id = o.op_id""")


def dma_bandwidth_bound(p) -> tuple[str, dict]:
    """The SQL condition (over ``instructions i``) and its parameters that a DMA transfer is
    bandwidth-bound: its bytes at one DMA engine's peak rate take at least as long as its fixed costs,
    the trigger-to-start latency plus the per-descriptor time inside its duration
    (``dur_ns - bytes / rate``); else it is latency-bound, and moving fewer bytes would not shorten it.
    The rate is the profile's ``dma_ddr_bandwidth`` over ``num_dma_engines_per_neuroncore``, the latency
    its ``dma_fixed_latency_ns``; a profile without the rate counts every transfer bandwidth-bound.

    Example: on trn1 (17 B/ns, 1300 ns) a 32 KiB load of 128 rows (3856 ns: 1928 of bytes, 1928 of
    descriptors) is latency-bound; a 512 KiB load of 4 KiB rows (32768 ns of bytes) is not.
    """
    md = p.metadata()
    try:
        rate = float(md["dma_ddr_bandwidth"]) / float(md["num_dma_engines_per_neuroncore"])
    except (KeyError, ValueError, ZeroDivisionError):
        return "TRUE", {}
    latency = float(md.get("dma_fixed_latency_ns") or 0.0)
    return ("2.0 * greatest(i.bytes_read, i.bytes_written) / $dma_rate >= i.dur_ns + $dma_latency",
            {"dma_rate": rate, "dma_latency": latency})


def layer_engine_time(p) -> pa.Table:
    """Per layer (``module_path``, '' for top-level ops) over the measured executions: each device
    engine's active ns (``<engine>_ns``) and their first source line (``file``, ``line``); of the DMA
    time, the union of its bandwidth-bound transfers' intervals (``dma_bandwidth_ns``,
    :func:`dma_bandwidth_bound`), and the layer's DMA transfers, latency-bound ones and bytes
    (``dma_transfers``, ``dma_latency_bound_transfers``, ``dma_bytes``).

    An in-order engine's time is the sum of its instructions; a concurrent engine's (DMA queues,
    collectives) the union of the layer's intervals in each execution, as the Summary counts the
    whole profile's: so a layer's DMA time never exceeds the profile's (summing the durations of
    overlapping queues did: 284 µs for one layer of a 263 µs profile).
    """
    warm = p.metadata().get("summary_includes_warmup", "false") == "true"
    concurrent = [e for e in DEVICE_ENGINES if e in CONCURRENT_ENGINES]
    summed = [e for e in DEVICE_ENGINES if e not in concurrent]
    base = p.sql(f"""
        SELECT coalesce(module_path, '') AS module_path,
               {", ".join(f"sum({e}_ns)::BIGINT AS {e}_ns" for e in summed)},
               arg_min(file, source_id) AS file, arg_min(line, source_id) AS line
        FROM op_summary WHERE device_ns > 0 GROUP BY ALL""").to_pylist()
    bound, params = dma_bandwidth_bound(p)
    # a bandwidth-bound DMA also counts under the pseudo-engine 'dma_bandwidth'
    rows = p.sql(f"""
        SELECT i.exec_id, coalesce(o.module_path, '') AS module_path,
               unnest(CASE WHEN i.engine = 'dma' AND ({bound}) THEN ['dma', 'dma_bandwidth']
                           ELSE [i.engine] END) AS engine,
               i.start_ns, i.dur_ns
        FROM instructions i LEFT JOIN ops o USING (op_id)
        WHERE list_contains($engines, i.engine)
          AND i.exec_id IN (SELECT exec_id FROM executions WHERE {measured_condition(warm)})""",
                 {"engines": concurrent, **params})
    active: dict[tuple, int] = {}
    for r in union_by(rows, ("exec_id", "module_path", "engine")).to_pylist():
        key = (r["module_path"], r["engine"])
        active[key] = active.get(key, 0) + r["active_ns"]
    counts = {r["module_path"]: r for r in p.sql(f"""
        SELECT coalesce(o.module_path, '') AS module_path, count(*) AS dma_transfers,
               count(*) FILTER (WHERE NOT ({bound})) AS dma_latency_bound_transfers,
               sum(greatest(i.bytes_read, i.bytes_written))::BIGINT AS dma_bytes
        FROM instructions i LEFT JOIN ops o USING (op_id)
        WHERE i.engine = 'dma'
          AND i.exec_id IN (SELECT exec_id FROM executions WHERE {measured_condition(warm)})
        GROUP BY ALL""", params).to_pylist()}
    layers = {r["module_path"]: r for r in base}
    for (module, _engine) in active:
        layers.setdefault(module, {"module_path": module, **{f"{e}_ns": 0 for e in summed}, "file": None,
                                   "line": None})
    dma_cols = ("dma_transfers", "dma_latency_bound_transfers", "dma_bytes")
    out = [{**r, **{f"{e}_ns": active.get((m, e), 0) for e in concurrent},
            "dma_bandwidth_ns": active.get((m, "dma_bandwidth"), 0),
            **{c: (counts.get(m) or {}).get(c) or 0 for c in dma_cols}} for m, r in sorted(layers.items())]
    cols = ["module_path", *(f"{e}_ns" for e in DEVICE_ENGINES), "dma_bandwidth_ns", *dma_cols, "file", "line"]
    return pa.table({c: [r[c] for r in out] for c in cols})


def hierarchy(p) -> pa.Table:
    """Device time and instruction count per (op, opcode) over the measured executions (device engines)."""
    warm = p.metadata().get("summary_includes_warmup", "false") == "true"
    return p.sql(f"""SELECT op_id, opcode, CAST(sum(dur_ns) AS BIGINT) AS device_ns, count(*) AS instructions
                     FROM instructions
                     WHERE engine <> 'cpu' AND exec_id IN (SELECT exec_id FROM executions
                                                           WHERE {measured_condition(warm)})
                     GROUP BY ALL ORDER BY ALL""")


def fallbacks(p) -> pa.Table:
    """See :meth:`traces.query.Profile.fallbacks`."""
    return p.sql("""
        SELECT o.op_id, o.graph_id, g.name AS graph_name, o.name, o.aten_op, o.fallback_reason,
               coalesce(o.module_path, '') AS module_path, o.source_id, s.file, s.line, s.code, o.shape,
               coalesce(os.cpu_calls, 0) AS cpu_calls, coalesce(os.cpu_ns, 0) AS cpu_ns
        FROM ops o LEFT JOIN op_summary os ON os.op_id = o.op_id
        LEFT JOIN graphs g ON g.graph_id = o.graph_id LEFT JOIN sources s ON s.source_id = o.source_id
        WHERE o.placement = $fb
        ORDER BY cpu_ns DESC, cpu_calls DESC, o.op_id""", {"fb": FALLBACK_PLACEMENT})


def graphs(p) -> pa.Table:
    """Every graph (with its NEFF's hash) with its call site, executions and first compile time (``compile_ts``),
    compile order;
    ``recompiled`` (:data:`traces.summary_sql.RECOMPILED_SQL`) and ``before_window`` (loaded before the recording
    window: :data:`traces.summary_sql.WINDOW_CTES`), so a page's counts are the Summary's."""
    return p.sql(f"""
        WITH {WINDOW_CTES}
        SELECT g.graph_id, g.name, g.kind, g.neff_hash, g.input_signature, g.compile_wall_ns, g.compile_ns, g.cache_hit,
               g.recompile_of, g.recompile_reason, g.source_id, s.file, s.line, s.code,
               coalesce({RECOMPILED_SQL}, FALSE) AS recompiled,
               g.graph_id IN (SELECT graph_id FROM before_window) AS before_window,
               (SELECT count(*) FROM executions e WHERE e.graph_id = g.graph_id) AS executions,
               (SELECT min(ts_ns) FROM events v WHERE v.graph_id = g.graph_id
                                                  AND v.kind IN ('compile', 'recompile')) AS compile_ts
        FROM graphs g LEFT JOIN sources s USING (source_id)
        ORDER BY g.compile_wall_ns IS NULL, g.graph_id""")


def idle_gap(p) -> dict | None:
    """The longest gap between two executions on one core: ``{"prev_end", "start_ns"}`` or None."""
    rows = p.sql("""
        SELECT prev_end, start_ns FROM (
          SELECT start_ns, lag(end_ns) OVER (PARTITION BY core ORDER BY start_ns) AS prev_end FROM executions)
        WHERE prev_end IS NOT NULL ORDER BY start_ns - prev_end DESC LIMIT 1""").to_pylist()
    return rows[0] if rows else None


def compiles_between(p, t0: int | None = None, t1: int | None = None) -> dict:
    """Compiles started in ``[t0, t1)`` (default: first to last execution): ``{"compiles", "compile_ns"}``.

    Recompile events are zero-length markers beside their graph's compile event: graphs are
    counted, durations summed.
    """
    if t0 is None or t1 is None:
        span = p.sql("SELECT min(start_ns) AS a, max(end_ns) AS b FROM executions").to_pylist()[0]
        t0, t1 = span["a"], span["b"]
    row = p.sql("""SELECT CAST(coalesce(sum(dur_ns), 0) AS BIGINT) AS compile_ns,
                          count(DISTINCT graph_id) AS compiles
                   FROM events WHERE kind IN ('compile', 'recompile') AND ts_ns >= $a AND ts_ns < $b""",
                {"a": t0, "b": t1}).to_pylist()[0]
    return row


def spill_traffic(p) -> dict:
    """Bytes and DMA time of spill/reload traffic (DMA queues named ``*spill*``)."""
    return p.sql("""SELECT CAST(coalesce(sum(bytes_read + bytes_written), 0) AS BIGINT) AS bytes,
                           CAST(coalesce(sum(dur_ns), 0) AS BIGINT) AS ns
                    FROM instructions WHERE engine = 'dma' AND queue ILIKE '%spill%'""").to_pylist()[0]
