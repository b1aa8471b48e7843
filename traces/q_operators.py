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

import pyarrow as pa

from traces.profile_hierarchy import HFU_SQL, MFU_SQL, nodes
from traces.summary_sql import measured_condition

#: The three levels: (level, the node key over i/o instructions and ops, its parent's key for ordering).
_LEVELS = (
    ("layer", "coalesce(o.module_path, '')"),
    ("op", "i.op_id::VARCHAR"),
    ("opcode", "i.op_id::VARCHAR || '|' || i.opcode"),
)


def operator_table(p, include_warmup: bool | None = None) -> pa.Table:
    """One row per layer (``module_path``; ``''`` for top-level ops), per op and per (op, opcode), device
    instructions of the measured executions only: ``level``, ``layer``, ``op_id``, ``op`` (ATen op),
    ``opcode``, ``device_ns`` (Σ instruction durations: engine time, as ``op_summary.device_ns``),
    ``active_ns`` (their merged intervals: wall time), ``mfu_percent``/``hfu_percent`` (Tensor Engine FLOPs
    without/with transposes over the peak for ``active_ns``), ``flops``, ``hbm_bytes`` (DMA traffic),
    ``sbuf_bytes``, ``instructions``, ``source_id``/``file``/``line`` (an op's line, a layer's first one),
    ``first_start_ns``/``first_end_ns`` (its span in the first execution it ran in). Ordered as a tree:
    layers by device time, each followed by its ops and their opcodes.
    """
    warm = (p.metadata().get("summary_includes_warmup", "false") == "true" if include_warmup is None
            else include_warmup)
    where = f"i.exec_id IN (SELECT exec_id FROM main.executions WHERE {measured_condition(warm)})"
    parts = []
    for level, key in _LEVELS:
        parts.append(f"""SELECT '{level}' AS level, h.k, {HFU_SQL} AS hfu_percent, {MFU_SQL} AS mfu_percent,
            h.dur AS device_ns, h.active_ns, h.cnt AS instructions, h.hfl AS flops, h.hr + h.hw AS hbm_bytes,
            h.sr + h.sw AS sbuf_bytes, h.fs AS first_start_ns, h.fe AS first_end_ns
            FROM {nodes(key, where, lists=False)} AS h""")
    return p.sql(f"""
        WITH r AS ({' UNION ALL '.join(parts)}),
        op AS (SELECT o.op_id, coalesce(o.module_path, '') AS layer, coalesce(o.aten_op, o.name) AS op,
                      o.source_id, s.file, s.line FROM main.ops AS o LEFT JOIN main.sources AS s USING (source_id)),
        lay AS (SELECT layer, arg_min(source_id, line) AS source_id, arg_min(file, line) AS file, min(line) AS line
                FROM op WHERE source_id IS NOT NULL GROUP BY layer),
        t AS (SELECT r.level, coalesce(op.layer, CASE WHEN r.level = 'layer' THEN r.k END) AS layer,
                     op.op_id, op.op, CASE WHEN r.level = 'opcode' THEN split_part(r.k, '|', 2) END AS opcode,
                     r.device_ns, r.active_ns, r.mfu_percent, r.hfu_percent, r.flops, r.hbm_bytes, r.sbuf_bytes,
                     r.instructions, coalesce(op.source_id, lay.source_id) AS source_id,
                     coalesce(op.file, lay.file) AS file, coalesce(op.line, lay.line) AS line,
                     r.first_start_ns, r.first_end_ns
              FROM r LEFT JOIN op ON r.level <> 'layer' AND op.op_id = try_cast(split_part(r.k, '|', 1) AS BIGINT)
              LEFT JOIN lay ON lay.layer = coalesce(op.layer, CASE WHEN r.level = 'layer' THEN r.k END)
                           AND r.level = 'layer')
        SELECT t.* FROM t
        LEFT JOIN (SELECT layer, device_ns AS ld FROM t WHERE level = 'layer') AS l USING (layer)
        LEFT JOIN (SELECT op_id, device_ns AS od FROM t WHERE level = 'op') AS o USING (op_id)
        ORDER BY ld DESC, layer, level <> 'layer', od DESC NULLS FIRST, op_id, level <> 'op', device_ns DESC,
                 opcode""")
