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
SCHEMA_VERSION = "1.2.0"   # 1.2.0: serving_requests, serving_steps (1.1.0 is nki_source_location)

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
])

EXECUTIONS = pa.schema([
    ("exec_id", _i64), ("run_id", _str), ("graph_id", _i64), ("core", _i32), ("iteration", _i64),
    ("wall_start_ns", _i64), ("wall_end_ns", _i64), ("start_ns", _i64), ("end_ns", _i64),
    ("device_ns", _i64), ("status", _str), ("warmup", _bool), ("flops", _i64),
    ("tensor_busy_ns", _i64), ("vector_busy_ns", _i64), ("scalar_busy_ns", _i64),
    ("gpsimd_busy_ns", _i64), ("sync_busy_ns", _i64), ("dma_busy_ns", _i64), ("cc_busy_ns", _i64),
    ("cpu_fallback_ns", _i64), ("hbm_read_bytes", _i64), ("hbm_write_bytes", _i64),
])

INSTRUCTIONS = pa.schema([
    ("exec_id", _i64), ("core", _i32), ("engine", _str), ("queue", _str), ("opcode", _str),
    ("op_id", _i64), ("pc", _i32), ("start_ns", _i64), ("dur_ns", _i64), ("flops", _i64),
    ("bytes_read", _i64), ("bytes_written", _i64), ("sem_wait_ns", _i64),
    ("nki_source_location", _str),   # 1.1: the NKI kernel line (file.py:line) of a kernel's instruction
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
    ("wall_start_ns", _i64), ("wall_end_ns", _i64),
])

TABLES: dict[str, pa.Schema] = {
    "metadata": METADATA, "runs": RUNS, "sources": SOURCES, "source_files": SOURCE_FILES,
    "graphs": GRAPHS, "ops": OPS, "executions": EXECUTIONS, "instructions": INSTRUCTIONS,
    "events": EVENTS, "memory": MEMORY, "serving_requests": SERVING_REQUESTS, "serving_steps": SERVING_STEPS,
}
"""Every raw table, in the order a finalised profile lists them."""

EVENT_KINDS = ("compile", "recompile", "cache_hit", "cpu_fallback", "host_transfer", "load",
               "oom", "error", "collective", "warning", "dispatch")
"""Values of ``events.kind``. ``detail`` is a JSON object whose keys depend on the kind."""
