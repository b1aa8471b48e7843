"""Host CPU utilisation and host memory, sampled while a profile records (``NEURON_RT_INSPECT_CPU_UTIL`` /
``_HOST_MEMORY``): rows for the recorder's ``cpu_usage``, ``host_memory`` and ``memory`` tables."""
from __future__ import annotations

import sys
import threading

from neuron_stack.device import clock


class HostSampler:
    """Host CPU utilisation per CPU and on average, and host memory in use (the host's, and the process's RSS
    as ``memory`` rows), sampled with psutil (``NEURON_RT_INSPECT_CPU_UTIL`` / ``_HOST_MEMORY``): at the start,
    every ``period`` s and at the end, each CPU figure the average since the previous sample (the real tool
    averages over 1 s)."""

    def __init__(self, rec, period: float = 1.0):
        import psutil
        self.rec, self.period, self.psutil, self._process = rec, period, psutil, psutil.Process()
        self._stop = threading.Event()
        psutil.cpu_percent(percpu=True)   # starts psutil's interval: the next call averages since now
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="neuron-host-sampler", daemon=True)
        self._thread.start()

    def sample(self) -> None:
        ts, cfg, run_id = clock.now_ns(), self.rec.config, self.rec.session.run_id
        if cfg.cpu_util:
            per = self.psutil.cpu_percent(percpu=True)
            ids = [str(i) for i in range(len(per))] + ["average"]
            vals = list(per) + [sum(per) / max(len(per), 1)]
            self.rec.append("cpu_usage", {"ts_ns": ts, "run_id": run_id, "cpu_id": ids, "util_percent": vals})
        if cfg.host_memory:
            mem = self.psutil.virtual_memory()
            self.rec.append("host_memory", {"ts_ns": [ts], "run_id": run_id, "used_bytes": [mem.total - mem.available],
                                            "used_percent": [mem.percent]})
            # the process's own host memory as neuron-monitor reports it live (monitor/collect.py): its RSS, of
            # which the runtime's host constants, the rest application memory; neuron-top --replay shows these
            rss, constants = self._process.memory_info().rss, self.rec.session.host_constants
            self.rec.append("memory", {"ts_ns": [ts, ts], "run_id": run_id, "core": [None, None],
                                       "location": ["host", "host"], "category": ["constants", "application_memory"],
                                       "bytes": [constants, max(rss - constants, 0)]})

    @clock.background
    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            sys.setprofile(None)   # a profiler tracing Python (torch.profiler with_stack) leaves this thread alone
            self.sample()

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout=2)
            self.sample()
