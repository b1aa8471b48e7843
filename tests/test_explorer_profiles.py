"""Small but real profiles for the Explorer's tests, written through ``traces.Writer`` + ``traces.finalize``.

``build_tables`` lays out what a runtime records for a two-layer MLP (inference) on ``cores``
NeuronCores: a graph per input shape (the sequence length changes, so later graphs are recompiles
of the first), ops with module paths and source lines, one CPU-fallback op (``aten.nonzero``),
executions, and per-instruction rows on every engine and a DMA queue, scheduled back to back so
that the instruction times sum to the executions' busy columns. ``bench/explorer.py`` uses the
same generator at ten million instructions.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import traces
from traces.ids import stable_id
from traces.schema import TABLES

MODEL_FILE = "/home/user/project/model.py"
MODEL_TEXT = '''import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, d=512, h=2048):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        h = self.fc1(x)
        h = self.act(h)
        y = self.fc2(h)
        keep = torch.nonzero(y > 0)
        return y, keep


def main():
    model = MLP()
    for seq in (57, 64, 100, 128):
        model(torch.randn(4, seq, 512))
'''
# op name, aten op, op class, module path, line, placement, per-instruction plan [(engine, queue, opcode, dur_ns)]
OPS = [
    ("addmm", "aten.addmm.default", "matmul", "fc1", 13, "device",
     [("dma", "qSyncIO0", "DMA_LOAD", 1300), ("tensor", "", "LDWEIGHTS", 90), ("tensor", "", "MATMUL", 460),
      ("sync", "", "EVENT_SEMAPHORE", 40)]),
    ("gelu", "aten.gelu.default", "activation", "act", 14, "device",
     [("scalar", "", "ACTIVATE", 150), ("vector", "", "TENSOR_TENSOR", 120)]),
    ("addmm_1", "aten.addmm.default", "matmul", "fc2", 15, "device",
     [("dma", "qSyncIO0", "DMA_LOAD", 1300), ("tensor", "", "LDWEIGHTS", 90), ("tensor", "", "MATMUL", 460),
      ("gpsimd", "", "IOTA", 170), ("dma", "qSyncSpillReload0", "DMA_SPILL", 900)]),
    ("nonzero", "aten.nonzero.default", "cpu", "", 16, "cpu_fallback", []),
]
SEQS = (57, 64, 100, 128)


def build_tables(iterations: int = 3, cores: int = 2, tiles: int = 2, seqs=SEQS, run_id: str = "run-1",
                 t_start: int = 1_000_000) -> dict[str, pa.Table]:
    """Arrow tables of a complete profile; ``tiles`` repeats each op's instruction plan per execution."""
    sources, ops, graphs, execs, events = [], [], [], [], []
    instr_parts = []
    for i, (_, _, _, _, line, _, _) in enumerate(OPS):
        sources.append({"source_id": stable_id(MODEL_FILE, line), "file": MODEL_FILE, "line": line,
                        "function": "forward", "code": MODEL_TEXT.splitlines()[line - 1]})
    sources.append({"source_id": stable_id(MODEL_FILE, 23), "file": MODEL_FILE, "line": 23,
                    "function": "main", "code": MODEL_TEXT.splitlines()[22]})
    t = t_start
    prev_graph = None
    exec_counter = 0
    for gi, seq in enumerate(seqs):
        graph_id = 1000 + gi
        compile_ns = 2_000_000 + 250_000 * gi
        graphs.append({"graph_id": graph_id, "run_id": run_id, "name": f"mlp_fwd_{gi}", "kind": "forward",
                       "neff_hash": f"{graph_id:040x}", "input_signature": f"x: float32[4, {seq}, 512]",
                       "compile_wall_ns": compile_ns, "compile_ns": compile_ns, "cache_hit": False,
                       "recompile_of": prev_graph,
                       "recompile_reason": (f"tensor 'x' dim 1: {seqs[gi - 1]} -> {seq}" if prev_graph else None),
                       "source_id": stable_id(MODEL_FILE, 23), "target": "trn1", "flags": "--auto-cast none",
                       "num_ops": len(OPS), "num_device_ops": len(OPS) - 1,
                       "num_instructions": tiles * sum(len(p) for *_, p in OPS)})
        events.append({"ts_ns": t, "wall_ns": t, "dur_ns": compile_ns, "run_id": run_id,
                       "kind": "recompile" if prev_graph else "compile", "core": None, "graph_id": graph_id,
                       "op_id": None, "source_id": stable_id(MODEL_FILE, 23),
                       "detail": json.dumps({"reason": graphs[-1]["recompile_reason"] or "first compile"})})
        t += compile_ns
        op_ids = {}
        for name, aten, cls, module, line, placement, plan in OPS:
            op_id = graph_id * 100 + len(op_ids)
            op_ids[name] = op_id
            ops.append({"op_id": op_id, "graph_id": graph_id, "name": name, "aten_op": aten, "op_class": cls,
                        "placement": placement,
                        "fallback_reason": "no device lowering for data-dependent output shape"
                                           if placement != "device" else None,
                        "fused_into": None, "module_path": module, "source_id": stable_id(MODEL_FILE, line),
                        "shape": f"[4, {seq}, 512]", "dtype": "float32",
                        "flops": 2 * 4 * seq * 512 * 2048 if cls == "matmul" else 0,
                        "bytes": 4 * seq * 512 * 4})
        for it in range(iterations):
            for core in range(cores):
                exec_id = 10_000 + exec_counter
                exec_counter += 1
                cursor = t
                busy = {e: 0 for e in ("tensor", "vector", "scalar", "gpsimd", "sync", "dma", "cc")}
                flops = 0
                for name, aten, cls, module, line, placement, plan in OPS:
                    if not plan:
                        continue
                    n = len(plan) * tiles
                    durs = np.array([p[3] for p in plan] * tiles, dtype=np.int64) * (1 + seq // 64)
                    starts = cursor + np.concatenate([[0], np.cumsum(durs)[:-1]])
                    cursor = int(starts[-1] + durs[-1])
                    engines = [p[0] for p in plan] * tiles
                    fl = np.array([2 * 128 * 128 * 512 if p[2] == "MATMUL" else 0 for p in plan] * tiles,
                                  dtype=np.int64)
                    for e, d in zip(engines, durs):
                        busy[e] += int(d)
                    flops += int(fl.sum())
                    instr_parts.append({
                        "exec_id": np.full(n, exec_id, np.int64), "core": np.full(n, core, np.int32),
                        "engine": engines, "queue": [p[1] or None for p in plan] * tiles,
                        "opcode": [p[2] for p in plan] * tiles, "op_id": np.full(n, op_ids[name], np.int64),
                        "pc": np.arange(n, dtype=np.int32), "start_ns": starts.astype(np.int64), "dur_ns": durs,
                        "flops": fl, "bytes_read": np.full(n, 65536, np.int64),
                        "bytes_written": np.full(n, 32768, np.int64), "sem_wait_ns": np.zeros(n, np.int64)})
                execs.append({"exec_id": exec_id, "run_id": run_id, "graph_id": graph_id, "core": core, "iteration": it,
                              "wall_start_ns": t, "wall_end_ns": cursor, "start_ns": t, "end_ns": cursor,
                              "device_ns": cursor - t, "status": "completed", "warmup": it == 0, "flops": flops,
                              **{f"{e}_busy_ns": v for e, v in busy.items()}, "cpu_fallback_ns": 0,
                              "hbm_read_bytes": 65536 * 10 * tiles, "hbm_write_bytes": 32768 * 10 * tiles})
                t = cursor + 500
            # the fallback op runs on the host after each step: a red span on the host lane
            fb = 40_000 + 100 * seq
            events.append({"ts_ns": t, "wall_ns": t, "dur_ns": fb, "run_id": run_id, "kind": "cpu_fallback",
                           "core": 0, "graph_id": graph_id, "op_id": op_ids["nonzero"],
                           "source_id": stable_id(MODEL_FILE, 16),
                           "detail": json.dumps({"op": "aten.nonzero.default", "reason": "data-dependent shape"})})
            t += fb + 1000
        prev_graph = graph_id
    instructions = pa.concat_tables([pa.table({"nki_source_location": [None] * len(p["exec_id"]),
                                               "pcore": [None] * len(p["exec_id"]),
                                               "hbm_read_bytes": [None] * len(p["exec_id"]),
                                               "hbm_write_bytes": [None] * len(p["exec_id"]), **p},
                                              schema=TABLES["instructions"]) for p in instr_parts])
    meta = {"target": "trn1", "device_profile": "trn1", "instance_type": "trn1.32xlarge", "is_simulation": "true",
            "timing_model": "instruction", "auto_cast": "none", "warmup_executions": "1",
            "tensor_engine_peak_bf16_flops": str(int(95e12)), "schema_version": "1.0.0"}
    return {
        "metadata": pa.table({"key": list(meta), "value": list(meta.values())}, schema=TABLES["metadata"]),
        "sources": pa.Table.from_pylist(sources, schema=TABLES["sources"]),
        "source_files": pa.Table.from_pylist([{"file": MODEL_FILE, "sha1": "0" * 40, "text": MODEL_TEXT}],
                                             schema=TABLES["source_files"]),
        "graphs": pa.Table.from_pylist(graphs, schema=TABLES["graphs"]),
        "ops": pa.Table.from_pylist(ops, schema=TABLES["ops"]),
        "executions": pa.Table.from_pylist(execs, schema=TABLES["executions"]),
        "instructions": instructions,
        "events": pa.Table.from_pylist(events, schema=TABLES["events"]),
        "memory": pa.table({"ts_ns": [t_start], "run_id": [run_id], "core": [0], "location": ["device"],
                            "category": ["tensors"], "bytes": [1 << 20]}, schema=TABLES["memory"]),
    }


def write_profile(out_dir: Path, tables: dict[str, pa.Table], run_id: str = "run-1") -> Path:
    """Write the tables with ``traces.Writer`` and finalise; returns the ``profile.duckdb`` path."""
    meta = dict(zip(tables["metadata"]["key"].to_pylist(), tables["metadata"]["value"].to_pylist()))
    start = min(tables["executions"]["start_ns"].to_pylist() or [0])
    w = traces.Writer(out_dir, run={"run_id": run_id, "pid": 1234, "tag": "mlp", "command": "python model.py",
                                    "host": "test", "target": "trn1", "rank": 0, "node": 0,
                                    "wall_start_ns": start, "start_ns": start}, metadata=meta)
    for name, table in tables.items():
        if name != "metadata":
            w.append(name, table)
    w.close(status="ok")
    return traces.finalize(out_dir)


def make_profile(out_dir: Path, **kw) -> Path:
    """``build_tables(**kw)`` written to ``out_dir/profile.duckdb``."""
    return write_profile(Path(out_dir), build_tables(**kw))


def make_compile_first_profile(out_dir: Path, executions: bool = True) -> Path:
    """One graph whose compile takes 2 s before three short executions on two cores, as
    sample_workloads/tensor_parallel.py records: the device work is a sliver of the session.
    ``executions=False`` keeps only the host events (a session that never ran on the device)."""
    tables = build_tables(seqs=(64,), iterations=3)
    events = tables["events"].to_pylist()
    comp = next(e for e in events if e["kind"] == "compile")
    for k in ("ts_ns", "wall_ns"):
        comp[k] -= 2_000_000_000
    comp["dur_ns"] += 2_000_000_000
    tables["events"] = pa.Table.from_pylist(events, schema=TABLES["events"])
    if not executions:
        tables["executions"] = tables["executions"].slice(0, 0)
        tables["instructions"] = tables["instructions"].slice(0, 0)
    return write_profile(Path(out_dir), tables)


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    return make_profile(tmp_path_factory.mktemp("session") / "20260101-000000_mlp")


def test_profile_builder_round_trips_through_the_trace_store(profile):
    with traces.open(profile) as p:
        n = p.sql("SELECT count(*) AS n FROM instructions").column(0)[0].as_py()
        fb = p.sql("SELECT count(*) FROM ops WHERE placement = 'cpu_fallback'").column(0)[0].as_py()
    assert n == 4 * 3 * 2 * 2 * 11   # seqs x iterations x cores x tiles x instructions per plan
    assert fb == 4


def test_view_help_runs_as_typed():
    exe = Path(sys.executable).parent / "neuron-explorer"
    out = subprocess.run([str(exe), "view", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--port" in out.stdout
