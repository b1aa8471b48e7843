"""The real Neuron Explorer profile schema (7.4.0), defined once, over our tables.

Scripts written for the real tool query ``Instruction``, ``Summary``, ``Metadata``,
``SystemProfileEvents``, ``CcOp``, ``HbmUsage``, ``SystemProfileHbmUsage``, ``CpuUsage``,
``HostMemUsage`` and ``SchemaFields`` (SDK ``tools/neuron-explorer/profile-schema-reference.rst``).
This module is the one definition of those tables: every field with its real name, type, unit,
whether the real schema requires it, its description, and the SQL over our raw tables that
fills it (``None``: we do not record it; ``why`` says why, and the view holds a typed NULL so
code that reads the column still runs). From it come the views :func:`finalize` creates in every
profile, the ``SchemaFields`` table, ``neuron-explorer --show-profile-schema`` and the mapping
table in docs/trace_schema.md.

>>> t = TABLES["Instruction"]
>>> [f.name for f in t.fields][:4]
['start_ts', 'end_ts', 'duration_ns', 'engine']
>>> t.field("evt_wait_time_ns").ours
'i.sem_wait_ns'
"""
from __future__ import annotations

import json
import re
from dataclasses import replace

from traces import profile_hierarchy, profile_rest, profile_tables
from traces.profile_hierarchy import OP_STACK, frame_id
from traces.profile_samples import CPU_USAGE, HBM_USAGE, HOST_MEM_USAGE, SYSTEM_PROFILE_HBM_USAGE
from traces.real_fields import _B, _NO_LNC, _NS, _PCORE, _TYPES, HBM_READ, HBM_WRITE, F, Field, Table  # noqa: F401

#: The real schema version these tables follow (Metadata.profile_schema_version of the real tool).
REAL_SCHEMA_VERSION = "7.4.0"


#: The compiler's facts per instruction (``instruction_info``, once per graph) that the view joins by
#: (graph, queue, pc, pcore); a key two device partitions of one graph share is left out (NULL), never guessed.
_INFO = ("SELECT * FROM main.instruction_info "
         "QUALIFY count(*) OVER (PARTITION BY graph_id, queue, pc, pcore) = 1")
_INFO_WHY = "from instruction_info (the compiler's schedule, once per graph): NULL where two device partitions " \
            "of a graph share the row's (queue, pc)"

INSTRUCTION = Table(
    "Instruction", "Instructions executed on NeuronCore compute engines.",
    "main.instructions AS i LEFT JOIN main.ops AS o USING (op_id) LEFT JOIN main.executions AS x USING (exec_id) "
    f"LEFT JOIN ({_INFO}) AS n ON n.graph_id = x.graph_id AND n.queue = i.queue AND n.pc = i.pc "
    "AND n.pcore = coalesce(i.pcore, 0)",
    (
        F("start_ts", "int64", _NS, True, "Timestamp when instruction started execution.", "i.start_ns"),
        F("end_ts", "int64", _NS, True, "Timestamp when instruction finished execution.", "i.start_ns + i.dur_ns"),
        F("duration_ns", "int64", _NS, True, "Duration of instruction execution.", "i.dur_ns"),
        F("engine", "string", None, True, "Compute engine that executed this instruction. Example: tensor.",
          "i.engine"),
        F("timeline_track", "string", None, False, "The timeline track this instruction appears on.", "i.queue",
          "ours is the engine queue (e.g. qSyncIO0, act0)"),
        F("pcore_idx", "int64", None, False, _PCORE, "coalesce(i.pcore, 0)",
          "the schedule's physical core (trn2 LNC=2: two cores' engines and DMA queues)"),
        F("opcode", "string", None, True, "Opcode for the instruction. Example: MATMUL.", "i.opcode"),
        F("operands", "string", None, True, "Input operands for the instruction.", "n.operands",
          "the compiler's access patterns as JSON (dst/src: m memory, b buffer, dt dtype, o offset, ap [stride, "
          "count] pairs, first = partitions; plus the opcode's attributes), " + _INFO_WHY),
        F("compiler_opcode", "string", None, False, "Opcode at compile time.", "i.opcode",
          "no runtime rewriting here: the runtime opcode is the compiler's"),
        F("compiler_operands", "string", None, False, "Operands at compile time.", "n.operands",
          "as operands: no runtime rewriting"),
        F("id", "int64", None, True, "Unique identifier for this instruction execution.",
          "(hash(i.exec_id, i.engine, i.pc) >> 1)::BIGINT"),
        F("pc", "int64", None, True, "The runtime program counter on the engine.", "i.pc"),
        F("compiler_pc", "int64", None, False, "The compiler program counter on the engine.", "i.pc"),
        F("penguin_id", "string", None, False, "Penguin compiler ID.", None, "no Penguin IR stage here"),
        F("raw_penguin_id", "int64", None, False, "Raw penguin compiler identifier.", None, "no Penguin IR stage"),
        F("bir_id", "string", None, True, "BIR instruction identifier.", "n.seq::VARCHAR",
          "no BIR stage (ops → ISA directly): the compiler's instruction index in program order, the id "
          "Flow.in_id/out_id use; " + _INFO_WHY),
        F("raw_bir_id", "int64", None, False, "Raw BIR id.", "n.seq", "as bir_id"),
        F("bir_instruction_name", "string", None, False, "Name of the BIR instruction.", None, "no BIR stage"),
        F("kernel_instruction_name", "string", None, False, "Kernel instruction identifier.", None,
          "NKI lines are in nki_source_location"),
        F("crc_in", "int64", None, False, "16-bit CRC of the input data.", None, "data is not checksummed"),
        F("crc_out", "int64", None, False, "16-bit CRC of the output data.", None, "data is not checksummed"),
        F("evt_wait_time_ns", "int64", _NS, False, "Time spent waiting for events or semaphores.", "i.sem_wait_ns"),
        F("hlo_attrs", "string", None, False, "Debug info of the HLO instruction.", None, "no HLO: ATen ops"),
        F("hlo_name", "string", None, False, "HLO operation name.", "o.aten_op", "ours is the ATen op"),
        F("raw_hlo_id", "int64", None, False, "HLO instruction id.", "i.op_id", "ours is ops.op_id"),
        F("raw_framework_id", "int64", None, False, "Framework instruction id.", "i.op_id", "ours is ops.op_id"),
        F("layer", "string", None, False, "Name from the framework debug info.", "o.module_path",
          "ours is the nn.Module path"),
        F("stack_frame_ids", "string", None, False, "Stack frame ids.",
          "CASE WHEN o.source_id IS NULL THEN NULL ELSE '[' || " + frame_id(OP_STACK) + " || ']' END",
          "the innermost frame (the op's line); StackFrame.parent_frame_id leads to its callers"),
        F("nki_source_location", "string", None, False, "NKI source location.", "i.nki_source_location"),
        F("bir_debug_info_source_location", "string", None, False, "Source location from BIR debug info.", None,
          "the source line is sources via stack_frame_ids"),
        F("dma_trigger_start_ts", "int64", None, False, "Start of the DMA this instruction triggered.", None,
          "never filled: no compute instruction triggers a DMA here; each DMA is its own row on its DMA queue, "
          "issued by that queue when its semaphores allow"),
        F("dma_trigger_end_ts", "int64", None, False, "End of the DMA this instruction triggered.", None,
          "never filled: as dma_trigger_start_ts"),
        F("dma_wait_time_ns", "int64", _NS, False, "Delay from trigger to DMA start.", None,
          "never filled: as dma_trigger_start_ts; a DMA's own wait is evt_wait_time_ns of its row"),
        F("instruction_chain", "string", None, False, "Instructions executed together.", None, "no chains"),
        F("hbm_read_bytes", "int64", None, False, "Bytes read from HBM.", HBM_READ,
          "the compiler's count per instruction (a DMA from HBM, a custom op, a collective step; schema 1.7); "
          "before 1.7 a DMA's bytes_read"),
        F("hbm_write_bytes", "int64", None, False, "Bytes written to HBM.", HBM_WRITE, "as hbm_read_bytes"),
        F("sbuf_read_bytes", "int64", None, False, "Bytes read from SBUF.",
          "CASE WHEN i.engine <> 'dma' THEN i.bytes_read ELSE 0 END",
          "an engine's one read count (PSUM included); a DMA's bytes are counted as HBM's"),
        F("sbuf_write_bytes", "int64", None, False, "Bytes written to SBUF.",
          "CASE WHEN i.engine <> 'dma' THEN i.bytes_written ELSE 0 END", "as sbuf_read_bytes"),
        F("spill_save_bytes", "int64", None, False, "Bytes spilled SBUF→HBM.", "n.spill_save_bytes", _INFO_WHY),
        F("spill_reload_bytes", "int64", None, False, "Bytes reloaded HBM→SBUF.", "n.spill_reload_bytes", _INFO_WHY),
        F("psum_read_bytes", "int64", None, False, "Bytes read from PSUM.", "n.psum_read_bytes",
          "the PSUM source operands' access patterns × element size (also counted in sbuf_read_bytes); " + _INFO_WHY),
        F("psum_write_bytes", "int64", None, False, "Bytes written to PSUM.", "n.psum_write_bytes",
          "as psum_read_bytes, for the PSUM destinations"),
        F("psum_read_sbuf_write_bytes", "int64", None, False, "Bytes PSUM→SBUF.", "n.psum_read_sbuf_write_bytes",
          "psum_read_bytes of an instruction that writes SBUF (a PSUM evacuation)"),
        F("input_queue_bytes", "int64", None, False, "Bytes from an INPUT DMA queue.", None, "queue kinds not kept"),
        F("output_queue_bytes", "int64", None, False, "Bytes from an OUTPUT DMA queue.", None, "queue kinds not kept"),
        F("weight_queue_bytes", "int64", None, False, "Bytes from a DATA/WEIGHT queue.", None, "queue kinds not kept"),
        F("performance_mode", "string", None, False, "2x / 4x Vector and Scalar modes.", "n.performance_mode",
          "Vector Engine rows: the mode the cost model applied (device/cost.vector_perf_mode: 1x, or 2x/4x for "
          "low precision on NC-v3); NULL on other engines (no Scalar modes are modelled); " + _INFO_WHY),
        F("tensor_instruction_type", "string", None, False, "REGULAR or TRANSPOSE.", "n.instruction_type",
          "Tensor Engine rows; " + _INFO_WHY),
        F("tensor_elements", "int64", None, False, "Deprecated element count.", "n.tensor_elements",
          "Tensor Engine rows: elements of the moving (first source) operand; " + _INFO_WHY),
        F("raw_flops", "int64", None, False, "FLOPs of this instruction (a MAC is 2).", "i.flops"),
        F("adjusted_flops", "int64", None, False, "BF16-equivalent FLOPs.", None, "dtype is not kept per row"),
        F("tensor_elements_transpose", "int64", None, False, "Transpose elements.",
          "CASE WHEN n.instruction_type = 'TRANSPOSE' THEN n.tensor_elements END",
          "tensor_elements of a TRANSPOSE instruction"),
        F("flops_transpose", "int64", None, False, "Transpose FLOPs.",
          "CASE WHEN n.instruction_type = 'TRANSPOSE' THEN i.flops END", "raw_flops of a TRANSPOSE instruction"),
        F("adjusted_flops_transpose", "int64", None, False, "BF16-equivalent transpose FLOPs.", None,
          "not recorded"),
        F("scalar_activation_fn", "string", None, False, "Activation function. Example: COPY.", "n.activation_fn",
          "Scalar Engine ACTIVATE rows: the function the lowering chose (COPY, GELU, EXP, ...); " + _INFO_WHY),
    ),
    extra=("i.core AS nc_idx", "i.exec_id AS exec_id"),
)

SYSTEM_PROFILE_EVENTS = Table(
    "SystemProfileEvents",
    "System profile events, generated from the Neuron Runtime, the framework code, or the Python application.",
    "main.system_events AS s LEFT JOIN main.runs AS r USING (run_id)",
    (
        F("id", "int64", None, True, "Unique identifier for this event.",
          "(hash(s.run_id, s.ts_ns, s.name, s.thread_id, s.core) >> 1)::BIGINT"),
        F("name", "string", None, True, "Name of the event. Example: nrt_execute.", "s.name"),
        F("start_ts", "int64", _NS, True, "Timestamp when event started.", "s.ts_ns"),
        F("end_ts", "int64", _NS, True, "Timestamp when event finished.", "s.ts_ns + s.dur_ns"),
        F("duration_ns", "int64", _NS, True, "Duration of this event.", "s.dur_ns"),
        F("trace_event_source", "string", None, True, "neuron_rt, neuron_hw or framework.", "s.source"),
        F("instance_id", "string", None, True, "The server instance that produced this event.", "r.host",
          "ours is the host name"),
        F("process_id", "int64", None, True, "The process id that produced this event.", "r.pid"),
        F("thread_id", "int64", None, True, "The thread id that produced this event.", "s.thread_id"),
        F("nc_idx", "int64", None, False, "Logical NeuronCore index (runtime and hardware events).", "s.core"),
        F("pcore_idx", "int64", None, False, "Physical NeuronCore index within a NeuronDevice.",
          "CASE WHEN s.core IS NULL THEN NULL ELSE s.core END", "one physical core per logical core here"),
        F("worker_gid", "int64", None, False, "Global NeuronCore worker id across processes and instances.",
          "CASE WHEN s.core IS NULL THEN NULL ELSE dense_rank() OVER (ORDER BY r.node, r.host, s.core) - 1 END",
          "dense rank of (node, host, core)"),
        F("flow_id", "string[]", None, False, "Flow ids linking framework → runtime → hardware events.",
          "CASE WHEN s.flow_id IS NULL THEN NULL ELSE [s.flow_id::VARCHAR] END"),
        F("framework_stream_id", "string", None, False, "Framework stream (the driver thread) id.",
          "CASE WHEN s.source = 'framework' THEN s.thread_id::VARCHAR END"),
        F("extra_attributes_json", "string", None, False, "Other attributes as JSON.", "s.detail"),
    ),
    extra=("s.exec_id AS exec_id", "r.rank AS rank", "r.node AS node"),
)

CC_OP = Table(
    "CcOp", "Collective Communication (CC) operations that are executed by the collective engines.",
    "main.events AS e WHERE e.kind = 'collective'",
    (
        F("start_ts", "int64", _NS, True, "Start of the collective operation.", "e.ts_ns"),
        F("end_ts", "int64", _NS, True, "End of the collective operation.", "e.ts_ns + e.dur_ns"),
        F("duration_ns", "int64", _NS, True, "Duration of the collective operation.", "e.dur_ns"),
        F("operation", "string", None, True, "Example: AllGather.", "e.detail->>'operation'"),
        F("algorithm", "string", None, True, "Example: Ring.", "e.detail->>'algorithm'",
          "the runtime's choice by size and topology: Mesh, SingleStepMesh, RDH, KangaRing, Ring, Hierarchical(...)"),
        F("num_elements", "int64", None, True, "Number of elements.", "(e.detail->>'num_elements')::BIGINT"),
        F("dtype", "string", None, True, "Data type. Example: fp16.", "e.detail->>'dtype'"),
        F("op_id", "int64", None, True, "ID of the collective operation.", "e.graph_id"),
        F("stream_id", "int64", None, True, "Stream of the operation in the profile.", "0",
          "one collective stream per core"),
        F("stream_index", "int64", None, True, "Stream relative to the execution.", "0", "one stream"),
        F("trigger_engine", "string", None, True, "Engine that triggered it. Example: Pool.", "'cc'",
          "collectives are issued by the cc engine here"),
        F("input_size", "int64", _B, False, "Input size in bytes.", "(e.detail->>'input_size')::BIGINT"),
        F("output_size", "int64", _B, False, "Output size in bytes.", "(e.detail->>'output_size')::BIGINT"),
        F("algorithm_bandwidth", "float", "bytes_per_second", False, "max(input, output) / duration.",
          "(e.detail->>'algorithm_bandwidth')::DOUBLE"),
        F("bus_bandwidth", "float", "bytes_per_second", False, "Algorithm bandwidth scaled per operation.",
          "(e.detail->>'bus_bandwidth')::DOUBLE"),
        F("trigger_start_ts", "int64", _NS, False, "Start of the triggering instruction.", "e.ts_ns"),
        F("cc_trigger_start_delay", "int64", _NS, False, "Delay from trigger to start.",
          "coalesce((e.detail->>'wait_ns')::BIGINT, 0)", "ours is the wait for the other ranks"),
        F("replica_group_id", "int64", None, False, "Replica group id.", None, "groups are named by their ranks"),
        F("replica_group", "string", None, False, "Participating ranks. Example: [[0, 1, 2, 3]].",
          "(e.detail->'replica_group')::VARCHAR"),
    ),
    extra=("e.core AS nc_idx", "e.run_id AS run_id"),
)

def _meta(key: str, typ: str = "string") -> str:
    expr = f"max(value) FILTER (WHERE key = '{key}')"
    return expr if typ == "string" else f"try_cast({expr} AS {_TYPES[typ][2]})"


_META_FIELDS = (
    ("profile_schema_version", "string", True, "The schema version of this profile (MAJOR.MINOR.PATCH).",
     f"'{REAL_SCHEMA_VERSION}'", "the real schema these views follow; ours is schema_version"),
    ("ntff_version", "int32", True, "Version of the NTFF format.", None, "no NTFF: rows go straight to DuckDB"),
    ("num_physical_cores", "int32", True, "Physical NeuronCores in the Logical NeuronCore.",
     _meta("num_physical_cores", "int32"), ""),
    ("vnc_enabled", "bool", True, "Whether execution was on Logical NeuronCores.", _meta("vnc_enabled", "bool"), ""),
    ("first_hw_timestamp", "int64", True, "First timestamp in the trace.", _meta("trace_start_ns", "int64"), ""),
    ("last_hw_timestamp", "int64", True, "Last timestamp in the trace.", _meta("trace_end_ns", "int64"), ""),
    ("first_ts", "string", True, "First timestamp in Unix time format.",
     f"strftime(make_timestamp(({_meta('trace_start_ns', 'int64')}) // 1000), '%Y-%m-%d %H:%M:%S+00:00')", ""),
    ("last_ts", "string", True, "Last timestamp in Unix time format.",
     f"strftime(make_timestamp(({_meta('trace_end_ns', 'int64')}) // 1000), '%Y-%m-%d %H:%M:%S+00:00')", ""),
    ("dma_ddr_bandwidth", "float", True, "Max DMA DDR bandwidth of one physical core.",
     _meta("dma_ddr_bandwidth", "float"), "ours in bytes per ns"),
    ("num_dma_engines_per_neuroncore", "int32", True, "DMA engines per core.",
     _meta("num_dma_engines_per_neuroncore", "int32"), ""),
    ("hbm_ddr_bandwidth", "float", True, "Max HBM bandwidth of one stack.", _meta("hbm_ddr_bandwidth", "float"),
     "ours in GB/s"),
    ("tensor_engine_num_rows", "int64", True, "Rows of the systolic array.", _meta("tensor_engine_num_rows", "int64"),
     ""),
    ("tensor_engine_num_cols", "int64", True, "Columns of the systolic array.",
     _meta("tensor_engine_num_cols", "int64"), ""),
    ("tensor_engine_clock_freq", "float", True, "Tensor Engine clock (GHz).",
     _meta("tensor_engine_clock_freq", "float"),
     ""),
    ("vector_engine_clock_freq", "float", True, "Vector Engine clock (GHz).",
     _meta("vector_engine_clock_freq", "float"),
     ""),
    ("vector_engine_num_channels", "int64", True, "Vector Engine channels.",
     _meta("vector_engine_num_channels", "int64"), ""),
    ("scalar_engine_clock_freq", "float", True, "Scalar Engine clock (GHz).",
     _meta("scalar_engine_clock_freq", "float"),
     ""),
    ("scalar_engine_num_channels", "int64", True, "Scalar Engine channels.",
     _meta("scalar_engine_num_channels", "int64"), ""),
    ("gpsimd_engine_clock_freq", "float", True, "GpSimd Engine clock (GHz).",
     _meta("gpsimd_engine_clock_freq", "float"),
     ""),
    ("gpsimd_engine_num_channels", "int64", True, "GpSimd Engine channels.", None, "not modelled"),
    ("neuroncore_clock_freq", "float", True, "NeuronCore clock (GHz).", _meta("neuroncore_clock_freq", "float"), ""),
    ("ticks_per_nanosec", "int64", True, "Profile ticks per nanosecond.", _meta("ticks_per_nanosec", "int64"), ""),
    ("instance_type", "string", False, "Instance type. Example: trn1.2xlarge.", _meta("instance_type"), ""),
    ("runtime_version", "string", False, "Neuron Runtime version.", _meta("stack_version"), "ours: neuron_stack's"),
    ("collectives_version", "string", False, "Neuron Collectives version.", None, "no separate library"),
    ("driver_version", "string", False, "Neuron driver version.", None, "no driver: simulated device"),
    ("explorer_version", "string", False, "Explorer version that processed the profile.", _meta("stack_version"),
     "ours: neuron_stack's"),
    ("compiler_version", "string", False, "Compiler version that built the NEFF.", _meta("stack_version"),
     "ours: neuron_stack's"),
    ("neuroncore_idx", "int64", False, "The index of this NeuronCore.", None, "a profile here holds every core"),
    ("neuron_device_idx", "int64", False, "The index of this NeuronDevice.", None, "a profile holds every device"),
    ("ultraserver_id", "int64", False, "UltraServer id.", None, "no UltraServer here"),
    ("ultraserver_type", "string", False, "UltraServer connectivity type.", None, "no UltraServer here"),
    ("ultraserver_size", "int32", False, "Instances in the UltraServer.", None, "no UltraServer here"),
    ("ultraserver_instance_index", "int32", False, "Instance index in the UltraServer.", None, "no UltraServer here"),
    ("s3_bucket_path", "string", False, "S3 path of the profile files.", None, "offline: no upload"),
    ("profile_name", "string", False, "User chosen name for this profile.",
     f"coalesce({_meta('profile_name')}, {_meta('default_profile_name')})",
     "neuron-explorer view --display-name NAME, else the script and mode the profile recorded (traces.naming)"),
    ("explorer_build_time", "string", False, "When neuron-explorer was built.", None, "not recorded"),
    ("is_simulation", "bool", False, "Whether this profile is a simulation.", _meta("is_simulation", "bool"),
     "always true here"),
)

METADATA = Table(
    "Metadata", "Metadata associated with this profile, including details about the system configuration.",
    "main.metadata", tuple(F(n, t, None, r, d, o, w) for n, t, r, d, o, w in _META_FIELDS))

_SUMMARY_NAMES = """
total_time neuroncore_cycle_count model_flops hardware_flops transpose_flops adjusted_hardware_flops
adjusted_transpose_flops mm_arithmetic_intensity peak_flops_bandwidth_ratio trace_count event_count total_row_count
dma_active_cycles dma_active_time dma_active_time_percent static_dma_active_time dynamic_dma_active_time_percent
static_dma_active_time_percent dma_transfer_average_bytes dma_packet_time dma_transfer_time dma_transfer_count
dma_transfer_total_bytes dma_queue_count inputs_and_weights_size_bytes inputs_outputs_weights_size_bytes
weight_size_bytes static_dma_packet_count static_dma_size dynamic_dma_packet_percent static_dma_packet_percent
dynamic_dma_size_percent static_dma_size_percent mbu_estimated_percent mbu_min_read_util_percent hbm_write_bytes
hbm_read_bytes sbuf_write_bytes sbuf_read_bytes spill_save_bytes spill_reload_bytes psum_write_bytes psum_read_bytes
psum_read_sbuf_write_count psum_read_sbuf_write_bytes input_queue_bytes output_queue_bytes weight_queue_bytes
software_dynamic_dma_active_time software_dynamic_dma_active_time_percent software_dynamic_dma_packet_count
software_dynamic_dma_size software_dynamic_dma_packet_percent software_dynamic_dma_size_percent
hardware_dynamic_dma_active_time hardware_dynamic_dma_active_time_percent hardware_dynamic_dma_packet_count
hardware_dynamic_dma_size hardware_dynamic_dma_packet_percent hardware_dynamic_dma_size_percent
tensor_engine_instruction_time tensor_engine_active_time tensor_engine_active_time_percent
tensor_engine_instruction_count matmul_instruction_count mfu_estimated_percent mfu_max_achievable_estimated_percent
mfu_hlo_estimated_percent mfu_hlo_max_achievable_estimated_percent mfu_inst_estimated_percent
mfu_inst_max_achievable_estimated_percent hfu_estimated_percent vector_engine_instruction_time
vector_engine_active_time vector_engine_active_time_percent vector_engine_instruction_count
scalar_engine_instruction_time scalar_engine_active_time scalar_engine_active_time_percent
scalar_engine_instruction_count activate_instruction_time activate_instruction_count sync_engine_instruction_time
sync_engine_active_time sync_engine_active_time_percent sync_engine_instruction_count gpsimd_engine_instruction_time
gpsimd_engine_active_time gpsimd_engine_active_time_percent gpsimd_engine_instruction_count cc_op_time
cc_op_active_time cc_op_active_time_percent cc_op_count cc_cores_instruction_time cc_cores_instruction_active_time
cc_cores_instruction_active_time_percent cc_cores_instruction_count total_exec_time total_active_time
total_active_time_percent""".split()

#: Summary columns our ``summary`` table has today (traces.summary_sql.summary_sql), under the real names.
_SUMMARY_OURS = frozenset("""
total_time total_exec_time neuroncore_cycle_count model_flops hardware_flops mm_arithmetic_intensity event_count
dma_active_time dma_active_time_percent dma_transfer_count dma_transfer_total_bytes dma_transfer_average_bytes
hbm_read_bytes hbm_write_bytes mfu_estimated_percent hfu_estimated_percent cc_op_active_time cc_op_active_time_percent
cc_op_count""".split()) | {f"{e}_engine_{m}" for e in ("tensor", "vector", "scalar", "gpsimd", "sync")
                         for m in ("instruction_time", "active_time", "active_time_percent", "instruction_count")}


def _summary_field(name: str) -> Field:
    float_ = name.endswith(("_percent", "_time", "_intensity", "_ratio", "_average_bytes"))
    unit = ("percent" if name.endswith("_percent") else "seconds" if name.endswith("_time") else
            "bytes" if name.endswith(("_bytes", "_size")) else "flops" if name.endswith("_flops") else
            "cycles" if name.endswith("_cycles") or name == "neuroncore_cycle_count" else None)
    why = ("" if name in _SUMMARY_OURS else
           "the DMA queues are not typed input / output / weight here" if name.endswith("_queue_bytes") else
           "DuckDB keeps no such count: each table's count(*) answers it" if name == "total_row_count" else
           "our summary table's column of this name, where the profile's summary has it (added since: a "
           "profile finalised before has NULL)")
    if name in profile_rest.SUMMARY_DERIVED:   # over small tables of ours, beside our summary row
        ours, why = profile_rest.SUMMARY_DERIVED[name]
    else:
        ours = f"s.{name}" if name in _SUMMARY_OURS else None
    return F(name, "float" if float_ else "int64", unit, False, f"Summary metric {name} (see the real schema).",
             ours, why)


SUMMARY = Table("Summary", "Profile performance metrics which summarize execution.", profile_rest.SUMMARY_SOURCE,
                tuple(_summary_field(n) for n in _SUMMARY_NAMES))

SCHEMA_FIELDS_COLUMNS = ("table_name", "table_description", "field_name", "field_description", "field_example",
                         "field_type", "field_required", "field_format", "field_unit", "field_minimum",
                         "field_maximum", "field_enum_values")

SCHEMA_FIELDS = Table(
    "SchemaFields", "The schema of the data in this profile: every field of every table.", 'main."SchemaFields"',
    tuple(F(c, "bool" if c == "field_required" else "float" if c in ("field_minimum", "field_maximum") else "string",
            None, c in ("table_name", "table_description", "field_name", "field_description", "field_type",
                        "field_required"), f"SchemaFields.{c}", c) for c in SCHEMA_FIELDS_COLUMNS))

TABLES: dict[str, Table] = {t.name: t for t in (
    INSTRUCTION, SUMMARY, METADATA, SYSTEM_PROFILE_EVENTS, CC_OP, HBM_USAGE, SYSTEM_PROFILE_HBM_USAGE, CPU_USAGE,
    HOST_MEM_USAGE, *profile_tables.TABLES, *profile_hierarchy.TABLES, *profile_rest.TABLES, SCHEMA_FIELDS)}
"""The real tables defined over ours. ``SchemaFields`` is a table in ``main``, generated by :func:`schema_fields`."""

#: DuckDB names are case-insensitive, so ``Metadata`` and ``Summary`` cannot sit beside our ``metadata`` and
#: ``summary``: every real table is a view in this schema too (``SELECT * FROM neuron_explorer.Metadata``).
SCHEMA = "neuron_explorer"


#: What the columns a real table's view keeps beside the real ones (``Table.extra``) mean.
EXTRA_DESCRIPTIONS = {
    "nc_idx": ("int32", "Logical NeuronCore index (ours, beside the real columns)."),
    "exec_id": ("int64", "The execution (executions.exec_id) the row belongs to (ours)."),
    "run_id": ("string", "The process run (runs.run_id) that recorded the row (ours)."),
    "rank": ("int32", "torch.distributed rank of the process (ours)."),
    "node": ("int32", "torch.distributed node of the process (ours)."),
    "flops": ("int64", "Hardware FLOPs of the instructions (ours, opcode_summary.flops)."),
    "transfer_bytes": ("int64", "Bytes the instructions moved, a DMA's larger side (ours, opcode_summary)."),
    "layer": ("string", "The op's nn.Module path (ours, Instruction.layer)."),
    "graph_id": ("int64", "The compiled graph (graphs.graph_id) (ours)."),
    "bucket_resolution_ns": ("int64", "The bucket's width in nanoseconds (ours, as DmaUsageSummary's)."),
    "bucket_bytes": ("int64", "HBM bytes moved in the bucket (ours: current_throughput × the bucket's width)."),
}

#: DuckDB column types → (OpenAPI type, format), for the rows of our own tables.
_OPENAPI = {"BIGINT": ("integer", "int64"), "INTEGER": ("integer", "int32"), "SMALLINT": ("integer", "int16"),
            "DOUBLE": ("number", "double"), "FLOAT": ("number", "float"), "VARCHAR": ("string", None),
            "BOOLEAN": ("boolean", None), "HUGEINT": ("integer", None), "DECIMAL": ("number", None)}


def openapi_type(duckdb_type: str) -> tuple[str, str | None]:
    """``(type, format)`` of a DuckDB column type as OpenAPI writes it.

    >>> openapi_type("BIGINT"), openapi_type("VARCHAR[]")
    (('integer', 'int64'), ('array', 'string'))
    """
    if duckdb_type.endswith("[]"):
        return "array", openapi_type(duckdb_type[:-2])[0]
    return _OPENAPI.get(duckdb_type.split("(")[0], ("string", None))


_EXAMPLE = re.compile(r"\bExample: (.+?)\.(?:\s|$)")


def schema_fields(ours=()) -> dict[str, list]:
    """The ``SchemaFields`` rows, as columns: every field of every real table (and the columns its view keeps
    beside them), then every column of our own tables. ``ours`` is ``[(table, description, [(column,
    duckdb_type, description), ...]), ...]`` (``traces.store`` reads it from the profile's catalogue and
    :mod:`traces.table_docs`). Example:
    >>> cols = schema_fields(); cols["field_name"][:2]
    ['start_ts', 'end_ts']
    """
    rows = {c: [] for c in SCHEMA_FIELDS_COLUMNS}

    def add(table, table_description, name, description, typ, required, fmt, unit):
        # the real reference gives an example inside the description ("... Example: MATMUL."): its field_example
        example = _EXAMPLE.search(description)
        values = (table, table_description, name, description, example and example.group(1), typ, required, fmt,
                  unit, None, None, None)
        for c, v in zip(SCHEMA_FIELDS_COLUMNS, values):
            rows[c].append(v)

    for t in TABLES.values():
        for f in t.fields:
            typ, fmt, _ = _TYPES[f.type]
            # the real description, then what this profile holds in it (why a column is NULL here)
            note = f" NULL here: {f.why}." if f.ours is None else f" Here: {f.why}." if f.why else ""
            add(t.name, t.description, f.name, f.description + note, typ, f.required, fmt, f.unit)
        for expr in t.extra:
            name = expr.rsplit(" AS ", 1)[1]
            kind, description = EXTRA_DESCRIPTIONS[name]
            add(t.name, t.description, name, description, _TYPES[kind][0], False, _TYPES[kind][1], None)
    for table, description, columns in ours:
        if table == "summary":   # the Summary view keeps our other summary columns beside the real ones
            extras = set(summary_extras([c for c, _, _ in columns]))
            for name, duckdb_type, meaning in columns:
                if name in extras:
                    typ, fmt = openapi_type(duckdb_type)
                    add(SUMMARY.name, SUMMARY.description, name, f"{meaning} (ours, summary.{name}).", typ, False,
                        fmt, None)
        for name, duckdb_type, meaning in columns:
            typ, fmt = openapi_type(duckdb_type)
            add(table, description, name, meaning, typ, False, fmt, None)
        for f in profile_rest.RECORD_FIELDS.get(table, ()):   # the real columns its real-name view adds
            typ, fmt, _ = _TYPES[f.type]
            note = f" NULL here: {f.why}." if f.ours is None else f" Here: {f.why}." if f.why else ""
            add(table, description, f.name, f.description + note, typ, f.required, fmt, f.unit)
    return rows


def schema_fields_table(ours=()):
    """:func:`schema_fields` as an Arrow table with the real column types (NULL columns typed too)."""
    import pyarrow as pa

    types = {"field_required": pa.bool_(), "field_minimum": pa.float64(), "field_maximum": pa.float64()}
    cols = schema_fields(ours)
    return pa.table({c: pa.array(v, types.get(c, pa.string())) for c, v in cols.items()})


def summary_extras(summary_columns) -> list[str]:
    """Our ``summary`` columns that are no real Summary field, in their order: the ``Summary`` view keeps them
    beside the real ones, so ``SELECT * FROM Summary`` is a superset of our table."""
    real = {f.name for f in SUMMARY.fields}
    return [c for c in summary_columns if c not in real]


def view_statements(taken: set[str], summary_columns=()) -> list[str]:
    """Every ``CREATE VIEW`` of the real tables: all in :data:`SCHEMA`, and in ``main`` those whose name
    is not ``taken`` (our table names there, lower case: ``summary``, ``metadata``, ``schemafields``).
    A real Summary field our ``summary`` table has gained since (``summary_columns``, in table order) is used
    too, and our other summary columns are kept beside the real ones (:func:`summary_extras`).

    The one in ``main`` selects from the one in :data:`SCHEMA`: a view is stored as its parsed query, about
    9 KiB for a real table's, and a second copy of each made a third of a small profile's size.

    >>> view_statements(set())[-1]
    'CREATE OR REPLACE VIEW main."SchemaFields" AS SELECT * FROM neuron_explorer."SchemaFields"'
    """
    out = [f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"]
    for t in TABLES.values():
        if t is SUMMARY:
            t = replace(t, fields=tuple(replace(f, ours=f"s.{f.name}") if f.ours is None and f.name in summary_columns
                                        else f for f in t.fields),
                        extra=tuple(f"s.{c} AS {c}" for c in summary_extras(summary_columns)))
        out.append(t.view_sql(SCHEMA))
        if t.name.lower() not in taken:
            out.append(f'CREATE OR REPLACE VIEW main."{t.name}" AS SELECT * FROM {SCHEMA}."{t.name}"')
    return out


def openapi_yaml(ours=()) -> str:
    """The schema as OpenAPI YAML, one block per table, as ``neuron-explorer --show-profile-schema`` prints it:
    the real tables, then ours (``ours`` as for :func:`schema_fields`).

    >>> print(openapi_yaml().splitlines()[0])
    openapi: 3.0.3
    """
    q = json.dumps   # a JSON string is a valid YAML scalar
    out = ["openapi: 3.0.3", "info:", "  title: neuron_stack profile schema (the real Neuron Explorer's names)",
           f"  version: {q(REAL_SCHEMA_VERSION)}", "components:", "  schemas:"]
    for t in TABLES.values():
        out += [f"    {t.name}:", "      type: object", f"      description: {q(t.description)}"]
        req = [f.name for f in t.fields if f.required]
        if req:
            out.append("      required: [" + ", ".join(req) + "]")
        out.append("      properties:")
        for f in t.fields:
            typ, fmt, _ = _TYPES[f.type]
            out.append(f"        {f.name}:")
            if typ == "array":
                out += ["          type: array", "          items:", f"            type: {fmt}"]
            else:
                out.append(f"          type: {typ}")
                if fmt:
                    out.append(f"          format: {fmt}")
            if f.unit:
                out.append(f"          x-unit: {f.unit}")
            out.append(f"          description: {q(f.description)}")
            out.append(f"          x-neuron-stack: {q(f.ours if f.ours is not None else 'not recorded: ' + f.why)}")
        for expr in t.extra:
            name = expr.rsplit(" AS ", 1)[1]
            kind, description = EXTRA_DESCRIPTIONS[name]
            out += [f"        {name}:", f"          type: {_TYPES[kind][0]}",
                    f"          description: {q(description)}"]
    for table, description, columns in ours:
        out += [f"    {table}:", "      type: object", f"      description: {q(description)}",
                "      x-neuron-stack: \"ours (docs/trace_schema.md)\"", "      properties:"]
        for name, duckdb_type, meaning in columns:
            typ, fmt = openapi_type(duckdb_type)
            out += [f"        {name}:", f"          type: {typ}"]
            if typ == "array":
                out += ["          items:", f"            type: {fmt}"]
            elif fmt:
                out.append(f"          format: {fmt}")
            out.append(f"          description: {q(meaning)}")
        for f in profile_rest.RECORD_FIELDS.get(table, ()):   # the real columns its real-name view adds
            typ, fmt, _ = _TYPES[f.type]
            out += [f"        {f.name}:", f"          type: {typ}"] + ([f"          format: {fmt}"] if fmt else [])
            out += [f"          description: {q(f.description)}",
                    f"          x-neuron-stack: {q(f.ours if f.ours is not None else 'not recorded: ' + f.why)}"]
    return "\n".join(out) + "\n"


def _module_of(t: Table) -> str:
    """The module that defines ``t``: this one, profile_tables, profile_hierarchy or profile_rest."""
    return next((m.__name__.rsplit(".", 1)[1] for m in (profile_tables, profile_hierarchy, profile_rest)
                 if t in m.TABLES),
                "profile_schema")


def mapping_markdown() -> str:
    """docs/trace_schema.md's mapping section: every real field, what fills it here, and why."""
    out = []
    for t in TABLES.values():
        source = t.source.split(' WHERE ')[0].replace('main.', '')
        source = (f"From `{source}`." if len(source) <= 200 and "(" not in source.split(" AS ")[0] else
                  f"From a query over our tables, defined in `traces/{_module_of(t)}.py`.")
        out += [f"### `{t.name}`", "", source, "",
                "| real field | ours | note |", "|---|---|---|"]
        for f in t.fields:
            ours = ("`" + f.ours.replace("|", "\\|") + "`") if f.ours is not None else "— (NULL)"
            out.append(f"| `{f.name}` | {ours} | {f.why} |")
        out.append("")
    return "\n".join(out)
