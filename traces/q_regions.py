"""The Region Highlighter's automatic regions (``overview-region-highlighter.rst``), three ways as the real one:
by layer (the operation hierarchy), by NKI kernel (kernel invocations) and by collective (the stretches of each
core's timeline between collectives), each with a per-region summary and its duration distribution.

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=2, instructions=200)
>>> with traces.open(d) as p:
...     r = regions(p)
>>> r.num_rows > 0 and all(a < b for a, b in zip(r["start_ns"].to_pylist(), r["end_ns"].to_pylist()))
True
"""
from __future__ import annotations

import pyarrow as pa

from traces.profile_tables import islands
from traces.summary_sql import measured_condition
from traces.vocab import DEVICE_ENGINES

#: The ways regions are cut, as the real tool's three methods (only one at a time, as there).
KINDS = ("layer", "kernel", "collective")

#: a layer is the module path up to its first numbered part (``layers.3``, ``encoder.layer.11``), else its
#: first part (``embeddings``); ops outside any module form ``(top level)``
_LAYER_SQL = ("coalesce(nullif(regexp_extract(coalesce(o.module_path, ''), '^((?:[^.]+[.])*?[0-9]+)(?:[.]|$)', 1), ''),"
              " nullif(split_part(coalesce(o.module_path, ''), '.', 1), ''), '(top level)')")
#: an NKI kernel invocation: the instructions of a kernel op (``op_class = 'nki'``), named by the kernel
_KERNEL_SQL = "CASE WHEN o.op_class = 'nki' THEN coalesce(o.name, o.aten_op) END"


def _tagged(kind: str, measured: str) -> str:
    """``exec_id, core, region, seg, start_ns, dur_ns, engine, flops`` of the instructions a region kind covers."""
    base = (f"FROM main.instructions i LEFT JOIN main.ops o USING (op_id) WHERE i.engine <> 'cpu' "
            f"AND i.exec_id IN (SELECT exec_id FROM main.executions WHERE {measured})")
    if kind in ("layer", "kernel"):
        key = _LAYER_SQL if kind == "layer" else _KERNEL_SQL
        return (f"SELECT * FROM (SELECT i.exec_id, i.core, {key} AS region, 0 AS seg, i.start_ns, i.dur_ns, "
                f"i.engine, i.flops {base}) WHERE region IS NOT NULL")
    # between collectives: each core's collectives (its cc instructions, merged) cut its timeline; an instruction
    # belongs to the stretch after the last collective that ended before it starts, named by the one closing it
    cc = islands("SELECT core, start_ns AS s, start_ns + dur_ns AS e FROM main.instructions WHERE engine = 'cc'",
                 "core")
    return f"""
        WITH cc AS (SELECT core, s, e, row_number() OVER (PARTITION BY core ORDER BY s) AS k,
                           (SELECT arg_min(c.opcode, c.start_ns) FROM main.instructions c WHERE c.engine = 'cc'
                              AND c.core = isl.core AND c.start_ns >= isl.s AND c.start_ns < isl.e) AS opcode
                    FROM ({cc}) AS isl),
        i AS (SELECT i.exec_id, i.core, i.start_ns, i.dur_ns, i.engine, i.flops {base} AND i.engine <> 'cc')
        SELECT i.exec_id, i.core, coalesce('before ' || nxt.opcode, 'after the last collective') AS region,
               coalesce(prev.k, 0) AS seg, i.start_ns, i.dur_ns, i.engine, i.flops
        FROM i ASOF LEFT JOIN cc AS prev ON i.core = prev.core AND i.start_ns >= prev.e
        LEFT JOIN cc AS nxt ON nxt.core = i.core AND nxt.k = coalesce(prev.k, 0) + 1
        WHERE EXISTS (SELECT 1 FROM cc)"""


def regions(p, by: str = "layer") -> pa.Table:
    """Automatic regions cut ``by`` one of :data:`KINDS`: ``layer`` (``_LAYER_SQL``, one region per execution and
    layer), ``kernel`` (one per execution and NKI kernel) or ``collective`` (one per core and stretch between
    two collectives, named ``before <opcode>`` by the collective closing it; its ``exec_id`` is its first
    instruction's). Measured executions only. One row per region: ``exec_id, core, region, start_ns, end_ns``
    (first start, last end, absolute ns), instructions, busy ns per device engine and its share of the span
    (``<engine>_busy_percent``: DMA queues run in parallel, so above 100 is possible), Tensor Engine FLOPs and
    ``hfu_percent`` (those FLOPs over the BF16 peak for the span); in time order. Layers' instructions
    interleave (the scheduler overlaps them), so their regions can overlap.
    """
    if by not in KINDS:
        from traces.errors import TraceError

        raise TraceError(f"regions by {by!r}: choose one of {', '.join(KINDS)}")
    warm = p.metadata().get("summary_includes_warmup", "false") == "true"
    busy = ", ".join(f"sum(dur_ns) FILTER (WHERE engine = '{e}')::BIGINT AS {e}_ns" for e in DEVICE_ENGINES)
    return p.sql(f"""
        WITH t AS ({_tagged(by, measured_condition(warm))}),
        r AS (
            SELECT arg_min(exec_id, start_ns) AS exec_id, core, region, min(start_ns) AS start_ns,
                   max(start_ns + dur_ns) AS end_ns, count(*) AS instructions, {busy},
                   coalesce(sum(flops) FILTER (WHERE engine = 'tensor'), 0)::BIGINT AS tensor_flops
            FROM t GROUP BY {'exec_id, ' if by != 'collective' else ''}core, region, seg),
        md AS (SELECT try_cast(max(value) FILTER (WHERE key = 'tensor_engine_peak_bf16_flops') AS DOUBLE) AS peak
               FROM main.metadata)
        SELECT r.*, 100.0 * tensor_flops / nullif(md.peak * (end_ns - start_ns) / 1e9, 0) AS hfu_percent,
               {", ".join(f"100.0 * coalesce({e}_ns, 0) / greatest(end_ns - start_ns, 1) AS {e}_busy_percent"
                          for e in DEVICE_ENGINES)}
        FROM r CROSS JOIN md ORDER BY start_ns, region""")


def region_durations(p, by: str = "layer") -> pa.Table:
    """Each region's duration over its occurrences (the Region Highlighter's distribution): ``region,
    executions`` (occurrences: executions, or stretches between collectives), ``min_ns, median_ns, max_ns`` (the
    lower median), regions in the order they first start within their execution."""
    rows = regions(p, by).to_pylist()
    exec_start: dict[int, int] = {}
    for r in rows:                     # time order: an execution's first region starts it
        exec_start.setdefault(r["exec_id"], r["start_ns"])
    durations: dict[str, list[int]] = {}
    offset: dict[str, int] = {}
    for r in rows:
        durations.setdefault(r["region"], []).append(r["end_ns"] - r["start_ns"])
        offset[r["region"]] = min(offset.get(r["region"], 1 << 62), r["start_ns"] - exec_start[r["exec_id"]])
    out = []
    for region in sorted(durations, key=lambda k: (offset[k], k)):
        d = sorted(durations[region])
        out.append({"region": region, "executions": len(d), "min_ns": d[0], "median_ns": d[(len(d) - 1) // 2],
                    "max_ns": d[-1]})
    schema = pa.schema([("region", pa.string()), ("executions", pa.int64()), ("min_ns", pa.int64()),
                        ("median_ns", pa.int64()), ("max_ns", pa.int64())])
    return pa.Table.from_pylist(out, schema=schema)
