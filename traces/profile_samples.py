"""The real Neuron Explorer's time-series sample tables over ours: ``HbmUsage`` (per core over time),
``SystemProfileHbmUsage`` (the runtime's memory categories), ``CpuUsage`` and ``HostMemUsage`` (host samples),
schema 7.4.0; :mod:`traces.profile_schema` lists them with the others.

>>> [f.name for f in CPU_USAGE.fields][:3]
['timestamp', 'util_percent', 'cpu_id']
"""
from __future__ import annotations

from traces.real_fields import _B, _NS, _PCORE, HBM_READ, HBM_WRITE, F, Field, Table

#: HbmUsage's samples per execution at most: its bucket is the smallest power of two of ns (the level-of-detail
#: pyramid's buckets, ``lod_busy``) that cuts the execution's device span into no more than this many.
HBM_USAGE_MAX_SAMPLES = 1000
#: An instruction's HBM bytes, as Instruction.hbm_read_bytes + hbm_write_bytes count them.
HBM_BYTES = f"{HBM_READ} + {HBM_WRITE}"
# Each instruction's b bytes spread evenly over its own [s, e) (at least 1 ns, w = e − s): the bytes before time t
# are ⌊b·(t − s) ÷ w⌋, so a bucket's share is that at its end minus that at its start, and the shares add up to b
# exactly. Written as q·x + ⌊r·x ÷ w⌋ (b = q·w + r, x = t − s): the same integer, and no product exceeds BIGINT.
_BEFORE = "(d.q * ({x}) + (d.r * ({x})) // d.w)"
_X = "least(greatest({t}, d.s), d.e) - d.s"
_HBM_BUCKETS = (
    "(SELECT exec_id, run_id, core, pcore, res, bucket, sum("
    + _BEFORE.format(x=_X.format(t="(bucket + 1) * res")) + " - " + _BEFORE.format(x=_X.format(t="bucket * res"))
    + ")::BIGINT AS bytes FROM ("
    "SELECT d.*, d.b // d.w AS q, d.b % d.w AS r, unnest(range(d.s // d.res, (d.e - 1) // d.res + 1)) AS bucket "
    "FROM (SELECT *, e - s AS w FROM ("
    f"SELECT i.exec_id, x.run_id, i.core, coalesce(i.pcore, 0) AS pcore, i.start_ns AS s, "
    f"i.start_ns + greatest(i.dur_ns, 1) AS e, {HBM_BYTES} AS b, x.res "
    "FROM main.instructions AS i JOIN (SELECT exec_id, run_id, 1::BIGINT << greatest(0, ceil(log2("
    f"greatest(end_ns - start_ns, 1) / {HBM_USAGE_MAX_SAMPLES}.0)))::INTEGER AS res FROM main.executions) AS x "
    f"USING (exec_id) WHERE {HBM_BYTES} > 0)) AS d) AS d GROUP BY ALL) AS h")
HBM_USAGE = Table(
    "HbmUsage", "HBM time-series usage metrics such as throughput over time.",
    _HBM_BUCKETS,
    (
        F("timestamp", "int64", _NS, True, "Timestamp for this measurement.", "h.bucket * h.res",
          f"the start of a bucket of h.res ns: per execution the smallest power of two that gives at most "
          f"{HBM_USAGE_MAX_SAMPLES} buckets over its device time; a bucket without HBM traffic has no row"),
        F("current_throughput", "float", "bytes_per_second", True, "HBM bytes per second at this time.",
          "h.bytes * 1e9 / h.res", "the bucket's HBM bytes over its width: each instruction's HBM bytes "
          "(Instruction.hbm_read_bytes + hbm_write_bytes) spread evenly over its own start..end"),
        F("total_transfer_bytes", "int64", _B, True, "HBM bytes transferred since the start (cumulative).",
          "sum(h.bytes) OVER (PARTITION BY h.run_id, h.core, h.pcore ORDER BY h.bucket * h.res, h.exec_id "
          "ROWS UNBOUNDED PRECEDING)", "to the bucket's end, per core; an execution's buckets add up to its "
          "HBM bytes exactly"),
        F("pcore_idx", "int64", None, True, _PCORE, "h.pcore"),
    ),
    extra=("h.core AS nc_idx", "h.run_id AS run_id", "h.exec_id AS exec_id", "h.res AS bucket_resolution_ns",
           "h.bytes AS bucket_bytes"),
)

#: SystemProfileHbmUsage's columns: the runtime records each as a ``memory`` row of location ``hbm_usage``
#: (``neuron_stack/runtime/hbm_usage.py``) beside the neuron-monitor categories (location ``device``) it splits.
_HBM_COLUMNS = ("total_bytes", "generic_bytes", "tensor_instructions_bytes", "scalar_instructions_bytes",
                "gpsimd_instructions_bytes", "io_bytes", "dram_spill_bytes", "weights_bytes",
                "profiler_buffers_bytes", "scalar_table_bytes", "vector_instructions_bytes",
                "sync_instructions_bytes", "shared_scratchpad_bytes", "tensors_bytes", "ucode_lib_bytes",
                "gpsimd_stdio_bytes", "collectives_bytes", "scratchpad_bytes", "dma_rings_runtime_bytes",
                "dma_rings_spill_bytes", "dma_rings_io_bytes", "dma_rings_collectives_bytes", "unknown_bytes")
_WHERE = {
    "generic_bytes": "the runtime's per-core reservation (neuron-monitor runtime_memory)",
    "weights_bytes": "the loaded models' weights (neuron-monitor constants)",
    "io_bytes": "the graphs' input and output tensors (the part of neuron-monitor tensors that is)",
    "dram_spill_bytes": "the values the compiler's spills save to HBM (the NEFF's spill_save_bytes, each value saved "
                        "once), at most the non-IO part of neuron-monitor tensors",
    "tensors_bytes": "the graphs' other tensors at their peak, and the KV cache (the rest of neuron-monitor tensors)",
    "shared_scratchpad_bytes": "the largest activation, the SBUF spills' staging buffer (model_shared_scratchpad)",
    "unknown_bytes": "model_code the NEFF does not split: none unless its bytes per instruction are not whole",
    "dma_rings_io_bytes": "the DMA descriptors of the IO queues (model_code's share of qSyncIO*/dynamic instructions)",
    "dma_rings_spill_bytes": "the DMA descriptors of the spill queues (model_code's share of q*Spill* instructions)",
    "dma_rings_collectives_bytes": "the collective steps compiled into a graph (model_code's share of cc "
                                   "instructions); a collective run by the runtime has no NEFF",
}
_ZERO = {
    "profiler_buffers_bytes": "the recorder keeps its rows in host memory (the device model has no trace buffer)",
    "scalar_table_bytes": "the Scalar Engine's functions are computed, no lookup tables are loaded",
    "ucode_lib_bytes": "no engine microcode library is loaded",
    "gpsimd_stdio_bytes": "GpSimd programs have no stdio here",
    "collectives_bytes": "collectives move data between the ranks' own tensors: no runtime buffers",
    "scratchpad_bytes": "a graph's private scratch is counted in tensors_bytes (no non-shared scratchpad)",
    "dma_rings_runtime_bytes": "the runtime's own rings are inside its per-core reservation (generic_bytes)",
}
#: neuron-monitor's device memory categories (``memory_used``) → the SystemProfileHbmUsage columns that split them:
#: the same bytes, so a category equals its columns' sum at every sample (tests/test_hbm_usage.py).
MONITOR_CATEGORIES = {
    "constants": ("weights_bytes",), "runtime_memory": ("generic_bytes",),
    "model_shared_scratchpad": ("shared_scratchpad_bytes",),
    ("tensors", "kv_cache"): ("io_bytes", "dram_spill_bytes", "tensors_bytes"),
    "model_code": ("tensor_instructions_bytes", "vector_instructions_bytes", "scalar_instructions_bytes",
                   "gpsimd_instructions_bytes", "sync_instructions_bytes", "dma_rings_io_bytes",
                   "dma_rings_spill_bytes", "dma_rings_collectives_bytes", "unknown_bytes"),
}
#: Before schema 1.7 (no ``hbm_usage`` rows): the neuron-monitor categories that filled each column.
_LEGACY = {"weights_bytes": ("constants",), "tensors_bytes": ("tensors", "kv_cache"),
           "shared_scratchpad_bytes": ("model_shared_scratchpad",), "generic_bytes": ("runtime_memory",),
           "unknown_bytes": ("model_code",)}


def _hbm_field(col: str) -> Field:
    if col == "total_bytes":
        return F(col, "int64", _B, True, "Total HBM bytes used across all usage types.",
                 "sum(m.bytes) FILTER (WHERE m.location = 'device')::BIGINT",
                 "the neuron-monitor categories' sum; the usage types add up to it")
    label = col.removesuffix("_bytes").replace("_", " ")
    if col in _ZERO:
        return F(col, "int64", _B, True, f"HBM bytes used for {label}.", "0", "0: " + _ZERO[col])
    usage = col.removesuffix("_bytes")
    ours = f"coalesce(sum(m.bytes) FILTER (WHERE m.location = 'hbm_usage' AND m.category = '{usage}'), 0)"
    legacy = _LEGACY.get(col)
    if legacy:
        old = ", ".join(f"'{c}'" for c in legacy)
        ours = (f"CASE WHEN count(*) FILTER (WHERE m.location = 'hbm_usage') > 0 THEN {ours} ELSE coalesce(sum("
                f"m.bytes) FILTER (WHERE m.location = 'device' AND m.category IN ({old})), 0) END")
    why = _WHERE.get(col, f"model_code's share of the {label.removesuffix(' instructions')} engine's instructions")
    return F(col, "int64", _B, True, f"HBM bytes used for {label}.", f"({ours})::BIGINT", why)


SYSTEM_PROFILE_HBM_USAGE = Table(
    "SystemProfileHbmUsage",
    "Neuron Device HBM memory utilization in bytes by usage type, one row per timestamp.",
    "main.memory AS m LEFT JOIN main.runs AS r USING (run_id) WHERE m.location IN ('device', 'hbm_usage') "
    "GROUP BY m.ts_ns, m.run_id, m.core, r.host ORDER BY m.ts_ns",
    tuple(_hbm_field(c) for c in _HBM_COLUMNS) + (
        F("timestamp", "int64", _NS, True, "Timestamp for this measurement.", "m.ts_ns"),
        F("device_idx", "int64", None, True, "Neuron device index relative to the instance.", "m.core // 2",
          "two logical cores per device (trn1/inf2)"),
        F("hbm_idx", "int64", None, True, "The HBM index relative to the device.", "m.core % 2"),
        F("instance_id", "string", None, True, "The instance.", "r.host"),
    ),
    extra=("m.core AS nc_idx", "m.run_id AS run_id"),
)

CPU_USAGE = Table(
    "CpuUsage", "Host CPU utilization samples, per CPU core and the average across cores.",
    "main.cpu_usage AS c LEFT JOIN main.runs AS r USING (run_id)",
    (
        F("timestamp", "int64", _NS, True, "Timestamp for this CPU utilization measurement.", "c.ts_ns"),
        F("util_percent", "float", "percent", True, "CPU utilization over the previous period.", "c.util_percent"),
        F("cpu_id", "string", None, True, "CPU core id or 'average'.", "c.cpu_id"),
        F("instance_id", "string", None, True, "The instance.", "r.host"),
        F("ultraserver_id", "int64", None, False, "UltraServer id.", None, "no UltraServer here"),
        F("ultraserver_instance_index", "int64", None, False, "Instance index in the UltraServer.", None,
          "no UltraServer here"),
    ),
)

HOST_MEM_USAGE = Table(
    "HostMemUsage", "Host memory utilization samples, one per instance and timestamp.",
    "main.host_memory AS h LEFT JOIN main.runs AS r USING (run_id)",
    (
        F("timestamp", "int64", _NS, True, "Timestamp for this memory measurement.", "h.ts_ns"),
        F("used_bytes", "int64", _B, True, "Host memory in use.", "h.used_bytes"),
        F("used_percent", "float", "percent", True, "used_bytes / capacity * 100.", "h.used_percent"),
        F("instance_id", "string", None, True, "The instance.", "r.host"),
        F("ultraserver_id", "int64", None, False, "UltraServer id.", None, "no UltraServer here"),
        F("ultraserver_instance_index", "int64", None, False, "Instance index in the UltraServer.", None,
          "no UltraServer here"),
    ),
)
