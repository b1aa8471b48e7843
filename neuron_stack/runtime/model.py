"""The runtime (the ``libnrt`` analogue): load a NEFF onto a simulated NeuronCore and execute it.

At load every partition of the program becomes a ``torch.fx.GraphModule`` (generated Python, built
once): device partitions run with torch on the CPU and are timed by their precomputed schedule;
CPU islands run op by op and are *measured*, plus PCIe transfers of their seam tensors. Each
execution moves the projected clock (:mod:`neuron_stack.device.clock`) by simulated minus real time.

Every process publishes live statistics for ``neuron-monitor`` (:class:`traces.live.LivePublisher`).
With ``NEURON_RT_INSPECT_ENABLE=1`` it also records runs, sources, graphs, ops, executions, events,
memory and one row per device instruction into ``NEURON_RT_INSPECT_OUTPUT_DIR`` (default ``./output``).

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

import atexit
import json
import operator
import os
import socket
import sys
import threading
import time
import uuid as uuidlib
import weakref
from collections import ChainMap
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.fx

from neuron_stack.device import clock
from neuron_stack.compiler.driver import stack_version
from neuron_stack.device.profiles import get_profile
from neuron_stack.ir import Program
from neuron_stack.isa.neff import Neff


class NeuronRuntimeError(RuntimeError):
    """A runtime failure whose message is one line naming the problem and the fix."""


class OutOfDeviceMemory(NeuronRuntimeError):
    """The model does not fit in the HBM of its NeuronCore."""


class InputMismatch(NeuronRuntimeError, ValueError):
    """Inputs that differ from the shapes and dtypes the NEFF was compiled for."""


MEMORY_CATEGORIES = ("constants", "model_code", "tensors", "runtime_memory", "model_shared_scratchpad")


# -- rebuilding executable graphs -------------------------------------------------------------------

def resolve_target(name: str):
    """The callable of a Program node target: ``aten.addmm.default`` -> ``torch.ops.aten.addmm.default``."""
    if name == "getitem":
        return operator.getitem
    mod, _, attr = name.rpartition(".")
    if mod in ("operator", "_operator"):
        return getattr(operator, attr)
    if mod in ("math", "builtins"):
        import builtins
        import math
        return getattr(math if mod == "math" else builtins, attr)
    parts = name.split(".")
    if len(parts) >= 2 and hasattr(torch.ops, parts[0]):
        obj: Any = torch.ops
        for p in parts:
            obj = getattr(obj, p)
        return obj
    if mod.startswith("torch"):
        obj = torch
        for p in mod.split(".")[1:] + [attr]:
            obj = getattr(obj, p)
        return obj
    raise NeuronRuntimeError(f"unknown op {name!r} in the NEFF: recompile it with this neuron_stack")


def _from_json(a: Any, env: dict) -> Any:
    if isinstance(a, list):
        return [_from_json(x, env) for x in a]
    if isinstance(a, dict):
        if "node" in a and len(a) == 1:
            return env[a["node"]]
        if "dtype" in a and len(a) == 1:
            return getattr(torch, a["dtype"])
        if "device" in a and len(a) == 1:
            return torch.device(a["device"])
        if "layout" in a and len(a) == 1:
            return getattr(torch, a["layout"])
        if "memory_format" in a and len(a) == 1:
            return getattr(torch, a["memory_format"])
        if "dict" in a and len(a) == 1:
            return {k: _from_json(v, env) for k, v in a["dict"].items()}
    return a


_CAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: The TensorE operands of matmul-class ops (argument positions), the only inputs ``--auto-cast
#: matmult`` rounds: bias and epilogue inputs stay fp32, as in the ISA lowering. Ops not listed
#: (mm, bmm, dot, attention...) have only operands.
MATMUL_OPERANDS = {"aten.addmm": (1, 2), "aten.baddbmm": (1, 2), "aten.addmv": (1, 2),
                   "aten.convolution": (0, 1), "aten.convolution_backward": (0, 1, 2)}


def round_to(x, dtype):
    """Round an fp32 tensor to ``dtype`` precision, keeping fp32 storage.

    This is --auto-cast: a bf16 matmul with fp32 (PSUM) accumulation equals an fp32 matmul of
    bf16-rounded inputs, because every bf16 x bf16 product is exact in fp32.

    >>> round_to(torch.tensor([1.0 + 2**-10]), torch.bfloat16)
    tensor([1.])
    """
    if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
        return x.to(dtype).to(torch.float32)
    return x


class _Env(dict):
    """Node name -> FX node; a weight is fetched (``get_attr``) the first time it is referenced."""

    def __init__(self, graph: torch.fx.Graph, root: torch.nn.Module, constants: dict):
        super().__init__()
        self.graph, self.root, self.constants = graph, root, constants
        self.const_names: dict[torch.fx.Node, str] = {}

    def __missing__(self, name: str) -> torch.fx.Node:
        if name not in self.constants:
            raise KeyError(name)
        attr = f"_const_{len(self.const_names)}"
        self.root.register_buffer(attr, self.constants[name], persistent=False)
        node = self[name] = self.graph.get_attr(attr)
        self.const_names[node] = name
        return node


#: Deterministic ops without tensor inputs: a device graph computes them once, at load.
FOLDABLE_SOURCES = frozenset({"aten.arange", "aten.full", "aten.zeros", "aten.ones", "aten.scalar_tensor",
                              "aten.eye", "aten.linspace"})
_NEVER_FOLD = ("rand", "dropout", "bernoulli", "multinomial", "normal", "uniform", "exponential", "poisson", "empty")


def _foldable(n, values: dict) -> bool:
    """True if ``n`` depends on weights only (``permute(weight)``, ``arange``) and is deterministic."""
    from neuron_stack.compiler.partition import refs

    packet = n.target.rsplit(".", 1)[0]
    op = packet.rsplit(".", 1)[-1]
    if op.endswith("_") or any(w in op for w in _NEVER_FOLD):
        return False
    deps = list(refs([n.args, n.kwargs]))
    return all(d in values for d in deps) if deps else packet in FOLDABLE_SOURCES


def build_graph_module(program: Program, part: dict, auto_cast: str = "none", cast_type: str = "bf16", *,
                       constants: dict | None = None, inputs: list[str] | None = None,
                       output=None) -> torch.fx.GraphModule:
    """A GraphModule computing partition ``part`` of ``program``.

    Weights (``constants``: node name -> tensor) live in the module, so only activations are
    arguments: placeholders are ``inputs`` (default: the partition's non-constant inputs). It
    returns ``output`` (a JSON output structure, e.g. ``program.output_names``) or else the tuple
    of ``part["outputs"]``. In a device partition, ops that depend on weights only (the
    ``permute`` of a linear's weight, ``arange``) are computed here, once: constant folding. With
    ``--auto-cast`` a weight is rounded once here too, an activation once per execution however
    many matmuls read it. CPU islands keep every op, since each is measured.
    Example: ``build_graph_module(prog, prog.partitions[0], constants=prog.constants)``.
    """
    constants = dict(constants or {})      # plus the folded values, by node name
    by_name = {n.name: n for n in program.nodes}
    g = torch.fx.Graph()
    root = torch.nn.Module()
    env = _Env(g, root, constants)
    for name in inputs if inputs is not None else [n for n in part["inputs"] if n not in constants]:
        env[name] = g.placeholder(name)
    dtype = _CAST_DTYPES[cast_type]
    device = part["kind"] == "device"
    cast = device and auto_cast != "none"
    rounded: dict[torch.fx.Node, torch.fx.Node] = {}

    def rounded_value(a: torch.fx.Node) -> torch.fx.Node:
        if a not in rounded:
            if a in env.const_names:   # a weight: round it now, once
                attr = f"{a.target}_{cast_type}"
                root.register_buffer(attr, round_to(constants[env.const_names[a]], dtype), persistent=False)
                rounded[a] = g.get_attr(attr)
            else:
                rounded[a] = g.call_function(round_to, (a, dtype))
        return rounded[a]

    for name in part["nodes"]:
        n = by_name[name]
        if device and _foldable(n, constants):
            with torch.no_grad():
                value = resolve_target(n.target)(*_from_json(n.args, constants),
                                                 **{k: _from_json(v, constants) for k, v in n.kwargs.items()})
            if isinstance(value, torch.Tensor):
                constants[name] = value   # fetched (get_attr) where it is used
                continue
        args = _from_json(n.args, env)
        kwargs = {k: _from_json(v, env) for k, v in n.kwargs.items()}
        if cast and (n.op_class in ("matmul", "conv") or auto_cast == "all"):
            which = MATMUL_OPERANDS.get(n.target.rsplit(".", 1)[0]) if auto_cast == "matmult" else None
            args = [rounded_value(a) if isinstance(a, torch.fx.Node) and (which is None or i in which) else a
                    for i, a in enumerate(args)]
        out = g.call_function(resolve_target(n.target), tuple(args), kwargs)
        out.name = name
        env[name] = out
    g.output(_from_json(output, env) if output is not None else tuple(env[o] for o in part["outputs"]))
    return torch.fx.GraphModule(root, g)


class _TimedInterpreter(torch.fx.Interpreter):
    """Runs a CPU island op by op and measures each op's host time (ns)."""

    def __init__(self, gm):
        super().__init__(gm)
        self.times: list[tuple[str, int]] = []

    def run_node(self, n):
        if n.op != "call_function":
            return super().run_node(n)
        t0 = time.perf_counter_ns()
        out = super().run_node(n)
        self.times.append((n.name, time.perf_counter_ns() - t0))
        return out


# -- the per-process session: clock, cores, live statistics, recorder ------------------------------

class Session:
    """Process-wide runtime state: core lease, device memory per core, live publisher, recorder."""

    _instances: dict[str, "Session"] = {}    # one per target (a process may load trn1 and inf2 NEFFs)
    _lock = threading.Lock()

    @classmethod
    def get(cls, target: str) -> "Session":
        with cls._lock:
            s = cls._instances.get(target)
            if s is None or s.closed:
                s = cls._instances[target] = Session(target)
            return s

    def __init__(self, target: str):
        from traces.live import LivePublisher
        from neuron_stack.runtime.cores import acquire

        self.target = target
        self.profile = get_profile(target)
        self.run_id = uuidlib.uuid4().hex
        self.closed = False
        self.lease = acquire(self.profile)
        self.cores = list(self.lease.cores)
        self._next_core = 0
        self.device_memory: dict[int, dict[str, int]] = {c: dict.fromkeys(MEMORY_CATEGORIES, 0) for c in self.cores}
        self.host_constants = 0
        p = self.profile
        self.live = LivePublisher(
            tag=os.environ.get("NEURON_PROCESS_TAG") or None, target=target, instance_type=p.instance_type,
            command=" ".join([os.path.basename(sys.executable)] + sys.argv),
            hardware={"neuron_device_type": p.neuron_device_type, "neuron_device_version": p.neuron_device_version,
                      "neuroncore_version": p.neuroncore_version, "neuron_device_count": p.chips_per_instance,
                      "neuron_device_memory_size": p.hbm_bytes_per_chip,
                      "neuroncore_per_device_count": p.cores_per_chip,
                      "logical_neuroncore_config": 2 if p.name == "trn2" else 1})
        self.live.cores = list(self.cores)
        self.models: weakref.WeakSet[LoadedModel] = weakref.WeakSet()   # loaded here, described to a capture
        # Guards `recorder`: a capture's timer may close it while an execution is being recorded.
        self.record_lock = threading.Lock()
        self._capture_timer: threading.Timer | None = None
        self.recorder = Recorder.from_env(self)
        atexit.register(self.close)

    def next_core(self) -> int:
        """Round-robin placement of loaded models over this process's cores, as the real runtime does."""
        core = self.cores[self._next_core % len(self.cores)]
        self._next_core += 1
        return core

    def poll_capture(self) -> None:
        """Start a timed recording if neuron-top asked for one (``traces.live.request_capture``).

        Cheap enough for every execution: the publisher looks at the disk at most every 0.25 s.
        """
        req = self.live.poll_capture()
        if req is not None:
            self.start_capture(req["output_dir"], req["seconds"])

    def start_capture(self, output_dir: str, seconds: float) -> bool:
        """Record everything into ``output_dir`` for ``seconds``, then stop and flush by itself
        (a timer, so an idle workload finishes its capture too). Models already loaded are
        described first (sources, graphs, ops, fallbacks, memory), so the capture stands alone.
        Returns False when this process is already recording. Example:
        ``Session.get("trn1").start_capture("/tmp/cap", 5)``, then ``traces.finalize("/tmp/cap")``.
        """
        with self.record_lock:
            if self.recorder is not None or self.closed:
                return False
            try:
                rec = Recorder(self, output_dir)
                for m in list(self.models):
                    m._record_load(rec, history=False)
            except Exception as exc:  # a bad capture directory must not break the workload
                print(f"neuron_stack: warning: capture into {output_dir} failed ({exc}); the workload "
                      "continues without recording", file=sys.stderr)
                return False
            self.recorder = rec
            self._capture_timer = threading.Timer(float(seconds), self.stop_capture, args=(rec,))
            self._capture_timer.daemon = True
            self._capture_timer.start()
        return True

    def stop_capture(self, rec: "Recorder") -> None:
        """End the timed recording ``rec`` (if still running): flush and close its segments."""
        with self.record_lock:
            if self.recorder is not rec:
                return
            self.recorder = None
            rec.close()

    def close(self) -> None:
        with self.record_lock:
            if self.closed:
                return
            self.closed = True
            if self._capture_timer is not None:
                self._capture_timer.cancel()
            if self.recorder is not None:
                self.recorder.close()
                self.recorder = None
        self.live.close()
        self.lease.release()


class Recorder:
    """Writes the trace tables through :class:`traces.Writer` (profiling on)."""

    def __init__(self, session: Session, out_dir: str):
        import traces

        self.session = session
        self.out_dir = out_dir
        self.sources_seen: set[int] = set()
        self.files_seen: set[str] = set()
        self.graph_settings: dict[str, set[str]] = {}
        filt = os.environ.get("NEURON_RT_INSPECT_EVENT_FILTER_NC", "").strip()
        if filt:
            from neuron_stack.runtime.cores import parse_core_list
            self.core_filter = set(parse_core_list(filt, session.profile.cores_per_instance,
                                                   name="NEURON_RT_INSPECT_EVENT_FILTER_NC"))
        else:
            self.core_filter = None
        # NEURON_RT_INSPECT_DEVICE_PROFILE as the real runtime: 0 = no device (instruction) rows,
        # 1/model = the first execution of each NEFF per core, session = every execution (default).
        mode = os.environ.get("NEURON_RT_INSPECT_DEVICE_PROFILE", "").strip().lower() or "session"
        if mode not in ("0", "1", "model", "session"):
            raise ValueError(f"NEURON_RT_INSPECT_DEVICE_PROFILE={mode!r} is not one of 0, 1, model, session")
        self.device_profile = {"0": "off", "1": "model"}.get(mode, mode)
        self.device_profiled: set[tuple[int, int]] = set()
        from traces.schema import SCHEMA_VERSION
        meta = dict(session.profile.metadata())
        meta.update({"schema_version": SCHEMA_VERSION, "stack_version": stack_version(), "target": session.target,
                     "is_simulation": "true", "device_profile": self.device_profile,
                     "warmup_executions": "1"})
        now = clock.wall_ns()
        self.writer = traces.Writer(out_dir, run={
            "run_id": session.run_id, "pid": os.getpid(), "tag": session.live.tag,
            "command": session.live.command, "host": socket.gethostname(), "target": session.target,
            "rank": int(os.environ.get("RANK", "0") or 0), "node": int(os.environ.get("GROUP_RANK", "0") or 0),
            "wall_start_ns": now, "start_ns": now + clock.offset_ns()}, metadata=meta)

    @classmethod
    def from_env(cls, session: Session) -> "Recorder | None":
        if os.environ.get("NEURON_RT_INSPECT_ENABLE", "0").strip().lower() in ("", "0", "false", "no", "off"):
            return None
        return cls(session, os.environ.get("NEURON_RT_INSPECT_OUTPUT_DIR") or "./output")

    def append(self, table: str, rows) -> None:
        self.writer.append(table, rows)

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

    def event(self, event_kind: str, *, ts_ns: int | None = None, dur_ns: int = 0, core: int | None = None,
              graph_id: int | None = None, op_id: int | None = None, source_id: int | None = None,
              **detail) -> None:
        ts = clock.now_ns() if ts_ns is None else ts_ns
        self.writer.append("events", {
            "ts_ns": [ts], "wall_ns": [ts - clock.offset_ns()], "dur_ns": [dur_ns],
            "run_id": [self.session.run_id], "kind": [event_kind], "core": [core], "graph_id": [graph_id],
            "op_id": [op_id], "source_id": [source_id], "detail": [json.dumps(detail, default=str)]})

    def close(self) -> None:
        import traces
        try:
            self.writer.close(status="ok")
        except traces.TraceError as exc:  # a full disk at exit: one warning line, never a traceback
            import logging
            logging.getLogger("traces").warning("%s", exc)


def source_id(src) -> int | None:
    """The trace store's id of a source line (``stable_id(file, line)``)."""
    from traces.ids import stable_id
    return stable_id(src.file, src.line) if src is not None else None


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
        from traces.ids import new_id

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

        # weights by node name (get_attr nodes alias a constant): they live inside the GraphModules
        self.const_env = dict(prog.constants)
        for n in prog.nodes:
            if n.target == "get_attr":
                self.const_env[n.name] = prog.constants[n.args[0]]
        self.out_refs = prog.output_names
        # Executable partitions, built once: generated Python, not a per-node interpreter.
        # One device partition (the common case) is built to take the graph's inputs and return
        # its outputs directly: the fast path is a single call with nothing to look up.
        single = len(prog.partitions) == 1 and prog.partitions[0]["kind"] == "device"
        cast_type = flags.get("auto_cast_type", "bf16")
        self.parts = []
        for p in prog.partitions:
            gm = build_graph_module(prog, p, self.auto_cast, cast_type, constants=self.const_env,
                                    inputs=prog.input_names if single else None,
                                    output=self.out_refs if single else None)
            sched = neff.schedules.get(p["index"])
            transfer_ns = sum(self._pcie_ns(t["bytes"]) for t in p["transfers"])
            self.parts.append({"part": p, "gm": gm, "sched": sched, "transfer_ns": transfer_ns,
                               "inputs": [n for n in p["inputs"] if n not in self.const_env],
                               "device_ns": int(sched["device_ns"]) if sched else 0})
        self.single = self.parts[0]["gm"].forward if single else None
        self.busy_ns: dict[str, int] = {}
        self.flops = 0
        self.hbm = [0, 0]
        for p in self.parts:
            if p["sched"]:
                for e, ns in p["sched"]["busy_ns"].items():
                    self.busy_ns[e] = self.busy_ns.get(e, 0) + ns
                self.flops += p["sched"]["flops"]
                self.hbm[0] += p["sched"]["hbm_read_bytes"]
                self.hbm[1] += p["sched"]["hbm_write_bytes"]
        self.static_device_ns = sum(p["device_ns"] + p["transfer_ns"] for p in self.parts
                                    if p["part"]["kind"] == "device")
        self.has_cpu = any(p["part"]["kind"] == "cpu" for p in self.parts)
        self._reserve_memory()   # last: a NEFF that cannot be built must not hold device memory

        self.op_ids = {n.name: new_id() for n in prog.nodes if n.is_op}
        self._instr_tables: dict[int, pa.Table] | None = None
        live = session.live
        live.model_loaded(name=self.name, uuid=neff.header["uuid"], model_id=self.graph_id & 0x7FFFFFFF,
                          core=self.core, device_bytes=dict(self.memory), host_bytes={"constants": self.memory["constants"]})
        live.count_event("cache_hit" if info.get("cache_hit") else "compile", op=self.name)
        if info.get("recompile_of"):
            live.count_event("recompile", reason=info.get("recompile_reason", ""), source=_where(info.get("source")))
        for n in prog.nodes:
            if n.is_compute and n.placement == "cpu_fallback":
                live.count_event("cpu_fallback", reason=n.fallback_reason, source=_where(n.source), op=n.target)
        self.compile_info = info
        with session.record_lock:
            session.models.add(self)
            if session.recorder is not None:
                self._record_load(session.recorder)

    # -- memory ------------------------------------------------------------------------------
    def _pcie_ns(self, nbytes: int) -> int:
        return int(self.profile.dma_fixed_ns + nbytes / self.profile.pcie_gbps)

    def _reserve_memory(self) -> None:
        plan = dict(self.program.stats.get("memory", {}))
        self.memory = {c: int(plan.get(c, 0)) for c in MEMORY_CATEGORIES}
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

    # -- recording ------------------------------------------------------------------------------
    def _record_load(self, rec: Recorder, history: bool = True) -> None:
        """Describe this model to ``rec``: sources, graph, ops, fallbacks, memory; with ``history``
        also its compile, cache hit, recompile and load events (a capture that starts later
        skips those: they happened before it)."""
        prog, info = self.program, self.compile_info
        now = clock.now_ns()
        src_rows = {"source_id": [], "file": [], "line": [], "function": [], "code": []}
        for n in prog.nodes:
            s = n.source
            if s is None:
                continue
            sid = source_id(s)
            if sid in rec.sources_seen:
                continue
            rec.sources_seen.add(sid)
            for k, v in zip(src_rows, (sid, s.file, s.line, s.function, s.code)):
                src_rows[k].append(v)
        if src_rows["source_id"]:
            rec.append("sources", src_rows)
        files = {f: t for f, t in self.neff.source_files.items() if f not in rec.files_seen}
        if files:
            import hashlib
            rec.files_seen.update(files)
            rec.append("source_files", {"file": list(files), "text": list(files.values()),
                                        "sha1": [hashlib.sha1(t.encode()).hexdigest() for t in files.values()]})
        call_site = info.get("source")
        sig = ", ".join(f"{tuple(s.shape)} {s.dtype}" for s in self.input_specs if s is not None)
        stats = prog.stats
        # Timing model and auto-cast are per graph (a lowering gap falls back to roofline); the
        # profile's metadata names every value its graphs used.
        rec.note_graph_settings(timing_model=stats.get("timing_model", "instruction"),
                                auto_cast=prog.flags.get("auto_cast", "none"))
        rec.append("graphs", {
            "graph_id": [self.graph_id], "run_id": [self.session.run_id], "name": [self.name],
            "kind": [info.get("kind", "trace")], "neff_hash": [self.neff.header["hash"]], "input_signature": [sig],
            "compile_wall_ns": [int(info.get("compile_wall_ns", 0))], "compile_ns": [int(info.get("compile_wall_ns", 0))],
            "cache_hit": [bool(info.get("cache_hit", False))], "recompile_of": [info.get("recompile_of")],
            "recompile_reason": [info.get("recompile_reason", "")], "source_id": [source_id(call_site)],
            "target": [self.neff.target], "flags": [json.dumps(prog.flags)], "num_ops": [stats.get("num_ops", 0)],
            "num_device_ops": [stats.get("num_device_ops", 0)], "num_instructions": [stats.get("num_instructions", 0)]})
        if call_site is not None and source_id(call_site) not in rec.sources_seen:
            rec.sources_seen.add(source_id(call_site))
            rec.append("sources", {"source_id": [source_id(call_site)], "file": [call_site.file],
                                   "line": [call_site.line], "function": [call_site.function],
                                   "code": [call_site.code]})
        ops = [n for n in prog.nodes if n.is_compute]
        rec.append("ops", {
            "op_id": [self.op_ids[n.name] for n in ops], "graph_id": [self.graph_id] * len(ops),
            "name": [n.name for n in ops], "aten_op": [n.target for n in ops], "op_class": [n.op_class for n in ops],
            "placement": [n.placement for n in ops], "fallback_reason": [n.fallback_reason for n in ops],
            "fused_into": [n.fused_into for n in ops], "module_path": [n.module_path for n in ops],
            "source_id": [source_id(n.source) for n in ops],
            "shape": [str(list(n.outputs[0].shape)) if n.outputs else "" for n in ops],
            "dtype": [n.outputs[0].dtype if n.outputs else "" for n in ops],
            "flops": [n.flops for n in ops], "bytes": [n.bytes for n in ops]})
        compile_ns = int(info.get("compile_wall_ns", 0))
        if history and info.get("cache_hit"):
            rec.event("cache_hit", ts_ns=now, graph_id=self.graph_id, model=self.name,
                      neff_hash=self.neff.header["hash"], path=info.get("cache_path", ""))
        elif history and compile_ns:
            rec.event("compile", ts_ns=now - compile_ns, dur_ns=compile_ns, graph_id=self.graph_id,
                      source_id=source_id(call_site), model=self.name, kind=info.get("kind", "trace"))
        if history and info.get("recompile_of"):
            rec.event("recompile", ts_ns=now, graph_id=self.graph_id, source_id=source_id(call_site),
                      reason=info.get("recompile_reason", ""), recompile_of=info["recompile_of"])
        for n in ops:
            if n.placement == "cpu_fallback":
                rec.event("cpu_fallback", ts_ns=now, graph_id=self.graph_id, op_id=self.op_ids[n.name],
                          source_id=source_id(n.source), op=n.target, reason=n.fallback_reason)
        if history:
            rec.event("load", ts_ns=now, core=self.core, graph_id=self.graph_id, model=self.name,
                      uuid=self.neff.header["uuid"], bytes=self.memory)
        rec.append("memory", {"ts_ns": [now] * len(self.memory), "run_id": [self.session.run_id] * len(self.memory),
                              "core": [self.core] * len(self.memory), "location": ["device"] * len(self.memory),
                              "category": list(self.memory),
                              "bytes": [self.session.device_memory[self.core][k] for k in self.memory]})

    def _instructions(self) -> dict[int, pa.Table]:
        """Each device partition's schedule with its op_id column, computed once per loaded graph."""
        if self._instr_tables is None:
            names = list(self.op_ids)
            ids = pa.array([self.op_ids[n] for n in names], pa.int64())
            out = {}
            for p in self.parts:
                if p["sched"] is None:
                    continue
                t = p["sched"]["table"]
                idx = pc.index_in(t.column("node"), value_set=pa.array(names, pa.string()))
                op_id = pc.take(ids, idx)
                keep = ["engine", "queue", "opcode", "pc", "dur_ns", "flops", "bytes_read", "bytes_written",
                        "sem_wait_ns"]
                cols = {k: t.column(k) for k in keep}
                cols["op_id"] = op_id
                cols["rel_start_ns"] = t.column("rel_start_ns")
                out[p["part"]["index"]] = pa.table(cols)
            self._instr_tables = out
        return self._instr_tables

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
        with torch.no_grad():
            return self._run(inputs, start_ns)

    def _run(self, inputs: list, start_ns: int | None = None) -> list:
        session = self.session
        session.poll_capture()
        rec = session.recorder
        wall0 = time.time_ns()
        t0 = time.perf_counter_ns()
        cpu_ns = 0
        timeline: list[tuple[str, dict, int, Any]] = []   # (kind, part, offset_ns, cpu op times)
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
                part = p["part"]
                args = [values[n] for n in p["inputs"]]
                cursor += p["transfer_ns"]
                if part["kind"] == "device":
                    outs = p["gm"](*args)
                    timeline.append(("device", p, cursor - p["transfer_ns"], None))
                    cursor += p["device_ns"]
                else:
                    interp = _TimedInterpreter(p["gm"])
                    outs = interp.run(*args)
                    island = sum(ns for _, ns in interp.times)
                    timeline.append(("cpu", p, cursor - p["transfer_ns"], interp.times))
                    cursor += island
                    cpu_ns += island + p["transfer_ns"]
                values.update(zip(part["outputs"], outs))
            device_ns = cursor
            result = _from_json(self.out_refs, values)
        real = time.perf_counter_ns() - t0
        wall1 = wall0 + real
        # start_ns: the projected start chosen by a multi-core scheduler (DataParallel, tensor parallel)
        proj0 = wall0 + clock.offset_ns() if start_ns is None else start_ns
        clock.advance(real, device_ns)
        warmup = self.executions == 0
        self.executions += 1
        session.live.record_execution(
            core=self.core, wall_end=wall1 / 1e9, proj_end_ns=proj0 + device_ns, total_latency_s=device_ns / 1e9,
            device_latency_s=(device_ns - cpu_ns) / 1e9, busy_ns=self.busy_ns, flops=self.flops)
        if rec is not None:
            with session.record_lock:
                if session.recorder is rec:   # not ended by its timer meanwhile
                    self._record_execution(rec, proj0, wall0, wall1, device_ns, cpu_ns, warmup, timeline)
        return result

    def _record_execution(self, rec: Recorder, proj0, wall0, wall1, device_ns, cpu_ns, warmup, timeline) -> None:
        from traces.ids import new_id
        exec_id = new_id()
        busy = self.busy_ns
        rec.append("executions", {
            "exec_id": [exec_id], "run_id": [self.session.run_id], "graph_id": [self.graph_id], "core": [self.core],
            "iteration": [self.executions - 1], "wall_start_ns": [wall0], "wall_end_ns": [wall1],
            "start_ns": [proj0], "end_ns": [proj0 + device_ns], "device_ns": [device_ns], "status": ["completed"],
            "warmup": [warmup], "flops": [self.flops],
            **{f"{e}_busy_ns": [busy.get(e, 0)] for e in ("tensor", "vector", "scalar", "gpsimd", "sync", "dma", "cc")},
            "cpu_fallback_ns": [cpu_ns], "hbm_read_bytes": [self.hbm[0]], "hbm_write_bytes": [self.hbm[1]]})
        if rec.core_filter is not None and self.core not in rec.core_filter:
            return
        if not rec.wants_instructions(self.graph_id, self.core):
            timeline = [(kind, p, offset, ()) for kind, p, offset, _ in timeline if p["part"]["transfers"]]
            tables = {}
        else:
            tables = self._instructions()
        batches = []
        for kind, p, offset, times in timeline:
            part = p["part"]
            for t in part["transfers"]:
                rec.event("host_transfer", ts_ns=proj0 + offset, dur_ns=self._pcie_ns(t["bytes"]), core=self.core,
                          graph_id=self.graph_id, op_id=self.op_ids.get(t["value"]), value=t["value"],
                          direction=t["direction"], bytes=t["bytes"])
                offset += self._pcie_ns(t["bytes"])
            if kind == "device":
                t = tables.get(part["index"])
                if t is None or t.num_rows == 0:
                    continue
                n = t.num_rows
                start = pc.add(t.column("rel_start_ns"), pa.scalar(proj0 + offset, pa.int64()))
                batches.append(t.drop_columns(["rel_start_ns"]).append_column("start_ns", start)
                               .append_column("exec_id", pa.array(np.full(n, exec_id, dtype=np.int64)))
                               .append_column("core", pa.array(np.full(n, self.core, dtype=np.int32))))
            else:
                starts, durs, ops, names = [], [], [], []
                for name, ns in times:
                    starts.append(proj0 + offset)
                    durs.append(ns)
                    ops.append(self.op_ids.get(name))
                    names.append(self.targets.get(name, name))
                    offset += ns
                batches.append(pa.table({
                    "engine": pa.array(["cpu"] * len(times)), "queue": pa.array(["host"] * len(times)),
                    "opcode": pa.array(names), "pc": pa.array(np.arange(len(times), dtype=np.int32)),
                    "dur_ns": pa.array(durs, pa.int64()), "flops": pa.array([0] * len(times), pa.int64()),
                    "bytes_read": pa.array([0] * len(times), pa.int64()),
                    "bytes_written": pa.array([0] * len(times), pa.int64()),
                    "sem_wait_ns": pa.array([0] * len(times), pa.int64()), "op_id": pa.array(ops, pa.int64()),
                    "start_ns": pa.array(starts, pa.int64()),
                    "exec_id": pa.array(np.full(len(times), exec_id, dtype=np.int64)),
                    "core": pa.array(np.full(len(times), self.core, dtype=np.int32))}))
        for b in batches:
            rec.append("instructions", b)

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
