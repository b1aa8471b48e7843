"""A synthetic but realistic trace, written through the public Writer API.

Used by the trace store's tests, by ``bench/ingest.py`` and to try the tools without running a
model. It mimics what the runtime records for a small transformer block on a trn1 NeuronCore:
a compiled graph with matmul / add / gelu / softmax ops (plus one CPU-fallback op and one
recompile), a static per-instruction schedule with every engine and several DMA queues running
concurrently, stamped once per execution, warm-up executions first. Every value is generated
from a seeded random generator, so a test can recompute the expected answers from the tables.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> ids = write_run(d, executions=2, instructions=500)
>>> sorted(ids)
['exec_ids', 'graph_ids', 'op_ids', 'run_id', 'source_ids']
"""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa

from traces.ids import new_id, stable_id
from traces.vocab import DEVICE_ENGINES
from traces.writer import Writer

#: Device metadata as a trn1 profile publishes it (the runtime takes it from neuron_stack.device).
TRN1_METADATA = {
    "target": "trn1", "instance_type": "trn1.32xlarge", "is_simulation": "true", "device_profile": "trn1",
    "neuroncore_version": "v2", "tensor_engine_peak_bf16_flops": str(int(128 * 128 * 2 * 2.8e9)),
    "neuroncore_clock_freq": "1.4", "tensor_engine_clock_freq": "2.8", "hbm_bytes_per_core": str(16 << 30),
    "timing_model": "instruction", "auto_cast": "matmult", "warmup_executions": "1", "stack_version": "0.1.0",
}

MODEL_FILE = "/synthetic/model.py"
MODEL_TEXT = """import torch


class Block(torch.nn.Module):
    def forward(self, x):
        h = self.proj(x)
        h = h + self.bias
        h = torch.nn.functional.gelu(h)
        p = torch.softmax(h, dim=-1)
        idx = torch.nonzero(p > 0.5)
        return p, idx
"""
#: (aten op, op class, source line, engines with the opcodes it lowers to and their share of rows)
OPS = (
    ("aten.mm.default", "matmul", 6, (("tensor", "MATMUL", 0.22), ("tensor", "LDWEIGHTS", 0.08),
                                      ("dma", "DMA_LOAD", 0.18))),
    ("aten.add.Tensor", "elementwise", 7, (("vector", "TENSOR_TENSOR", 0.14), ("dma", "DMA_LOAD", 0.04))),
    ("aten.gelu.default", "activation", 8, (("scalar", "ACTIVATE", 0.12),)),
    ("aten._softmax.default", "reduction", 9, (("vector", "REDUCE", 0.07), ("scalar", "ACTIVATE", 0.05),
                                               ("gpsimd", "IOTA", 0.02), ("sync", "EVENT_SEMAPHORE", 0.03),
                                               ("dma", "DMA_STORE", 0.05))),
)
FALLBACK_OP = ("aten.nonzero.default", "indexing", 10)
DMA_QUEUES = np.array(["qSyncIO0", "qSyncIO1", "qScalarDynamicHW0", "qGpSimdPIO0"])
_BASE_DUR = {"tensor": 420, "vector": 260, "scalar": 240, "gpsimd": 300, "sync": 60, "dma": 1500}


def schedule(op_ids: list[int], instructions: int, seed: int = 0) -> pa.Table:
    """A static schedule like the compiler emits: ``rel_start_ns`` from the partition start.

    Each engine runs its instructions in order; DMA has four queues running concurrently.
    Vectorised (no per-row Python), so a million-row schedule takes a fraction of a second.
    Example: ``schedule([11, 12, 13, 14], 10_000).num_rows == 10_000``.
    """
    rng = np.random.default_rng(seed)
    kinds = [(op_ids[i], eng, opc, share) for i, (_, _, _, parts) in enumerate(OPS) for eng, opc, share in parts]
    shares = np.array([k[3] for k in kinds])
    pick = rng.choice(len(kinds), size=instructions, p=shares / shares.sum())
    engine = np.array([k[1] for k in kinds])[pick]
    opcode = np.array([k[2] for k in kinds])[pick]
    op_id = np.array([k[0] for k in kinds], dtype=np.int64)[pick]
    base = np.vectorize(_BASE_DUR.get)(engine)
    dur = (base * rng.uniform(0.5, 1.5, instructions)).astype(np.int64)
    queue = engine.astype(object)
    is_dma = engine == "dma"
    queue[is_dma] = DMA_QUEUES[rng.integers(0, len(DMA_QUEUES), int(is_dma.sum()))]
    queue = queue.astype(str)
    gap = rng.integers(0, 120, instructions)  # semaphore waits between dependent instructions
    rel = np.zeros(instructions, dtype=np.int64)
    for lane in np.unique(queue):  # a handful of lanes: each is one in-order stream
        idx = np.flatnonzero(queue == lane)
        step = dur[idx] + gap[idx]
        rel[idx] = np.concatenate(([0], np.cumsum(step)[:-1]))
    is_mm = opcode == "MATMUL"
    flops = np.where(is_mm, 2 * 128 * 128 * rng.integers(128, 513, instructions), 0)
    nbytes = np.where(is_dma, rng.integers(4096, 262144, instructions), rng.integers(512, 65536, instructions))
    return pa.table({
        "engine": engine, "queue": queue, "opcode": opcode, "op_id": op_id,
        "pc": np.arange(instructions, dtype=np.int32), "rel_start_ns": rel, "dur_ns": dur,
        "flops": flops.astype(np.int64), "bytes_read": nbytes.astype(np.int64),
        "bytes_written": np.where(is_dma | (engine == "vector"), nbytes, nbytes // 4).astype(np.int64),
        "sem_wait_ns": gap.astype(np.int64),
        # what write_run's executions count as HBM traffic: the DMAs' reads and the stores' writes
        "hbm_read_bytes": np.where(is_dma, nbytes, 0).astype(np.int64),
        "hbm_write_bytes": np.where(opcode == "DMA_STORE", nbytes, 0).astype(np.int64),
    })


def write_run(out_dir: str | os.PathLike, *, executions: int = 4, instructions: int = 2000, cores=(0,),
              warmup: int = 1, seed: int = 0, run_id: str | None = None, tag: str = "synthetic",
              start_ns: int = 1_750_000_000_000_000_000, close: bool = True, writer: Writer | None = None) -> dict:
    """Record one synthetic run into ``out_dir`` with the Writer; return the ids it used.

    ``executions`` per core, the first ``warmup`` of them marked warm-up; ``instructions`` rows
    per execution. Example: ``write_run("out", executions=3, cores=(0, 1))``.
    """
    run_id = run_id or f"synthetic-{seed}-{os.getpid()}"
    w = writer or Writer(out_dir, run={"run_id": run_id, "tag": tag, "target": "trn1", "start_ns": start_ns,
                                       "command": "python model.py"}, metadata=TRN1_METADATA)
    source_ids = {line: stable_id(MODEL_FILE, line) for line in (6, 7, 8, 9, 10)}
    code = MODEL_TEXT.splitlines()
    w.append("source_files", {"file": [MODEL_FILE], "sha1": ["synthetic"], "text": [MODEL_TEXT]})
    w.append("sources", {"source_id": list(source_ids.values()), "file": MODEL_FILE,
                         "line": list(source_ids), "function": "forward",
                         "code": [code[line - 1].strip() for line in source_ids]})
    graph_id, recompiled_id = new_id(), new_id()
    sig = json.dumps({"x": [8, 128]})
    w.append("graphs", {
        "graph_id": [graph_id, recompiled_id], "run_id": run_id, "name": ["Block.forward", "Block.forward"],
        "kind": "inference", "neff_hash": ["a1b2c3", "d4e5f6"],
        "input_signature": [sig, json.dumps({"x": [8, 136]})], "compile_wall_ns": [2_100_000_000, 1_900_000_000],
        "compile_ns": [start_ns, start_ns + 40_000_000], "cache_hit": [False, False],
        "recompile_of": [None, graph_id], "recompile_reason": [None, "tensor 'x' dim 1: 128 -> 136"],
        "source_id": source_ids[6], "target": "trn1", "flags": "--auto-cast matmult",
        "num_ops": len(OPS) + 1, "num_device_ops": len(OPS), "num_instructions": instructions})
    op_ids = [new_id() for _ in OPS]
    fallback_op = new_id()
    w.append("ops", {
        "op_id": op_ids + [fallback_op], "graph_id": graph_id,
        "name": [f"{o[0].split('.')[1]}_{i}" for i, o in enumerate(OPS)] + ["nonzero"],
        "aten_op": [o[0] for o in OPS] + [FALLBACK_OP[0]], "op_class": [o[1] for o in OPS] + [FALLBACK_OP[1]],
        "placement": ["device"] * len(OPS) + ["cpu_fallback"],
        "fallback_reason": [None] * len(OPS) + ["data-dependent output shape (no device lowering)"],
        "module_path": ["block.proj", "block", "block", "block", "block"],
        "source_id": [source_ids[o[2]] for o in OPS] + [source_ids[FALLBACK_OP[2]]],
        "shape": "[8, 128]", "dtype": "float32", "flops": [2 * 8 * 128 * 128, 1024, 1024, 3072, 0], "bytes": 4096})
    sched = schedule(op_ids, instructions, seed)
    device_ns = int((sched["rel_start_ns"].to_numpy() + sched["dur_ns"].to_numpy()).max())
    engines = sched["engine"].to_numpy(zero_copy_only=False)
    durs = sched["dur_ns"].to_numpy()
    busy = {e: int(durs[engines == e].sum()) for e in DEVICE_ENGINES}
    flops = int(sched["flops"].to_numpy().sum())
    # the same for every execution: computed once (per execution it was most of the bench's writer time)
    hbm_read = int(sched["hbm_read_bytes"].to_numpy().sum())
    hbm_write = int(sched["hbm_write_bytes"].to_numpy().sum())
    cpu_ns = 35_000
    exec_ids = []
    for core in cores:
        t = start_ns + 50_000_000
        for i in range(executions):
            eid = new_id()
            exec_ids.append(eid)
            begin, dev_end = t + 20_000, t + 20_000 + device_ns
            w.append("instructions", sched.drop_columns(["rel_start_ns"]), exec_id=eid, core=core,
                     start_ns=sched["rel_start_ns"].to_numpy() + begin)
            w.append("executions", {
                "exec_id": [eid], "run_id": run_id, "graph_id": graph_id, "core": core, "iteration": i,
                "wall_start_ns": t, "wall_end_ns": dev_end + cpu_ns + 40_000, "start_ns": t,
                "end_ns": dev_end + cpu_ns, "device_ns": device_ns, "status": "completed", "warmup": i < warmup,
                "flops": flops, **{f"{e}_busy_ns": b for e, b in busy.items()},
                "cpu_fallback_ns": cpu_ns,
                "hbm_read_bytes": hbm_read, "hbm_write_bytes": hbm_write})
            w.append("events", {"ts_ns": [dev_end], "wall_ns": dev_end, "dur_ns": cpu_ns, "run_id": run_id,
                                "kind": "cpu_fallback", "core": core, "graph_id": graph_id, "op_id": fallback_op,
                                "source_id": source_ids[10],
                                "detail": json.dumps({"op": FALLBACK_OP[0], "reason": "data-dependent output shape"})})
            w.append("memory", {"ts_ns": [t], "run_id": run_id, "core": core, "location": "device",
                                "category": "tensors", "bytes": 1 << 20})
            t = dev_end + cpu_ns + 60_000
    w.append("events", {"ts_ns": [start_ns, start_ns + 40_000_000], "run_id": run_id,
                        "kind": ["compile", "recompile"], "graph_id": [graph_id, recompiled_id],
                        "source_id": source_ids[6],
                        "detail": [json.dumps({"cache_hit": False}),
                                   json.dumps({"reason": "tensor 'x' dim 1: 128 -> 136"})]})
    if close and writer is None:
        w.close(status="ok", end_ns=t)
    return {"run_id": run_id, "graph_ids": [graph_id, recompiled_id], "op_ids": op_ids + [fallback_op],
            "exec_ids": exec_ids, "source_ids": source_ids}


#: What one synthetic execution's system events are, as an eager torch.profiler(with_stack=True)
#: window records them: (source, name, start offset ns, duration ns, on a core). The ATen op encloses
#: its Python frames and the runtime's calls, which enclose the device execution.
SYSTEM_STEP = (
    ("framework", "aten::linear", 0, 15_000, False),
    *(("framework", f"model.py({20 + k}): forward", 200 + k * 900, 800, False) for k in range(12)),
    *(("framework", "torch/nn/modules/module.py(1751): _call_impl", 250 + k * 900, 300, False) for k in range(4)),
    ("neuron_rt", "nrt_tensor_write", 1_000, 700, True),
    ("neuron_rt", "nrt_execute", 2_000, 11_000, True),
    ("neuron_hw", "nc_exec_running", 3_000, 9_000, True),
)
#: Time between synthetic executions, and executions per ProfilerStep span.
SYSTEM_PERIOD_NS, SYSTEM_STEP_EXECUTIONS = 20_000, 100


def write_system(out_dir: str | os.PathLike, events: int = 1_000_000, *, host: str = "i-synthetic", pid: int = 4242,
                 start_ns: int = 1_750_000_000_000_000_000, chunk: int = 200_000) -> int:
    """Record a synthetic system profile of about ``events`` events into ``out_dir`` with the Writer and
    return how many it wrote: per execution (every ``SYSTEM_PERIOD_NS``) the framework, runtime and
    device events of :data:`SYSTEM_STEP` on core 0, plus a ``ProfilerStep#i`` span per
    ``SYSTEM_STEP_EXECUTIONS`` executions. Example: ``write_system("out", events=10_000)``.
    """
    per = len(SYSTEM_STEP)
    executions = max(1, events // per)
    source, name, offset, dur, on_core = (np.array(c) for c in zip(*SYSTEM_STEP))
    tid = np.full(len(source), pid)   # the runtime is called on the framework's thread (the Dependency Chain)
    written = 0
    with Writer(out_dir, run={"run_id": f"system-{pid}", "host": host, "pid": pid, "start_ns": start_ns}) as w:
        for lo in range(0, executions, chunk // per):
            ex = np.arange(lo, min(executions, lo + chunk // per))
            t = start_ns + ex * SYSTEM_PERIOD_NS
            w.append("system_events", {
                "ts_ns": (t[:, None] + offset).ravel(), "dur_ns": np.tile(dur, len(ex)),
                "name": np.tile(name, len(ex)), "source": np.tile(source, len(ex)),
                "thread_id": np.tile(tid, len(ex)),
                "core": pa.array(np.zeros(len(ex) * per, np.int32), mask=np.tile(~on_core, len(ex))),
                "exec_id": pa.array(np.repeat(ex, per), pa.int64(), mask=np.tile(~on_core, len(ex)))},
                run_id=w.run_id)
            steps = ex[ex % SYSTEM_STEP_EXECUTIONS == 0]
            w.append("system_events", {"ts_ns": start_ns + steps * SYSTEM_PERIOD_NS - 100,
                                       "dur_ns": SYSTEM_STEP_EXECUTIONS * SYSTEM_PERIOD_NS - 100,
                                       "name": [f"ProfilerStep#{s // SYSTEM_STEP_EXECUTIONS}" for s in steps],
                                       "source": "framework", "thread_id": pid}, run_id=w.run_id)
            written += len(ex) * per + len(steps)
            w.flush()
    return written
