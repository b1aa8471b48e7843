"""Device memory by the real Neuron Explorer's HBM usage types (``SystemProfileHbmUsage``), from the runtime's
neuron-monitor categories (``session.MEMORY_CATEGORIES``) and what the NEFF holds.

neuron-monitor reports a loaded model's device memory in a few categories; the profiler's HBM usage splits the same
bytes finer. Here each category is split where the NEFF says how: ``tensors`` into the graph's inputs and outputs
(``io``), the values the compiler's spills save to HBM (``dram_spill``: the NEFF's ``spill_save_bytes``, each
spilled value saved once, at most the tensors that are not IO) and the rest; ``model_code`` (the compiler's
instructions × ``INSTRUCTION_BYTES``, ``compiler/driver.py``) into each engine's instruction stream by its share of
the NEFF's instructions, and the DMA queues' descriptors into the DMA rings of their queue's purpose (``q*Spill*`` →
spill, the other queues → io; collective steps → collectives). The split never invents bytes: each category's
parts add up to it, and what is left is ``unknown``.

>>> import pyarrow as pa
>>> t = pa.table({"engine": ["tensor", "tensor", "dma", "dma"], "queue": ["Tensor", "Tensor", "qSyncIO0",
...                                                                    "qSyncSpillSave0"]})
>>> u = usage_types({"constants": 10, "model_code": 4 * 64, "tensors": 30, "model_shared_scratchpad": 5,
...                  "kv_cache": 0, "runtime_memory": 99, "io_tensors": 12}, [t])
>>> u["tensor_instructions"], u["dma_rings_io"], u["dma_rings_spill"], u["io"], u["tensors"], u["unknown"]
(128, 64, 64, 12, 18, 0)
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

#: The usage types a loaded model's bytes go to (``<type>_bytes`` in SystemProfileHbmUsage); ``generic`` (the
#: runtime's per-core reservation) is the core's, not a model's.
MODEL_USAGE_TYPES = ("weights", "io", "dram_spill", "tensors", "shared_scratchpad", "tensor_instructions",
                     "vector_instructions", "scalar_instructions", "gpsimd_instructions", "sync_instructions",
                     "dma_rings_io", "dma_rings_spill", "dma_rings_collectives", "unknown")
_STREAMS = {e: f"{e}_instructions" for e in ("tensor", "vector", "scalar", "gpsimd", "sync")}


def _ring(engine: str, queue: str) -> str | None:
    """The usage type of one instruction's bytes of ``model_code``."""
    if engine in _STREAMS:
        return _STREAMS[engine]
    if engine == "cc":
        return "dma_rings_collectives"
    if engine == "dma":
        return "dma_rings_spill" if "Spill" in queue else "dma_rings_io"
    return None


def usage_types(memory: dict, schedules: list[pa.Table]) -> dict[str, int]:
    """A loaded model's device bytes by usage type; ``memory`` is its memory plan (categories plus
    ``io_tensors``), ``schedules`` its partitions' instruction tables. The values add up to ``memory``'s
    categories other than ``runtime_memory``. Example in the module docstring."""
    tensors = int(memory.get("tensors", 0)) + int(memory.get("kv_cache", 0))
    io = min(int(memory.get("io_tensors", 0)), int(memory.get("tensors", 0)))
    out = dict.fromkeys(MODEL_USAGE_TYPES, 0)
    out.update(weights=int(memory.get("constants", 0)), io=io, tensors=tensors - io,
               shared_scratchpad=int(memory.get("model_shared_scratchpad", 0)))
    spill = sum(int(pc.sum(t["spill_save_bytes"]).as_py() or 0) for t in schedules
                if "spill_save_bytes" in t.column_names)
    out["dram_spill"] = min(spill, out["tensors"])
    out["tensors"] -= out["dram_spill"]
    code = int(memory.get("model_code", 0))
    counts: dict[str, int] = {}
    for t in schedules:
        if t.num_rows and {"engine", "queue"} <= set(t.column_names):
            pairs = pc.binary_join_element_wise(t["engine"], t["queue"], "\x00")
            for row in pc.value_counts(pairs).to_pylist():
                kind = _ring(*row["values"].split("\x00", 1)) or "unknown"
                counts[kind] = counts.get(kind, 0) + row["counts"]
    total = sum(counts.values())
    if total and code % total == 0:   # the NEFF's bytes per instruction: model_code over its instructions
        for kind, n in counts.items():
            out[kind] += n * (code // total)
    else:                             # a NEFF accounted otherwise: the category stays whole
        out["unknown"] = code
    return out
