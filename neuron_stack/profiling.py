"""Capture with ``torch.profiler``, in the names of the real ``torch_neuronx.profiling`` (a script written for
TorchNeuron changes only its import line)::

    from torch.profiler import profile, ProfilerActivity, schedule, record_function
    from neuron_stack.profiling import NeuronConfig, ProfileMode, NeuronProfiler

    cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME, ProfileMode.CPU_UTIL],
                       profile_output_dir="./profile_output", capture_enabled_for_nc="0", max_events_per_nc=500000)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=cfg,
                 schedule=schedule(wait=1, warmup=1, active=2), on_trace_ready=NeuronProfiler(cfg).export_trace) as p:
        for step in range(4):
            with record_function("step"):
                model(x)
            p.step()

Each active window of the schedule becomes one profile,
``<profile_output_dir>/<host>_pid_<pid>/<time>_<n>/profile.duckdb`` (plus torch's own ``trace.json``):
device instructions (``ProfileMode.DEVICE``), the system profile (``RUNTIME``: ``nrt_load``, ``nrt_execute``,
tensor reads and writes, ``nc_exec_running``), host CPU and memory samples (``CPU_UTIL``, ``HOST_MEMORY``)
and torch.profiler's own events (``record_function`` regions, ATen ops and, with ``with_stack``, Python
frames: the user's and torch's, never this project's, :mod:`neuron_stack.runtime.host_frames`) as ``framework``
events of ``SystemProfileEvents``.

How it hooks in: torch 2.13 accepts ``ProfilerActivity.PrivateUse1`` without a C++ profiler backend (it
warns, which this module silences) and keeps ``experimental_config`` as given, so ``NeuronConfig`` is an
``_ExperimentalConfig``. The runtime asks on every load and execution whether a torch.profiler window is
recording (``torch._C._autograd._profiler_enabled()``, true only in the schedule's active steps) and, if a
:class:`NeuronProfiler` exists, records into that window's directory; ``export_trace`` closes the window.
Do not combine with ``NEURON_RT_INSPECT_ENABLE=1`` (the real docs say the same): that recording wins.

>>> cfg = NeuronConfig(modes=[ProfileMode.RUNTIME], capture_enabled_for_nc="0-1")
>>> c = cfg.inspect_config(); c.device_profile, c.system_profile, c.cpu_util
('off', True, False)
"""
from __future__ import annotations

import enum
import os
import socket
import threading
import time
import warnings
import weakref
from pathlib import Path

import torch

import traces
from neuron_stack.device import clock
from neuron_stack.runtime import host_frames
from neuron_stack.runtime.cores import parse_core_list
from neuron_stack.runtime.inspect_config import MAX_EVENTS_PER_NC, InspectConfig, InspectConfigError, max_events
from neuron_stack.runtime.recorder import Recorder
from neuron_stack.runtime.session import Session

__all__ = ["NeuronConfig", "ProfileMode", "NeuronProfiler"]

# torch warns "The privateuseone is not a valid device option." (or "neuron" once renamed) when no C++ profiler
# backend is registered for PrivateUse1; this module is that backend.
warnings.filterwarnings("ignore", message=r"The \w+ is not a valid device option")


class ProfileMode(enum.Enum):
    """What a capture records: ``DEVICE`` instructions, ``RUNTIME`` system events, host ``CPU_UTIL`` and
    ``HOST_MEMORY`` samples."""
    DEVICE = "device"
    RUNTIME = "runtime"
    CPU_UTIL = "cpu_util"
    HOST_MEMORY = "host_memory"


class NeuronConfig(torch._C._profiler._ExperimentalConfig):
    """The capture settings, passed as ``torch.profiler.profile(experimental_config=...)`` and to
    :class:`NeuronProfiler`. ``capture_enabled_for_nc`` ("0,2-3") limits capture to those NeuronCores, counted
    as the process's own (``neuron:0`` is 0 whichever machine core it holds, as the real runtime counts);
    ``max_events_per_nc`` is the system-event ring size per core. A bad value raises one line.
    Example: ``NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], capture_enabled_for_nc="0")``."""

    def __init__(self, modes=(ProfileMode.DEVICE, ProfileMode.RUNTIME), profile_output_dir: str = "./profile_output",
                 capture_enabled_for_nc: str | None = None, max_events_per_nc: int = MAX_EVENTS_PER_NC,
                 neff_cache_dir: str | None = None, precache_node_info: bool = False):
        super().__init__()
        bad = [m for m in modes if not isinstance(m, ProfileMode)]
        if bad or not modes:
            raise InspectConfigError(f"NeuronConfig(modes=...): {bad[0] if bad else 'nothing'!r} is not a ProfileMode: "
                                     "use ProfileMode.DEVICE, RUNTIME, CPU_UTIL or HOST_MEMORY")
        self.modes = tuple(modes)
        self.profile_output_dir = str(profile_output_dir)
        if capture_enabled_for_nc is not None:
            parse_core_list(str(capture_enabled_for_nc), 1 << 16, name="NeuronConfig(capture_enabled_for_nc)")
        self.capture_enabled_for_nc = capture_enabled_for_nc
        self.max_events_per_nc = max_events(max_events_per_nc, "NeuronConfig(max_events_per_nc)")
        self.neff_cache_dir = neff_cache_dir
        self.precache_node_info = precache_node_info

    def inspect_config(self) -> InspectConfig:
        """The runtime's view of these settings (``NEURON_RT_INSPECT_EVENT_FILTER_TYPE`` still applies)."""
        env = InspectConfig.from_env({k: v for k, v in os.environ.items() if k.endswith("_EVENT_FILTER_TYPE")})
        return InspectConfig(
            device_profile="session" if ProfileMode.DEVICE in self.modes else "off",
            system_profile=ProfileMode.RUNTIME in self.modes, cpu_util=ProfileMode.CPU_UTIL in self.modes,
            host_memory=ProfileMode.HOST_MEMORY in self.modes, max_events_per_nc=self.max_events_per_nc,
            include_types=env.include_types, exclude_types=env.exclude_types)


_current: "weakref.ref[NeuronProfiler] | None" = None


class NeuronProfiler:
    """Turns each torch.profiler active window into a profile; use ``export_trace`` as ``on_trace_ready``.
    ``traces`` lists the ``profile.duckdb`` of every window exported so far.
    Example: ``profile(..., on_trace_ready=NeuronProfiler(cfg).export_trace)``."""

    def __init__(self, config: NeuronConfig):
        global _current
        if not isinstance(config, NeuronConfig):
            raise InspectConfigError(f"NeuronProfiler needs a NeuronConfig, got {type(config).__name__}")
        self.config = config
        self.traces: list[Path] = []
        self._lock = threading.Lock()
        self._recs: list[tuple[Session, Recorder]] = []
        self._dir: Path | None = None
        self._cycle = 0
        self._warned = False
        _current = weakref.ref(self)

    def _window_dir(self) -> Path:
        if self._dir is None:
            self._cycle += 1
            self._dir = (Path(self.config.profile_output_dir) / f"{socket.gethostname()}_pid_{os.getpid()}"
                         / f"{time.strftime('%Y%m%dT%H%M%S')}_{self._cycle}")
        return self._dir

    def attach(self, session: Session) -> None:
        """Record ``session`` into the open window (the runtime calls this while torch.profiler records)."""
        with self._lock:
            if any(s is session for s, _ in self._recs):
                return
            if session.recorder is not None:
                if not self._warned:
                    self._warned = True
                    warnings.warn("neuron_stack.profiling: this process is already recording (NEURON_RT_INSPECT_ENABLE"
                                  "=1 or a neuron-top capture): torch.profiler's window adds framework events only; "
                                  "use one or the other", stacklevel=3)
                return
            rec = Recorder(session, str(self._window_dir()), self.config.inspect_config())
            # the process's own core indices (neuron:0 is 0), as the real runtime counts them
            if self.config.capture_enabled_for_nc is not None:
                rec.set_core_filter(str(self.config.capture_enabled_for_nc), "capture_enabled_for_nc")
            rec.device_off = ("ProfileMode.DEVICE is not in NeuronConfig(modes)", "add ProfileMode.DEVICE")
            if session.begin_recording(rec):
                self._recs.append((session, rec))
            else:
                rec.close()

    def export_trace(self, prof) -> Path:
        """``on_trace_ready``: close the window, add torch.profiler's events, write ``trace.json`` (torch's own
        Chrome trace) and finalise the window's ``profile.duckdb``; return its path."""
        with self._lock:
            recs, self._recs = self._recs, []
            out = self._window_dir()
            self._dir = None
        for session, rec in recs:
            session.stop_capture(rec)
        run = dict(recs[0][1].writer.run) if recs else {}
        for k in ("status", "wall_end_ns", "end_ns"):
            run.pop(k, None)
        results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
        acts, dropped = host_frames.user_events(results.trace_activities()) if results is not None else ([], 0)
        host_frames.write_framework_events(acts, out, run, dropped)
        if results is not None:
            host_frames.write_chrome_trace(results, acts, out / "trace.json",
                                           {"neuron_framework_events_dropped": str(dropped)})
        path = traces.finalize(out)
        self.traces.append(path)
        return path




def _capture_hook(session: Session) -> None:
    """On every load and execution: join the recording torch.profiler window, if any."""
    prof = _current() if _current is not None else None
    if prof is not None and torch._C._autograd._profiler_enabled():
        with clock.excluded():   # opening the window's recording is not the user's time
            prof.attach(session)


Session.capture_hooks.append(_capture_hook)
