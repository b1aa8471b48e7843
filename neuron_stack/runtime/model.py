"""A NEFF loaded on a simulated NeuronCore (the ``libnrt`` analogue): ``LoadedModel(neff).run(inputs)``.

At load every partition of the program becomes a generated Python function (:mod:`.graph`): device
partitions run with torch on the CPU and are timed by their precomputed schedule; CPU islands run
op by op and are *measured*, plus PCIe transfers of their seam tensors. Each execution moves the
projected clock (:mod:`neuron_stack.device.clock`) by simulated minus real time, publishes live
statistics for ``neuron-monitor`` and, with profiling on, is recorded (:mod:`.recorder`).

>>> import torch
>>> from neuron_stack.frontend.export import capture
>>> from neuron_stack.compiler.driver import compile_program
>>> from neuron_stack.frontend.flags import parse_flags
>>> neff = compile_program(capture(torch.nn.ReLU(), (torch.randn(4),)), parse_flags(env=""))
>>> model = LoadedModel(neff)                                   # doctest: +SKIP
>>> model.run([torch.tensor([-1.0, 2.0, -3.0, 4.0])])            # doctest: +SKIP
[tensor([0., 2., 0., 4.])]
"""
from __future__ import annotations

import os
import time
from collections import ChainMap
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import torch

from neuron_stack.device import clock
from neuron_stack.device.cost import pcie_ns
from neuron_stack.ir import Partition
from neuron_stack.isa.neff import Neff, PartitionSchedule
from neuron_stack.runtime.errors import InputMismatch, OutOfDeviceMemory
from neuron_stack.runtime.graph import PartitionFn, build_graph_module, from_json
from neuron_stack.runtime.hbm_usage import usage_types
from neuron_stack.runtime.recorder import is_recompile, record_execution, record_load
from neuron_stack.runtime.session import MEMORY_CATEGORIES, Session
from traces.ids import new_id
from traces.intervals import union_by
from traces.vocab import CONCURRENT_ENGINES, FALLBACK_PLACEMENT


def _active_ns(sched: PartitionSchedule) -> dict[str, int]:
    """Per concurrent engine (DMA queues, collectives): the union of its instruction intervals."""
    t = sched.table
    rows = pa.table({"engine": t["engine"], "start_ns": t["rel_start_ns"], "dur_ns": t["dur_ns"]})
    rows = rows.filter(pc.is_in(rows["engine"], value_set=pa.array(list(CONCURRENT_ENGINES))))
    return {r["engine"]: r["active_ns"] for r in union_by(rows, ("engine",)).to_pylist()}


@dataclass(frozen=True)
class LoadedPartition:
    """One partition as loaded: its executable graph, schedule (device partitions) and seam cost."""

    part: Partition
    gm: PartitionFn
    sched: PartitionSchedule | None
    transfer_ns: int                           # PCIe time of its host<->device transfers, per execution
    inputs: tuple[str, ...]                    # its non-constant inputs, in argument order
    device_ns: int                             # the schedule's device time (0 for a CPU island)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


# -- a loaded model ----------------------------------------------------------------------------------

class LoadedModel:
    """A NEFF loaded on one simulated NeuronCore: ``run(list_of_tensors) -> list_of_outputs``.

    ``compile_info`` describes how the graph came to be, for the ``graphs`` row and compile events:
    ``kind`` (trace, forward, backward, inference), ``compile_wall_ns``, ``cache_hit``,
    ``recompile_of``, ``recompile_reason``, ``source`` (the user's call site).
    Example: ``LoadedModel(neuron_stack.isa.neff.load("model.neff")).run([x])``.
    """

    def __init__(self, neff: Neff, compile_info: dict | None = None, core: int | None = None):
        load_t0 = time.perf_counter_ns()
        info = dict(compile_info or {})
        self.neff = neff
        self.program = prog = neff.program
        self.session = session = Session.get(neff.target)
        self.profile = session.profile
        # core: pinned by the caller (DataParallel, tensor parallel), else round-robin
        self.core = session.next_core() if core is None else core
        self.graph_id = new_id()
        self.name = neff.name
        self.executions = 0
        flags = prog.flags or {}
        self.auto_cast = flags.get("auto_cast", "none")
        by_name = {n.name: n for n in prog.nodes}
        self.input_specs = [by_name[n].outputs[0] if by_name[n].outputs else None for n in prog.input_names]
        # (shape, dtype) per input, compared per call without string work
        self._expect = [(torch.Size(s.shape), getattr(torch, s.dtype)) if s is not None else None
                        for s in self.input_specs]
        self.targets = {n.name: n.target for n in prog.nodes}

        # weights by node name (get_attr nodes alias a constant): globals of the partition functions
        self.const_env = dict(prog.constants)
        for n in prog.nodes:
            if n.target == "get_attr":
                self.const_env[n.name] = prog.constants[n.args[0]]
        self.out_refs = prog.output_names
        # Executable partitions, built once: generated Python, not a per-node interpreter.
        # One device partition (the common case) is built to take the graph's inputs and return
        # its outputs directly: the fast path is a single call with nothing to look up.
        single = len(prog.partitions) == 1 and prog.partitions[0].kind == "device"
        cast_type = flags.get("auto_cast_type", "bf16")
        self.parts: list[LoadedPartition] = []
        for p in prog.partitions:
            gm = build_graph_module(prog, p, self.auto_cast, cast_type, constants=self.const_env,
                                    inputs=prog.input_names if single else None,
                                    output=self.out_refs if single else None)
            sched = neff.schedules.get(p.index)
            self.parts.append(LoadedPartition(
                part=p, gm=gm, sched=sched, transfer_ns=sum(pcie_ns(self.profile, t.bytes) for t in p.transfers),
                inputs=tuple(n for n in p.inputs if n not in self.const_env),
                device_ns=int(sched.device_ns) if sched else 0))
        self.single = self.parts[0].gm.forward if single else None
        self.busy_ns: dict[str, int] = {}
        # what the monitor shows per engine: active time, the union of a DMA engine's overlapping
        # queues (as the profile's Summary counts it), not the sum of their durations
        self.active_ns: dict[str, int] = {}
        self.flops = 0
        self.hbm = [0, 0]
        self.spill = [0, 0]            # spill save, reload bytes per execution
        self.transpose_flops = 0
        for p in self.parts:
            if p.sched:
                for e, ns in p.sched.busy_ns.items():
                    self.busy_ns[e] = self.busy_ns.get(e, 0) + ns
                    self.active_ns[e] = self.active_ns.get(e, 0) + _active_ns(p.sched).get(e, ns)
                self.flops += p.sched.flops
                self.hbm[0] += p.sched.hbm_read_bytes
                self.hbm[1] += p.sched.hbm_write_bytes
                self.spill[0] += p.sched.spill_save_bytes
                self.spill[1] += p.sched.spill_reload_bytes
                t = p.sched.table
                if "instruction_type" in t.column_names and t.num_rows:
                    self.transpose_flops += int(pc.sum(pc.filter(t.column("flops"), pc.equal(
                        t.column("instruction_type"), "TRANSPOSE"))).as_py() or 0)
        self.static_device_ns = sum(p.device_ns + p.transfer_ns for p in self.parts if p.part.kind == "device")
        self.has_cpu = any(p.part.kind == "cpu" for p in self.parts)
        self._reserve_memory()   # last: a NEFF that cannot be built must not hold device memory

        self.op_ids = {n.name: new_id() for n in prog.nodes if n.is_op}
        self.instruction_cache: dict[int, pa.Table] | None = None   # filled by recorder.instruction_tables
        live = session.live
        live.model_loaded(name=self.name, uuid=neff.header["uuid"], model_id=self.graph_id & 0x7FFFFFFF,
                          core=self.core, device_bytes=dict(self.memory),
                          host_bytes={"constants": self.memory["constants"]})
        if info.get("cache_hit") or info.get("compile_wall_ns"):   # as the recorder's events (record_load)
            live.count_event("cache_hit" if info.get("cache_hit") else "compile", op=self.name)
        if is_recompile(info):
            live.count_event("recompile", reason=info.get("recompile_reason", ""), source=_where(info.get("source")))
        for n in prog.nodes:
            if n.is_compute and n.placement == FALLBACK_PLACEMENT:
                live.count_event("cpu_fallback", reason=n.fallback_reason, source=_where(n.source), op=n.target)
        self.compile_info = info
        self.load_wall_ns = time.perf_counter_ns() - load_t0   # nrt_load's span in the system profile
        session.poll_capture()   # a torch.profiler window open now records this load
        with session.record_lock:
            session.models.add(self)
            if session.recorder is not None:
                record_load(session.recorder, self)

    # -- memory ------------------------------------------------------------------------------
    def _reserve_memory(self) -> None:
        plan = dict(self.program.stats.get("memory", {}))
        self.memory = {c: int(plan.get(c, 0)) for c in MEMORY_CATEGORIES}
        # the same bytes by the profiler's HBM usage types (SystemProfileHbmUsage), recorded beside them
        self.hbm_usage = usage_types(plan, [p.sched.table for p in self.parts if p.sched is not None])
        used = self.session.device_memory[self.core]
        # runtime_memory is a per-core reservation, not per model
        need = sum(v for k, v in self.memory.items() if k != "runtime_memory") + (
            self.memory["runtime_memory"] if used["runtime_memory"] == 0 else 0)
        have = self.profile.hbm_bytes_per_core - sum(used.values())
        if need > have:
            with self.session.record_lock:
                if self.session.recorder is not None:
                    self.session.recorder.event("oom", core=self.core, model=self.name, need=need, free=have)
            self.session.live.count_error("runtime")
            parts = ", ".join(f"{k} {_mib(v)}" for k, v in self.memory.items() if v)
            raise OutOfDeviceMemory(
                f"out of device memory loading {self.name} on NeuronCore {self.core}: needs {_mib(need)} "
                f"({parts}) but {_mib(max(have, 0))} of {_mib(self.profile.hbm_bytes_per_core)} HBM per core "
                f"is free on {self.profile.name}; use a smaller batch or model, shard it over more cores, "
                f"or compile for a target with more HBM (--target trn2)")
        for k, v in self.memory.items():
            if k == "runtime_memory":
                used[k] = max(used[k], v)
            else:
                used[k] += v
            self.session.live.set_device_memory(self.core, k, used[k])
        self.session.host_constants += self.memory["constants"]
        self.session.live.set_host_memory("constants", self.session.host_constants)

    # -- execution -------------------------------------------------------------------------------
    def check_inputs(self, inputs: list) -> None:
        """Refuse inputs that differ from the compiled signature, naming input, dim, expected and got."""
        if len(inputs) != len(self._expect):
            raise InputMismatch(f"{self.name} was compiled for {len(self._expect)} inputs but got {len(inputs)}")
        for i, (x, expect) in enumerate(zip(inputs, self._expect)):
            if expect is not None and not (isinstance(x, torch.Tensor) and x.shape == expect[0]
                                           and x.dtype == expect[1]):
                self._mismatch(i, x)

    def _mismatch(self, i: int, x) -> None:
        spec = self.input_specs[i]
        if not isinstance(x, torch.Tensor):
            raise InputMismatch(f"{self.name} input {i}: expected a tensor of shape {tuple(spec.shape)}, "
                                f"got {type(x).__name__}")
        raise InputMismatch(
            f"{self.name} input {i} was compiled for shape {tuple(spec.shape)} {spec.dtype} but got "
            f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}: a compiled NEFF runs one static "
            f"shape; trace again with this shape, or pad inputs to the traced shape")

    def run(self, inputs: list, start_ns: int | None = None) -> list:
        """Execute on the simulated core: inputs and outputs are CPU tensors (flat lists)."""
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)     # torch.no_grad(), without its microseconds per eager op
        try:
            return self._run(inputs, start_ns)
        finally:
            torch._C._set_grad_enabled(grad)

    def _run(self, inputs: list, start_ns: int | None = None) -> list:
        session = self.session
        before, p0 = session.recorder, time.perf_counter_ns()
        session.poll_capture()   # starting a capture or a torch.profiler window takes its own time off the clock
        rec = session.recorder
        wall0 = time.time_ns()
        t0 = time.perf_counter_ns()
        session.live.execution_started(wall0 + clock.offset_ns() if start_ns is None else start_ns)
        cpu_ns = 0
        timeline: list[tuple[str, LoadedPartition, int, Any]] = []   # (kind, part, offset_ns, cpu op times)
        if self.single is not None:
            # The fast path: one device partition taking the graph's inputs, returning its outputs.
            result = self.single(*inputs)
            device_ns = self.static_device_ns
            if rec is not None:
                timeline.append(("device", self.parts[0], 0, None))
        else:
            values = ChainMap(dict(zip(self.program.input_names, inputs)), self.const_env)
            cursor = 0
            for p in self.parts:
                args = [values[n] for n in p.inputs]
                cursor += p.transfer_ns
                if p.part.kind == "device":
                    outs = p.gm(*args)
                    timeline.append(("device", p, cursor - p.transfer_ns, None))
                    cursor += p.device_ns
                else:
                    outs, times = p.gm.run_timed(*args)
                    island = sum(ns for _, ns in times)
                    timeline.append(("cpu", p, cursor - p.transfer_ns, times))
                    cursor += island
                    cpu_ns += island + p.transfer_ns
                values.update(zip(p.part.outputs, outs))
            device_ns = cursor
            result = from_json(self.out_refs, values)
        t1 = time.perf_counter_ns()
        real = t1 - t0
        wall1 = wall0 + real
        # start_ns: the projected start chosen by a multi-core scheduler (DataParallel, tensor parallel)
        proj0 = wall0 + clock.offset_ns() if start_ns is None else start_ns
        warmup = self.executions == 0
        self.executions += 1
        # The simulator's own work (polling, publishing, recording) is no program time: off the projected clock,
        # so a recorded run keeps an unrecorded one's timing (live busy and the busy of a capture of the same
        # seconds agree, docs/top.md). Polling and publishing go with the run in one advance (when the poll
        # opened a recording, that took its own time off already).
        own = (t0 - p0) if rec is before else 0
        session.live.record_execution(
            core=self.core, wall_end=wall1 / 1e9, proj_end_ns=proj0 + device_ns, total_latency_s=device_ns / 1e9,
            device_latency_s=(device_ns - cpu_ns) / 1e9, busy_ns=self.active_ns, flops=self.flops, start_ns=proj0)
        clock.advance(real + own + time.perf_counter_ns() - t1, device_ns)
        if rec is not None:
            with clock.excluded(), session.record_lock:
                if session.recorder is rec:   # not ended by its timer meanwhile
                    record_execution(rec, self, proj0, wall0, wall1, device_ns, cpu_ns, warmup, timeline)
        return result

    def unload(self) -> None:
        """Give the model's device and host memory back. Example: ``model.unload()``."""
        session = self.session
        used = session.device_memory[self.core]
        for k, v in self.memory.items():
            if k != "runtime_memory":
                used[k] -= v
                session.live.set_device_memory(self.core, k, used[k])
        session.host_constants -= self.memory["constants"]
        session.live.set_host_memory("constants", session.host_constants)
        session.live.model_unloaded(self.graph_id & 0x7FFFFFFF)
        with session.record_lock:
            session.models.discard(self)


def _where(src) -> str:
    return f"{os.path.basename(src.file)}:{src.line}" if src is not None else ""
