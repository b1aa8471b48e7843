"""The last of the real Neuron Explorer's tables over ours (schema 7.4.0, SDK
``tools/neuron-explorer/profile-schema-reference.rst``): ``ExecutionInfo``, ``NeffHeader``, ``DeviceProfileList``,
``SystemProfileMetadata``, ``CcInstruction``, ``CcStream``, ``DmaUsage``, ``DmaUsageSummary``,
``HbmUsageSummaryByType``, ``Error``, ``Warning``, ``FrameworkInstruction`` and the compiler stages the simulated
compiler has not (``PenguinInstruction``, ``BirInstruction``, ``AssemblyInstruction``: their real columns, no
rows); and the real columns the compiler's record tables (``SbufAllocation``, ``SemaphoreUpdate``,
``TensorInfo``) lack, added by their views (:data:`RECORD_FIELDS`). The reference's ``MemoryBandwidth*`` types are
no tables there either ("not persisted to a parquet table": the API computes them), so none here.

>>> [f.name for f in EXECUTION_INFO.fields][:3]
['execution_index', 'neff_name', 'execution_start_ts']
>>> sorted(RECORD_FIELDS)
['SbufAllocation', 'SemaphoreUpdate', 'TensorInfo']
"""
from __future__ import annotations

from traces.profile_hierarchy import STAGE_FIGURES
from traces.profile_tables import _MEASURED, _meta, islands
from traces.real_fields import _B, _NO_LNC, _NS, _PCORE, F, Table

#: The physical core a queue name carries (``Tensor.pc1``: the LNC=2 schedule's second core), else 0.
_QUEUE_PCORE = "coalesce(try_cast(regexp_extract({q}, '\\.pc(\\d+)$', 1) AS BIGINT), 0)"

EXECUTION_INFO = Table(
    "ExecutionInfo", "Per-execution information: one row per execution within the profile.",
    "main.executions AS x LEFT JOIN main.graphs AS g USING (graph_id) LEFT JOIN (SELECT exec_id, count(*) AS n "
    "FROM main.instructions GROUP BY exec_id) AS c USING (exec_id)",
    (
        F("execution_index", "int32", None, True, "Zero-based index of this execution within the profile.",
          "row_number() OVER (ORDER BY x.start_ns, x.exec_id) - 1", "every execution, warm-ups included, in time"),
        F("neff_name", "string", None, False, "File name of the NEFF executed. Example: model.neff.",
          "g.name || '.neff'", "the compiled graph's name: the NEFF is held in memory, not a file"),
        F("execution_start_ts", "int64", _NS, False, "Start timestamp of this execution.", "x.start_ns"),
        F("execution_end_ts", "int64", _NS, False, "End timestamp of this execution.", "x.end_ns"),
        F("num_subgraphs", "int32", None, False, "Number of subgraphs processed in this execution.",
          "1", "one subgraph per logical core and execution"),
        F("row_count", "int64", None, False, "Number of rows written to the profile for this execution.",
          "coalesce(c.n, 0)", "its Instruction rows"),
    ),
    extra=("x.exec_id AS exec_id", "x.core AS nc_idx"),
)

NEFF_HEADER = Table(
    "NeffHeader", "Information contained in the NEFF header.",
    "main.graphs AS g LEFT JOIN main.runs AS r USING (run_id)",
    (
        F("network_name", "string", None, False, "Name of the NEFF. Example: file.neff.", "g.name || '.neff'"),
        F("uuid", "string", None, False, "Unique identifier of the NEFF.", "g.graph_id::VARCHAR",
          "graphs.graph_id"),
        F("hash", "string", None, False, "Hash of the NEFF.", "g.neff_hash"),
        F("enabled_features", "string", None, False, "Comma-separated list of enabled features.", None,
          "the simulated NEFF has no feature flags"),
        F("header_size", "int64", _B, False, "Size of the NEFF header in bytes.", None,
          "the NEFF is an in-memory object, not a packed file"),
        F("data_size", "int64", _B, False, "Data size in bytes.", None,
          "the NEFF is an in-memory object, not a packed file"),
        F("major_version", "int64", None, False, "NEFF major version number.", None, "no NEFF file format"),
        F("minor_version", "int64", None, False, "NEFF minor version number.", None, "no NEFF file format"),
        F("package_version", "string", None, False, "Package version.", _meta("stack_version", "VARCHAR"),
          "neuron_stack's version"),
        F("build_version", "string", None, False, "Build version.", None, "no separate build number"),
        F("cc_participant_count", "int64", None, False, "Number of collective communication participants.", None,
          "groups are chosen when the collective runs, not compiled in"),
        F("neuroncore_count", "int64", None, False, "Number of NeuronCores used by the NEFF.", "1",
          "a graph runs on one logical core"),
        F("logical_neuroncore_count", "int64", None, False, "Number of Logical NeuronCores used by the NEFF.", "1"),
        F("pcore_count_per_lnc", "int64", None, False, "Physical NeuronCores per Logical NeuronCore.",
          "coalesce(CASE WHEN json_valid(g.flags) THEN try_cast(json_extract_string(g.flags, '$.lnc') AS BIGINT) "
          "END, 1)", "the compile's --lnc (1 when the graph's flags do not say)"),
    ),
    extra=("g.graph_id AS graph_id", "g.run_id AS run_id"),
)

DEVICE_PROFILE_LIST = Table(
    "DeviceProfileList", "Device profiles: one per process and NeuronCore that executed.",
    "(SELECT DISTINCT run_id, core FROM main.executions) AS d JOIN main.runs AS r USING (run_id)",
    (
        F("device_profile_name", "string", None, True, "Name of the device profile. Example: neuron_profile_001.",
          "coalesce(r.tag, r.run_id) || '_nc' || d.core", "the run's tag (its pid by default) and the core"),
        F("instance_id", "string", None, True, "Server instance that produced this profile.", "r.host"),
        F("process_id", "int64", None, True, "Process ID that produced this profile.", "r.pid"),
        F("nc_id", "int64", None, True, "NeuronCore ID associated with this profile.", "d.core"),
        F("session_id", "int64", None, False, "Session identifier (session-based profiling).", None,
          "a session is the profile itself (one session directory)"),
        F("model_id", "int64", None, False, "Model identifier (model-based profiling).", None,
          "model-based profiling keeps each model's executions in the one profile"),
    ),
    extra=("d.run_id AS run_id",),
)

SYSTEM_PROFILE_METADATA = Table(
    "SystemProfileMetadata", "Metadata for a system profile.",
    "(SELECT min(ts_ns) AS t0, max(ts_ns + coalesce(dur_ns, 0)) AS t1 FROM main.system_events) AS s "
    "WHERE s.t0 IS NOT NULL",
    (
        F("first_ts", "string", None, True, "First timestamp in the system profile, human-readable.",
          "strftime(make_timestamp(s.t0 // 1000), '%Y-%m-%d %H:%M:%S.') || lpad((s.t0 % 1000000000)::VARCHAR, 9, "
          "'0') || ' +0000 UTC'"),
        F("last_ts", "string", None, True, "Last timestamp in the system profile, human-readable.",
          "strftime(make_timestamp(s.t1 // 1000), '%Y-%m-%d %H:%M:%S.') || lpad((s.t1 % 1000000000)::VARCHAR, 9, "
          "'0') || ' +0000 UTC'"),
        F("first_ts_ns", "string", None, True, "First timestamp, in Unix nanoseconds.", "s.t0::VARCHAR"),
        F("last_ts_ns", "string", None, True, "Last timestamp, in Unix nanoseconds.", "s.t1::VARCHAR"),
        F("ntff_version", "int64", None, True, "Version of the NTFF used for this profile.", None,
          "no NTFF: the profile is a DuckDB file"),
        F("hbm_capacity_bytes", "int64", _B, True, "Total HBM capacity in bytes for a single NeuronCore.",
          _meta("hbm_bytes_per_core", "BIGINT")),
    ),
)

CC_INSTRUCTION = Table(
    "CcInstruction", "Collective Communication instructions executed by the CC-Cores.",
    "main.instructions AS i WHERE i.engine = 'cc'",
    (
        F("start_ts", "int64", _NS, True, "When the collective instruction started.", "i.start_ns"),
        F("end_ts", "int64", _NS, True, "When the collective instruction finished.", "i.start_ns + i.dur_ns"),
        F("duration_ns", "int64", _NS, True, "Duration of the collective instruction.", "i.dur_ns"),
        F("core_idx", "int64", None, True, "Index of the CC-Core that executed it.",
          "coalesce(try_cast(regexp_extract(i.queue, '(\\d+)$', 1) AS BIGINT), 0)",
          "one CC-Core per logical core: its queue's number, else 0"),
        F("description", "string", None, True, "Name of the collective instruction. Example: DMA_ADVANCE.",
          "i.opcode"),
        F("trigger_engine", "string", None, False, "The engine that triggered it. Example: Pool.", None,
          "the collective is issued by the runtime, not triggered by an engine instruction"),
        F("trigger_start_ts", "int64", _NS, False, "Start of the PSEUDO_TRIGGER_COLLECTIVE instruction.", None,
          "no trigger instruction"),
    ),
    extra=("i.core AS nc_idx", "i.exec_id AS exec_id"),
)

CC_STREAM = Table(
    "CcStream", "Collective Communication streams.",
    "(SELECT DISTINCT e.run_id FROM main.events AS e WHERE e.kind = 'collective') AS c",
    (
        F("stream_id", "int64", None, True, "The id of this stream.", "0", "one stream per process (CcOp.stream_id)"),
        F("stream_index", "int64", None, True, "Stream of the operation relative to the execution.", "0"),
        F("cc_core_ids", "string", None, True, "The CC-Core ids assigned to this stream. Example: [8,9,10,11].",
          "'[0]'", "one CC-Core (CcInstruction.core_idx)"),
    ),
    extra=("c.run_id AS run_id",),
)

_DMA_BYTES = "greatest(i.bytes_read, i.bytes_written)"   # DmaPacket.transfer_bytes
DMA_USAGE = Table(
    "DmaUsage", "DMA time-series usage: throughput over time.",
    "main.instructions AS i JOIN main.executions AS x USING (exec_id) WHERE i.engine = 'dma'",
    (
        F("timestamp", "int64", _NS, True, "Timestamp for this measurement.", "i.start_ns + i.dur_ns",
          "one sample per DMA instruction, at its end"),
        F("current_throughput", "float", "bytes_per_second", True, "DMA bytes per second at this timestamp.",
          f"{_DMA_BYTES} * 1e9 / nullif(i.dur_ns, 0)", "the DMA's bytes over its duration"),
        F("total_transfer_bytes", "int64", _B, True, "DMA bytes transferred since the start (cumulative).",
          f"(sum({_DMA_BYTES}) OVER (PARTITION BY x.run_id, i.core, coalesce(i.pcore, 0) "
          "ORDER BY i.start_ns + i.dur_ns, i.queue, i.pc ROWS UNBOUNDED PRECEDING))::BIGINT"),
        F("pcore_idx", "int64", None, False, _PCORE, "coalesce(i.pcore, 0)"),
    ),
    extra=("i.core AS nc_idx", "i.exec_id AS exec_id"),
)

#: DmaUsageSummary's bucket: the real one's resolution is not published; 1 µs keeps a µs-long execution's shape.
DMA_BUCKET_NS = 1000
DMA_USAGE_SUMMARY = Table(
    "DmaUsageSummary", "DmaUsage pre-bucketed for fast aggregation.",
    f"(SELECT timestamp // {DMA_BUCKET_NS} * {DMA_BUCKET_NS} AS b, pcore_idx, nc_idx, "
    "sum(current_throughput) AS st, sum(total_transfer_bytes) AS sb, max(total_transfer_bytes) AS mb, count(*) AS n "
    "FROM neuron_explorer.\"DmaUsage\" GROUP BY ALL) AS u",
    (
        F("timestamp", "int64", _NS, True, "Bucket start timestamp.", "u.b"),
        F("pcore_idx", "int64", None, True, "Index of the physical NeuronCore.", "u.pcore_idx"),
        F("sum_current_throughput", "float", None, True, "Sum of current_throughput in this bucket.", "u.st"),
        F("sum_total_transfer_bytes", "int64", None, True, "Sum of total_transfer_bytes in this bucket.", "u.sb"),
        F("max_total_transfer_bytes", "int64", None, True, "Maximum total_transfer_bytes in this bucket.", "u.mb"),
        F("count", "int64", None, True, "Number of DmaUsage rows in this bucket.", "u.n"),
        F("bucket_resolution_ns", "int64", _NS, True, "The bucket resolution in nanoseconds.", str(DMA_BUCKET_NS),
          "1 µs (the real resolution is not published)"),
    ),
    extra=("u.nc_idx AS nc_idx",),
)

HBM_USAGE_SUMMARY_BY_TYPE = Table(
    "HbmUsageSummaryByType", "HBM memory usage summarized by type.",
    "(SELECT core, category, max(bytes) AS b FROM main.memory WHERE location = 'device' AND core IS NOT NULL "
    "GROUP BY ALL) AS m",
    (
        F("neuron_device_idx", "int64", None, True, "The Neuron Device index.",
          f"m.core // greatest({_meta('neuroncore_per_device_count', 'BIGINT')}, 1)",
          "the core's device: core ÷ NeuronCores per device"),
        F("neuroncore_idx", "int64", None, True, "The NeuronCore index.", "m.core"),
        F("usage_type", "string", None, True, "The type of memory usage. Example: Weights.", "m.category",
          "the runtime's categories (constants, tensors, model_code, ...) as neuron-monitor names them"),
        F("usage_bytes", "int64", _B, True, "HBM used by this type.", "m.b", "its largest sample"),
    ),
)

ERROR = Table(
    "Error", "Hardware-generated error events (out of bounds, NaN, ...).",
    "main.events AS e WHERE e.kind IN ('error', 'oom')",
    (
        F("description", "string", None, True, "Short description of the error condition.",
          "coalesce(CASE WHEN json_valid(e.detail) THEN coalesce(e.detail->>'message', e.detail->>'error') END, "
          "e.kind)"),
        F("error_type_id", "int32", None, True, "Numerical value of the error type.",
          "CASE e.kind WHEN 'error' THEN 1 ELSE 2 END", "1 a runtime error, 2 out of device memory"),
        F("metadata", "string", None, False, "Error metadata.", "e.detail"),
        F("metadata_hex", "string", None, False, "Hexadecimal error metadata.", None, "no hardware error word"),
        F("pcore_idx", "int64", None, False, _PCORE, "0", _NO_LNC),
        F("timestamp", "int64", _NS, True, "When the error occurred.", "e.ts_ns"),
        F("type", "string", None, True, "Category: Custom Notification, Errors or Warnings.", "'Errors'"),
    ),
    extra=("e.core AS nc_idx", "e.run_id AS run_id"),
)

WARNING = Table(
    "Warning", "Warnings produced during profile processing (missing or unexpected data).",
    "(SELECT coalesce(CASE WHEN json_valid(detail) THEN detail->>'message' END, detail) AS m, 'Runtime' AS c "
    "FROM main.events WHERE kind = 'warning' "
    "UNION ALL SELECT 'Segments skipped while finalising the profile: ' || value, 'Missing Data' FROM main.metadata "
    "WHERE key = 'skipped_segments' AND value <> '' "
    "UNION ALL SELECT value, 'Missing Data' FROM main.metadata WHERE key = 'device_rows_note' AND value <> '') AS w",
    (
        F("message", "string", None, True, "The warning shown to users.", "w.m",
          "the runtime's warnings, segments finalising skipped, and why device rows are missing"),
        F("category", "string", None, True, "The type of warning. Example: Missing Data.", "w.c"),
    ),
)

_STAGE_IDS = (
    F("id", "int64", None, True, "Identifier of the corresponding assembly level instruction.", "h.k",
      "ours is ops.op_id"),
    F("raw_bir_id", "int64", None, True, "BIR level id.", None, "no BIR stage (ops → ISA directly)"),
    F("raw_penguin_id", "int64", None, True, "Penguin level id.", None, "no Penguin stage"),
    F("raw_hlo_id", "int64", None, True, "HLO level id.", "h.k", "ours is ops.op_id (Instruction.raw_hlo_id)"),
    F("raw_framework_id", "int64", None, True, "Framework level id.", "h.k",
      "ours is ops.op_id (Instruction.raw_framework_id)"),
)
_FLOW = F("modular_flow_invocation_idx", "int64", None, False, "Which call of the function.", None, "no modular flows")

_ENGINE_COUNTS = ("SELECT op_id, " + ", ".join(f"count(*) FILTER (WHERE engine = '{e}') AS n_{e}" for e in
                                                 ("tensor", "scalar", "sync", "gpsimd", "vector"))
                  + " FROM main.instructions WHERE engine <> 'cpu' AND op_id IS NOT NULL GROUP BY op_id")
FRAMEWORK_INSTRUCTION = Table(
    "FrameworkInstruction", "Framework level instructions (ours: each op under its nn.Module path), with their "
    "instructions' figures.",
    # the same nodes as HloInstruction (one per op), read from its view: one definition of their figures
    f'neuron_explorer."HloInstruction" AS h LEFT JOIN main.ops AS o ON o.op_id = h.id LEFT JOIN ({_ENGINE_COUNTS}) '
    "AS c ON c.op_id = h.id",
    (*(F(f.name, f.type, f.unit, f.required, f.description, f"h.{f.name}" if f.ours else None, f.why)
       for f in _STAGE_IDS), _FLOW,
     F("framework_name", "string", None, False,
       "Framework operation name. Example: NeuronLlamaDecoderLayer[1]/function[2]/aten.add.",
       "CASE WHEN coalesce(o.module_path, '') = '' THEN o.aten_op ELSE replace(o.module_path, '.', '/') || '/' "
       "|| o.aten_op END", "the op's nn.Module path, then its ATen op"),
     *(F(f.name, f.type, f.unit, f.required, f.description, f"h.{f.name}", f.why) for f in STAGE_FIGURES))
    + tuple(F(f"{e}_engine_instruction_count", "int64", None, False, f"{e} engine instructions.",
              f"coalesce(c.n_{e}, 0)") for e in ("tensor", "scalar", "sync", "gpsimd", "vector")),
    extra=("o.module_path AS layer",),
)


def _no_stage(name: str, description: str, label: str, why: str, pcore: bool = False) -> Table:
    """A real compiler stage we have not: its real columns, typed, and no rows (never made-up ones)."""
    fields = (*_STAGE_IDS, F(label, "string", None, True, f"{name[:-11]} instruction name.", None), _FLOW,
              *((F("pcore_idx", "int64", None, False, _PCORE, None),) if pcore else ()), *STAGE_FIGURES)
    # no source rows: every column a typed NULL (a small view: a profile stores each view's parsed query)
    return Table(name, description, "(SELECT 1) AS z WHERE FALSE",
                 tuple(F(f.name, f.type, f.unit, f.required, f.description, None, why) for f in fields))


_NO_STAGES = "no rows: the compiler lowers each ATen op to the ISA directly (HloInstruction and Instruction)"
PENGUIN_INSTRUCTION = _no_stage("PenguinInstruction", "Penguin level instructions: between HLO and BIR.",
                                "penguin_name", _NO_STAGES + ", with no Penguin stage")
BIR_INSTRUCTION = _no_stage("BirInstruction", "BIR level instructions: between Penguin and the ISA.",
                            "bir_name", _NO_STAGES + ", with no BIR stage", pcore=True)
ASSEMBLY_INSTRUCTION = Table(
    "AssemblyInstruction", "Assembly instructions of the NEFF (perf_sim profiles only).",
    "(SELECT 1) AS z WHERE FALSE",
    tuple(F(n, t, None, True, d, None, "no rows: the real table is filled only by perf_sim profiles, and our "
                                    "Instruction rows are the assembly instructions already")
          for n, t, d in (("instruction_id", "int64", "Parent Instruction.id."),
                          ("compiler_opcode", "string", "Opcode at compile time."),
                          ("compiler_operands", "string", "Operands at compile time."),
                          ("compiler_pc", "int64", "Compiler program counter."))),
)

TABLES = (EXECUTION_INFO, NEFF_HEADER, DEVICE_PROFILE_LIST, SYSTEM_PROFILE_METADATA, CC_INSTRUCTION, CC_STREAM,
          DMA_USAGE, DMA_USAGE_SUMMARY, HBM_USAGE_SUMMARY_BY_TYPE, ERROR, WARNING, FRAMEWORK_INSTRUCTION,
          PENGUIN_INSTRUCTION, BIR_INSTRUCTION, ASSEMBLY_INSTRUCTION)
"""The tables this module defines."""

RECORD_FIELDS = {
    "SbufAllocation": (
        F("block_id", "int64", None, False, "DMA block ID (DMA source only).", None,
          "a DMA is one transfer here, not split into blocks"),
        F("hlo_name", "string", None, False, "HLO operation of the allocation. Example: dot.1.",
          "(SELECT o.aten_op FROM main.ops AS o WHERE o.op_id = r.op_id)", "the op's ATen op (Instruction.hlo_name)"),
        F("pcore_idx", "int64", None, False, _PCORE,
          f"CASE WHEN r.queue_name IS NOT NULL THEN {_QUEUE_PCORE.format(q='r.queue_name')} END",
          "a DMA's from its queue; an engine's allocation is recorded per logical core (NULL)"),
    ),
    "SemaphoreUpdate": (
        F("double_set_or_clear", "bool", None, False, "A double event set or clear.", None,
          "the simulator never sets an event twice"),
        F("update_mode", "int32", None, False, "The ISA's raw semaphore update mode.", None,
          "the decoded update_operation_type and update_trigger_timing are recorded, not the raw mode"),
        F("pcore_idx", "int64", None, False, _PCORE, _QUEUE_PCORE.format(q="r.queue"), "from its queue's name"),
    ),
    "TensorInfo": (
        F("pcore_idx", "int64", None, False, _PCORE, None, "a tensor belongs to the logical core's graph"),
    ),
}
"""The real columns the compiler's record tables (physical tables under the real names) lack: their views in
:data:`traces.profile_schema.SCHEMA` add them (``r`` is the record table)."""


def record_view(name: str, schema: str) -> str:
    """``CREATE VIEW`` of a record table in ``schema``: its columns and the real ones it lacks.

    >>> record_view("TensorInfo", "neuron_explorer").splitlines()[0]
    'CREATE OR REPLACE VIEW neuron_explorer."TensorInfo" AS SELECT r.*,'
    """
    cols = ",\n    ".join(f.sql for f in RECORD_FIELDS.get(name, ()))
    return (f'CREATE OR REPLACE VIEW {schema}."{name}" AS SELECT r.*' + (f",\n    {cols}" if cols else "")
            + f'\nFROM main."{name}" AS r')

# -- Summary fields our summary table has not: each aggregate once, in the subqueries SUMMARY_SOURCE joins ----------
_STATIC, _SOFTWARE = "opcode <> 'DMA_INDIRECT'", "opcode = 'DMA_INDIRECT'"
#: Each measured instruction twice: as kind ``all``, and as ``d`` (a static DMA), ``w`` (DMA_INDIRECT) or ``x``.
_KINDS = (f"SELECT exec_id, CASE WHEN v.all_ THEN 'all' WHEN engine <> 'dma' THEN 'x' WHEN {_SOFTWARE} THEN 'w' "
          "ELSE 'd' END AS k, start_ns AS s, start_ns + dur_ns AS e FROM main.instructions CROSS JOIN "
          f"(VALUES (TRUE), (FALSE)) AS v(all_) WHERE {_MEASURED} AND dur_ns > 0 AND engine <> 'cpu'")
#: The real BF16-equivalent multiplier of a Tensor Engine instruction's input dtype (the reference's list:
#: BF16, FP16, TF32 1.0; FP32 4.0; FP8 1.0 on trn1 / inf2 and 0.5 on trn2 / trn3; UINT8 0.5).
_DT = "CASE WHEN json_valid(n.operands) THEN json_extract_string(n.operands, '$.src[0].dt') END"
_BF16 = ("CASE WHEN dt = 'float32' THEN 4.0 WHEN dt IN ('uint8', 'int8') THEN 0.5 WHEN dt LIKE 'float8%' AND "
         "m.target IN ('trn2', 'trn3') THEN 0.5 ELSE 1.0 END")
_TENSOR_SIZES = ("SELECT graph_id, sum(size) FILTER (WHERE type = 'WEIGHT') AS w, sum(size) FILTER (WHERE type IN "
                 "('IN', 'WEIGHT')) AS iw, sum(size) FILTER (WHERE type IN ('IN', 'OUT', 'WEIGHT')) AS iow "
                 "FROM main.\"TensorInfo\" GROUP BY graph_id")
SUMMARY_SOURCE = (
    "main.summary AS s CROSS JOIN (SELECT try_cast(max(value) FILTER (WHERE key = 'hbm_ddr_bandwidth') AS DOUBLE) "
    "* 1e9 AS bw, try_cast(max(value) FILTER (WHERE key = 'neuroncore_clock_freq') AS DOUBLE) AS ghz, "
    "max(value) FILTER (WHERE key = 'target') AS target FROM main.metadata) AS m "
    # the opcodes' counts and times (measured executions, as opcode_summary)
    "CROSS JOIN (SELECT sum(instruction_count) FILTER (WHERE opcode = 'MATMUL') AS mm, "
    "sum(instruction_count) FILTER (WHERE opcode IN ('ACTIVATE', 'ACTIVATE_QUANTIZE')) AS act, "
    "sum(instruction_time_ns) FILTER (WHERE opcode IN ('ACTIVATE', 'ACTIVATE_QUANTIZE')) AS act_ns, "
    "sum(instruction_time_ns) FILTER (WHERE engine = 'dma') AS dma_ns, "
    "sum(instruction_count) FILTER (WHERE engine = 'cc') AS cc, sum(instruction_time_ns) FILTER (WHERE engine = "
    "'cc') AS cc_ns FROM main.opcode_summary) AS o "
    # the engines' SBUF / PSUM traffic (one read and one write count per instruction)
    f"CROSS JOIN (SELECT sum(bytes_read) AS r, sum(bytes_written) AS w FROM main.exec_engine_summary "
    f"WHERE engine NOT IN ('dma', 'cc', 'cpu') AND {_MEASURED}) AS eb "
    # the measured instructions with the compiler's facts, as the Instruction view joins them
    "CROSS JOIN (SELECT sum(pr) AS pr, sum(pw) AS pw, sum(prs) AS prs, count(*) FILTER (WHERE prs > 0) AS prs_n, "
    f"sum(fl * {_BF16}) FILTER (WHERE eng = 'tensor') AS adj, sum(fl * {_BF16}) FILTER (WHERE eng = 'tensor' "
    "AND it = 'TRANSPOSE') AS adj_t FROM (SELECT n.psum_read_bytes AS pr, n.psum_write_bytes AS pw, "
    f"n.psum_read_sbuf_write_bytes AS prs, i.flops AS fl, i.engine AS eng, n.instruction_type AS it, {_DT} AS dt "
    "FROM main.instructions AS i JOIN main.executions AS x USING (exec_id) JOIN (SELECT * FROM main.instruction_info "
    "QUALIFY count(*) OVER (PARTITION BY graph_id, queue, pc, pcore) = 1) AS n ON n.graph_id = x.graph_id AND "
    f"n.queue = i.queue AND n.pc = i.pc AND n.pcore = coalesce(i.pcore, 0) WHERE i.{_MEASURED})) AS n "
    # merged intervals per execution: every row (all), static DMAs (d), DMA_INDIRECT (w)
    "CROSS JOIN (SELECT sum(e - s) FILTER (WHERE k = 'all') / 1e9 AS t_all, sum(e - s) FILTER (WHERE k = 'd') / 1e9 "
    f"AS t_d, sum(e - s) FILTER (WHERE k = 'w') / 1e9 AS t_w FROM ({islands(_KINDS, 'exec_id, k')})) AS a "
    # the tensors of the measured executions' graphs, and read once per execution
    f"CROSS JOIN (SELECT sum(t.w) AS w, sum(t.iw) AS iw, sum(t.iow) AS iow FROM ({_TENSOR_SIZES}) AS t "
    f"WHERE t.graph_id IN (SELECT graph_id FROM main.executions WHERE {_MEASURED})) AS ts "
    f"CROSS JOIN (SELECT sum(t.iw) AS iw FROM main.executions AS x JOIN ({_TENSOR_SIZES}) AS t USING (graph_id) "
    f"WHERE x.{_MEASURED}) AS tx")
"""``FROM`` of the Summary view: our summary row ``s`` and the aggregates :data:`SUMMARY_DERIVED` reads."""

_RATIO = "(s.tensor_engine_peak_bf16_flops / nullif(m.bw, 0))"
_INST_FLOPS = "s.hardware_flops - coalesce(s.transpose_flops, 0)"


def _best_mfu(flops: str) -> str:
    """(FLOPs per HBM byte) over (peak FLOPs per HBM byte): the real formula, at most 100."""
    return f"least(100.0, 100.0 * ({flops}) / nullif(s.hbm_read_bytes + s.hbm_write_bytes, 0) / nullif({_RATIO}, 0))"


def _percent(seconds: str) -> str:
    return f"100.0 * coalesce({seconds}, 0) / nullif(s.total_time, 0)"


_ONE_PACKET = "one DMA instruction is one packet and one transfer here"
_NO_DGE = "every dynamic DMA is software's (no hardware DGE modelled)"
SUMMARY_DERIVED = {
    "matmul_instruction_count": ("coalesce(o.mm, 0)", "opcode_summary"),
    "activate_instruction_count": ("coalesce(o.act, 0)", "opcode_summary"),
    "activate_instruction_time": ("coalesce(o.act_ns, 0) / 1e9", "opcode_summary"),
    "dma_packet_time": ("coalesce(o.dma_ns, 0) / 1e9", _ONE_PACKET),
    "dma_transfer_time": ("coalesce(o.dma_ns, 0) / 1e9", _ONE_PACKET + ": dma_packet_time"),
    "dma_active_cycles": ("round(s.dma_active_time * m.ghz * 1e9)", "dma_active_time × neuroncore_clock_freq"),
    "dma_queue_count": ("(SELECT count(DISTINCT queue) FROM main.lod_busy WHERE engine = 'dma')",
                        "the DMA queues that carried a transfer"),
    "cc_cores_instruction_count": ("coalesce(o.cc, 0)", "the CC-core's instructions (CcInstruction)"),
    "cc_cores_instruction_time": ("coalesce(o.cc_ns, 0) / 1e9", "the CC-core's instructions (CcInstruction)"),
    "cc_cores_instruction_active_time": ("s.cc_op_active_time", "one CC-core: cc_op_active_time"),
    "cc_cores_instruction_active_time_percent": ("s.cc_op_active_time_percent", "one CC-core"),
    "cc_op_time": ("(SELECT coalesce(sum(dur_ns), 0) FROM main.events WHERE kind = 'collective') / 1e9",
                   "Σ CcOp.duration_ns"),
    "weight_size_bytes": ("coalesce(ts.w, 0)", "TensorInfo of the measured executions' graphs"),
    "inputs_and_weights_size_bytes": ("coalesce(ts.iw, 0)", "TensorInfo"),
    "inputs_outputs_weights_size_bytes": ("coalesce(ts.iow, 0)", "TensorInfo"),
    "mbu_min_read_util_percent": ("100.0 * coalesce(tx.iw, 0) / nullif(s.total_time, 0) / nullif(m.bw, 0)",
                                  "inputs and weights read once per measured execution"),
    "peak_flops_bandwidth_ratio": (_RATIO, "FLOPs per HBM byte"),
    "mfu_max_achievable_estimated_percent": (_best_mfu("s.model_flops"), "capped at 100"),
    "mfu_hlo_estimated_percent": ("s.mfu_estimated_percent", "model FLOPs are the ops' (our HLO level)"),
    "mfu_hlo_max_achievable_estimated_percent": (_best_mfu("s.model_flops"), "capped at 100"),
    "mfu_inst_estimated_percent": (f"100.0 * ({_INST_FLOPS}) / nullif(s.tensor_engine_peak_bf16_flops * "
                                   "s.total_time, 0)", "hardware_flops - transpose_flops"),
    "mfu_inst_max_achievable_estimated_percent": (_best_mfu(_INST_FLOPS), "capped at 100"),
    "dynamic_dma_packet_percent": ("s.software_dynamic_dma_packet_percent", _NO_DGE),
    "dynamic_dma_size_percent": ("s.software_dynamic_dma_size_percent", _NO_DGE),
    **{f"hardware_dynamic_dma_{m}": ("0", "no hardware DGE is modelled: no such DMA")
       for m in ("active_time", "active_time_percent", "packet_count", "size", "packet_percent", "size_percent")},
    "total_active_time": ("coalesce(a.t_all, 0)", "the union of every engine's, DMA queue's and the CC-core's "
                                                  "instruction intervals per execution"),
    "total_active_time_percent": (_percent("a.t_all"), "of total_time"),
    "static_dma_active_time": ("coalesce(a.t_d, 0)", "DMAs the compiler generated (not DMA_INDIRECT)"),
    "static_dma_active_time_percent": (_percent("a.t_d"), "of total_time"),
    "software_dynamic_dma_active_time": ("coalesce(a.t_w, 0)", "DMA_INDIRECT: descriptors GpSimd writes"),
    "software_dynamic_dma_active_time_percent": (_percent("a.t_w"), "of total_time"),
    "dynamic_dma_active_time_percent": (_percent("a.t_w"), _NO_DGE),
    "sbuf_read_bytes": ("coalesce(eb.r, 0) + s.hbm_write_bytes",
                        "engine reads (PSUM included: one read count per instruction) and DMAs out of SBUF to HBM"),
    "sbuf_write_bytes": ("coalesce(eb.w, 0) + s.hbm_read_bytes", "engine writes (PSUM included) and DMAs into SBUF"),
    "psum_read_bytes": ("coalesce(n.pr, 0)", "instruction_info (the compiler's operands)"),
    "psum_write_bytes": ("coalesce(n.pw, 0)", "instruction_info (the compiler's operands)"),
    "psum_read_sbuf_write_bytes": ("coalesce(n.prs, 0)", "instruction_info (the compiler's operands)"),
    "psum_read_sbuf_write_count": ("n.prs_n", "instructions that evacuate PSUM to SBUF"),
    "adjusted_hardware_flops": ("coalesce(n.adj, 0)",
                                "Tensor Engine FLOPs × the real multiplier of their input dtype (instruction_info)"),
    "adjusted_transpose_flops": ("coalesce(n.adj_t, 0)", "as adjusted_hardware_flops, for the transposes"),
    "trace_count": ("(SELECT count(*) FROM main.instructions) + (SELECT count(*) FROM main.\"SemaphoreUpdate\")",
                    "every instruction and semaphore update recorded"),
}
"""Real Summary fields our ``summary`` table has not: ``{name: (SQL over s and SUMMARY_SOURCE's subqueries, why)}``
(:data:`traces.profile_schema.SUMMARY` uses them)."""
