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

#: per (op, opcode, execution) of the rows: the sums every level adds up and the span in that execution
_X0 = ("SELECT op_id, opcode, x, min(s) AS fs, max(e) AS fe, sum(dur)::BIGINT AS dur, count(*)::BIGINT AS cnt, "
       "sum(mfl)::BIGINT AS mfl, sum(hfl)::BIGINT AS hfl, sum(hr + hw)::BIGINT AS hb, sum(sr + sw)::BIGINT AS sb "
       "FROM ({src}) GROUP BY ALL")
_X0_COLS = {"op_id": "BIGINT", "opcode": "VARCHAR", "x": "BIGINT", "fs": "BIGINT", "fe": "BIGINT", "dur": "BIGINT",
            "cnt": "BIGINT", "mfl": "BIGINT", "hfl": "BIGINT", "hb": "BIGINT", "sb": "BIGINT"}


def _nodes(p, x0: pa.Table) -> pa.Table:
    """The table's nodes, keyed by small integers: one row per (op, opcode) of the aggregate ``x0``, with its
    ``layer`` (the op's module path) and ``k1`` per layer, ``k2`` per op, ``k3`` per (op, opcode), numbered in
    tree order, so an op's opcodes and a layer's ops are consecutive keys."""
    return p.sql("""
        WITH d AS (SELECT DISTINCT * FROM (SELECT unnest($op_id::BIGINT[]) AS op_id,
                                                  unnest($opcode::VARCHAR[]) AS opcode)),
        l AS (SELECT coalesce(o.module_path, '') AS layer, d.op_id, d.opcode FROM d
              LEFT JOIN main.ops AS o ON o.op_id = d.op_id)
        SELECT layer, op_id, opcode, (dense_rank() OVER (ORDER BY layer))::INT AS k1,
               (dense_rank() OVER (ORDER BY layer, op_id))::INT AS k2,
               (row_number() OVER (ORDER BY layer, op_id, opcode))::INT AS k3
        FROM l ORDER BY k3""", {"op_id": x0.column("op_id").to_pylist(), "opcode": x0.column("opcode").to_pylist()})


#: the nodes (:func:`_nodes`) as a relation from the query's list parameters
_KK = """kk AS (SELECT unnest($layer::VARCHAR[]) AS layer, unnest($op_id::BIGINT[]) AS op_id,
                   unnest($opcode::VARCHAR[]) AS opcode, unnest($k1::INT[]) AS k1, unnest($k2::INT[]) AS k2,
                   unnest($k3::INT[]) AS k3)"""


def _active(p, where: str, params: dict, kk: pa.Table) -> dict[str, list]:
    """Each node's merged time (``active_ns``), as lists ``level``, ``k``, ``active_ns``: the union of its
    instructions' intervals, merged with numpy (:func:`traces.intervals.merge_intervals`: a sort and a running
    maximum, several times cheaper than SQL window passes) per (op, opcode), then those merged intervals per op,
    then the op's per layer (an op belongs to one layer; the keys' tree order makes each step's input runs that
    the sort merges cheaply). Reads three narrow columns of the rows, not the rows' joins."""
    t = p.sql(f"""WITH {_KK}
        SELECT kk.k3::BIGINT AS k3, i.start_ns AS s, i.start_ns + i.dur_ns AS e FROM main.instructions AS i
        JOIN kk ON kk.op_id IS NOT DISTINCT FROM i.op_id AND kk.opcode IS NOT DISTINCT FROM i.opcode
        WHERE i.engine <> 'cpu' AND {where}""", params)
    col = {c: t.column(c).to_numpy() for c in t.column_names}
    out: dict[str, list] = {"level": [], "k": [], "active_ns": []}
    if not t.num_rows:
        return out
    up = {}   # k3 -> k2, k2 -> k1
    for lo, hi in (("k3", "k2"), ("k2", "k1")):
        up[lo] = np.zeros(int(max(kk.column(lo).to_pylist())) + 1, dtype=np.int64)
        up[lo][kk.column(lo).to_numpy()] = kk.column(hi).to_numpy()
    track, s, e = merge_intervals(col["k3"], col["s"], col["e"])
    for level, parent in (("opcode", "k3"), ("op", "k2"), ("layer", None)):
        cuts = np.flatnonzero(np.r_[True, track[1:] != track[:-1]])   # merged intervals come in key order
        out["level"] += [level] * len(cuts)
        out["k"] += track[cuts].tolist()
        out["active_ns"] += np.add.reduceat(e - s, cuts).tolist()
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

    Why it is fast: two passes over the instructions and no per-row copy: one aggregate per (op, opcode,
    execution), whose few rows give the nodes (:func:`_nodes`) and every level's sums (grouping sets), and the
    merged time, the costly part, from three narrow columns by a numpy sort and running maximum
    (:func:`_active`).
    """
    warm = (p.metadata().get("summary_includes_warmup", "false") == "true" if include_warmup is None
            else include_warmup)
    where = f"i.exec_id IN (SELECT exec_id FROM main.executions WHERE {measured_condition(warm)})"
    x0 = p.sql(_X0.format(src=rows("i.op_id, i.opcode", where, channels=False)))
    kk = _nodes(p, x0)
    params = {c: kk.column(c).to_pylist() for c in kk.column_names}
    act = _active(p, where, params, kk)
    sums = "sum(dur) AS dur, sum(cnt) AS cnt, sum(mfl) AS mfl, sum(hfl) AS hfl, sum(hb) AS hb, sum(sb) AS sb"
    x0_rel = ", ".join(f"unnest($x0_{c}::{t}[]) AS {c}" for c, t in _X0_COLS.items())
    params.update({f"x0_{c}": x0.column(c).to_pylist() for c in _X0_COLS})
    return p.sql(f"""
        WITH {_KK},
        x0 AS (SELECT {x0_rel}),
        x AS (SELECT kk.k3, x0.* EXCLUDE (op_id, opcode) FROM x0 JOIN kk ON kk.op_id IS NOT DISTINCT FROM x0.op_id
              AND kk.opcode IS NOT DISTINCT FROM x0.opcode),
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
                 opcode""", {**params, "level": act["level"], "k": act["k"], "active": act["active_ns"]})
