"""Kernel runs as trace-store rows: each kernel source line is an op, each instruction a row with its
``nki_source_location`` (reference §1.11), so the Explorer's Source page and timeline link kernel
lines and instructions both ways, as they link model lines and ops.

Rows go through a ``traces.Writer`` (``nki.profile``) or through the runtime's recorder when the
process runs under ``neuron-explorer inspect`` (``NEURON_RT_INSPECT_ENABLE=1``).

>>> import numpy as np, tempfile, traces
>>> import neuron_stack.nki as nki, neuron_stack.nki.language as nl
>>> @nki.jit
... def neg(a):
...     out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
...     nl.store(out, value=nl.negative(nl.load(a)))
...     return out
>>> d = tempfile.mkdtemp()
>>> w = traces.Writer(d, run={"run_id": "r1"}, metadata={"target": "trn1"})
>>> graph_id = record(w.append, "r1", nki.run_kernel(neg, (np.ones((4, 4), np.float32),)))
>>> w.close()
>>> with traces.open(traces.finalize(d)) as prof:
...     prof.sql("SELECT count(*) > 0 AS ok FROM instructions JOIN executions USING (exec_id) "
...              "WHERE graph_id = ? AND nki_source_location LIKE '%:%'", [graph_id]).to_pylist()
[{'ok': True}]
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .kernel import KernelRun

#: how kernel instructions are timed: each one by the engine cost model, scheduled on its engine queue
TIMING_MODEL = "instruction"

MAX_SOURCE_BYTES = 2 * 2**20     # a kernel file larger than this is not embedded in the profile

_ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync", "dma", "cc")


def _read_source(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_SOURCE_BYTES:
        return None
    return data.decode("utf-8", errors="replace")


def describe(append, run_id: str, run: KernelRun, graph_id: int, seen: set | None = None,
             files_seen: set | None = None) -> dict[str, int]:
    """Write the kernel's sources, source file, graph and ops (one per kernel line); returns the
    op id of each ``file.py:line``."""
    from neuron_stack.compiler.records import instruction_info  # as a model's graph (runtime/recorder.py)
    from traces.ids import new_id, stable_id

    seen = seen if seen is not None else set()
    files_seen = files_seen if files_seen is not None else set()
    tr, sched = run.trace, run.schedule
    lines = sorted({i.node for i in tr.instrs}, key=lambda k: (k.rsplit(":", 1)[0], int(k.rsplit(":", 1)[1])
                                                                 if k.rsplit(":", 1)[-1].isdigit() else 0))
    rows = {"source_id": [], "file": [], "line": [], "function": [], "code": []}
    files = {}
    for key in lines:
        path, line, fn, code = tr.sources.get(key, (key, 0, "", ""))
        sid = stable_id(path, line)
        if sid not in seen:
            seen.add(sid)
            for c, v in zip(rows, (sid, path, line, fn, code)):
                rows[c].append(v)
        if path not in files and path not in files_seen:
            files_seen.add(path)
            text = _read_source(path)
            if text is not None:
                files[path] = text
    if rows["source_id"]:
        append("sources", rows)
    if files:
        append("source_files", {"file": list(files), "text": list(files.values()),
                                "sha1": [hashlib.sha1(t.encode()).hexdigest() for t in files.values()]})
    sig = ", ".join(f"{tuple(m['shape'])} {m['dtype']}" for m in tr.hbm.values() if m["role"] == "input")
    ops_col = sched.table.column("operands").to_pylist()
    digest = hashlib.sha1("".join(ops_col).encode()).hexdigest()[:16]
    append("graphs", {
        "graph_id": [graph_id], "run_id": [run_id], "name": [run.name], "kind": ["nki"], "neff_hash": [digest],
        "input_signature": [sig], "compile_wall_ns": [run.trace_wall_ns], "compile_ns": [run.trace_wall_ns],
        "cache_hit": [False], "recompile_of": [None], "recompile_reason": [""],
        "source_id": [None], "target": [tr.p.name], "flags": [json.dumps({"nki": True, "grid": list(tr.grid)})],
        "num_ops": [len(lines)], "num_device_ops": [len(lines)], "num_instructions": [len(tr.instrs)]})
    info = instruction_info(sched.table, tr.p)
    if info.num_rows:   # operands with the loop variables (KernelIterationVariables), PSUM traffic, ...
        n = info.num_rows
        append("instruction_info", info.add_column(0, "partition", pa.array(np.zeros(n, np.int32)))
               .add_column(0, "graph_id", pa.array(np.full(n, graph_id, dtype=np.int64))))
    op_ids = {key: new_id() for key in lines}
    per = {k: {"flops": 0, "bytes": 0, "ops": []} for k in lines}
    for ins in tr.instrs:
        d = per[ins.node]
        d["flops"] += ins.flops
        d["bytes"] += ins.bytes_read + ins.bytes_written
        if ins.opcode not in d["ops"]:
            d["ops"].append(ins.opcode)
    append("ops", {
        "op_id": [op_ids[k] for k in lines], "graph_id": [graph_id] * len(lines), "name": lines,
        "aten_op": ["nki." + "+".join(per[k]["ops"]) for k in lines], "op_class": ["nki"] * len(lines),
        "placement": ["device"] * len(lines), "fallback_reason": [""] * len(lines), "fused_into": [""] * len(lines),
        "module_path": [run.name] * len(lines),
        "source_id": [stable_id(*tr.sources.get(k, (k, 0))[:2]) for k in lines],
        "shape": [""] * len(lines), "dtype": [""] * len(lines),
        "flops": [per[k]["flops"] for k in lines], "bytes": [per[k]["bytes"] for k in lines]})
    return op_ids


def execution(append, run_id: str, run: KernelRun, graph_id: int, op_ids: dict, core: int, iteration: int,
              proj0: int, wall0: int, wall1: int, instructions: bool = True, warmup: bool | None = None) -> int:
    """Write one execution row and (``instructions``) its instruction rows; returns the exec id.
    ``warmup`` defaults to the runtime's rule: a graph's first execution is its warm-up."""
    from traces.ids import new_id

    s = run.schedule
    exec_id = new_id()
    append("executions", {
        "exec_id": [exec_id], "run_id": [run_id], "graph_id": [graph_id], "core": [core], "iteration": [iteration],
        "wall_start_ns": [wall0], "wall_end_ns": [wall1], "start_ns": [proj0], "end_ns": [proj0 + s.device_ns],
        "device_ns": [s.device_ns], "status": ["completed"],
        "warmup": [iteration == 0 if warmup is None else warmup], "flops": [s.flops],
        **{f"{e}_busy_ns": [int(s.busy_ns.get(e, 0))] for e in _ENGINES},
        "cpu_fallback_ns": [0], "hbm_read_bytes": [s.hbm_read_bytes], "hbm_write_bytes": [s.hbm_write_bytes]})
    if instructions:
        t = s.table
        names = list(op_ids)
        idx = pc.index_in(t.column("node"), value_set=pa.array(names, pa.string()))
        n = t.num_rows
        cols = {k: t.column(k) for k in ("engine", "queue", "opcode", "pc", "dur_ns", "flops", "bytes_read",
                                         "bytes_written", "sem_wait_ns", "hbm_read_bytes", "hbm_write_bytes")}
        cols["op_id"] = pc.take(pa.array([op_ids[k] for k in names], pa.int64()), idx)
        cols["start_ns"] = pc.add(t.column("rel_start_ns"), pa.scalar(proj0, pa.int64()))
        cols["exec_id"] = pa.array(np.full(n, exec_id, dtype=np.int64))
        cols["core"] = pa.array(np.full(n, core, dtype=np.int32))
        cols["nki_source_location"] = t.column("node")
        append("instructions", pa.table(cols))
        _allocations(append, s.records.get("SbufAllocation"), exec_id, graph_id, op_ids, core, proj0)
    return exec_id


def _allocations(append, t, exec_id: int, graph_id: int, op_ids: dict, core: int, proj0: int) -> None:
    """The kernel's SBUF/PSUM tiles (where the allocator placed them, first to last use) as the
    execution's SbufAllocation rows, stamped on its clock as a model's are (runtime/recorder.py)."""
    if t is None or t.num_rows == 0:
        return
    n = t.num_rows
    for c in ("start_ts", "end_ts"):
        t = t.set_column(t.schema.get_field_index(c), c, pc.add(t.column(c), pa.scalar(proj0, pa.int64())))
    append("SbufAllocation", t.append_column("exec_id", pa.array(np.full(n, exec_id, dtype=np.int64)))
           .append_column("core", pa.array(np.full(n, core, dtype=np.int32)))
           .append_column("graph_id", pa.array(np.full(n, graph_id, dtype=np.int64)))
           .append_column("op_id", pa.array([op_ids.get(x) for x in t.column("node").to_pylist()], pa.int64())))


def record(append, run_id: str, run: KernelRun, core: int = 0, executions: int = 1, proj0: int | None = None,
           seen: set | None = None) -> int:
    """Describe ``run`` and record ``executions`` back-to-back executions of it, all but the last
    marked warm-up (``nki.profile(profile_nth=N)`` profiles the N-th); returns the graph id.

    Example: ``record(writer.append, writer.run_id, nki.run_kernel(kernel, (a, b)))``.
    """
    import time

    from traces.ids import new_id
    graph_id = new_id()
    op_ids = describe(append, run_id, run, graph_id, seen)
    t = time.time_ns() if proj0 is None else proj0
    for it in range(executions):
        execution(append, run_id, run, graph_id, op_ids, core, it, t, t, t + run.device_ns,
                  warmup=it < executions - 1)
        t += run.device_ns
    return graph_id


def record_if_inspecting(run: KernelRun, real_ns: int) -> None:
    """Under ``NEURON_RT_INSPECT_ENABLE=1`` (``neuron-explorer inspect``): record this call into the
    process's runtime session, on its core and projected clock, like a model execution."""
    if os.environ.get("NEURON_RT_INSPECT_ENABLE", "0").strip().lower() in ("", "0", "false", "no", "off"):
        return
    from neuron_stack.device import clock
    from neuron_stack.runtime.session import Session

    session = Session.get(run.trace.p.name)
    rec = session.recorder
    if rec is None or rec.device_profile == "off":   # NEURON_RT_INSPECT_DEVICE_PROFILE=0: no device rows
        return
    wall1 = clock.wall_ns()
    wall0 = wall1 - real_ns
    proj0 = wall0 + clock.offset_ns()
    clock.advance(real_ns, run.device_ns)
    with session.record_lock:
        if session.recorder is not rec:
            return
        from traces.ids import new_id
        # one graph per kernel and instruction stream in this recording; later calls are its executions
        graphs = rec.__dict__.setdefault("nki_graphs", {})
        key = (run.name, hashlib.sha1("".join(run.schedule.table.column("operands").to_pylist()).encode()).digest())
        if key not in graphs:
            graph_id = new_id()
            rec.note_graph_settings(timing_model=TIMING_MODEL)
            graphs[key] = [graph_id, describe(rec.append, session.run_id, run, graph_id, rec.sources_seen,
                                              rec.files_seen), 0]
        graph_id, op_ids, it = graphs[key]
        graphs[key][2] += 1
        core = session.cores[0]
        want = rec.device_rows_for(graph_id, core)
        execution(rec.append, session.run_id, run, graph_id, op_ids, core, it, proj0, wall0, wall1, want)
