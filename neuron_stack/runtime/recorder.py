"""The trace recorder: with profiling on (``NEURON_RT_INSPECT_ENABLE=1``) or during a timed capture,
every table of a run goes through :class:`traces.Writer` into segment files: runs, sources, graphs,
ops, executions, one row per device instruction and CPU op, events and memory.

The rows built by hand are typed (:mod:`neuron_stack.runtime.rows`); instruction rows come from
each partition's static schedule, stamped per execution.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import traces
from neuron_stack.compiler.version import stack_version
from neuron_stack.device import clock
from neuron_stack.device.cost import pcie_ns
from neuron_stack.runtime.cores import parse_core_list
from neuron_stack.runtime.host_sampler import HostSampler
from neuron_stack.runtime.inspect_config import InspectConfig
from neuron_stack.runtime.launch_env import env_int
from neuron_stack.runtime.rows import EventRow, ExecutionRow, GraphRow
from traces.dataset import SegmentUploader
from traces.ids import host_name, instance_id, new_id, stable_id
from traces.objstore import is_url
from traces.schema import SCHEMA_VERSION
from traces.vocab import FALLBACK_PLACEMENT

#: Bound on a rank's end-of-job publish (finalise its segments, upload its Parquet tables).
PUBLISH_TIMEOUT_S = 900


class Recorder:
    """Writes the trace tables through :class:`traces.Writer` (profiling on)."""

    def __init__(self, session, out_dir: str, config: InspectConfig | None = None):
        self.session = session
        self.out_dir = out_dir
        self.sources_seen: set[int] = set()
        self.files_seen: set[str] = set()
        self.graph_settings: dict[str, set[str]] = {}
        self.set_core_filter(os.environ.get("NEURON_RT_INSPECT_EVENT_FILTER_NC", "").strip() or None,
                             "NEURON_RT_INSPECT_EVENT_FILTER_NC")
        # why device rows are off, and the fix, for the capture's verdict (profiling.py and capture.py say theirs)
        self.device_off = ("NEURON_RT_INSPECT_DEVICE_PROFILE is 0 (the runtime's default: system profile only)",
                           "set NEURON_RT_INSPECT_DEVICE_PROFILE=session (or 1)")
        # executions that used the device, those recorded with instruction rows, and why the others were not
        self.device_executions = self.device_recorded = 0
        self.skipped: collections.Counter = collections.Counter()
        self.skipped_cores: set[int] = set()
        self.system_seen = 0
        # NEURON_RT_INSPECT_* as the real runtime (inspect_config): device rows off by default (0), 1/model = the
        # first execution of each NEFF per core, session = every one; a timed capture (neuron-top) records them all
        self.config = config if config is not None else InspectConfig.from_env(device_default="session")
        self.device_profile = self.config.device_profile
        self.device_profiled: set[tuple[int, int]] = set()
        # system events wait in a ring per NeuronCore (the newest max_events_per_nc) until the capture ends
        self.system: dict[int | None, collections.deque] = {}
        meta = dict(session.profile.metadata())
        inst = getattr(session, "instance", None)   # the process's one identity (NEURON_STACK_INSTANCE_TYPE)
        if inst is not None:
            meta.update(instance_type=inst.instance_type, neuron_device_count=str(inst.chips))
        meta.update({"schema_version": SCHEMA_VERSION, "stack_version": stack_version(), "target": session.target,
                     "is_simulation": "true", "device_profile": self.device_profile,
                     "warmup_executions": "1"})
        # the unprefixed keys are one target's; a process's other targets keep their own (q_figures.targets)
        meta.update({f"target.{session.target}.{k}": meta[k]
                     for k in ("instance_type", "tensor_engine_peak_bf16_flops")})
        now = clock.wall_ns()
        self.publish_to = None
        on_segment = None
        if is_url(out_dir):   # object storage: stage locally, upload each segment as it is published
            self.publish_to = (out_dir, instance_id(), env_int("RANK", 0))
            on_segment = SegmentUploader(*self.publish_to)
            out_dir = tempfile.mkdtemp(prefix="neuron-inspect-")
        self.writer = traces.Writer(out_dir, on_segment=on_segment, run={
            "run_id": session.run_id, "pid": os.getpid(), "tag": session.live.tag,
            "command": session.live.command, "host": host_name(), "target": session.target,
            "rank": env_int("RANK", 0), "node": env_int("GROUP_RANK", 0),   # checked: RANK=abc, ٣
            "wall_start_ns": now, "start_ns": clock.now_ns()}, metadata=meta)
        self.host_sampler = HostSampler(self) if (self.config.cpu_util or self.config.host_memory) else None

    @classmethod
    def from_env(cls, session) -> "Recorder | None":
        if os.environ.get("NEURON_RT_INSPECT_ENABLE", "0").strip().lower() in ("", "0", "false", "no", "off"):
            return None
        return cls(session, os.environ.get("NEURON_RT_INSPECT_OUTPUT_DIR") or "./output", InspectConfig.from_env())

    @clock.excluding
    def append(self, table: str, rows) -> None:
        self.writer.append(table, rows)

    def add(self, row) -> None:
        """Append one typed row (:mod:`neuron_stack.runtime.rows`) to its table."""
        self.writer.append(row.TABLE, row.columns())

    def set_core_filter(self, text: str | None, name: str) -> None:
        """Record only the NeuronCores ``text`` names (``0,2-3``; None: all). As in the real runtime the indices
        are the process's own (``neuron:0`` is 0, whichever machine core it holds), not the machine's.

        >>> from types import SimpleNamespace as NS
        >>> rec = Recorder.__new__(Recorder)
        >>> rec.session = NS(profile=NS(cores_per_instance=32), core_index=[5, 6].index)
        >>> rec.set_core_filter("1", "capture_enabled_for_nc"); rec.records_core(6), rec.records_core(5)
        (True, False)
        """
        self.core_filter_setting = f"{name}={text!r}"
        self.core_filter = None if text is None else set(
            parse_core_list(text, self.session.profile.cores_per_instance, name=name))

    def records_core(self, core: int | None) -> bool:
        """Whether events of machine core ``core`` are recorded (the core filter, in the process's indices)."""
        return self.core_filter is None or core is None or self.session.core_index(core) in self.core_filter

    def device_rows_for(self, graph_id: int, core: int) -> bool:
        """Whether one execution that used the device on ``core`` gets instruction rows (core filter, then
        the device mode); counts why not, for :meth:`device_rows_verdict`."""
        self.device_executions += 1
        if not self.records_core(core):
            self.skipped["core_filter"] += 1
            self.skipped_cores.add(core)
            return False
        if not self.wants_instructions(graph_id, core):
            self.skipped["device_off" if self.device_profile == "off" else "model"] += 1
            return False
        self.device_recorded += 1
        return True

    def device_rows_verdict(self) -> tuple[str, str]:
        """``(status, line)``: ``recorded``, ``unused`` (no execution used the device), ``off`` (device rows
        deliberately off: informational) or ``missing`` (the device was used, nothing was recorded: the line
        says why and the fix)."""
        n = self.device_executions
        if self.device_recorded or not n:
            return ("recorded" if n else "unused"), ""
        if self.skipped["core_filter"]:
            mine = sorted((self.session.core_index(c), c) for c in self.skipped_cores)
            name = self.core_filter_setting.split("=")[0]
            return "missing", (
                f"no device rows: {self.core_filter_setting} excludes every NeuronCore this process ran on (its "
                f"core {', '.join(f'{i} = machine core {c}' for i, c in mine)}, {n} device executions); core indices "
                f"are the process's own (neuron:0 is 0): use {name}={','.join(str(i) for i, _ in mine)!r} or leave "
                "it unset")
        why, fix = self.device_off
        return "off", f"no device rows: {why}; {n} device executions are in the system profile only: {fix}"

    def wants_instructions(self, graph_id: int, core: int) -> bool:
        """Whether this execution's instruction rows are recorded (NEURON_RT_INSPECT_DEVICE_PROFILE)."""
        if self.device_profile == "off":
            return False
        if self.device_profile == "model":
            if (graph_id, core) in self.device_profiled:
                return False
            self.device_profiled.add((graph_id, core))
        return True

    def note_graph_settings(self, **settings: str) -> None:
        for key, value in settings.items():
            self.graph_settings.setdefault(key, set()).add(str(value))
        keys = sorted(self.graph_settings)
        self.append("metadata", {"key": keys, "value": ["+".join(sorted(self.graph_settings[k])) for k in keys]})

    @clock.excluding
    def event(self, event_kind: str, *, ts_ns: int | None = None, dur_ns: int = 0, core: int | None = None,
              graph_id: int | None = None, op_id: int | None = None, source_id: int | None = None,
              **detail) -> None:
        ts = clock.now_ns() if ts_ns is None else ts_ns
        self.add(EventRow(ts_ns=ts, wall_ns=ts - clock.offset_ns(), dur_ns=dur_ns, run_id=self.session.run_id,
                          kind=event_kind, core=core, graph_id=graph_id, op_id=op_id, source_id=source_id,
                          detail=detail))

    @clock.excluding
    def system_event(self, name: str, ts_ns: int, dur_ns: int, source: str = "neuron_rt", core: int | None = None,
                     exec_id: int | None = None, flow_id: int | None = None, **detail) -> None:
        """One system-profile event (``SystemProfileEvents``), unless filtered out
        (``NEURON_RT_INSPECT_SYSTEM_PROFILE``, ``_EVENT_FILTER_TYPE``); the newest ``max_events_per_nc`` per core
        are kept."""
        if not self.config.wants(name) or not self.records_core(core):
            return
        self.system_seen += 1
        ring = self.system.get(core)
        if ring is None:
            ring = self.system[core] = collections.deque(maxlen=self.config.max_events_per_nc)
        ring.append((ts_ns, dur_ns, name, source, threading.get_native_id(), core, exec_id, flow_id,
                     json.dumps(detail) if detail else None))

    def flush_system(self) -> None:
        """Write the system events held so far and empty the rings."""
        rows = [r for ring in self.system.values() for r in ring]
        self.system.clear()
        dropped, self.system_seen = self.system_seen - len(rows), 0
        if dropped:
            self.append("metadata", {"key": ["system_events_dropped", "system_events_note"], "value": [
                str(dropped), f"{dropped:,} system events dropped: max_events_per_nc="
                f"{self.config.max_events_per_nc:,} keeps the newest per NeuronCore; raise it "
                "(NeuronConfig(max_events_per_nc) or NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC) to keep them all"]})
        if rows:
            cols = list(zip(*rows))
            self.append("system_events", {
                "ts_ns": cols[0], "dur_ns": cols[1], "run_id": self.session.run_id, "name": cols[2],
                "source": cols[3], "thread_id": cols[4], "core": cols[5], "exec_id": cols[6], "flow_id": cols[7],
                "detail": cols[8]})

    def close(self) -> None:
        # the window ends now, on the projected clock as it began (not its start plus the wall time elapsed,
        # which counts the simulator's own time), before the flushing below
        end_ns, wall_end_ns = clock.now_ns(), clock.wall_ns()
        if self.host_sampler is not None:
            self.host_sampler.stop()
        self.flush_system()
        status, line = self.device_rows_verdict()
        self.append("metadata", {"key": ["device_rows", "device_rows_note"], "value": [status, line]})
        if status == "missing":
            _warn_once(f"{line} (profile: {self.out_dir})")
        try:
            self.writer.close(status="ok", end_ns=end_ns, wall_end_ns=wall_end_ns)
            if self.publish_to is not None:
                self._publish()
        except traces.TraceError as exc:  # a full disk at exit: one warning line, never a traceback
            logging.getLogger("traces").warning("%s", exc)

    def _publish(self) -> None:
        """This rank's partition of the job's dataset, built by a child process: this one may be exiting,
        when no thread starts. Its segments are on the object store already, whatever happens here."""
        url, instance, rank = self.publish_to
        cmd = [sys.executable, "-m", "traces.dataset", "publish-rank", str(self.writer.out_dir), url, instance,
               str(rank)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=PUBLISH_TIMEOUT_S)
            ok, why = done.returncode == 0, (done.stderr.strip().splitlines() or ["?"])[-1]
        except subprocess.TimeoutExpired:
            ok, why = False, f"took more than {PUBLISH_TIMEOUT_S} s"
        if ok:
            shutil.rmtree(self.writer.out_dir, ignore_errors=True)
        else:
            logging.getLogger("traces").warning(
                "could not publish rank %s's tables to %s (%s); its segments are there: publish them with "
                "`python -m traces.dataset publish-segments %s`", rank, url, why, url)


_warned: list[str] = []


def _warn_once(line: str) -> None:
    """One line on stderr, the first time a capture of this process records no device rows."""
    if not _warned:
        _warned.append(line)
        print(f"neuron_stack: warning: {line}", file=sys.stderr, flush=True)


#: A copy's runtime API call and the driver's copy beneath it, per direction (reference §3.8, glossary.rst).
TRANSFER_EVENTS = {"to_device": ("nrt_tensor_write", "dmem_buf_copyin"),
                   "to_host": ("nrt_tensor_read", "dmem_buf_copyout")}


def record_transfer(rec: Recorder, profile, ts_ns: int, core: int, direction: str, nbytes: int, tensor_name: str,
                    exec_id: int | None = None, graph_id: int | None = None, op_id: int | None = None,
                    source: str | None = None, **detail) -> int:
    """One host<->device copy of ``nbytes`` (``direction`` ``to_device`` or ``to_host``) starting at ``ts_ns`` on
    the projected clock: its ``host_transfer`` event (``dur_ns`` PCIe time, never device time) and, in the system
    profile, the runtime call (``nrt_tensor_write`` / ``nrt_tensor_read``) with the driver's copy beneath it
    (``dmem_buf_copyin`` / ``dmem_buf_copyout``), each with ``size`` and ``bandwidth_bytes_per_sec``. Returns the
    PCIe ns (``device/cost.py: pcie_ns``). The one recording of a transfer: compiled graphs' CPU-island seams and
    eager copies both call it. ``source`` (``file:line``) goes on every row (``source_location`` in the system
    profile), ``detail`` on the event only. A core outside ``NEURON_RT_INSPECT_EVENT_FILTER_NC`` records nothing.

    >>> from types import SimpleNamespace as NS
    >>> from neuron_stack.device.profiles import get_profile
    >>> rec = NS(records_core=lambda core: False, event=None, system_event=None)
    >>> record_transfer(rec, get_profile("trn1"), 0, 0, "to_device", 32_000, "x")   # filtered out: PCIe ns only
    2300
    """
    ns = pcie_ns(profile, nbytes)
    if not rec.records_core(core):
        return ns
    where = {"source": source} if source else {}
    rec.event("host_transfer", ts_ns=ts_ns, dur_ns=ns, core=core, graph_id=graph_id, op_id=op_id, value=tensor_name,
              direction=direction, bytes=nbytes, **where, **detail)
    # system_event's own ``source`` is the event's origin (neuron_rt): the line goes as ``source_location``
    where = {"source_location": source} if source else {}
    for name in TRANSFER_EVENTS[direction]:
        rec.system_event(name, ts_ns, ns, core=core, exec_id=exec_id, tensor_name=tensor_name, size=nbytes,
                         direction=direction, bandwidth_bytes_per_sec=round(nbytes * 1e9 / max(ns, 1), 1), **where)
    return ns


def record_dispatch(model, host_ns: int, mode: str) -> None:
    """A ``dispatch`` event: the host time (``dur_ns``, measured, never device time) the framework spent
    around one execution of ``model`` outside the simulated run, ``mode`` ``eager`` or ``compiled``;
    ``host_time`` says so (``measured``: the simulator's own dispatch path stands for torch-neuronx's; the
    compile, load, simulated run and recording are not in it).
    Nothing is recorded when profiling is off:

    >>> from types import SimpleNamespace as NS
    >>> record_dispatch(NS(session=NS(recorder=None)), 1200, "eager")
    """
    s = model.session
    rec = s.recorder
    if rec is None:          # profiling off: nothing to take off the projected clock either
        return
    with clock.excluded(), s.record_lock:
        if s.recorder is rec:
            rec.event("dispatch", dur_ns=int(host_ns), core=model.core, graph_id=model.graph_id, mode=mode,
                      host_time="measured")


def is_recompile(info: dict) -> bool:
    """A graph is a recompile when it names the graph it replaces or dynamo gave a reason (the Summary's
    ``recompile_count`` counts the same graphs: ``traces.summary_sql.RECOMPILED_SQL``).
    Example: ``is_recompile({"recompile_reason": "x dim 0: 4 -> 8"})`` is True."""
    return info.get("recompile_of") is not None or bool(info.get("recompile_reason"))


def source_id(src) -> int | None:
    """The trace store's id of a source line (``stable_id(file, line)``)."""
    return stable_id(src.file, src.line) if src is not None else None


@clock.excluding
def record_load(rec: Recorder, model, history: bool = True) -> None:
    """Describe a loaded ``model`` (:class:`~neuron_stack.runtime.model.LoadedModel`) to ``rec``: sources,
    graph, ops, fallbacks, memory; with ``history``
    also its compile, cache hit, recompile and load events (a capture that starts later
    skips those: they happened before it)."""
    prog, info = model.program, model.compile_info
    now = clock.now_ns()
    src_rows = {"source_id": [], "file": [], "line": [], "function": [], "code": []}
    for s in [x for n in prog.nodes for x in (*n.stack, n.source, n.fwd_source) if x is not None]:
        sid = source_id(s)
        if sid in rec.sources_seen:
            continue
        rec.sources_seen.add(sid)
        for k, v in zip(src_rows, (sid, s.file, s.line, s.function, s.code)):
            src_rows[k].append(v)
    if src_rows["source_id"]:
        rec.append("sources", src_rows)
    files = {f: t for f, t in model.neff.source_files.items() if f not in rec.files_seen}
    if files:
        rec.files_seen.update(files)
        rec.append("source_files", {"file": list(files), "text": list(files.values()),
                                    "sha1": [hashlib.sha1(t.encode()).hexdigest() for t in files.values()]})
    call_site = info.get("source")
    sig = ", ".join(f"{tuple(s.shape)} {s.dtype}" for s in model.input_specs if s is not None)
    stats = prog.stats
    # Timing model and auto-cast are per graph (a lowering gap falls back to roofline); the
    # profile's metadata names every value its graphs used.
    rec.note_graph_settings(timing_model=stats.get("timing_model", "instruction"),
                            auto_cast=prog.flags.get("auto_cast", "none"), numbers=stats.get("numbers", "cpu"))
    rec.add(GraphRow(
        graph_id=model.graph_id, run_id=model.session.run_id, name=model.name, kind=info.get("kind", "trace"),
        neff_hash=model.neff.header["hash"], input_signature=sig,
        compile_wall_ns=int(info.get("compile_wall_ns", 0)), compile_ns=int(info.get("compile_wall_ns", 0)),
        cache_hit=bool(info.get("cache_hit", False)), recompile_of=info.get("recompile_of"),
        recompile_reason=info.get("recompile_reason", ""), source_id=source_id(call_site),
        target=model.neff.target, flags=json.dumps(prog.flags), num_ops=stats.get("num_ops", 0),
        num_device_ops=stats.get("num_device_ops", 0), num_instructions=stats.get("num_instructions", 0)))
    if call_site is not None and source_id(call_site) not in rec.sources_seen:
        rec.sources_seen.add(source_id(call_site))
        rec.append("sources", {"source_id": [source_id(call_site)], "file": [call_site.file],
                               "line": [call_site.line], "function": [call_site.function],
                               "code": [call_site.code]})
    ops = [n for n in prog.nodes if n.is_compute]
    rec.append("ops", {
        "op_id": [model.op_ids[n.name] for n in ops], "graph_id": [model.graph_id] * len(ops),
        "name": [n.name for n in ops], "aten_op": [n.target for n in ops], "op_class": [n.op_class for n in ops],
        "placement": [n.placement for n in ops], "fallback_reason": [n.fallback_reason for n in ops],
        "fused_into": [n.fused_into for n in ops], "module_path": [n.module_path for n in ops],
        "source_id": [source_id(n.source) for n in ops], "fwd_source_id": [source_id(n.fwd_source) for n in ops],
        # the user's call stack (source ids, outermost first, ending at the op's line) when more than its line
        "stack": [",".join(str(source_id(f)) for f in n.stack) if len(n.stack) > 1 and n.stack[-1] == n.source
                  else None for n in ops],
        "shape": [str(list(n.outputs[0].shape)) if n.outputs else "" for n in ops],
        "dtype": [n.outputs[0].dtype if n.outputs else "" for n in ops],
        "flops": [n.flops for n in ops], "bytes": [n.bytes for n in ops]})
    compile_ns = int(info.get("compile_wall_ns", 0))
    if history and info.get("cache_hit"):
        rec.event("cache_hit", ts_ns=now, graph_id=model.graph_id, model=model.name,
                  neff_hash=model.neff.header["hash"], path=info.get("cache_path", ""))
    elif history and compile_ns:
        rec.event("compile", ts_ns=now - compile_ns, dur_ns=compile_ns, graph_id=model.graph_id,
                  source_id=source_id(call_site), model=model.name, kind=info.get("kind", "trace"),
                  pass_s=stats.get("pass_s", {}))   # seconds per compiler pass (compile log names them too)
    if history and is_recompile(info):   # dynamo may name a recompile whose first graph it never handed us
        rec.event("recompile", ts_ns=now, graph_id=model.graph_id, source_id=source_id(call_site),
                  reason=info.get("recompile_reason", ""), recompile_of=info.get("recompile_of"))
    for n in ops:
        if n.placement == FALLBACK_PLACEMENT:
            rec.event("cpu_fallback", ts_ns=now, graph_id=model.graph_id, op_id=model.op_ids[n.name],
                      source_id=source_id(n.source), op=n.target, reason=n.fallback_reason)
    if history:
        rec.event("load", ts_ns=now, core=model.core, graph_id=model.graph_id, model=model.name,
                  uuid=model.neff.header["uuid"], bytes=model.memory)
        load_ns = int(getattr(model, "load_wall_ns", 0))
        rec.system_event("nrt_load", now - load_ns, load_ns, core=model.core, model=model.name,
                         uuid=model.neff.header["uuid"], neff_hash=model.neff.header["hash"])
    record_graph_records(rec, model)
    rec.append("memory", {"ts_ns": [now] * len(model.memory), "run_id": [model.session.run_id] * len(model.memory),
                          "core": [model.core] * len(model.memory), "location": ["device"] * len(model.memory),
                          "category": list(model.memory),
                          "bytes": [model.session.device_memory[model.core][k] for k in model.memory]})
    # the same bytes by HBM usage type (runtime/hbm_usage.py): the loaded models' on this core, and the core's
    # runtime reservation (generic)
    usage = {"generic": model.session.device_memory[model.core]["runtime_memory"]}
    for m in model.session.models:
        if m.core == model.core:
            for k, v in getattr(m, "hbm_usage", {}).items():
                usage[k] = usage.get(k, 0) + v
    rec.append("memory", {"ts_ns": [now] * len(usage), "run_id": [model.session.run_id] * len(usage),
                          "core": [model.core] * len(usage), "location": ["hbm_usage"] * len(usage),
                          "category": list(usage), "bytes": list(usage.values())})


def instruction_tables(model) -> dict[int, pa.Table]:
    """Each device partition's schedule with its op_id column, computed once per loaded model."""
    if model.instruction_cache is None:
        names = list(model.op_ids)
        ids = pa.array([model.op_ids[n] for n in names], pa.int64())
        out = {}
        for p in model.parts:
            if p.sched is None:
                continue
            t = p.sched.table
            idx = pc.index_in(t.column("node"), value_set=pa.array(names, pa.string()))
            op_id = pc.take(ids, idx)
            keep = ["engine", "queue", "opcode", "pc", "dur_ns", "flops", "bytes_read", "bytes_written",
                    "sem_wait_ns", "pcore", "hbm_read_bytes", "hbm_write_bytes"]
            cols = {k: t.column(k) for k in keep if k in t.column_names}   # roofline tables have no pcore
            cols["op_id"] = op_id
            cols["rel_start_ns"] = t.column("rel_start_ns")
            # an NKI kernel op's instructions carry their kernel line (neuron_stack.nki.lowering)
            has = pc.match_substring(t.column("operands"), '"nki_loc"')
            if t.num_rows and pc.any(has).as_py():
                cols["nki_source_location"] = pa.array(
                    [json.loads(o)["nki_loc"] if h else None
                     for o, h in zip(t.column("operands").to_pylist(), has.to_pylist())], pa.string())
            out[p.part.index] = pa.table(cols)
        model.instruction_cache = out
    return model.instruction_cache


@clock.excluding
def record_execution(rec: Recorder, model, proj0, wall0, wall1, device_ns, cpu_ns, warmup, timeline) -> None:
    """Record one execution of ``model``: its ``executions`` row; unless filtered out
    (``NEURON_RT_INSPECT_EVENT_FILTER_NC``, ``NEURON_RT_INSPECT_DEVICE_PROFILE``) one instruction row per
    device instruction and CPU op, and a ``host_transfer`` event per seam crossing. ``timeline``
    lists ``(kind, loaded partition, offset_ns, cpu op times)`` in execution order."""
    exec_id = new_id()
    busy = model.busy_ns
    rec.add(ExecutionRow(
        exec_id=exec_id, run_id=model.session.run_id, graph_id=model.graph_id, core=model.core,
        iteration=model.executions - 1, wall_start_ns=wall0, wall_end_ns=wall1, start_ns=proj0,
        end_ns=proj0 + device_ns, device_ns=device_ns, warmup=warmup, flops=model.flops, busy_ns=busy,
        cpu_fallback_ns=cpu_ns, hbm_read_bytes=model.hbm[0], hbm_write_bytes=model.hbm[1],
        spill_save_bytes=model.spill[0], spill_reload_bytes=model.spill[1], transpose_flops=model.transpose_flops))
    device = any(kind == "device" for kind, *_ in timeline)
    if not rec.records_core(model.core):   # NEURON_RT_INSPECT_EVENT_FILTER_NC / capture_enabled_for_nc
        if device:
            rec.device_rows_for(model.graph_id, model.core)
        return
    flow = exec_id & 0x7FFFFFFFFFFF   # links the runtime call to its device execution (a Perfetto flow)
    rec.system_event("nrt_execute", proj0, device_ns, core=model.core, exec_id=exec_id, flow_id=flow,
                     model=model.name, iteration=model.executions - 1, warmup=warmup)
    wanted = rec.device_rows_for if device else rec.wants_instructions   # the first counts for the verdict
    if not wanted(model.graph_id, model.core):
        # no instruction rows, but the transfers and device executions stay in the system profile
        timeline = [(kind, p, offset, ()) for kind, p, offset, _ in timeline if p.part.transfers or kind == "device"]
        tables = {}
    else:
        tables = instruction_tables(model)
    batches = []
    for kind, p, offset, times in timeline:
        part = p.part
        for t in part.transfers:
            offset += record_transfer(rec, model.profile, proj0 + offset, model.core, t.direction, t.bytes,
                                      t.value, exec_id=exec_id, graph_id=model.graph_id,
                                      op_id=model.op_ids.get(t.value))
        if kind == "device":
            rec.system_event("nc_exec_running", proj0 + offset, p.device_ns, source="neuron_hw", core=model.core,
                             exec_id=exec_id, flow_id=flow, model=model.name, partition=part.index)
            t = tables.get(part.index)
            if t is None or t.num_rows == 0:
                continue
            n = t.num_rows
            start = pc.add(t.column("rel_start_ns"), pa.scalar(proj0 + offset, pa.int64()))
            batches.append(t.drop_columns(["rel_start_ns"]).append_column("start_ns", start)
                           .append_column("exec_id", pa.array(np.full(n, exec_id, dtype=np.int64)))
                           .append_column("core", pa.array(np.full(n, model.core, dtype=np.int32))))
        else:
            starts, durs, ops, names = [], [], [], []
            for name, ns in times:
                starts.append(proj0 + offset)
                durs.append(ns)
                ops.append(model.op_ids.get(name))
                names.append(model.targets.get(name, name))
                offset += ns
            batches.append(pa.table({
                "engine": pa.array(["cpu"] * len(times)), "queue": pa.array(["host"] * len(times)),
                "opcode": pa.array(names), "pc": pa.array(np.arange(len(times), dtype=np.int32)),
                "dur_ns": pa.array(durs, pa.int64()), "flops": pa.array([0] * len(times), pa.int64()),
                "bytes_read": pa.array([0] * len(times), pa.int64()),
                "bytes_written": pa.array([0] * len(times), pa.int64()),
                "hbm_read_bytes": pa.array([0] * len(times), pa.int64()),
                "hbm_write_bytes": pa.array([0] * len(times), pa.int64()),
                "sem_wait_ns": pa.array([0] * len(times), pa.int64()), "op_id": pa.array(ops, pa.int64()),
                "start_ns": pa.array(starts, pa.int64()),
                "exec_id": pa.array(np.full(len(times), exec_id, dtype=np.int64)),
                "core": pa.array(np.full(len(times), model.core, dtype=np.int32))}))
    for b in batches:
        rec.append("instructions", b)
    if tables:
        _record_timelines(rec, model, exec_id, proj0, timeline)


def _record_timelines(rec: Recorder, model, exec_id: int, proj0: int, timeline) -> None:
    """The schedule's SbufAllocation and SemaphoreUpdate rows (compiler/records.py), stamped at this
    execution's device partitions' starts as their instruction rows are."""
    for kind, p, offset, _ in timeline:
        recs = p.sched.records if kind == "device" and p.sched is not None else {}
        offset += sum(pcie_ns(model.profile, t.bytes) for t in p.part.transfers)
        for name, cols in (("SbufAllocation", ("start_ts", "end_ts")), ("SemaphoreUpdate", ("timestamp",))):
            t = recs.get(name)
            if t is None or t.num_rows == 0:
                continue
            n = t.num_rows
            for c in cols:
                t = t.set_column(t.schema.get_field_index(c), c,
                                 pc.add(t.column(c), pa.scalar(proj0 + offset, pa.int64())))
            t = (t.append_column("exec_id", pa.array(np.full(n, exec_id, dtype=np.int64)))
                 .append_column("core", pa.array(np.full(n, model.core, dtype=np.int32))))
            if name == "SbufAllocation":
                t = t.append_column("graph_id", pa.array(np.full(n, model.graph_id, dtype=np.int64)))
                t = t.append_column("op_id", pa.array([model.op_ids.get(x) for x in t.column("node").to_pylist()],
                                                      pa.int64()))
            rec.append(name, t)


@clock.excluding
def record_graph_records(rec: Recorder, model) -> None:
    """Each device partition's Flow and TensorInfo rows (compiler/records.py), once per loaded graph."""
    for p in model.parts:
        recs = p.sched.records if p.sched is not None else {}
        for name in ("Flow", "TensorInfo"):
            t = recs.get(name)
            if t is None or t.num_rows == 0:
                continue
            n = t.num_rows
            rec.append(name, t.append_column("graph_id", pa.array(np.full(n, model.graph_id, dtype=np.int64)))
                       .append_column("partition", pa.array(np.full(n, p.part.index, dtype=np.int32))))
        if recs and rec.device_profile != "off":   # the facts the Instruction view joins to the instruction rows
            # imported here: it pulls in the lowering, which loading and running a saved NEFF never needs
            from neuron_stack.compiler.records import instruction_info
            t = instruction_info(p.sched.table, model.profile)
            n = t.num_rows
            if n:
                part = pa.array(np.full(n, p.part.index, np.int32))
                rec.append("instruction_info", t.add_column(0, "partition", part)
                           .add_column(0, "graph_id", pa.array(np.full(n, model.graph_id, dtype=np.int64))))
