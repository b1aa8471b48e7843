"""The real Neuron Explorer's time-series sample tables over ours: ``HbmUsage`` (per execution),
``SystemProfileHbmUsage`` (the runtime's memory categories), ``CpuUsage`` and ``HostMemUsage`` (host samples),
schema 7.4.0; :mod:`traces.profile_schema` lists them with the others.

>>> [f.name for f in CPU_USAGE.fields][:3]
['timestamp', 'util_percent', 'cpu_id']
"""
from __future__ import annotations

from traces.real_fields import _B, _NO_LNC, _NS, _PCORE, F, Field, Table

HBM_USAGE = Table(
    "HbmUsage", "HBM time-series usage metrics such as throughput over time.",
    "main.executions AS x",
    (
        F("timestamp", "int64", _NS, True, "Timestamp for this measurement.", "x.start_ns",
          "one sample per execution (its HBM traffic over its device time)"),
        F("current_throughput", "float", "bytes_per_second", True, "HBM bytes per second at this time.",
          "(coalesce(x.hbm_read_bytes, 0) + coalesce(x.hbm_write_bytes, 0)) * 1e9 / nullif(x.device_ns, 0)"),
        F("total_transfer_bytes", "int64", _B, True, "HBM bytes transferred since the start (cumulative).",
          "(sum(coalesce(x.hbm_read_bytes, 0) + coalesce(x.hbm_write_bytes, 0)) OVER "
          "(PARTITION BY x.run_id, x.core ORDER BY x.start_ns))::BIGINT"),
        F("pcore_idx", "int64", None, False, _PCORE, "0", _NO_LNC),
    ),
    extra=("x.core AS nc_idx", "x.run_id AS run_id"),
)

# memory.category (the runtime's neuron-monitor categories) → SystemProfileHbmUsage columns
_HBM_CATEGORY = {"weights_bytes": ("constants",), "tensors_bytes": ("tensors", "kv_cache"),
                 "shared_scratchpad_bytes": ("model_shared_scratchpad",), "generic_bytes": ("runtime_memory",),
                 "unknown_bytes": ("model_code",)}
_HBM_COLUMNS = ("total_bytes", "generic_bytes", "tensor_instructions_bytes", "scalar_instructions_bytes",
                "gpsimd_instructions_bytes", "io_bytes", "dram_spill_bytes", "weights_bytes",
                "profiler_buffers_bytes", "scalar_table_bytes", "vector_instructions_bytes",
                "sync_instructions_bytes", "shared_scratchpad_bytes", "tensors_bytes", "ucode_lib_bytes",
                "gpsimd_stdio_bytes", "collectives_bytes", "scratchpad_bytes", "dma_rings_runtime_bytes",
                "dma_rings_spill_bytes", "dma_rings_io_bytes", "dma_rings_collectives_bytes", "unknown_bytes")


def _hbm_field(col: str) -> Field:
    if col == "total_bytes":
        return F(col, "int64", _B, True, "Total HBM bytes used across all usage types.", "sum(m.bytes)::BIGINT")
    cats = _HBM_CATEGORY.get(col)
    label = col.removesuffix("_bytes").replace("_", " ")
    if cats is None:
        return F(col, "int64", _B, True, f"HBM bytes used for {label}.", "0",
                 "the runtime model has no such allocation")
    in_list = ", ".join(f"'{c}'" for c in cats)
    why = "model_code: instruction streams, not split per engine" if col == "unknown_bytes" else \
        "from memory.category " + "+".join(cats)
    return F(col, "int64", _B, True, f"HBM bytes used for {label}.",
             f"coalesce(sum(m.bytes) FILTER (WHERE m.category IN ({in_list})), 0)::BIGINT", why)


SYSTEM_PROFILE_HBM_USAGE = Table(
    "SystemProfileHbmUsage",
    "Neuron Device HBM memory utilization in bytes by usage type, one row per timestamp.",
    "main.memory AS m LEFT JOIN main.runs AS r USING (run_id) WHERE m.location = 'device' "
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
