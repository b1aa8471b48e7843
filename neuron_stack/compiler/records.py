"""What the scheduler knows that the profiler shows: the schedule's record tables, stored in the NEFF
beside the instruction table and finalised into every profile under the real Neuron Explorer's names.

- ``SbufAllocation``: each on-chip allocation of the compiler's allocators (the SBUF tile ring and
  resident heap, PSUM banks) with its address range per partition, partitions, occupancy (first to
  last instruction that touches it), owning op and whether spill traffic moved it;
- ``Flow``: every instruction dependency the lowering recorded, as predecessor -> successor edges
  with the real kinds (``FLOW_DEPENDENCE`` read-after-write, ``ANTI_DEPENDENCE`` write-after-read,
  ``OUTPUT_DEPENDENCE`` write-after-write) and ``gap_time`` (successor start - predecessor end);
- ``SemaphoreUpdate``: the increments a cross-queue dependency makes (the producer signals at
  completion, the consumer's queue waits for the count), one semaphore per (producer, consumer) queue pair;
- ``TensorInfo``: every HBM tensor of the partition with its role, shape, layout and the DMAs that
  load it into SBUF.

Times are relative to the partition start (the runtime stamps them per execution, as instruction rows).

>>> from neuron_stack.ir import Node, Program, TensorSpec
>>> from neuron_stack.device.profiles import get_profile
>>> from neuron_stack.compiler.schedule import build_schedule
>>> t = TensorSpec((128, 512), "float32")
>>> prog = Program("g", [Node("x", "placeholder", outputs=[t]),
...     Node("r", "aten.relu.default", [{"node": "x"}], inputs=[t], outputs=[t], op_class="activation",
...          partition=0)], ["x"], [{"node": "r"}])
>>> rec = build_schedule(prog, 0, get_profile("trn1"), {}).records
>>> sorted(rec), rec["Flow"].column("dependency_type").to_pylist()[:1]
(['Flow', 'SbufAllocation', 'SemaphoreUpdate', 'TensorInfo'], ['FLOW_DEPENDENCE'])
>>> rec["TensorInfo"].to_pylist()[0]["load_to_sbuf_repeat_factor"]
1.0
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from neuron_stack.compiler.lower.tiles import Instr, Lowered, nbytes_of
from traces.schema import RECORD_CONTEXT, TABLES


def _stored(name: str) -> pa.Schema:
    """A record table's columns as the NEFF stores them: the trace schema without the recorder's context."""
    schema = TABLES[name]
    return pa.schema([f for f in schema if f.name not in RECORD_CONTEXT[name]])


ALLOCATION_SCHEMA, FLOW_SCHEMA, SEMAPHORE_SCHEMA, TENSOR_SCHEMA = (
    _stored(n) for n in ("SbufAllocation", "Flow", "SemaphoreUpdate", "TensorInfo"))
"""Each record table's stored columns (traces/schema.py; docs/trace_schema.md explains them)."""

#: ``instruction_info`` as :func:`instruction_info` builds it: the trace schema without the recorder's context.
INSTRUCTION_INFO_SCHEMA = pa.schema([f for f in TABLES["instruction_info"] if f.name not in ("graph_id", "partition")])

#: TensorInfo ``type`` as the real tool spells it, from the lowering's buffer role
_TENSOR_TYPE = {"input": "IN", "output": "OUT", "const": "WEIGHT", "scratch": "SCRATCH"}


def build(low: Lowered, start: np.ndarray, dur: np.ndarray, queue: list[str], pc: np.ndarray) -> dict[str, pa.Table]:
    """The four record tables of a scheduled partition (``{name: table}``); see the module docstring."""
    instrs = low.instrs
    # plain lists: the passes below index them once per operand and dependency
    start, end, pc = start.tolist(), (start + dur).tolist(), pc.tolist()
    keys = [_on_chip(ins) for ins in instrs]
    return {"SbufAllocation": _allocations(low, instrs, keys, start, end, queue, pc),
            **_flows(instrs, keys, start, end, queue, pc),
            "TensorInfo": _tensors(low, instrs, queue, pc)}


def _operand_bytes(o: dict) -> int:
    """Bytes an operand's access pattern covers: the product of its counts times the element size."""
    n = 1
    for _stride, count in o.get("ap", ()):
        n *= count
    return n * nbytes_of(o.get("dt", "float32"))


def _channels(dst: list, src: list) -> int | None:
    """The partitions (channels) an instruction's lanes cover: the partition count of its output's on-chip
    access pattern (SBUF/PSUM: the first ``[stride, num]`` pair, :mod:`neuron_stack.isa.instructions`), else its
    first on-chip input's (a DMA to HBM); None without an on-chip operand (a semaphore wait, HBM to HBM).

    >>> _channels([{"m": "sbuf", "ap": [[512, 64], [1, 512]]}], [])
    64
    >>> _channels([{"m": "hbm", "ap": [[1, 4096]]}], [{"m": "sbuf", "ap": [[16, 128], [1, 16]]}])
    128
    """
    for o in (*dst, *src):
        if o.get("m") in ("sbuf", "psum") and o.get("ap"):
            return int(o["ap"][0][1])
    return None


def instruction_info(schedule: pa.Table, profile) -> pa.Table:
    """What the compiler knows about each instruction of a scheduled partition, for the profile's
    ``instruction_info`` table and the ``Instruction`` view's columns the per-execution rows do not carry:
    the operands (JSON access patterns), the compiler's instruction index (``seq``: the id ``Flow`` uses),
    the Tensor Engine's instruction type, the activation function, PSUM traffic, the Tensor Engine's
    elements, the Vector Engine's performance mode (``device/cost.py``), spill traffic and the channels
    (partitions) the instruction covers (:func:`_channels`). One row per
    ``(queue, pc, pcore)``; empty for a schedule compiled without operands (timings only).

    >>> from neuron_stack.device.profiles import get_profile
    >>> t = pa.table({"engine": ["scalar"], "queue": ["Scalar"], "opcode": ["ACTIVATE"], "pc": [0], "seq": [3],
    ...     "instruction_type": [""], "spill_save_bytes": [0], "spill_reload_bytes": [0], "pcore": [0],
    ...     "operands": ['{"dst":[{"m":"sbuf","dt":"float32","ap":[[1,128],[1,4]]}],'
    ...                  '"src":[{"m":"psum","dt":"float32","ap":[[1,128],[1,4]]}],"func":"gelu"}']})
    >>> row = instruction_info(t, get_profile("trn1")).to_pylist()[0]
    >>> row["activation_fn"], row["psum_read_bytes"], row["psum_read_sbuf_write_bytes"], row["channels"]
    ('GELU', 2048, 2048, 128)
    """
    from neuron_stack.device.cost import vector_perf_mode

    cols = {k: [] for k in INSTRUCTION_INFO_SCHEMA.names}
    keep = ("queue", "pc", "pcore", "seq", "operands", "spill_save_bytes", "spill_reload_bytes")
    needed = ["engine", "opcode", "instruction_type", *keep]
    if not set(needed) <= set(schedule.column_names):   # a roofline-timed partition has no instruction detail
        return INSTRUCTION_INFO_SCHEMA.empty_table()
    rows = schedule.select(needed).to_pylist()
    if not rows or not rows[0]["operands"]:
        return INSTRUCTION_INFO_SCHEMA.empty_table()
    for r in rows:
        ops = json.loads(r["operands"])
        dst, src = ops.get("dst", []), ops.get("src", [])
        psum_in = sum(_operand_bytes(o) for o in src if o.get("m") == "psum")
        dtype = (dst or src or [{}])[0].get("dt", "float32")
        values = {k: r[k] for k in keep}
        values.update(
            pcore=r["pcore"] or 0,
            instruction_type=(r["instruction_type"] or "REGULAR") if r["engine"] == "tensor" else None,
            activation_fn=str(ops["func"]).upper() if r["engine"] == "scalar" and "func" in ops else None,
            psum_read_bytes=psum_in,
            psum_write_bytes=sum(_operand_bytes(o) for o in dst if o.get("m") == "psum"),
            psum_read_sbuf_write_bytes=psum_in if any(o.get("m") == "sbuf" for o in dst) else 0,
            tensor_elements=_operand_bytes(src[0]) // nbytes_of(src[0].get("dt", "float32"))
            if r["engine"] == "tensor" and src else None,
            performance_mode=f"{vector_perf_mode(profile, r['opcode'], dtype)}x" if r["engine"] == "vector" else None,
            channels=_channels(dst, src))
        for k in cols:
            cols[k].append(values[k])
    return pa.table(cols, schema=INSTRUCTION_INFO_SCHEMA)


def _on_chip(ins: Instr) -> tuple[set, set]:
    """The SBUF/PSUM buffer keys an instruction writes and reads."""
    ops = ins.operands
    return ({o["b"] for o in ops.get("dst", ()) if o["m"] != "hbm"},
            {o["b"] for o in ops.get("src", ()) if o["m"] != "hbm"})


def _allocations(low, instrs, keys, start, end, queue, pc) -> pa.Table:
    allocs = low.allocs
    nxt, cur = 0, {}                  # the allocation each key names at the current instruction
    acc: dict[int, list] = {}         # allocation -> [t0, t1, p_lo, p_hi, first instr, accesses, spill]
    for i, ins in enumerate(instrs):
        while nxt < len(allocs) and allocs[nxt][4] <= i:
            cur[allocs[nxt][1]] = nxt
            nxt += 1
        if not (keys[i][0] or keys[i][1]):
            continue
        ops = ins.operands
        spill = ("save" if ins.spill_save else "reload") if ins.spill_save or ins.spill_reload else ""
        for o in (*ops.get("dst", ()), *ops.get("src", ())):
            a = cur.get(o["b"]) if o["m"] != "hbm" else None
            if a is None:
                continue
            pitch, n = o["ap"][0]
            p0 = o["o"] // pitch if pitch > 0 else 0
            r = acc.get(a)
            if r is None:
                acc[a] = [start[i], end[i], p0, p0 + n, i, 1, spill]
                continue
            if start[i] < r[0]:        # the scheduler may start a later instruction first
                r[0] = start[i]
            if end[i] > r[1]:
                r[1] = end[i]
            if p0 < r[2]:
                r[2] = p0
            if p0 + n > r[3]:
                r[3] = p0 + n
            r[5] += 1
            if spill:
                r[6] = spill
    rows = []
    for a, (t0, t1, plo, phi, i, count, spill) in sorted(acc.items()):
        mem, key, addr, size, _first, parts = low.allocs[a]
        if parts:
            plo, phi = 0, parts
        first = instrs[i]
        own = [o for o in (*first.operands.get("dst", ()), *first.operands.get("src", ())) if o.get("b") == key]
        rows.append((t0, t1, addr, addr + size - 1, plo, max(1, min(phi, 128) - plo), mem.upper(),
                     "dma" if first.engine == "dma" else "instruction", first.opcode,
                     json.dumps(own[0], separators=(",", ":")) if own else "",
                     queue[i] if first.engine == "dma" else None, key, first.node, spill or None, pc[i], count))
    return _table(ALLOCATION_SCHEMA, rows)


def _kind(pk, sk, succ_opcode: str) -> tuple[str, str | None]:
    """The dependency type of an edge between instructions with on-chip keys ``pk`` -> ``sk``
    ((writes, reads) each) and the buffer that carries it."""
    both = pk[0] & sk[1]
    if both:
        return "FLOW_DEPENDENCE", min(both)
    both = pk[0] & sk[0]
    if both:
        return "OUTPUT_DEPENDENCE", min(both)
    both = pk[1] & sk[0]
    if both or succ_opcode == "EVENT_SEMAPHORE":
        return "ANTI_DEPENDENCE", min(both) if both else None
    # a reused on-chip region: waiting on the old buffer's last writer, or on its readers
    return ("OUTPUT_DEPENDENCE" if pk[0] else "ANTI_DEPENDENCE"), None


def _flows(instrs, keys, start, end, queue, pc) -> dict[str, pa.Table]:
    cols = {k: [] for k in ("in_id", "out_id", "dependency_type", "gap_time", "via")}
    gate: dict[str, tuple[int, int]] = {}   # HBM tensor -> (end, writer) of its last-finishing writer so far
    read: set[str] = set()                  # tensors read since their last new version (as the scheduler)
    sems: dict[tuple[int, str], str] = {}   # (producer, consumer queue) -> semaphore (one signal per pair)
    ins_id, out_id, kinds, gaps, vias = (cols[k] for k in ("in_id", "out_id", "dependency_type", "gap_time", "via"))
    for i, ins in enumerate(instrs):
        sk, op, s, q = keys[i], ins.opcode, start[i], queue[i]
        for d in ins.deps:
            kind, via = _kind(keys[d], sk, op)
            ins_id.append(d)
            kinds.append(kind)
            vias.append(via)
        for t in ins.tdeps:
            g = gate.get(t)
            if g is not None:      # waits for every writer: the last to finish is the one it waited for
                ins_id.append(g[1])
                kinds.append("FLOW_DEPENDENCE")
                vias.append(t)
            read.add(t)
        for t in ins.writes:
            g = gate.get(t)
            if g is None or t in read or end[i] >= g[0]:
                gate[t] = (end[i], i)
            read.discard(t)
        for d in ins_id[len(out_id):]:
            out_id.append(i)
            gaps.append(s - end[d])
            if queue[d] != q:
                sems[(d, q)] = f"{queue[d]}->{q}"
    n = len(ins_id)
    flow = pa.table({
        **{k: cols[k] for k in ("in_id", "out_id")}, "in_table": ["instruction"] * n, "out_table": ["instruction"] * n,
        "dependency_type": kinds, "gap_time": gaps, "in_queue": [queue[d] for d in ins_id],
        "in_pc": [pc[d] for d in ins_id], "out_queue": [queue[i] for i in out_id], "out_pc": [pc[i] for i in out_id],
        "via": vias}, schema=FLOW_SCHEMA)
    sem_rows, count = [], {}
    for (d, _q), sid in sorted(sems.items(), key=lambda kv: (end[kv[0][0]], kv[0][0], kv[1])):
        count[sid] = count.get(sid, 0) + 1
        sem_rows.append((end[d], sid, count[sid], instrs[d].engine, "sem_inc", "complete", queue[d], pc[d]))
    return {"Flow": flow, "SemaphoreUpdate": _table(SEMAPHORE_SCHEMA, sem_rows)}


def _format(meta: dict) -> str:
    """Dimension order in memory, outermost first: ``NCHW`` letters for 4-D, ``d0 d1`` otherwise."""
    shape, strides = meta.get("shape") or [], meta.get("strides")
    names = list("NCHW") if len(shape) == 4 else [f"d{k}" for k in range(len(shape))]
    if not strides or len(strides) != len(shape):
        return "".join(names) if len(shape) == 4 else " ".join(names)
    order = sorted(range(len(shape)), key=lambda k: (-strides[k], k))
    out = [names[k] for k in order]
    return "".join(out) if len(shape) == 4 else " ".join(out)


def _tensors(low, instrs, queue, pc) -> pa.Table:
    loads: dict[str, list] = {}       # tensor -> [dma count, bytes, first instruction]
    for i, ins in enumerate(instrs):
        if ins.engine != "dma":
            continue
        ops = ins.operands
        if not any(o["m"] == "sbuf" for o in ops.get("dst", ())):
            continue
        for o in ops.get("src", ()):
            if o["m"] == "hbm":
                r = loads.setdefault(o["b"], [0, 0, i])
                r[0] += 1
                r[1] += ins.bytes_read
    rows = []
    for name, meta in low.hbm_buffers.items():
        size = int(meta["numel"]) * nbytes_of(meta["dtype"])
        n, total, i = loads.get(name, (0, 0, None))
        rows.append((name, _TENSOR_TYPE.get(meta.get("role"), meta.get("role")), _format(meta),
                     " ".join(str(d) for d in meta.get("shape") or []), meta["dtype"], size, name.split(":")[0],
                     total // n if n else 0, total, n, round(total / size, 3) if size else 0.0,
                     queue[i] if i is not None else None, pc[i] if i is not None else None))
    return _table(TENSOR_SCHEMA, rows)


def _table(schema: pa.Schema, rows: list[tuple]) -> pa.Table:
    cols = list(zip(*rows)) if rows else [[] for _ in schema]
    return pa.table([pa.array(list(c), f.type) for c, f in zip(cols, schema)], schema=schema)
