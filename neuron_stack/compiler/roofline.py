"""Roofline device timing: one instruction row per device op, timed from the device profile.

This is the timing model used when the instruction-level scheduler (``neuron_stack.compiler.schedule``) is
not available; a profile made with it says ``timing_model = roofline`` in its metadata. Each
unfused op runs on the engine of its op class for ``max(compute, memory)``: compute from the
engine formulas of reference §5.4 (TensorE peak for matmuls, ``max(64, N/lanes)`` cycles on the
Vector/Scalar engines, ``150 + N`` on GpSimd), memory from its bytes over the core's HBM share.
Ops run back to back (no overlap) and fused ops add their engine time beside their host op.

>>> from neuron_stack.device.profiles import get_profile
>>> from neuron_stack.ir import Node, Program, TensorSpec
>>> t = TensorSpec((128, 128), "float32")
>>> n = Node("mm", "aten.mm.default", op_class="matmul", partition=0, flops=2 * 128**3, bytes=3 * 65536,
...          inputs=[t, t], outputs=[t])
>>> s = build_roofline(Program("g", [n], [], []), 0, get_profile("trn1"), {"auto_cast": "none"})
>>> s.table.num_rows, s.device_ns > 0
(1, True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pyarrow as pa

ENGINE_OF = {"matmul": "tensor", "conv": "tensor", "elementwise": "vector", "reduction": "vector",
             "softmax": "vector", "normalization": "vector", "activation": "scalar", "gather": "gpsimd",
             "data_movement": "dma", "collective": "cc"}
OPCODE_OF = {"matmul": "MATMUL", "conv": "MATMUL", "elementwise": "TENSOR_TENSOR", "reduction": "REDUCE",
             "softmax": "ACTIVATE", "normalization": "BN_STATS", "activation": "ACTIVATE",
             "gather": "IOTA", "data_movement": "DMA_COPY", "collective": "CC_ALL_REDUCE"}
QUEUE_OF = {"tensor": "qPE", "vector": "qDVE", "scalar": "qACT", "gpsimd": "qPOOL", "dma": "qSyncIO0",
            "cc": "qCC"}


@dataclass
class Schedule:
    """Same fields as ``neuron_stack.compiler.schedule.Schedule`` (docs/CONTRACTS.md)."""

    table: pa.Table
    busy_ns: dict
    device_ns: int
    hbm_read_bytes: int = 0
    hbm_write_bytes: int = 0
    spill_save_bytes: int = 0
    spill_reload_bytes: int = 0
    flops: int = 0
    tensor_flops: int = 0
    transpose_flops: int = 0
    records: dict = field(default_factory=dict)   # the roofline knows no allocations or dependencies


def _compute_ns(n, profile, flags) -> float:
    out = n.outputs[0].numel if n.outputs else 0
    cls = n.op_class
    if cls in ("matmul", "conv"):
        cast = flags.get("auto_cast", "none") != "none"
        dtype = "bfloat16" if cast or (n.inputs and n.inputs[-1].dtype in ("bfloat16", "float16")) else "float32"
        return n.flops / (profile.lnc * profile.tensor_peak_flops(dtype)) * 1e9   # every PE array of the core
    if cls == "activation":
        return max(profile.min_ii_cycles, math.ceil(out / profile.scalar_lanes)) / profile.scalar_clock_ghz
    if cls in ("elementwise", "reduction", "softmax", "normalization"):
        n_in = max((s.numel for s in n.inputs), default=out)
        passes = {"softmax": 3, "normalization": 3}.get(cls, 2 if len(n.inputs) > 1 else 1)
        return passes * max(profile.min_ii_cycles, math.ceil(n_in / profile.vector_lanes)) / profile.vector_clock_ghz
    if cls == "gather":
        return (profile.gpsimd_start_cycles + math.ceil(out / 8)) / profile.gpsimd_clock_ghz
    if cls == "data_movement":
        return profile.dma_fixed_ns + n.bytes / (profile.lnc * profile.dma_bytes_per_ns)
    return 0.0


def build_roofline(program, partition: int, profile, flags: dict) -> Schedule:
    """Time the device ops of ``partition`` with the roofline model. Example in the module docstring."""
    cols = {k: [] for k in ("engine", "queue", "opcode", "node", "pc", "rel_start_ns", "dur_ns", "flops",
                            "bytes_read", "bytes_written", "sem_wait_ns", "hbm_read_bytes", "hbm_write_bytes")}
    busy: dict[str, int] = {}
    t = 0
    hbm_bw = profile.hbm_bytes_per_ns_per_core
    read = written = total_flops = 0
    fused_by_root: dict[str, list] = {}
    for n in program.nodes:
        if n.partition == partition and n.fused_into:
            fused_by_root.setdefault(n.fused_into, []).append(n)
    for n in program.nodes:
        if n.partition != partition or n.op_class not in ENGINE_OF or n.fused_into or n.placement != "device":
            continue
        out_bytes = sum(max(s.numel, 0) * 4 for s in n.outputs)
        mem_ns = n.bytes / hbm_bw
        dur = max(1, int(max(_compute_ns(n, profile, flags), mem_ns)))
        group = [n] + fused_by_root.get(n.name, [])
        for k, m in enumerate(group):
            engine = ENGINE_OF[m.op_class]
            d = dur if k == 0 else max(1, int(_compute_ns(m, profile, flags)))
            cols["engine"].append(engine)
            cols["queue"].append(QUEUE_OF[engine])
            cols["opcode"].append(OPCODE_OF[m.op_class])
            cols["node"].append(m.name)
            cols["pc"].append(len(cols["pc"]))
            cols["rel_start_ns"].append(t)
            cols["dur_ns"].append(d)
            cols["flops"].append(m.flops)
            cols["bytes_read"].append(n.bytes - out_bytes if k == 0 else 0)
            cols["bytes_written"].append(out_bytes if k == 0 else 0)
            cols["sem_wait_ns"].append(0)
            # an op's traffic is HBM's here (the roofline's memory time): the read and written totals below
            cols["hbm_read_bytes"].append(max(n.bytes - out_bytes, 0) if k == 0 else 0)
            cols["hbm_write_bytes"].append(out_bytes if k == 0 else 0)
            busy[engine] = busy.get(engine, 0) + d
            total_flops += m.flops
        read += max(n.bytes - out_bytes, 0)
        written += out_bytes
        t += dur
    types = {"pc": pa.int32(), "engine": pa.string(), "queue": pa.string(), "opcode": pa.string(),
             "node": pa.string()}
    table = pa.table({k: pa.array(v, type=types.get(k, pa.int64())) for k, v in cols.items()})
    return Schedule(table=table, busy_ns=busy, device_ns=t, hbm_read_bytes=read, hbm_write_bytes=written,
                    flops=total_flops)
