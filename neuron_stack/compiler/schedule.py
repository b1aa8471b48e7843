"""Pass 5, schedule: every instruction of a partition gets its start and duration on the projected clock.

The lowering (:mod:`neuron_stack.compiler.lower`) emits instructions in a valid program order with their
dependencies (read-after-write on tiles, write-after-read when a pool slot or SBUF region is
reused, and "all writers done" on HBM tensors). The scheduler replays that order as the hardware
does: one in-order queue per compute engine, DMAs on the earliest free of the core's 16 queues
(``qSyncIO0``..``qSyncIO15``, spills on ``qSyncSpillReload*``), and cross-engine dependencies as
semaphore waits (``sem_wait_ns``: how long the engine sat idle waiting). Double buffering falls
out of the pools: the next tile's DMA only waits for the slot it reuses. On trn2 the Tensor Engine
throttles (50% ramping to 100% over ~3 us after idling).

A logical core of LNC=n (trn2: 2) has n physical cores' engines and DMA queues: each instruction runs
on one instance of its engine (column ``pcore``; tracks of physical core p > 0 are suffixed ``.pc<p>``),
the earliest free one, lowest index on ties. A Tensor Engine *unit* (an LDWEIGHTS with its MATMULs,
widened until every PSUM accumulation it opened is stopped) stays on one PE array, units start in
program order, and a PE array runs one unit at a time. Assumed, not modelled: each physical core has its
own SBUF and PSUM, here the logical core's engines share one (optimistic: no cross-core exchange is
costed), of one physical core's size (pessimistic: twice the spills a two-SBUF plan could avoid).

>>> from neuron_stack.ir import Node, Program, TensorSpec
>>> from neuron_stack.device.profiles import get_profile
>>> t = TensorSpec((128, 512), "float32")
>>> prog = Program("g", [Node("x", "placeholder", outputs=[t]),
...     Node("r", "aten.relu.default", [{"node": "x"}], inputs=[t], outputs=[t], op_class="activation",
...          partition=0)], ["x"], [{"node": "r"}])
>>> s = build_schedule(prog, 0, get_profile("trn1"), {})
>>> s.table.column_names[:6]
['engine', 'queue', 'opcode', 'node', 'pc', 'rel_start_ns']
>>> s.busy_ns["scalar"] > 0 and s.device_ns >= s.busy_ns["scalar"]
True
"""
from __future__ import annotations

import heapq
import json
import math
from array import array
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from neuron_stack.compiler import records as records_mod
from neuron_stack.compiler.lower import lower
from neuron_stack.compiler.lower.tiles import Instrs, Lowered
from neuron_stack.device.cost import throttle_factor
from neuron_stack.device.profiles import DeviceProfile, get_profile
from neuron_stack.ir import Program
from neuron_stack.isa.instructions import dma_queue_name
from traces.vocab import ENGINE_LABELS, ENGINES

SPILL_QUEUES = 2

TABLE_SCHEMA = pa.schema([
    ("engine", pa.string()), ("queue", pa.string()), ("opcode", pa.string()), ("node", pa.string()),
    ("pc", pa.int32()), ("rel_start_ns", pa.int64()), ("dur_ns", pa.int64()), ("flops", pa.int64()),
    ("bytes_read", pa.int64()), ("bytes_written", pa.int64()), ("sem_wait_ns", pa.int64()),
    ("seq", pa.int32()), ("instruction_type", pa.string()),
    ("hbm_read_bytes", pa.int64()), ("hbm_write_bytes", pa.int64()),
    ("spill_save_bytes", pa.int64()), ("spill_reload_bytes", pa.int64()),
    ("operands", pa.string()), ("pcore", pa.int32()),
])
"""Columns of ``Schedule.table``: the contract columns first, then the interpreter's ``operands``
(one JSON object per instruction, see :mod:`neuron_stack.isa.instructions`), per-instruction traffic
and the physical core of the logical core that ran it (0 unless LNC > 1)."""


@dataclass
class Schedule:
    """A scheduled partition (docs/CONTRACTS.md). Extra fields beyond the contract are additive."""
    table: pa.Table
    busy_ns: dict[str, int]
    device_ns: int
    hbm_read_bytes: int
    hbm_write_bytes: int
    spill_save_bytes: int
    spill_reload_bytes: int
    flops: int
    tensor_flops: int = 0             # MATMUL flops, transposes excluded (model flops on TensorE)
    transpose_flops: int = 0
    active_ns: dict[str, int] = field(default_factory=dict)   # union of busy intervals per engine (<= device_ns)
    dma_transfer_bytes: int = 0
    dma_transfer_count: int = 0
    sbuf_peak_bytes: int = 0          # per partition
    buffers: dict = field(default_factory=dict)   # HBM buffer name -> dtype, shape, strides, role
    values: dict = field(default_factory=dict)    # value name -> strided view of a buffer
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    target: str = ""
    records: dict = field(default_factory=dict)   # SbufAllocation, Flow, SemaphoreUpdate, TensorInfo (records.py)

    def scalars(self) -> dict:
        """Everything but the table, JSON-able (what a NEFF stores next to the Arrow table).

        Example: ``Schedule.from_parts(s.table, json.loads(json.dumps(s.scalars())))``.
        """
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("table", "records")}

    @classmethod
    def from_parts(cls, table: pa.Table, scalars: dict) -> "Schedule":
        """Rebuild a Schedule from its table and :meth:`scalars` (e.g. after loading a NEFF)."""
        return cls(table=table, **scalars)


def build_schedule(program: Program, partition: int, profile: DeviceProfile, flags: dict | None,
                   detail: bool = True) -> Schedule:
    """Lower and schedule the device nodes of ``partition`` (fused nodes in their host's epilogue).

    ``flags``: the parsed compiler flags (``auto_cast``, ``auto_cast_type``, ``optlevel``, ``target``);
    ``detail=False``: the timings only, for a caller that reads nothing else: no record tables
    (:mod:`neuron_stack.compiler.records`) and empty ``operands`` (the interpreter cannot run it).
    Example: ``build_schedule(prog, 0, get_profile("trn1"), {"auto_cast": "matmult"}).device_ns``.
    """
    low = lower(program, partition, profile, flags or {}, detail)
    return schedule_lowered(low, profile, detail, consume=not detail)


def build_schedules(program: Program, flags: dict | None = None, profile: DeviceProfile | None = None
                    ) -> dict[int, Schedule]:
    """Every device partition's schedule, ``{partition: Schedule}`` (partition 0 of a program that
    was never partitioned), for ``flags["target"]`` (default trn1) unless ``profile`` is given.

    Example: ``run_program(prog, inputs, build_schedules(prog, {"auto_cast": "matmult"}))``.
    """
    flags = flags or {}
    profile = profile or get_profile(flags.get("target", "trn1"), flags.get("lnc"))
    parts = [p.index for p in program.partitions if p.kind == "device"] if program.partitions else [0]
    return {i: build_schedule(program, i, profile, flags) for i in parts}


def schedule_lowered(low: Lowered, profile: DeviceProfile, detail: bool = True, consume: bool = False) -> Schedule:
    """List-schedule a lowered instruction list (``detail=False``: timings only, see :func:`build_schedule`;
    ``consume``: free the lowering's dependency lists as soon as they are read, for a caller that
    drops ``low`` afterwards).

    Event-driven list scheduling: among the instructions whose dependencies are done, the one that
    can start earliest goes first (ties: program order), each engine running one instruction at a
    time and DMAs taking the earliest free of 16 queues. Independent work of a later op therefore
    fills an engine's idle time, as the compiler's scheduler reorders each engine's stream; the
    Tensor Engine keeps program order (LDWEIGHTS/MATMUL pairs share the PE array).
    """
    instrs = low.instrs
    n = len(instrs)
    # the placement's per-instruction state is gone (peak memory) before the table is built
    start, dur, wait, queue, qlist, pcore = _place(instrs, profile, consume)
    # program counter = position in the queue's executed order
    pc = np.zeros(n, dtype=np.int32)
    qarr = np.frombuffer(queue, dtype=np.int16)
    for q in range(len(qlist)):
        idx = np.flatnonzero(qarr == q)
        order = idx[np.lexsort((idx, start[idx]))]
        pc[order] = np.arange(len(order), dtype=np.int32)
    queue = pa.DictionaryArray.from_arrays(pa.array(qarr), pa.array(qlist, pa.string())).cast(pa.string())
    return _assemble(low, instrs, start, dur, wait, queue, pc, pcore, profile, detail)


def _place(instrs: Instrs, profile: DeviceProfile, consume: bool = False) -> tuple:
    """The list scheduling of :func:`schedule_lowered`: (start, dur, sem_wait, queue index per
    instruction, queue names, physical core). ``consume``: free the dependency columns of ``instrs``
    once read (peak memory; ``instrs`` is then fit only for the timings-only table)."""
    return _Placer(instrs, profile, consume).run()


class _Placer:
    """One partition's list scheduling: the dependency counts and HBM barriers (:meth:`_barriers`), each
    instruction's fields as flat arrays, the candidates per issue class (:meth:`_classes`), and the loop
    (:meth:`run`) that starts, one at a time, the candidate that can start earliest."""

    def __init__(self, instrs: Instrs, profile: DeviceProfile, consume: bool):
        self.n, self.lnc, self.profile = len(instrs), profile.lnc, profile
        self.unit, self.unit_last, self.next_unit = _tensor_units(instrs, self.lnc)
        later_units = set(self.next_unit.values())     # each waits for the previous unit's start
        preds, self.succ, self.succ_off = _edges(instrs, self.unit, self.lnc)
        if consume:
            instrs.deps = instrs.deps_off = None
        if later_units:
            preds[list(later_units)] += 1
        self._barriers(instrs, preds)
        if consume:
            instrs.tdeps = instrs.tdeps_off = instrs.writes = None
        self.preds_left = array("i", preds.tobytes())
        del preds
        self._fields(instrs)
        self._classes(instrs)

    def _barriers(self, instrs: Instrs, preds: np.ndarray) -> None:
        """One zero-time barrier node per HBM tensor ("every writer done"); each write names its barrier, each
        reader of a tensor written earlier counts it as a predecessor."""
        tensors: dict[int, int] = {}
        self.bar_succ = bar_succ = []
        self.bar_left = bar_left = []
        self.bar_ready = bar_ready = []
        tdeps, tdeps_off, writes, writes_off = instrs.tdeps, instrs.tdeps_off, instrs.writes, instrs.writes_off
        self.writes_off = writes_off
        self.write_bar = write_bar = array("i", bytes(4 * len(writes)))
        for i in range(self.n):
            t0, t1 = tdeps_off[i], tdeps_off[i + 1]
            if t0 != t1:
                for t in tdeps[t0:t1]:
                    b = tensors.get(t)
                    if b is None:
                        continue                     # an input: ready at time 0
                    bar_succ[b].append(i)
                    preds[i] += 1
            for k in range(writes_off[i], writes_off[i + 1]):
                w = writes[k]
                b = tensors.get(w)
                if b is None or bar_succ[b]:     # first writer, or written again after being read
                    b = tensors[w] = len(bar_succ)
                    bar_succ.append([])
                    bar_left.append(0)
                    bar_ready.append(0)
                bar_left[b] += 1
                write_bar[k] = b

    def _fields(self, instrs: Instrs) -> None:
        """Per-instruction fields as flat arrays: the loop runs once per instruction (and again on every
        re-queue), so it reads arrays, never Instr attributes."""
        n = self.n
        self.strs, self.eng_code, self.qkind = instrs.strs, instrs.engine, instrs.queue_kind
        spill_code, dma_code = instrs.names.get("SpillReload", -1), instrs.names.get("dma", -1)
        self.kind = array("b", [(2 if self.qkind[i] == spill_code else 1) if self.eng_code[i] == dma_code else 0
                                for i in range(n)])
        self.raw_dur = instrs.dur
        self.base_dur = array("q", np.maximum(1, np.ceil(np.frombuffer(self.raw_dur, dtype=np.float64)))
                              .astype(np.int64).tobytes())
        self.lat = array("q", np.ceil(np.frombuffer(instrs.latency, dtype=np.float64)).astype(np.int64).tobytes())
        self.matmul_code, self.opcode = instrs.names.get("MATMUL", -1), instrs.opcode
        self.start = np.zeros(n, dtype=np.int64)
        self.dur = np.zeros(n, dtype=np.int64)
        self.wait = np.zeros(n, dtype=np.int64)
        self.ready = array("q", bytes(8 * n))
        self.queue = array("h", bytes(2 * n))      # each instruction's queue track, an index into qlist
        self.pcore = np.zeros(n, dtype=np.int32)
        self.ramp_start, self.last_tensor_end = [0] * self.lnc, [-10**18] * self.lnc     # per PE array
        self.qnames: dict[tuple, int] = {}           # queue track -> its index in qlist
        self.qlist: list[str] = []

    def _classes(self, instrs: Instrs) -> None:
        """Candidates (dependencies done) are kept per issue class: each compute engine, the IO DMA
        queues, the spill queues. A class is free from ``cfree[c]`` (an engine's free time, the
        earliest free of its DMA queues); a candidate could start at max(cfree, its ready time).
        Those already ready by then sit in ``avail[c]`` by program order, the rest in ``waiting[c]``
        by ready time, so the next instruction, the one that can start earliest (ties: program order),
        is the best head of a handful of heaps: no per-candidate re-evaluation."""
        kind, strs, eng_code, lnc = self.kind, self.strs, self.eng_code, self.lnc
        self.cls_names = cls_names = {}
        self.cls = array("b", [cls_names.setdefault(f"dma{kind[i]}" if kind[i] else strs[eng_code[i]], len(cls_names))
                               for i in range(self.n)])
        self.cfree = [0] * len(cls_names)
        self.avail: list[list[int]] = [[] for _ in cls_names]
        self.waiting: list[list[tuple[int, int]]] = [[] for _ in cls_names]
        # each class's instances (free times), lnc physical cores' worth: an engine, 16 IO or 2 spill queues
        per = {"dma1": self.profile.dma_engines_per_core, "dma2": SPILL_QUEUES}
        self.inst = [[0] * (lnc * per.get(name, 1)) for name in cls_names]
        self.tcls = cls_names.get("tensor", -1) if lnc > 1 else -1
        self.tcand: list[int] = []                   # Tensor candidates with several PE arrays (a handful)
        self.unit_q = [-1] * (len(self.unit_last) or 1)   # the PE array a unit runs on
        self.owner = [-1] * lnc                      # the unit a PE array is running
        self.tstale = True                           # the Tensor pick changes only when tcand or an array does

    def add(self, j: int) -> None:
        """Instruction ``j``'s dependencies are done: a candidate of its class."""
        c = self.cls[j]
        if c == self.tcls:
            self.tcand.append(j)
            self.tstale = True
            return
        r = self.ready[j] + self.lat[j] if self.kind[j] else self.ready[j]
        if r <= self.cfree[c]:
            heapq.heappush(self.avail[c], j)
        else:
            heapq.heappush(self.waiting[c], (r, j))

    def tensor_pick(self) -> tuple[int, int, int] | None:
        """(start, instruction, PE array) of the Tensor candidate that can start first: a unit's next
        instruction on its array, or a unit's first on the earliest free array no unit holds."""
        best, tinst, ready = None, self.inst[self.tcls], self.ready
        for j in self.tcand:
            q = self.unit_q[self.unit[j]]
            if q < 0:
                free_qs = [x for x in range(self.lnc) if self.owner[x] < 0]
                if not free_qs:
                    continue
                q = min(free_qs, key=lambda x: (max(tinst[x], ready[j]), x))
            cand = (max(tinst[q], ready[j]), j, q)
            if best is None or cand < best:
                best = cand
        return best

    def track(self, i: int, bc: int, best_q: int, s: int, d_ns: int) -> int:
        """Instruction ``i`` starts at ``s`` on instance ``best_q`` of class ``bc``: its duration (a trn2 MATMUL
        throttled after an idle Tensor Engine), with its queue track's index recorded in ``queue[i]``."""
        qs, profile = self.inst[bc], self.profile
        nq = len(qs) // self.lnc
        p_i = self.pcore[i] = best_q // nq
        if self.kind[i]:
            qkey = (best_q, self.qkind[i])
        else:
            eng = self.strs[self.eng_code[i]]
            if eng == "tensor":
                if profile.throttle:
                    if s - self.last_tensor_end[p_i] > profile.throttle_ramp_ns:
                        self.ramp_start[p_i] = s      # idle for a ramp window: the limiter re-engages at 50%
                    if self.opcode[i] == self.matmul_code:
                        d_ns = max(1, int(math.ceil(self.raw_dur[i]
                                                    / throttle_factor(profile, s - self.ramp_start[p_i]))))
                self.last_tensor_end[p_i] = s + d_ns
                if bc == self.tcls:
                    u = self.unit[i]
                    self.unit_q[u], self.owner[best_q] = best_q, (-1 if self.unit_last[u] == i else u)
            qkey = (best_q, eng)
        qc = self.qnames.get(qkey)
        if qc is None:
            # DMA queues by index and purpose; an in-order engine's queue is its track
            q_name = dma_queue_name(best_q % nq, self.strs[self.qkind[i]] or "IO") if self.kind[i] \
                else ENGINE_LABELS[eng]
            qc = self.qnames[qkey] = len(self.qlist)
            self.qlist.append(q_name + (f".pc{p_i}" if p_i else ""))
        self.queue[i] = qc
        return d_ns

    def run(self) -> tuple:
        """Start, one at a time, the candidate that can start earliest; release what waited on it."""
        n, tcls, inst, cfree, avail, waiting = self.n, self.tcls, self.inst, self.cfree, self.avail, self.waiting
        ready, lat, base_dur, preds_left, add = self.ready, self.lat, self.base_dur, self.preds_left, self.add
        start, dur, wait, next_unit = self.start, self.dur, self.wait, self.next_unit
        bar_ready, bar_left, bar_succ, write_bar, writes_off = \
            self.bar_ready, self.bar_left, self.bar_succ, self.write_bar, self.writes_off
        succ, succ_off, push, pop = self.succ, self.succ_off, heapq.heappush, heapq.heappop
        for i in range(n):
            if preds_left[i] == 0:
                add(i)
        done, ncls, tp = 0, range(len(self.cls_names)), None
        while True:
            bc, best = -1, None
            for c in ncls:
                if c == tcls:
                    if self.tstale:
                        tp, self.tstale = self.tensor_pick(), False
                    cand = tp[:2] if tp else None
                elif avail[c]:
                    cand = (cfree[c], avail[c][0])
                elif waiting[c]:
                    cand = waiting[c][0]
                else:
                    continue
                if cand is not None and (best is None or cand < best):
                    bc, best = c, cand
            if best is None:
                break
            i = best[1]
            if bc == tcls:
                self.tcand.remove(i)
                self.tstale = True
            elif avail[bc]:
                pop(avail[bc])
            else:
                pop(waiting[bc])
            r = ready[i] + lat[i]
            qs = inst[bc]
            if bc == tcls:
                best_q = tp[2]
            else:
                m = min(qs)
                # the earliest-starting instance, lowest index on ties: every instance free by r starts at r
                best_q = qs.index(m) if m > r else next(q for q, x in enumerate(qs) if x <= r)
            qfree = qs[best_q]
            s = qfree if qfree > r else r
            d_ns = self.track(i, bc, best_q, s, base_dur[i])
            qs[best_q] = s + d_ns
            cfree[bc] = min(qs)
            w = waiting[bc]
            while w and w[0][0] <= cfree[bc]:
                push(avail[bc], pop(w)[1])
            start[i], dur[i] = s, d_ns
            j = next_unit.get(i, -1)          # the next Tensor unit may start once this one has
            if j >= 0:
                ready[j] = max(ready[j], s)
                preds_left[j] -= 1
                if preds_left[j] == 0:
                    add(j)
            wait[i] = r - qfree if r > qfree else 0
            done += 1
            end = s + d_ns
            for b in write_bar[writes_off[i]:writes_off[i + 1]]:
                if end > bar_ready[b]:
                    bar_ready[b] = end
                bar_left[b] -= 1
                if bar_left[b] == 0:
                    br = bar_ready[b]
                    for j in bar_succ[b]:
                        if br > ready[j]:
                            ready[j] = br
                        preds_left[j] -= 1
                        if preds_left[j] == 0:
                            add(j)
            for j in succ[succ_off[i]:succ_off[i + 1]]:
                if end > ready[j]:
                    ready[j] = end
                preds_left[j] -= 1
                if preds_left[j] == 0:
                    add(j)
        if done != n:
            raise RuntimeError(f"schedule: dependency cycle, {n - done} of {n} instructions unscheduled")
        return start, dur, wait, self.queue, self.qlist, self.pcore


def _edges(instrs: Instrs, unit: list[int], lnc: int) -> tuple[np.ndarray, memoryview, array]:
    """(predecessor count, successors, successor offsets) of each instruction (see :func:`_successors`)."""
    n = len(instrs)
    tensor_code = instrs.names.get("tensor", -1)
    # dependency edges (predecessor -> successor) as flat arrays: the lowering's deps, plus program
    # order on the Tensor Engine within a unit (with one PE array: always)
    dep_off = np.frombuffer(instrs.deps_off, dtype=np.int64)
    t_src, t_dst = array("i"), array("i")
    prev_tensor = -1
    deps, eng_code = instrs.deps, instrs.engine
    for i in memoryview(np.flatnonzero(np.frombuffer(eng_code, dtype=np.int32) == tensor_code).astype(np.int32)):
        if prev_tensor >= 0 and (lnc == 1 or unit[prev_tensor] == unit[i]):
            d0, d1 = dep_off[i], dep_off[i + 1]
            if prev_tensor not in deps[d0:d1]:
                t_src.append(prev_tensor)
                t_dst.append(i)
        prev_tensor = i
    t_src, t_dst = np.frombuffer(t_src, dtype=np.int32), np.frombuffer(t_dst, dtype=np.int32)
    deps_np = np.frombuffer(deps, dtype=np.int32)

    def edges():
        """(sources, destinations) a slice of instructions at a time: no edge-sized array of each (and
        small slices: :func:`_successors`' sort buffers are this size, above everything else held)."""
        step = 1 << 12
        for a in range(0, n, step):
            b = min(n, a + step)
            yield (deps_np[dep_off[a]:dep_off[b]],
                   np.repeat(np.arange(a, b, dtype=np.int32), np.diff(dep_off[a:b + 1])))
        yield t_src, t_dst

    preds = (np.diff(dep_off) + np.bincount(t_dst, minlength=n)).astype(np.int32)
    succ, succ_off = _successors(edges, n, len(deps_np) + len(t_src))
    return preds, succ, succ_off


def _successors(edges, n: int, count: int) -> tuple[memoryview, array]:
    """The ``count`` edges ``src -> dst`` that ``edges()`` yields in chunks of (sources, destinations),
    grouped by source: (successors, offsets), the successors of ``i`` being ``succ[off[i]:off[i + 1]]``
    (in no particular order). Two passes over the chunks, so no edge-sized sort buffers.

    >>> succ, off = _successors(lambda: iter([(np.array([2, 0, 0]), np.array([3, 1, 2]))]), 4, 3)
    >>> [sorted(succ[off[i]:off[i + 1]]) for i in range(4)]
    [[1, 2], [], [3], []]
    """
    off = np.zeros(n + 1, dtype=np.int64)
    for src, _ in edges():
        off[1:] += np.bincount(src, minlength=n)
    np.cumsum(off, out=off)
    fill = off[:-1].copy()
    out = np.empty(count, dtype=np.int32)
    for src, dst in edges():
        o = np.argsort(src, kind="stable")
        s, d = src[o], dst[o]
        first = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]])) if len(s) else np.zeros(0, np.int64)
        sizes = np.diff(np.append(first, len(s)))
        out[fill[s] + np.arange(len(s)) - np.repeat(first, sizes)] = d
        fill[s[first]] += sizes
    del fill
    offsets = array("q")
    offsets.frombytes(memoryview(off).cast("B"))    # no intermediate bytes copy (peak memory)
    return memoryview(out), offsets


def _tensor_units(instrs: Instrs, lnc: int) -> tuple[list[int], list[int], dict[int, int]]:
    """With several PE arrays (LNC > 1): each Tensor instruction's unit, each unit's last instruction,
    and ``{first of unit k: first of unit k+1}`` (units start in program order). A unit is an
    LDWEIGHTS and what follows it up to the next LDWEIGHTS issued with no PSUM accumulation open.

    >>> from neuron_stack.compiler.lower.tiles import Instr
    >>> mm = lambda b, a, z: Instr("tensor", "MATMUL", "n", 1, [], [], {"dst": [{"b": b}], "start": a, "stop": z})
    >>> lw = Instr("tensor", "LDWEIGHTS", "n", 1, [], [], {})
    >>> _tensor_units(Instrs.of([lw, mm(1, True, False), lw, mm(1, False, True), lw, mm(2, True, True)]), 2)[:2]
    ([0, 0, 0, 0, 1, 1], [3, 5])
    """
    n = len(instrs)
    unit = [-1] * n
    last: list[int] = []
    links: dict[int, int] = {}
    if lnc == 1:
        return unit, last, links
    open_acc: set = set()
    first = -1
    names = instrs.names
    tensor, ldweights = names.get("tensor", -1), names.get("LDWEIGHTS", -1)
    opcode, acc, acc_stop = instrs.opcode, instrs.acc, instrs.acc_stop
    for i in memoryview(np.flatnonzero(np.frombuffer(instrs.engine, dtype=np.int32) == tensor).astype(np.int32)):
        if not last or (opcode[i] == ldweights and not open_acc):
            if first >= 0:
                links[first] = i
            first = i
            last.append(i)
        last[-1] = i
        unit[i] = len(last) - 1
        b = acc[i]                   # a MATMUL's PSUM bank: open until the one with stop
        if b >= 0:
            if acc_stop[i]:
                open_acc.discard(b)
            else:
                open_acc.add(b)
    return unit, last, links


def _assemble(low: Lowered, instrs: Instrs, start, dur, wait, queue, pc, pcore, profile,
              detail=True) -> Schedule:
    n = len(instrs)
    num = lambda f: np.frombuffer(getattr(instrs, f), dtype=np.int64)  # noqa: E731
    codes = lambda f: np.frombuffer(getattr(instrs, f), dtype=np.int32)  # noqa: E731
    names = pa.array(instrs.strs, pa.string())
    # name columns from their string-table codes (no per-row Python string list)
    text = lambda f: pa.DictionaryArray.from_arrays(pa.array(codes(f)), names).cast(pa.string())  # noqa: E731
    flops = num("flops")
    table = pa.Table.from_pydict({
        "engine": text("engine"), "queue": queue, "opcode": text("opcode"), "node": text("node"),
        "pc": pc, "rel_start_ns": start, "dur_ns": dur, "flops": flops,
        "bytes_read": num("bytes_read"), "bytes_written": num("bytes_written"),
        "sem_wait_ns": wait, "seq": np.arange(n, dtype=np.int32), "instruction_type": text("itype"),
        "hbm_read_bytes": num("hbm_read"), "hbm_write_bytes": num("hbm_write"),
        "spill_save_bytes": num("spill_save"), "spill_reload_bytes": num("spill_reload"),
        "operands": [json.dumps(x, separators=(",", ":")) for x in instrs.operands] if detail else pa.repeat("", n),
        "pcore": pcore,
    }, schema=TABLE_SCHEMA)
    eng = codes("engine")
    code = lambda name: instrs.names.get(name, -1)  # noqa: E731
    busy, active = {}, {}
    for e in ENGINES:
        m = eng == code(e)
        busy[e] = int(dur[m].sum()) if n else 0
        active[e] = union_ns(start[m], dur[m])
    end = start + dur
    device_ns = int(end.max()) if n else 0
    is_t = codes("itype") == code("TRANSPOSE")
    is_mm = codes("opcode") == code("MATMUL")
    dma = eng == code("dma")
    return Schedule(
        table=table, busy_ns=busy, device_ns=device_ns,
        hbm_read_bytes=int(table["hbm_read_bytes"].to_numpy().sum()) if n else 0,
        hbm_write_bytes=int(table["hbm_write_bytes"].to_numpy().sum()) if n else 0,
        spill_save_bytes=int(table["spill_save_bytes"].to_numpy().sum()) if n else 0,
        spill_reload_bytes=int(table["spill_reload_bytes"].to_numpy().sum()) if n else 0,
        flops=int(flops[~is_t].sum()) if n else 0,
        tensor_flops=int(flops[is_mm & ~is_t].sum()) if n else 0,
        transpose_flops=int(flops[is_t].sum()) if n else 0,
        active_ns=active,
        dma_transfer_bytes=int(table["bytes_read"].to_numpy()[dma].sum()) if n else 0,
        dma_transfer_count=int(dma.sum()),
        sbuf_peak_bytes=int(low.sbuf_peak_bytes), buffers=low.hbm_buffers, values=low.values,
        inputs=list(low.inputs), outputs=list(low.outputs), target=profile.name,
        records=records_mod.build(low, start, dur, queue.to_pylist(), pc) if detail else {})


def union_ns(s: np.ndarray, d: np.ndarray) -> int:
    """Total length of the union of intervals [s, s+d) (engines with several queues overlap).

    >>> union_ns(np.array([0, 5, 20]), np.array([10, 10, 1]))
    16
    """
    if len(s) == 0:
        return 0
    o = np.argsort(s, kind="stable")
    s, e = s[o], (s + d)[o]
    run_end = np.maximum.accumulate(e)
    # a new merged interval starts where s exceeds every earlier end
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    ends = np.append(run_end[idx[1:] - 1], run_end[-1])
    return int((ends - s[idx]).sum())
