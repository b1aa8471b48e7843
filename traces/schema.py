"""Arrow schemas of every trace table: the contract between the runtime (writer) and every reader.

One schema per table of DESIGN.md §4. Column meanings are documented in docs/trace_schema.md.
Times are integer nanoseconds. ``*_ns`` columns without a clock prefix are on the *projected*
clock (what the program would see on real hardware); ``wall_*`` columns are the real host clock.

Ids (``graph_id``, ``op_id``, ``exec_id``, ``source_id``) are int64 and unique across every
process writing into one output directory without coordination: see :func:`traces.ids.new_id`
and :func:`traces.ids.stable_id`.

>>> TABLES["instructions"].field("opcode").type
DataType(string)
"""
from __future__ import annotations

import pyarrow as pa

from traces.vocab import ENGINES  # noqa: F401  (re-exported: the schema's engine column values)

#: Bumped on every change: major = readers must refuse, minor = added columns/tables.
SCHEMA_VERSION = "1.7.0"   # 1.7.0: instruction_info.channels (partitions an instruction covers),
# instructions.hbm_read_bytes, hbm_write_bytes (HbmUsage over time);
# 1.6.0: serving_steps.request_ns, ops.stack (the user's call stack);
# 1.5.0: ops.fwd_source_id (a backward op's forward line);
# instruction_info (the compiler's facts per instruction of a graph);
# 1.4.0: instructions.pcore (the physical core of an LNC=2 logical core);
# 1.3.0: system_events, cpu_usage, host_memory; SbufAllocation, Flow,
# SemaphoreUpdate, TensorInfo, executions' spill/transpose columns, events.kind 'dispatch';
# 1.2.0: serving_requests, serving_steps (1.1.0 is nki_source_location)

_i64, _i32, _str, _bool, _f64 = pa.int64(), pa.int32(), pa.string(), pa.bool_(), pa.float64()


METADATA = pa.schema([("key", _str), ("value", _str)])

RUNS = pa.schema([
    ("run_id", _str), ("pid", _i32), ("tag", _str), ("command", _str), ("host", _str),
    ("target", _str), ("rank", _i32), ("node", _i32),
    ("wall_start_ns", _i64), ("wall_end_ns", _i64), ("start_ns", _i64), ("end_ns", _i64),
    ("status", _str),
])

SOURCES = pa.schema([
    ("source_id", _i64), ("file", _str), ("line", _i32), ("function", _str), ("code", _str),
])

SOURCE_FILES = pa.schema([("file", _str), ("sha1", _str), ("text", _str)])

GRAPHS = pa.schema([
    ("graph_id", _i64), ("run_id", _str), ("name", _str), ("kind", _str), ("neff_hash", _str),
    ("input_signature", _str), ("compile_wall_ns", _i64), ("compile_ns", _i64), ("cache_hit", _bool),
    ("recompile_of", _i64), ("recompile_reason", _str), ("source_id", _i64), ("target", _str),
    ("flags", _str), ("num_ops", _i32), ("num_device_ops", _i32), ("num_instructions", _i64),
])

OPS = pa.schema([
    ("op_id", _i64), ("graph_id", _i64), ("name", _str), ("aten_op", _str), ("op_class", _str),
    ("placement", _str), ("fallback_reason", _str), ("fused_into", _str), ("module_path", _str),
    ("source_id", _i64), ("shape", _str), ("dtype", _str), ("flops", _i64), ("bytes", _i64),
    ("fwd_source_id", _i64),   # 1.5: a backward op's forward line (source_id is the backward() call)
    ("stack", _str),   # 1.6: the user's call stack, source ids outermost first
])

EXECUTIONS = pa.schema([
    ("exec_id", _i64), ("run_id", _str), ("graph_id", _i64), ("core", _i32), ("iteration", _i64),
    ("wall_start_ns", _i64), ("wall_end_ns", _i64), ("start_ns", _i64), ("end_ns", _i64),
    ("device_ns", _i64), ("status", _str), ("warmup", _bool), ("flops", _i64),
    ("tensor_busy_ns", _i64), ("vector_busy_ns", _i64), ("scalar_busy_ns", _i64),
    ("gpsimd_busy_ns", _i64), ("sync_busy_ns", _i64), ("dma_busy_ns", _i64), ("cc_busy_ns", _i64),
    ("cpu_fallback_ns", _i64), ("hbm_read_bytes", _i64), ("hbm_write_bytes", _i64),
    # 1.3: the schedule's spill traffic and the Tensor Engine's transpose FLOPs (not in ``flops``)
    ("spill_save_bytes", _i64), ("spill_reload_bytes", _i64), ("transpose_flops", _i64),
])

INSTRUCTIONS = pa.schema([
    ("exec_id", _i64), ("core", _i32), ("engine", _str), ("queue", _str), ("opcode", _str),
    ("op_id", _i64), ("pc", _i32), ("start_ns", _i64), ("dur_ns", _i64), ("flops", _i64),
    ("bytes_read", _i64), ("bytes_written", _i64), ("sem_wait_ns", _i64),
    ("nki_source_location", _str),   # 1.1: the NKI kernel line (file.py:line) of a kernel's instruction
    ("pcore", _i32),                 # 1.4: physical core within the logical core (0/1 under LNC=2; null: 0)
    ("hbm_read_bytes", _i64), ("hbm_write_bytes", _i64),   # 1.7: of bytes_read / bytes_written, HBM's
])

EVENTS = pa.schema([
    ("ts_ns", _i64), ("wall_ns", _i64), ("dur_ns", _i64), ("run_id", _str), ("kind", _str),
    ("core", _i32), ("graph_id", _i64), ("op_id", _i64), ("source_id", _i64), ("detail", _str),
])

MEMORY = pa.schema([
    ("ts_ns", _i64), ("run_id", _str), ("core", _i32), ("location", _str), ("category", _str),
    ("bytes", _i64),
])

# LLM serving (neuron_stack.inference): one row per request and one per engine step (prefill or decode).
SERVING_REQUESTS = pa.schema([
    ("run_id", _str), ("request_id", _str), ("model", _str), ("slot", _i32), ("prompt_tokens", _i32),
    ("output_tokens", _i32), ("cte_bucket", _i32), ("finish_reason", _str), ("arrival_ns", _i64),
    ("scheduled_ns", _i64), ("first_token_ns", _i64), ("finish_ns", _i64), ("wall_arrival_ns", _i64),
    ("wall_finish_ns", _i64),
])

SERVING_STEPS = pa.schema([
    ("run_id", _str), ("step", _i64), ("phase", _str), ("bucket", _i32), ("batch_size", _i32),
    ("active", _i32), ("slots", _str), ("request_ids", _str), ("tokens", _i32), ("waiting", _i32),
    ("kv_slots_used", _i32), ("start_ns", _i64), ("end_ns", _i64), ("device_ns", _i64),
    ("wall_start_ns", _i64), ("wall_end_ns", _i64), ("request_ns", _i64),
])

# The system profile (NEURON_RT_INSPECT_SYSTEM_PROFILE, ProfileMode.RUNTIME): runtime API spans (neuron_rt),
# device executions (neuron_hw) and torch.profiler spans (framework); the real SystemProfileEvents over them.
SYSTEM_EVENTS = pa.schema([
    ("ts_ns", _i64), ("dur_ns", _i64), ("run_id", _str), ("name", _str), ("source", _str), ("thread_id", _i64),
    ("core", _i32), ("exec_id", _i64), ("flow_id", _i64), ("detail", _str),
])

# Host samples (NEURON_RT_INSPECT_CPU_UTIL / _HOST_MEMORY, ProfileMode.CPU_UTIL / HOST_MEMORY).
CPU_USAGE = pa.schema([("ts_ns", _i64), ("run_id", _str), ("cpu_id", _str), ("util_percent", _f64)])
HOST_MEMORY = pa.schema([("ts_ns", _i64), ("run_id", _str), ("used_bytes", _i64), ("used_percent", _f64)])

# The compiler's records (neuron_stack/compiler/records.py), under the real Neuron Explorer's table names:
# the real columns first, then ours. Timeline tables are stamped per execution like instructions
# (``*_ts``/``timestamp`` on the projected clock); Flow and TensorInfo are per graph and partition.
SBUF_ALLOCATION = pa.schema([
    ("exec_id", _i64), ("core", _i32), ("graph_id", _i64), ("op_id", _i64),
    ("start_ts", _i64), ("end_ts", _i64), ("start_address", _i64), ("end_address", _i64),
    ("partition", _i32), ("partition_count", _i32), ("memory", _str), ("op_source_type", _str),
    ("opcode", _str), ("operands", _str), ("queue_name", _str), ("tensor_name", _str), ("node", _str),
    ("spill", _str), ("first_pc", _i32), ("access_count", _i32),
])

FLOW = pa.schema([
    ("graph_id", _i64), ("partition", _i32),
    ("in_id", _i64), ("out_id", _i64), ("in_table", _str), ("out_table", _str), ("dependency_type", _str),
    ("gap_time", _i64), ("in_queue", _str), ("in_pc", _i32), ("out_queue", _str), ("out_pc", _i32), ("via", _str),
])

SEMAPHORE_UPDATE = pa.schema([
    ("exec_id", _i64), ("core", _i32),
    ("timestamp", _i64), ("id", _str), ("value", _i32), ("update_source", _str),
    ("update_operation_type", _str), ("update_trigger_timing", _str), ("queue", _str), ("pc", _i32),
])

TENSOR_INFO = pa.schema([
    ("graph_id", _i64), ("partition", _i32),
    ("variable_name", _str), ("type", _str), ("format", _str), ("shape", _str), ("dtype", _str),
    ("size", _i64), ("node", _str), ("load_to_sbuf_avg_size_bytes", _i64), ("load_to_sbuf_total_size_bytes", _i64),
    ("load_to_sbuf_dma_count", _i64), ("load_to_sbuf_repeat_factor", _f64), ("first_load_queue", _str),
    ("first_load_pc", _i32),
])

# What the compiler knows about each instruction of a graph (compiler/records.instruction_info, from the
# NEFF's schedule), once per graph and partition: the Instruction view joins it to the per-execution rows
# by (graph, queue, pc, pcore), so no execution's rows grow.
INSTRUCTION_INFO = pa.schema([
    ("graph_id", _i64), ("partition", _i32), ("queue", _str), ("pc", _i32), ("pcore", _i32), ("seq", _i32),
    ("operands", _str), ("instruction_type", _str), ("activation_fn", _str), ("psum_read_bytes", _i64),
    ("psum_write_bytes", _i64), ("psum_read_sbuf_write_bytes", _i64), ("tensor_elements", _i64),
    ("performance_mode", _str), ("spill_save_bytes", _i64), ("spill_reload_bytes", _i64), ("channels", _i32),
])

#: the columns the recorder adds to each record table (the NEFF stores the rest)
RECORD_CONTEXT = {"SbufAllocation": ("exec_id", "core", "graph_id", "op_id"), "Flow": ("graph_id", "partition"),
                  "SemaphoreUpdate": ("exec_id", "core"), "TensorInfo": ("graph_id", "partition")}

TABLES: dict[str, pa.Schema] = {
    "metadata": METADATA, "runs": RUNS, "sources": SOURCES, "source_files": SOURCE_FILES,
    "graphs": GRAPHS, "ops": OPS, "executions": EXECUTIONS, "instructions": INSTRUCTIONS,
    "events": EVENTS, "memory": MEMORY, "serving_requests": SERVING_REQUESTS, "serving_steps": SERVING_STEPS,
    "system_events": SYSTEM_EVENTS, "cpu_usage": CPU_USAGE, "host_memory": HOST_MEMORY,
    "SbufAllocation": SBUF_ALLOCATION, "Flow": FLOW, "SemaphoreUpdate": SEMAPHORE_UPDATE, "TensorInfo": TENSOR_INFO,
    "instruction_info": INSTRUCTION_INFO,
}
"""Every raw table, in the order a finalised profile lists them."""

EVENT_KINDS = ("compile", "recompile", "cache_hit", "cpu_fallback", "host_transfer", "load",
               "oom", "error", "collective", "warning", "dispatch")
"""Values of ``events.kind``. ``detail`` is a JSON object whose keys depend on the kind."""
