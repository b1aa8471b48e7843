"""The compiler's records in a profile (``SbufAllocation``, ``Flow``, ``TensorInfo``; docs/trace_schema.md):
an instruction's dependencies, the allocations of one execution, the tensors of the graphs.

A profile finalised before schema 1.3.0 has none of these tables: every function answers empty.

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=1, instructions=50)
>>> with traces.open(d) as p:
...     dependencies(p, 0, "qSyncIO0", 0, 0), allocation_executions(p).num_rows
({}, 0)
"""
from __future__ import annotations

import pyarrow as pa

#: the columns of an instruction at either end of a dependency
_END = "x.start_ns, x.dur_ns, x.engine, x.queue, x.pc, x.opcode, x.op_id"


def has_table(p, name: str) -> bool:
    """Whether the profile holds table ``name`` (case-insensitive, as SQL reads it)."""
    return p.sql("SELECT count(*) AS n FROM information_schema.tables WHERE lower(table_name) = lower($t)",
                 {"t": name}).column("n")[0].as_py() > 0


def dependencies(p, core: int, queue: str, pc: int, start_ns: int) -> dict:
    """The instruction at ``(core, queue, pc, start_ns)`` (absolute ns) with its predecessors and
    successors in its execution: ``{"instruction", "predecessors", "successors"}``, each end a dict
    with ``dependency_type``, ``gap_time``, ``via`` and the other instruction's row; ``{}`` when the
    instruction or the ``Flow`` table is missing. A graph with several device partitions repeats
    ``(queue, pc)``; an edge's ``gap_time`` names the right pair.
    """
    if not has_table(p, "Flow"):
        return {}
    rows = p.sql("""SELECT i.exec_id, e.graph_id, e.start_ns AS exec_start, e.end_ns AS exec_end, i.start_ns,
                           i.dur_ns, i.engine, i.queue, i.pc, i.opcode, i.op_id, i.core
                    FROM instructions i JOIN executions e USING (exec_id)
                    WHERE i.core = $core AND i.queue = $q AND i.pc = $pc AND i.start_ns = $s LIMIT 1""",
                 {"core": int(core), "q": str(queue), "pc": int(pc), "s": int(start_ns)}).to_pylist()
    if not rows:
        return {}
    me = rows[0]
    key = {"x": me["exec_id"], "g": me["graph_id"], "q": me["queue"], "pc": me["pc"]}
    preds = p.sql(f"""SELECT f.dependency_type, f.gap_time, f.via, {_END}
                      FROM Flow f JOIN instructions x ON x.queue = f.in_queue AND x.pc = f.in_pc
                      WHERE f.graph_id = $g AND f.out_queue = $q AND f.out_pc = $pc AND x.exec_id = $x
                        AND x.start_ns BETWEEN $lo AND $s AND $s - x.start_ns - x.dur_ns = f.gap_time
                      ORDER BY x.start_ns, x.queue""", {**key, "s": me["start_ns"], "lo": me["exec_start"]}).to_pylist()
    succs = p.sql(f"""SELECT f.dependency_type, f.gap_time, f.via, {_END}
                      FROM Flow f JOIN instructions x ON x.queue = f.out_queue AND x.pc = f.out_pc
                      WHERE f.graph_id = $g AND f.in_queue = $q AND f.in_pc = $pc AND x.exec_id = $x
                        AND x.start_ns BETWEEN $e AND $hi AND x.start_ns - $e = f.gap_time
                      ORDER BY x.start_ns, x.queue""",
                  {**key, "e": me["start_ns"] + me["dur_ns"], "hi": me["exec_end"]}).to_pylist()
    keep = ("exec_id", "graph_id", "core", "start_ns", "dur_ns", "engine", "queue", "pc", "opcode", "op_id")
    return {"instruction": {k: me[k] for k in keep}, "predecessors": preds, "successors": succs}


def allocation_executions(p) -> pa.Table:
    """Executions with SbufAllocation rows: ``exec_id, graph_id, graph, core, start_ns, allocations``, in time order."""
    if not has_table(p, "SbufAllocation"):
        return pa.table({"exec_id": pa.array([], pa.int64())})
    return p.sql("""SELECT a.exec_id, a.graph_id, g.name AS graph, a.core, e.start_ns, count(*) AS allocations
                    FROM SbufAllocation a JOIN executions e USING (exec_id)
                    LEFT JOIN graphs g ON g.graph_id = a.graph_id
                    GROUP BY ALL ORDER BY e.start_ns, a.exec_id""")


def allocations(p, exec_id: int, memory: str = "SBUF", partition: int | None = None, limit: int = 20_000) -> pa.Table:
    """One execution's allocations in ``memory`` (``SBUF``/``PSUM``), those spanning ``partition`` if given,
    in time order, at most ``limit``."""
    if not has_table(p, "SbufAllocation"):
        return pa.table({"start_ts": pa.array([], pa.int64())})
    return p.sql("""SELECT start_ts, end_ts, start_address, end_address, partition, partition_count, memory,
                           op_source_type, opcode, operands, queue_name, tensor_name, node, spill, op_id, core,
                           first_pc
                    FROM SbufAllocation
                    WHERE exec_id = $x AND memory = $m
                      AND ($p IS NULL OR (partition <= $p AND $p < partition + partition_count))
                    ORDER BY start_ts, start_address LIMIT $n""",
                 {"x": int(exec_id), "m": str(memory), "p": partition, "n": int(limit)})


def tensors(p) -> pa.Table:
    """Every TensorInfo row with its graph's name and the start (absolute ns) of its first load DMA
    in the graph's first execution with instruction rows (``first_load_ns``, NULL if never loaded)."""
    if not has_table(p, "TensorInfo"):
        return pa.table({"variable_name": pa.array([], pa.string())})
    return p.sql("""
        WITH first_exec AS (SELECT graph_id, arg_min(exec_id, start_ns) AS exec_id, arg_min(core, start_ns) AS core
                            FROM executions WHERE exec_id IN (SELECT exec_id FROM exec_engine_summary
                                                              WHERE origin = 'instructions')
                            GROUP BY graph_id)
        SELECT t.graph_id, g.name AS graph, t.partition, t.variable_name, t.type, t.format, t.shape, t.dtype, t.size,
               t.node, t.load_to_sbuf_avg_size_bytes, t.load_to_sbuf_total_size_bytes, t.load_to_sbuf_dma_count,
               t.load_to_sbuf_repeat_factor, t.first_load_queue, t.first_load_pc, f.core,
               (SELECT min(i.start_ns) FROM instructions i
                WHERE i.exec_id = f.exec_id AND i.queue = t.first_load_queue AND i.pc = t.first_load_pc)
                   AS first_load_ns
        FROM TensorInfo t LEFT JOIN graphs g USING (graph_id) LEFT JOIN first_exec f USING (graph_id)
        ORDER BY g.name, t.partition, t.type, t.variable_name""")


def execution_labels(p) -> pa.Table:
    """What each execution was, for a picker: ``exec_id, graph_id, graph, kind, core, iteration, input_signature,
    warmup, device_ns`` (:data:`traces.summary_sql.DEVICE_NS_SQL`, the Summary's device time of one execution),
    ``start_ns`` (absolute), in time order."""
    from traces.summary_sql import DEVICE_NS_SQL

    return p.sql(f"""SELECT e.exec_id, e.graph_id, g.name AS graph, g.kind, e.core, e.iteration, g.input_signature,
                            coalesce(e.warmup, FALSE) AS warmup, ({DEVICE_NS_SQL})::BIGINT AS device_ns, e.start_ns
                     FROM executions e LEFT JOIN graphs g USING (graph_id) ORDER BY e.start_ns, e.exec_id""")


def columns(p) -> pa.Table:
    """Every table's columns and types (``table_name, column_name, data_type``) with what ``SchemaFields`` says
    of each (``required, unit, example, description``; NULL where it has no row), for a schema inspector."""
    fields = ("""LEFT JOIN main."SchemaFields" f ON f.table_name = c.table_name AND f.field_name = c.column_name"""
              if has_table(p, "SchemaFields") else
              "LEFT JOIN (SELECT NULL AS field_required, NULL AS field_unit, NULL AS field_example, "
              "NULL AS field_description) f ON FALSE")
    return p.sql(f"""SELECT c.table_name, c.column_name, c.data_type, f.field_required AS required,
                            f.field_unit AS unit, f.field_example AS example, f.field_description AS description
                     FROM information_schema.columns c {fields}
                     WHERE c.table_schema = 'main' ORDER BY c.table_name, c.ordinal_position""")
