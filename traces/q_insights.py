"""The real Summary's remaining figures (``overview-summary-page.rst``): NKI engine statistics, DMA utilisation,
collective operation durations with their outliers, and throttling, over the measured executions. The
Summary page, its insights (explorer/recommend.py) and ``neuron-explorer summary --json`` read them here.

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=2, instructions=300)
>>> with traces.open(d) as p:
...     nki_coverage(p)["tensor"]["nki_percent"]
0.0
"""
from __future__ import annotations

import pyarrow as pa

from traces.profile_tables import _MEASURED, _RAMP, _THROTTLES
from traces.summary_sql import DEVICE_NS_SQL

#: The engines the real NKI Engine Statistics chart and coverage rule cover.
NKI_ENGINES = ("tensor", "vector", "scalar")
#: A collective is an outlier when it takes more than this many times the median of its (operation, size)
#: group of at least ``OUTLIER_MIN_GROUP`` operations. Ours: the real rule names no number ("significantly
#: exceeds the group median", glossary).
OUTLIER_FACTOR = 2.0
OUTLIER_MIN_GROUP = 3


def nki_engine_stats(p) -> pa.Table:
    """Instructions per engine (tensor, vector, scalar), source (``nki``: issued by an NKI kernel line,
    ``compiler``) and opcode: ``engine, source, opcode, instructions``."""
    return p.sql(f"""
        SELECT engine, CASE WHEN nki_source_location IS NULL THEN 'compiler' ELSE 'nki' END AS source, opcode,
               count(*) AS instructions
        FROM main.instructions WHERE list_contains($engines, engine) AND {_MEASURED}
        GROUP BY ALL ORDER BY engine, source, instructions DESC, opcode""", {"engines": list(NKI_ENGINES)})


def nki_coverage(p) -> dict[str, dict]:
    """Per engine: ``nki`` and ``compiler`` instruction counts and ``nki_percent`` (the real "NKI instruction
    coverage"); an engine without instructions is left out."""
    out: dict[str, dict] = {}
    for r in nki_engine_stats(p).to_pylist():
        e = out.setdefault(r["engine"], {"nki": 0, "compiler": 0})
        e[r["source"]] += r["instructions"]
    for e in out.values():
        e["nki_percent"] = 100.0 * e["nki"] / max(e["nki"] + e["compiler"], 1)
    return {k: out[k] for k in NKI_ENGINES if k in out}


def dma_utilization(p) -> pa.Table:
    """Per core and DMA queue (the real "All Engines" view; a core's rows add up to its "Neuron Cores" one):
    ``core, queue, source_type`` (``static`` or ``software_dynamic``: DMA_INDIRECT, as the Summary's split),
    ``transfer_bytes``, ``busy_ns``, ``bandwidth_percent`` (bytes over the queue's share of the core's DMA
    bandwidth, ``dma_ddr_bandwidth / num_dma_engines_per_neuroncore``, for the core's device time) and
    ``active_percent`` (busy time over the core's device time)."""
    return p.sql(f"""
        WITH md AS (SELECT try_cast(max(value) FILTER (WHERE key = 'dma_ddr_bandwidth') AS DOUBLE) AS bw,
                           try_cast(max(value) FILTER (WHERE key = 'num_dma_engines_per_neuroncore') AS DOUBLE)
                               AS engines FROM main.metadata),
        dev AS (SELECT core, sum({DEVICE_NS_SQL}) AS device_ns FROM main.executions WHERE {_MEASURED} GROUP BY core),
        q AS (SELECT core, queue, CASE WHEN bool_or(opcode = 'DMA_INDIRECT') THEN 'software_dynamic'
                                       ELSE 'static' END AS source_type,
                     sum(greatest(bytes_read, bytes_written))::BIGINT AS transfer_bytes,
                     sum(dur_ns)::BIGINT AS busy_ns
              FROM main.instructions WHERE engine = 'dma' AND {_MEASURED} GROUP BY core, queue)
        SELECT q.*, 100.0 * q.transfer_bytes / nullif(md.bw / greatest(md.engines, 1) * dev.device_ns, 0)
                   AS bandwidth_percent,
               100.0 * q.busy_ns / nullif(dev.device_ns, 0) AS active_percent
        FROM q JOIN dev USING (core) CROSS JOIN md
        ORDER BY core, try_cast(regexp_extract(queue, '(\\d+)$', 1) AS INTEGER), queue""")


def collective_ops(p) -> pa.Table:
    """Every collective operation (the real ``CcOp`` rows) with its group's median and ``outlier``: longer than
    :data:`OUTLIER_FACTOR` × the median of its (operation, input size) group of at least
    :data:`OUTLIER_MIN_GROUP` operations. ``operation, algorithm, input_size, start_ts, duration_ns, nc_idx,
    group_count, group_median_ns, outlier``, by operation then time."""
    return p.sql("""
        WITH c AS (SELECT operation, algorithm, input_size, start_ts, duration_ns, nc_idx,
                          count(*) OVER g AS group_count, median(duration_ns) OVER g AS group_median_ns
                   FROM main."CcOp" WINDOW g AS (PARTITION BY operation, input_size))
        SELECT *, group_count >= $n AND duration_ns > $k * group_median_ns AS outlier
        FROM c ORDER BY operation, start_ts""", {"n": OUTLIER_MIN_GROUP, "k": OUTLIER_FACTOR})


def collective_stats(p) -> pa.Table:
    """The box plot per operation: ``operation, count, min_ns, q1_ns, median_ns, mean_ns, q3_ns, max_ns,
    variance``."""
    return p.sql("""
        SELECT operation, count(*) AS count, min(duration_ns) AS min_ns,
               quantile_cont(duration_ns, 0.25) AS q1_ns, median(duration_ns) AS median_ns,
               avg(duration_ns) AS mean_ns, quantile_cont(duration_ns, 0.75) AS q3_ns, max(duration_ns) AS max_ns,
               var_pop(duration_ns) AS variance
        FROM main."CcOp" GROUP BY operation ORDER BY operation""")


def throttling(p) -> dict:
    """The Tensor Engine's throttling (the trn2 cost model's ramp, ``Throttle`` rows) over the measured
    executions: ``throttled_active_ns`` (time the Tensor Engine lost while computing: each instruction in a
    ramp took ``dur × (1 − limit)`` longer than at full rate), ``active_throttled_percent`` (that, as a share
    of the peak FLOPs over the device time: the real chart's "Active Throttled %"), ``throttle_events`` and
    ``average_utilization_limit_percent`` (time-weighted over the device time and PE arrays)."""
    if not float(p.metadata().get("tensor_engine_throttle_ramp_ns") or 0):   # no limiter on this target
        return {"throttle_events": 0, "throttled_active_ns": 0.0, "active_throttled_percent": 0.0,
                "average_utilization_limit_percent": 100.0}
    rows = p.sql(f"""
        WITH t AS (SELECT * FROM {_THROTTLES} WHERE {_MEASURED}),
        i AS (SELECT i.exec_id, i.core, coalesce(i.pcore, 0) AS pcore, i.start_ns, i.dur_ns,
                     (SELECT max(t.t) FROM t WHERE t.exec_id = i.exec_id AND t.core = i.core
                                              AND t.pcore = coalesce(i.pcore, 0) AND t.t <= i.start_ns) AS ramp
              FROM main.instructions AS i WHERE i.engine = 'tensor' AND {_MEASURED}),
        dev AS (SELECT sum({DEVICE_NS_SQL}) AS device_ns FROM main.executions WHERE {_MEASURED}),
        pc AS (SELECT greatest(1, try_cast(max(value) AS INTEGER)) AS n FROM main.metadata
               WHERE key = 'num_physical_cores')
        SELECT (SELECT count(*) FROM t) AS throttle_events,
               (SELECT coalesce(sum(dur * (0.5 - 0.25 * dur / {_RAMP})), 0) FROM t) AS limited_ns,
               coalesce(sum(dur_ns * (0.5 - 0.5 * least(1.0, (start_ns - ramp) / {_RAMP})))
                        FILTER (WHERE ramp IS NOT NULL AND start_ns - ramp < {_RAMP}), 0) AS throttled_active_ns,
               (SELECT device_ns FROM dev) AS device_ns, (SELECT n FROM pc) AS pcores
        FROM i""").to_pylist()
    r = rows[0] if rows else {}
    device = float(r.get("device_ns") or 0) * int(r.get("pcores") or 1)
    lost = float(r.get("throttled_active_ns") or 0)
    return {"throttle_events": int(r.get("throttle_events") or 0), "throttled_active_ns": lost,
            "active_throttled_percent": 100.0 * lost / device if device else 0.0,
            "average_utilization_limit_percent":
                100.0 - 100.0 * float(r.get("limited_ns") or 0) / device if device else 100.0}
