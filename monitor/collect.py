"""Build neuron-monitor documents (reference §1.3–§1.5) from the live snapshots and psutil.

Each process using the runtime publishes a snapshot (``traces.live``); the collector reads them
without any lock, turns cumulative counters into per-period deltas and the projected clock into
utilization, and adds the host figures from psutil.

>>> from monitor.config import load_config
>>> doc = Collector(load_config(None)).collect()
>>> sorted(doc)
['instance_info', 'neuron_hardware_info', 'neuron_runtime_data', 'system_data']
"""
from __future__ import annotations

import functools
import os
import time

import numpy as np
import psutil

from monitor.config import Config, default_config
from monitor.merge import merge_runtimes
from monitor.triggers import Watch
from traces import identity, live, monitor_figures
from traces.ids import host_name, instance_id
from traces.vocab import MONITOR_ENGINES

PERCENTILES = (("p0", 0), ("p1", 1), ("p25", 25), ("p50", 50), ("p75", 75), ("p99", 99), ("p100", 100))
_CPU_FIELDS = (("user", "user"), ("nice", "nice"), ("system", "system"), ("idle", "idle"),
               ("io_wait", "iowait"), ("irq", "irq"), ("soft_irq", "softirq"))
MODEL_DEVICE_MEMORY = ("constants", "model_code", "runtime_memory", "tensors")
REAL_CORE_MEMORY = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")
ENGINES = MONITOR_ENGINES
_OLD_CLOCK_EXECUTIONS = 33   # an older publisher's in-flight time: the median gap of its last executions


def _process_memory(runtime: dict) -> None:
    """The process's host memory, measured: ``application_memory`` (neuron-top's ``App. Memory``) is its
    resident set (psutil RSS) less the runtime's tensors, constants and DMA buffers, so the ``host`` total
    (neuron-top's ``Host Used Memory``) is the process's RSS. Read here, once per merged process, so an idle
    process's figure is current and a process with several targets is counted once."""
    block = runtime["report"].get("memory_used")
    if block is None:
        return
    used = block["neuron_runtime_used_bytes"]
    host = used["usage_breakdown"]["host"]
    try:
        rss = _process(runtime["pid"]).memory_info().rss
    except psutil.Error:   # it ended meanwhile, or belongs to a user whose memory we may not read
        block["error"] = block["error"] or "cannot read the process's memory (ended, or another user's)"
        return
    host["application_memory"] = max(int(rss) - sum(v for k, v in host.items() if k != "application_memory"), 0)
    used["host"] = sum(host.values())


@functools.lru_cache(maxsize=1024)
def _process(pid: int) -> psutil.Process:
    """``psutil.Process(pid)``, made once per pid: making one parses /proc/<pid>/stat, and each refresh reads
    three figures of every process (its reads do not check the pid for reuse either way)."""
    return psutil.Process(pid)


_PERCENTILE_KEYS = tuple(k for k, _ in PERCENTILES)
_QUANTILES = np.array([p for _, p in PERCENTILES], dtype=np.float64) / 100


def _percentiles(values: np.ndarray) -> np.ndarray:
    """``np.percentile(values, [0, 1, 25, 50, 75, 99, 100], axis=1).T`` (its default linear method), row by
    row of a 2-D array, without numpy's general set-up: that was most of a refresh's latency statistics.

    >>> v = np.array([[4.0, 1.0, 3.0, 2.0]])
    >>> bool((_percentiles(v) == np.percentile(v, [p for _, p in PERCENTILES], axis=1).T).all())
    True
    """
    n = values.shape[1]
    ordered = np.sort(values, axis=1)
    virtual = (n - 1) * _QUANTILES
    below = np.floor(virtual).astype(np.intp)
    a, b = ordered[:, below], ordered[:, np.minimum(below + 1, n - 1)]
    t = virtual - below
    diff = b - a
    # numpy's own interpolation (np.lib's _lerp), so the figures match it to the last bit
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


def _r(x: float, nd: int = 2) -> float:
    return round(float(x), nd)


class Collector:
    """Turns live snapshots into neuron-monitor documents; deltas are since the group's last report.

    ``collect()`` reports every configured group; ``collect(due=keys)`` only the groups whose
    keys (from ``Config.groups()``) are due, as the CLI's scheduler does.

    >>> import tempfile
    >>> from monitor.config import load_config
    >>> c = Collector(load_config(None), directory=tempfile.mkdtemp())
    >>> c.collect()["neuron_runtime_data"]
    []
    """

    def __init__(self, config: Config | None = None, directory: str | os.PathLike | None = None):
        self.config = config or default_config()
        self.directory = directory
        self.started = time.time()
        # Per (snapshot file, group): the state at the group's last report for that process.
        self._prev: dict[tuple[str, str], dict] = {}
        self._sys_prev: dict[str, dict] = {}
        self._seen: set[str] = set()
        self._last_scan = self.started
        self._host_id = instance_id()
        self._device = None
        self._groups_of_tag: dict[str, list] = {}
        self.watch = Watch(self.config.triggers, directory)
        # Processes already running count from now: their history before the monitor is not "this period".
        for snap in live.read_all(self.directory):
            self._seen.add(snap["file"])
            for _, g in self._runtime_groups(snap):
                self._prev[(snap["file"], g.type)] = self._baseline(snap, self.started)
        for g in self.config.system:
            self._sys_prev[g.type] = self._system_baseline(g.type)
        psutil.cpu_percent(percpu=True)  # prime psutil's own counters

    # -- public -----------------------------------------------------------------------------
    def collect(self, due=None) -> dict:
        """One complete document; ``due`` (a set of group keys) limits which groups are reported.

        >>> from monitor.config import load_config
        >>> doc = Collector(load_config(None)).collect()
        >>> doc["system_data"]["memory_info"]["error"]
        ''
        """
        now = time.time()
        snaps = live.read_all(self.directory, ring=False)   # each ring's new part is read below
        device = self._device_info(snaps)
        runtimes = []
        alive = set()
        for snap in snaps:
            key = snap["file"]
            alive.add(key)
            groups = self._runtime_groups(snap)
            if not groups:
                continue
            if key not in self._seen:
                # Appeared since the last scan: all its work happened since it started (or since then).
                self._seen.add(key)
                created = snap.get("process_start_time") or snap.get("start_time", now)
                since = min(now, max(float(created), self._last_scan))
                # Its CPU time so far all falls in this period only if it started after the last scan.
                cpu = (0.0, 0.0) if created >= self._last_scan else self._cpu_times(snap["pid"])
                for _, g in groups:
                    self._prev[(key, g.type)] = dict(self._baseline(None, since), cpu=cpu)
            try:
                snap["ring"] = live.read_ring(snap, self._ring_after(snap, key, groups))
            except (OSError, ValueError, KeyError, TypeError):
                continue   # its ring is being replaced or is gone: the next refresh reads it
            report = {}
            proj = self._proj_now(snap, now)   # once per process, not per group
            for i, g in groups:
                if due is not None and ("runtime", i, g.type) not in due:
                    continue
                prev = self._prev[(key, g.type)]
                try:
                    report[g.type], state = self._runtime_group(g.type, snap, prev, now, device, proj)
                except psutil.Error:
                    report = None  # the process ended while being read: it simply disappears
                    break
                self._prev[(key, g.type)] = state
            if report is None:
                continue
            runtimes.append({"pid": snap["pid"], "address": "", "neuron_runtime_tag": str(snap["tag"]),
                             "error": "", "report": report})
        runtimes = merge_runtimes(runtimes)   # one entry per process, however many targets it uses
        for rt in runtimes:
            _process_memory(rt)
        # triggers attach by themselves; every process's last attach joins its neuron_stack group
        self.watch.apply(runtimes, {s["pid"]: s.get("process_start_time") for s in snaps})
        # Forget processes that went away so a reused file name starts fresh.
        for k in [k for k in self._prev if k[0] not in alive]:
            del self._prev[k]
        self._seen &= alive
        self._last_scan = now

        system = {}
        k8s = None
        for g in self.config.system:
            if due is not None and ("system", g.type) not in due:
                continue
            prev = self._sys_prev.get(g.type) or self._system_baseline(g.type, self.started)
            block, state = self._system_group(g.type, prev, now, device)
            self._sys_prev[g.type] = state
            if g.type == "neuron_k8s_info":
                k8s = block
            else:
                system[g.type] = block
        doc = {"neuron_runtime_data": runtimes, "system_data": system,
               "instance_info": self._instance_info(device),
               "neuron_hardware_info": self._hardware_info(device)}
        if k8s is not None:
            doc["neuron_k8s_info"] = k8s
        return doc

    # -- runtime groups ---------------------------------------------------------------------
    def _runtime_groups(self, snap: dict):
        tag = str(snap.get("tag", ""))
        groups = self._groups_of_tag.get(tag)
        if groups is None:   # matched once per tag: the config does not change, and an RE2 search is not free
            found = self.config.selector_for(tag)
            groups = [] if found is None else [(found[0], g) for g in found[1].metrics]
            if len(self._groups_of_tag) > 4096:
                self._groups_of_tag.clear()
            self._groups_of_tag[tag] = groups
        return groups

    def _ring_after(self, snap: dict, key: str, groups) -> int:
        """The last execution every group has reported already: only newer ones are read from the ring."""
        after = min(self._prev[(key, g.type)]["seq"] for _, g in groups)
        if snap.get("proj_now_ns") is None:   # an older publisher's clock needs its last executions
            after = min(after, int(snap["seq"]) - _OLD_CLOCK_EXECUTIONS)
        return after

    @staticmethod
    def _proj_now(snap: dict, now: float) -> int:
        """The process's projected clock at wall time ``now`` (DESIGN §3.4), never ahead of it.

        The snapshot holds the clock at its writing (``proj_now_ns``), or where it stands while an
        execution is simulated (``proj_stands``: the simulation's wall time is not projected time, and
        extrapolating over it made a period's projected span collapse to nothing, the core 100 % busy).
        Past the writing the clock runs at wall speed only over time known to be idle: up to
        ``now - PUBLISH_DELAY_MAX_S`` (an execution that started or ended before would be on disk).

        >>> Collector._proj_now({"wall": 10.0, "proj_now_ns": 5, "proj_stands": True}, now=20.0)
        5
        >>> round(Collector._proj_now({"wall": 10.0, "proj_now_ns": 5, "proj_stands": False}, now=20.0) / 1e9, 3)
        9.4
        """
        if snap.get("proj_now_ns") is None:   # an older publisher: from the last execution's end, as it was
            known = max(snap["wall"], now - live.PUBLISH_DELAY_MAX_S)
            ends = snap["ring"]["wall_end"][-_OLD_CLOCK_EXECUTIONS:]
            gaps = np.sort(np.diff(ends))   # their median (np.median's own arithmetic, without its set-up)
            in_flight = float((gaps[(len(gaps) - 1) // 2] + gaps[len(gaps) // 2]) / 2) if len(ends) > 2 else 0.0
            return int(snap["proj_ns"] + max(0.0, known - snap["proj_wall"] - in_flight) * 1e9)
        if snap.get("proj_stands"):
            return int(snap["proj_now_ns"])
        idle = max(0.0, now - live.PUBLISH_DELAY_MAX_S - snap["wall"])
        return int(snap["proj_now_ns"] + idle * 1e9)

    def _baseline(self, snap: dict | None, when: float) -> dict:
        """Counters as they were at ``when``: the snapshot's, or zeros for a process new since then."""
        if snap is not None:
            return {"wall": when, "proj": self._proj_now(snap, when), "seq": snap["seq"],
                    "executions": snap["executions"], "errors": snap["errors"], "core_stats": snap["core_stats"],
                    "events": snap["events"], "cpu": self._cpu_times(snap["pid"])}
        # A new process: its projected clock started at the wall clock at its start (CONTRACTS).
        return {"wall": when, "proj": int(when * 1e9), "seq": 0, "executions": {}, "errors": {},
                "core_stats": {}, "events": {}, "cpu": (0.0, 0.0)}

    def _runtime_group(self, kind: str, snap: dict, prev: dict, now: float, device: dict, proj: int):
        period = max(now - prev["wall"], 1e-9)
        proj_now = max(proj, prev["proj"])  # never runs backwards
        state = {"wall": now, "proj": proj_now, "seq": snap["seq"], "executions": snap["executions"],
                 "errors": snap["errors"], "core_stats": snap["core_stats"], "events": snap["events"],
                 "cpu": prev.get("cpu")}
        # The projected span can never be shorter than the device time it contains.
        proj_span = max(proj_now - prev["proj"], 1)
        if kind == "neuroncore_counters":
            block = {"period": period, "neuroncores_in_use": self._cores(snap, prev, proj_span, device), "error": ""}
        elif kind == "execution_stats":
            block = self._execution_stats(snap, prev, period)
        elif kind == "memory_used":
            block = self._memory_used(snap, period)
        elif kind == "neuron_runtime_vcpu_usage":
            try:
                cpu = self._cpu_times(snap["pid"], strict=True)
            except psutil.AccessDenied:
                block = {"period": period, "vcpu_usage": {"user": 0.0, "system": 0.0},
                         "error": "cannot read the process's CPU times: permission denied (run as its user)"}
                return block, state
            before = prev.get("cpu") or cpu
            ncpu = psutil.cpu_count() or 1
            block = {"period": period, "vcpu_usage": {
                "user": _r(min(100.0, max(0.0, cpu[0] - before[0]) / period / ncpu * 100)),
                "system": _r(min(100.0, max(0.0, cpu[1] - before[1]) / period / ncpu * 100))}, "error": ""}
            state["cpu"] = cpu
        elif kind == "neuron_stack":
            block = self._neuron_stack(snap, prev, period, proj_span)
        else:  # config.py only lets known groups through
            raise AssertionError(kind)
        return block, state

    def _cores(self, snap: dict, prev: dict, proj_span: int, device: dict) -> dict:
        cores = sorted({int(c) for c in snap.get("cores", [])} | {int(c) for c in snap["core_stats"]})
        v3d = (device.get("hardware") or {}).get("neuroncore_version") == "v3d"
        out = {}
        for c in cores:
            now_s = snap["core_stats"].get(str(c), {})
            was = prev["core_stats"].get(str(c), {})
            # the union of the core's execution intervals (older snapshots: their summed device time)
            busy = now_s.get("active_ns", now_s.get("device_ns", 0)) - was.get("active_ns", was.get("device_ns", 0))
            span = max(proj_span, busy)
            util = monitor_figures.percent(busy, span)
            flops = (now_s.get("flops", 0) - was.get("flops", 0)) / (span / 1e9)
            entry = {"neuroncore_utilization": util, "flops": int(flops)}
            if v3d:
                # LNC=2: a logical core drives two physical NC-v3; work is spread over both.
                entry["v3d"] = {f"nc_v3.{2 * c + k}": {"neuroncore_utilization": util} for k in (0, 1)}
            out[str(c)] = entry
        return out

    def _execution_stats(self, snap: dict, prev: dict, period: float) -> dict:
        summary = {k: int(snap["executions"].get(k, 0) - prev["executions"].get(k, 0)) for k in live.EXECUTION_STATUSES}
        errors = {k: int(snap["errors"].get(k, 0) - prev["errors"].get(k, 0)) for k in live.ERROR_TYPES}
        ring = snap["ring"]
        # Executions after the previous report are exactly those with a larger sequence number.
        start = int(np.searchsorted(ring["seq"], prev["seq"], side="right"))
        names = ("total_latency", "device_latency")
        latency = dict.fromkeys(names)
        if len(ring["seq"]) > start:
            values = np.stack([ring[name][start:].astype(np.float64) for name in names])
            for name, row in zip(names, np.round(_percentiles(values), 9).tolist()):
                latency[name] = dict(zip(_PERCENTILE_KEYS, row))
        return {"period": period, "error_summary": errors, "execution_summary": summary,
                "latency_stats": latency, "error": ""}

    @staticmethod
    def _memory_used(snap: dict, period: float) -> dict:
        host = {k: int(snap["host_memory"].get(k, 0)) for k in live.HOST_MEMORY}
        # the real document's five categories; an LLM's KV cache is a runtime tensor there (its own
        # figure is in the neuron_stack group's "serving")
        per_core = {c: {k: int(m.get(k, 0)) + (int(m.get("kv_cache", 0)) if k == "tensors" else 0)
                        for k in REAL_CORE_MEMORY} for c, m in snap["device_memory"].items()}
        models = []
        for m in snap["models"]:
            dev = {k: int(m["device_bytes"].get(k, 0)) for k in MODEL_DEVICE_MEMORY}
            mhost = {k: int(m["host_bytes"].get(k, 0)) for k in live.HOST_MEMORY}
            models.append({"name": m["name"], "uuid": m["uuid"], "model_id": m["model_id"],
                           "is_running": bool(m["is_running"]),
                           "subgraphs": {"sg_00": {
                               "memory_used_bytes": {"host": sum(mhost.values()), "neuron_device": sum(dev.values()),
                                                     "usage_breakdown": {"host": mhost, "neuron_device": dev}},
                               "neuroncore_index": m["core"], "neuron_device_index": m["device_index"]}}})
        return {"period": period, "neuron_runtime_used_bytes": {
            "host": sum(host.values()), "neuron_device": sum(sum(m.values()) for m in per_core.values()),
            "usage_breakdown": {"host": host, "neuroncore_memory_usage": per_core}},
            "loaded_models": models, "error": ""}

    @staticmethod
    def _neuron_stack(snap: dict, prev: dict, period: float, proj_span: int) -> dict:
        engines = {}
        for c, st in snap["core_stats"].items():
            was = prev["core_stats"].get(c, {}).get("busy_ns", {})
            delta = {e: ns - was.get(e, 0) for e, ns in st["busy_ns"].items()}
            engines[c] = monitor_figures.engine_shares(delta, proj_span)
        for c in snap.get("cores", []):
            engines.setdefault(str(c), dict.fromkeys(ENGINES, 0.0))
        ev, pev = snap["events"], prev["events"]

        def delta(kind):
            return int(ev.get(kind, {}).get("count", 0) - pev.get(kind, {}).get("count", 0))

        rec, fb = ev.get("recompile", {}), ev.get("cpu_fallback", {})
        now_stats, prev_stats = snap["core_stats"].values(), prev["core_stats"].values()
        # this session's target: its own instance, cores, runtime reservation per core and peak
        targets = {snap["target"]: monitor_figures.target_block(
            snap.get("instance_type", ""), [*snap.get("cores", []), *map(int, snap["core_stats"])],
            {c: m.get("runtime_memory", 0) for c, m in snap["device_memory"].items()}, snap.get("peak_flops", 0.0),
            sum(st["flops"] for st in now_stats) - sum(st.get("flops", 0) for st in prev_stats),
            sum(st["device_ns"] for st in now_stats) - sum(st.get("device_ns", 0) for st in prev_stats))
        } if snap.get("target") else {}
        return {"period": period, "error": "", "engines": engines,
                "recompiles": {"count": delta("recompile"), "last_reason": rec.get("last_reason", ""),
                               "last_source": rec.get("last_source", "")},
                "cpu_fallbacks": {"count": delta("cpu_fallback"), "last_op": fb.get("last_op", ""),
                                  "last_reason": fb.get("last_reason", ""), "last_source": fb.get("last_source", "")},
                "compiles": delta("compile"), "cache_hits": delta("cache_hit"),
                "cores": list(snap.get("cores", [])), "command": snap.get("command", ""),
                "target": snap.get("target", ""), "targets": targets,
                # an LLM serving engine's figures (neuron_stack.inference), else null
                "serving": snap.get("serving")}

    @staticmethod
    def _cpu_times(pid: int, strict: bool = False):
        try:
            t = _process(pid).cpu_times()
            return (t.user + t.children_user, t.system + t.children_system)
        except psutil.Error:
            if strict:
                raise
            return None

    # -- system groups ----------------------------------------------------------------------
    def _system_baseline(self, kind: str, when: float | None = None) -> dict:
        state = {"wall": when if when is not None else time.time()}
        if kind == "vcpu_usage":
            state["cpu"] = psutil.cpu_times(percpu=True)
            state["ctx"] = psutil.cpu_stats().ctx_switches
        return state

    def _system_group(self, kind: str, prev: dict, now: float, device: dict):
        period = max(now - prev["wall"], 1e-9)
        state = {"wall": now}
        if kind == "vcpu_usage":
            cpus = psutil.cpu_times(percpu=True)
            ctx = psutil.cpu_stats().ctx_switches
            usage = {str(i): _cpu_percent(b, a) for i, (b, a) in enumerate(zip(prev["cpu"], cpus))}
            total_b = _sum_times(prev["cpu"])
            total_a = _sum_times(cpus)
            block = {"period": period, "average_usage": _cpu_percent(total_b, total_a), "usage_data": usage,
                     "context_switch_count": int(max(0, ctx - prev["ctx"])), "error": ""}
            state.update(cpu=cpus, ctx=ctx)
        elif kind == "memory_info":
            vm, sw = psutil.virtual_memory(), psutil.swap_memory()
            block = {"period": period, "memory_total_bytes": int(vm.total), "memory_used_bytes": int(vm.used),
                     "swap_total_bytes": int(sw.total), "swap_used_bytes": int(sw.used), "error": ""}
        elif kind == "neuron_hw_counters":
            count = int((device.get("hardware") or {}).get("neuron_device_count") or 0)
            # A simulated device has no ECC events; the counters are real zeros, not placeholders.
            block = {"period": period, "neuron_devices": [
                {"neuron_device_index": i, "mem_ecc_corrected": 0, "mem_ecc_uncorrected": 0,
                 "sram_ecc_uncorrected": 0, "sram_ecc_corrected": 0} for i in range(count)],
                "error": "" if count else _NO_DEVICE}
        elif kind == "neuron_k8s_info":
            block = {"period": period, "neuroncores_k8s_info": {}, "neurondevices_k8s_info": {},
                     "error": "" if os.environ.get("KUBERNETES_SERVICE_HOST") else "not running in Kubernetes"}
        else:  # config.py only lets known groups through
            raise AssertionError(kind)
        return block, state

    # -- always-present blocks ----------------------------------------------------------------
    def _device_info(self, snaps: list[dict]) -> dict:
        # One identity, as neuron-ls decides it (traces.identity): the variables, else the running processes'
        return identity.machine(snaps, self.directory)

    def _instance_info(self, device: dict) -> dict:
        return {"instance_name": host_name(), "instance_id": self._host_id,
                "instance_type": device.get("instance_type", ""),
                # A simulated instance has no AZ, region, AMI or subnet; the fields stay, empty.
                "instance_availability_zone": "", "instance_availability_zone_id": "", "instance_region": "",
                "ami_id": "", "subnet_id": "", "error": ""}

    @staticmethod
    def _hardware_info(device: dict) -> dict:
        hw = device.get("hardware") or {}
        return {"neuron_device_type": str(hw.get("neuron_device_type", "")),
                "neuron_device_version": str(hw.get("neuron_device_version", "")),
                "neuroncore_version": str(hw.get("neuroncore_version", "")),
                "neuron_device_count": int(hw.get("neuron_device_count", 0)),
                "neuron_device_memory_size": int(hw.get("neuron_device_memory_size", 0)),
                "neuroncore_per_device_count": int(hw.get("neuroncore_per_device_count", 0)),
                "logical_neuroncore_config": int(hw.get("logical_neuroncore_config", 1 if hw else 0)),
                "error": "" if hw else _NO_DEVICE}


_NO_DEVICE = "no simulated Neuron device described yet: run a neuron_stack workload"


def _sum_times(times) -> dict:
    return {f: sum(getattr(t, f, 0.0) for t in times) for f in _CPU_TIME_FIELDS}


def _cpu_percent(before, after) -> dict:
    """Percent of elapsed CPU time per field between two psutil cpu_times (namedtuples or sums)."""
    def get(t, f):
        return t.get(f, 0.0) if isinstance(t, dict) else getattr(t, f, 0.0)

    deltas = {f: max(0.0, get(after, f) - get(before, f)) for f in _CPU_TIME_FIELDS}
    # steal time is in the denominator so the fields are shares of the real elapsed time.
    total = sum(deltas.values())
    if total <= 0:
        return {name: 0.0 for name, _ in _CPU_FIELDS}
    return {name: _r(100.0 * deltas[f] / total) for name, f in _CPU_FIELDS}


_CPU_TIME_FIELDS = tuple(f for _, f in _CPU_FIELDS) + ("steal",)
