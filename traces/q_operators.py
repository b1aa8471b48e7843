"""The operator table: layer → op → opcode over the measured executions, each row with its device time, MFU,
HFU, FLOPs and bytes moved, its source line and the window of its first execution (the real Neuron
Explorer's Operator Table). A row's figures are the hierarchy tables' (:func:`traces.profile_hierarchy.nodes`):
one definition for FrameworkNode, HloInstruction and this table.

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=2, instructions=300)
>>> with traces.open(d) as p:
...     t = operator_table(p)
>>> sorted(set(t.column("level").to_pylist()))
['layer', 'op', 'opcode']
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from traces.intervals import merge_intervals
from traces.profile_hierarchy import HFU_SQL, MFU_SQL, rows
from traces.summary_sql import measured_condition


def _with(src: str) -> str:
    """The rows (``r0``: one narrow copy) and the nodes keyed by small integers (``kk``: ``k1`` per layer, ``k2``
    per op, ``k3`` per (op, opcode), the same in every query over the same rows), then ``r``: the rows keyed."""
    return f"""WITH r0 AS MATERIALIZED (SELECT layer, op_id, opcode, x, s, e, dur, mfl, hfl, hr + hw AS hb,
                                               sr + sw AS sb FROM ({src})),
        kk AS MATERIALIZED (SELECT layer, op_id, opcode, (dense_rank() OVER (ORDER BY layer))::INT AS k1,
                                   (dense_rank() OVER (ORDER BY layer, op_id))::INT AS k2,
                                   (row_number() OVER (ORDER BY layer, op_id, opcode))::INT AS k3
                            FROM (SELECT DISTINCT layer, op_id, opcode FROM r0)),
        r AS (SELECT r0.*, kk.k1, kk.k2, kk.k3 FROM r0 JOIN kk ON kk.layer = r0.layer
              AND kk.op_id IS NOT DISTINCT FROM r0.op_id AND kk.opcode IS NOT DISTINCT FROM r0.opcode)"""


def _active(p, src: str) -> dict[str, list]:
    """Each node's merged time (``active_ns``), as lists ``level``, ``k``, ``active_ns``: the union of its
    instructions' intervals, merged with numpy (:func:`traces.intervals.merge_intervals`: a sort and a running
    maximum, several times cheaper than SQL window passes) per (op, opcode), then those merged intervals per op,
    then the op's per layer (an op belongs to one layer)."""
    t = p.sql(f"{_with(src)} SELECT k1, k2, k3, s, e FROM r")
    col = {c: t.column(c).to_numpy() for c in t.column_names}
    out: dict[str, list] = {"level": [], "k": [], "active_ns": []}
    if not t.num_rows:
        return out
    up = {}   # k3 -> k2, k2 -> k1
    for lo, hi in (("k3", "k2"), ("k2", "k1")):
        up[lo] = np.zeros(int(col[lo].max()) + 1, dtype=np.int64)
        up[lo][col[lo]] = col[hi]
    track, s, e = merge_intervals(col["k3"], col["s"], col["e"])
    for level, parent in (("opcode", "k3"), ("op", "k2"), ("layer", None)):
        keys, inv = np.unique(track, return_inverse=True)
        out["level"] += [level] * len(keys)
        out["k"] += keys.tolist()
        out["active_ns"] += np.bincount(inv, weights=e - s).astype(np.int64).tolist()
        if parent:
            track, s, e = merge_intervals(up[parent][track], s, e)
    return out


def operator_table(p, include_warmup: bool | None = None) -> pa.Table:
    """One row per layer (``module_path``; ``''`` for top-level ops), per op and per (op, opcode), device
    instructions of the measured executions only: ``level``, ``layer``, ``op_id``, ``op`` (ATen op),
    ``opcode``, ``device_ns`` (Σ instruction durations: engine time, as ``op_summary.device_ns``),
    ``active_ns`` (their merged intervals: wall time), ``mfu_percent``/``hfu_percent`` (Tensor Engine FLOPs
    without/with transposes over the peak for ``active_ns``), ``flops``, ``hbm_bytes`` (DMA traffic),
    ``sbuf_bytes``, ``instructions``, ``source_id``/``file``/``line`` (an op's line, a layer's first one),
    ``first_start_ns``/``first_end_ns`` (its span in the first execution it ran in). Ordered as a tree:
    layers by device time, each followed by its ops and their opcodes.

    Why it is fast (1.2 M instructions): the rows are read into a narrow copy keyed by small integers; every
    level's sums come from one aggregate per (op, opcode, execution) rolled up by grouping sets; the merged
    time, the costly part, is a numpy sort and running maximum (:func:`_active`), not SQL window passes.
    """
    warm = (p.metadata().get("summary_includes_warmup", "false") == "true" if include_warmup is None
            else include_warmup)
    where = f"i.exec_id IN (SELECT exec_id FROM main.executions WHERE {measured_condition(warm)})"
    src = rows("coalesce(o.module_path, '') AS layer, i.op_id, i.opcode", where)
    act = _active(p, src)
    sums = "sum(dur) AS dur, sum(cnt) AS cnt, sum(mfl) AS mfl, sum(hfl) AS hfl, sum(hb) AS hb, sum(sb) AS sb"
    return p.sql(f"""
        {_with(src)},
        x AS (SELECT k3, x, min(s) AS fs, max(e) AS fe, sum(dur) AS dur, count(*) AS cnt, sum(mfl) AS mfl,
                     sum(hfl) AS hfl, sum(hb) AS hb, sum(sb) AS sb FROM r GROUP BY ALL),
        g AS (SELECT level, k, sum(dur)::BIGINT AS dur, sum(cnt)::BIGINT AS cnt, sum(mfl)::BIGINT AS mfl,
                     sum(hfl)::BIGINT AS hfl, sum(hb)::BIGINT AS hb, sum(sb)::BIGINT AS sb,
                     arg_min(fs, x) AS fs, arg_min(fe, x) AS fe
              FROM (SELECT CASE grouping(k2, k3) WHEN 3 THEN 'layer' WHEN 1 THEN 'op' ELSE 'opcode' END AS level,
                           coalesce(k3, k2, k1) AS k, x, min(fs) AS fs, max(fe) AS fe, {sums}
                    FROM x JOIN kk USING (k3) GROUP BY GROUPING SETS ((k1, x), (k2, x), (k3, x)))
              GROUP BY level, k),
        a AS (SELECT unnest($level::VARCHAR[]) AS level, unnest($k::BIGINT[]) AS k,
                     unnest($active::BIGINT[]) AS active_ns),
        n AS (SELECT DISTINCT 'layer' AS level, k1 AS k, layer, NULL::BIGINT AS op_id, NULL AS opcode FROM kk
              UNION ALL SELECT DISTINCT 'op', k2, layer, op_id, NULL FROM kk
              UNION ALL SELECT 'opcode', k3, layer, op_id, opcode FROM kk),
        h AS (SELECT g.*, a.active_ns, n.layer, n.op_id, n.opcode FROM g JOIN n USING (level, k)
              LEFT JOIN a USING (level, k)),
        op AS (SELECT o.op_id, coalesce(o.aten_op, o.name) AS op, o.source_id, s.file, s.line
               FROM main.ops AS o LEFT JOIN main.sources AS s USING (source_id)),
        lay AS (SELECT coalesce(o.module_path, '') AS layer, arg_min(o.source_id, s.line) AS source_id,
                       arg_min(s.file, s.line) AS file, min(s.line) AS line
                FROM main.ops AS o JOIN main.sources AS s USING (source_id) GROUP BY 1),
        t AS (SELECT h.level, h.layer, h.op_id, op.op, h.opcode, h.dur AS device_ns, h.active_ns,
                     {MFU_SQL} AS mfu_percent, {HFU_SQL} AS hfu_percent, h.hfl AS flops, h.hb AS hbm_bytes,
                     h.sb AS sbuf_bytes, h.cnt AS instructions, coalesce(op.source_id, lay.source_id) AS source_id,
                     coalesce(op.file, lay.file) AS file, coalesce(op.line, lay.line) AS line,
                     h.fs AS first_start_ns, h.fe AS first_end_ns
              FROM h LEFT JOIN op ON op.op_id = h.op_id AND h.level <> 'layer'
              LEFT JOIN lay ON lay.layer = h.layer AND h.level = 'layer')
        SELECT t.* FROM t
        LEFT JOIN (SELECT layer, device_ns AS ld FROM t WHERE level = 'layer') AS l USING (layer)
        LEFT JOIN (SELECT layer, op_id, device_ns AS od FROM t WHERE level = 'op') AS o USING (layer, op_id)
        ORDER BY ld DESC, layer, level <> 'layer', od DESC NULLS FIRST, op_id, level <> 'op', device_ns DESC,
                 opcode""", {"level": act["level"], "k": act["k"], "active": act["active_ns"]})
