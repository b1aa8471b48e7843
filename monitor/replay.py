"""Play a finished profile back as neuron-monitor documents, one per time window (``neuron-top --replay``).

The profile's projected clock is cut into windows of ``window_s`` seconds; each window becomes one
document of the same shape as :meth:`monitor.collect.Collector.collect` returns: per recorded process
(``runs``), ``neuroncore_counters`` (busy device time of the executions overlapping the window),
``execution_stats`` (executions that finished in it, their latency percentiles), ``memory_used``
(the last memory sample of each category, the models loaded so far) and the ``neuron_stack`` group
(engine busy shares; recompiles, CPU fallbacks, compiles and cache hits in the window, with the
last reason and source line). Host vCPU and system memory are not recorded in a profile, so those
groups are left out (neuron-top shows ``n/a``), as a config without them would.

Every number comes from the ``traces`` query API (``Profile.replay_window``, ``Profile.figures``):
this module holds no SQL, only the document's shape. Each document also carries the whole
profile's headline figures (``neuron_stack.profile``: ``Profile.figures()``, the numbers
``neuron-explorer summary`` and the Explorer show), so neuron-top can show them beside the window.

>>> import tempfile, traces
>>> from traces.synthetic import write_run
>>> d = tempfile.mkdtemp()
>>> _ = write_run(d, executions=3, instructions=200)
>>> with Replay(traces.finalize(d), window_s=0.001) as replay:
...     doc = next(iter(replay))
>>> sorted(doc)
['instance_info', 'neuron_hardware_info', 'neuron_runtime_data', 'system_data']
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator

import traces
from monitor.merge import merge_runtimes
from traces.errors import TraceError
from traces.live import CORE_ONLY_MEMORY
from traces.monitor_figures import engine_shares, percent, target_block
from traces.q_replay import PERCENTILES, REPLAY_ENGINES

EXECUTION_STATUSES = ("completed", "completed_with_err", "completed_with_num_err", "timed_out",
                      "incorrect_input", "failed_to_queue")
ERROR_TYPES = ("generic", "numerical", "transient", "model", "runtime", "hardware")
DEVICE_MEMORY = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")
MODEL_DEVICE_MEMORY = ("constants", "model_code", "runtime_memory", "tensors")
HOST_MEMORY = ("application_memory", "constants", "dma_buffers", "tensors")


def _json(text) -> dict:
    try:
        value = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _short_source(source: str | None) -> str:
    # neuron-top has little room: the file's base name and line, as the monitor's last_source.
    if not source:
        return ""
    path, _, line = source.rpartition(":")
    return f"{os.path.basename(path)}:{line}" if path else source


class Replay:
    """Documents of a finished profile, window after window (iterate it; it is restartable).

    ``profile``: a ``profile.duckdb`` or a directory of segments (finalised first by ``traces.open``).
    ``window_s``: profile seconds per document (neuron-top passes ``period * speed``).
    Raises :class:`traces.TraceError` with one line for a missing or unreadable profile.

    Example::

        with Replay("output/session/profile.duckdb", window_s=0.5) as replay:
            for document in replay:
                print(document["neuron_runtime_data"][0]["report"]["neuroncore_counters"])
    """

    def __init__(self, profile: str | os.PathLike, window_s: float = 1.0):
        if not window_s > 0:
            raise TraceError(f"replay window must be a positive number of seconds, got {window_s}")
        if not os.path.exists(profile):
            raise TraceError(f"profile {profile} does not exist: give a profile.duckdb or its session "
                             "directory (neuron-explorer inspect prints its path)")
        self._profile = traces.open(profile)
        self.path = str(profile)
        self.window_ns = max(1, int(window_s * 1e9))
        self.metadata = self._profile.metadata()
        self._runs = self._profile.replay_runs()
        self.start_ns, self.end_ns = self._profile.replay_span()
        figures = self._profile.figures()
        self.figures = {**figures.as_dict(), "before_window_text": figures.before_window_text()}
        self.targets = {t["target"]: t for t in self._profile.targets()}   # instance type and peak per target
        self.position_ns = self.start_ns
        self.cores_per_device = self._hardware_info()["neuroncore_per_device_count"] or 1

    # -- position -------------------------------------------------------------------------------
    @property
    def duration_s(self) -> float:
        """Length of the recorded time, in profile seconds."""
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def position_s(self) -> float:
        """How far the replay has got, in profile seconds from the start."""
        return (self.position_ns - self.start_ns) / 1e9

    def __iter__(self) -> Iterator[dict]:
        t = self.start_ns
        while True:
            t1 = t + self.window_ns
            self.position_ns = min(t1, self.end_ns)
            yield self.document(t, t1)
            if t1 > self.end_ns:
                return
            t = t1

    # -- one document ---------------------------------------------------------------------------
    def document(self, t0: int, t1: int) -> dict:
        """The neuron-monitor document of the profile window ``[t0, t1)`` (projected-clock ns).

        Example: ``replay.document(replay.start_ns, replay.start_ns + 10**9)``.
        """
        period = (t1 - t0) / 1e9
        w = self._profile.replay_window(t0, t1)
        busy, finished, latency, events, memory, loads = (w.busy, w.finished, w.latency, w.events, w.memory,
                                                          w.loads)

        runtimes = []
        for run in self._runs:
            start, end = run["start_ns"], run["end_ns"]
            if start is not None and start >= t1 or end is not None and end < t0:
                continue   # not running during this window
            rid = run["run_id"]
            run_busy = [r for r in busy if r["run_id"] == rid]
            report = {
                "neuroncore_counters": self._counters(run_busy, period),
                "execution_stats": self._stats([r for r in finished if r["run_id"] == rid],
                                               latency.get(rid), period),
                "memory_used": self._memory([r for r in memory if r["run_id"] == rid],
                                            [r for r in loads if r["run_id"] == rid], period,
                                            self.cores_per_device),
                "neuron_stack": dict(self._extra(run, run_busy, [r for r in events if r["run_id"] == rid],
                                                 period, t1 - t0), profile=self.figures,
                                     targets=self._target(run, run_busy, [r for r in memory if r["run_id"] == rid])),
            }
            runtimes.append({"pid": int(run["pid"] or 0), "address": "",
                             "neuron_runtime_tag": str(run["tag"] or run["pid"] or rid),
                             "error": "", "report": report})
        # one entry per process, however many targets (runs) it used
        return {"neuron_runtime_data": merge_runtimes(runtimes), "system_data": {},
                "instance_info": self._instance_info(), "neuron_hardware_info": self._hardware_info()}

    @staticmethod
    def _counters(rows: list[dict], period: float) -> dict:
        span_ns = period * 1e9
        cores = {str(int(r["core"])): {"neuroncore_utilization": percent(r["busy_ns"], span_ns),
                                       "flops": int(r["flops"] / period)} for r in rows if r["core"] is not None}
        return {"period": period, "neuroncores_in_use": cores, "error": ""}

    def _target(self, run: dict, busy: list[dict], memory: list[dict]) -> dict:
        """The run's target as the live monitor reports it (``monitor_figures.target_block``), over the window."""
        target = str(run["target"] or "")
        if not target:
            return {}
        whole = self.targets.get(target) or {}
        reserved = {r["core"]: r["bytes"] for r in memory
                    if r["category"] == "runtime_memory" and r["location"] == "device" and r["core"] is not None}
        return {target: target_block(whole.get("instance_type", ""),
                                     [r["core"] for r in busy if r["core"] is not None] + list(reserved), reserved,
                                     whole.get("peak_flops", 0.0), sum(r["flops"] for r in busy),
                                     sum(r["device_ns"] for r in busy))}

    @staticmethod
    def _stats(rows: list[dict], latency: dict | None, period: float) -> dict:
        summary = dict.fromkeys(EXECUTION_STATUSES, 0)
        for r in rows:
            status = r["status"] if r["status"] in summary else "completed_with_err"
            summary[status] += int(r["n"])
        stats = {}
        for name in ("total_latency", "device_latency"):
            values = (latency or {}).get(name)
            stats[name] = ({k: round(float(v), 9) for (k, _), v in zip(PERCENTILES, values)}
                           if values else None)
        return {"period": period, "error_summary": dict.fromkeys(ERROR_TYPES, 0),
                "execution_summary": summary, "latency_stats": stats, "error": ""}

    @staticmethod
    def _memory(rows: list[dict], loads: list[dict], period: float, cores_per_device: int) -> dict:
        host = dict.fromkeys(HOST_MEMORY, 0)
        per_core: dict[str, dict[str, int]] = {}
        for r in rows:
            if r["location"] == "host" or r["core"] is None:
                if r["category"] in host:
                    host[r["category"]] += int(r["bytes"] or 0)
                continue
            cats = per_core.setdefault(str(int(r["core"])), dict.fromkeys(DEVICE_MEMORY, 0))
            if r["category"] in cats:
                cats[r["category"]] = int(r["bytes"] or 0)
        models = []
        for load in loads:
            detail = _json(load["detail"])
            # the per-core runtime reservation is the core's, not the model's (as the live monitor shows it)
            dev = {k: 0 if k in CORE_ONLY_MEMORY else int((detail.get("bytes") or {}).get(k, 0))
                   for k in MODEL_DEVICE_MEMORY}
            mhost = dict.fromkeys(HOST_MEMORY, 0)
            core = int(load["core"] or 0)
            models.append({
                "name": str(detail.get("model") or "model"), "uuid": str(detail.get("uuid") or ""),
                # The same model id the live runtime publishes for this graph.
                "model_id": int(load["graph_id"] or 0) & 0x7FFFFFFF, "is_running": False,
                "subgraphs": {"sg_00": {
                    "memory_used_bytes": {"host": 0, "neuron_device": sum(dev.values()),
                                          "usage_breakdown": {"host": mhost, "neuron_device": dev}},
                    "neuroncore_index": core, "neuron_device_index": core // cores_per_device}}})
        return {"period": period, "neuron_runtime_used_bytes": {
            "host": sum(host.values()), "neuron_device": sum(sum(c.values()) for c in per_core.values()),
            "usage_breakdown": {"host": host, "neuroncore_memory_usage": per_core}},
            "loaded_models": models, "error": ""}

    @staticmethod
    def _extra(run: dict, busy: list[dict], events: list[dict], period: float, span_ns: int) -> dict:
        # the live monitor's engines block, the CC engine's share (collectives) with them
        engines = {str(int(r["core"])): engine_shares({e: r[e] for e in REPLAY_ENGINES}, span_ns)
                   for r in busy if r["core"] is not None}
        by_kind = {r["kind"]: r for r in events}

        def counter(kind: str) -> dict:
            row = by_kind.get(kind) or {}
            detail = _json(row.get("detail"))
            out = {"count": int(row.get("recent") or 0), "last_reason": str(detail.get("reason") or ""),
                   "last_source": _short_source(row.get("source"))}
            if kind == "cpu_fallback":
                out["last_op"] = str(detail.get("op") or "")
            return out

        return {"period": period, "error": "", "engines": engines,
                "recompiles": counter("recompile"), "cpu_fallbacks": counter("cpu_fallback"),
                "compiles": int((by_kind.get("compile") or {}).get("recent") or 0),
                "cache_hits": int((by_kind.get("cache_hit") or {}).get("recent") or 0),
                "cores": sorted(int(c) for c in engines), "command": str(run["command"] or ""),
                "target": str(run["target"] or "")}

    def _instance_info(self) -> dict:
        host = next((r["host"] for r in self._runs if r["host"]), "")
        return {"instance_name": host, "instance_id": f"replay:{os.path.basename(self.path)}",
                "instance_type": self.metadata.get("instance_type", self.metadata.get("target", "")),
                "instance_availability_zone": "", "instance_availability_zone_id": "", "instance_region": "",
                "ami_id": "", "subnet_id": "", "error": ""}

    def _hardware_info(self) -> dict:
        m = self.metadata

        def integer(*keys) -> int:
            for key in keys:
                try:
                    return int(float(m[key]))
                except (KeyError, ValueError):
                    continue
            return 0
        return {"neuron_device_type": m.get("neuron_device_type", ""),
                "neuron_device_version": m.get("neuron_device_version", ""),
                "neuroncore_version": m.get("neuroncore_version", ""),
                "neuron_device_count": integer("neuron_device_count"),
                "neuron_device_memory_size": integer("neuron_device_memory_size"),
                "neuroncore_per_device_count": integer("neuroncore_per_device_count", "num_physical_cores"),
                "logical_neuroncore_config": integer("logical_neuroncore_config") or 1,
                "error": ""}

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the profile (idempotent)."""
        self._profile.close()

    def __enter__(self) -> "Replay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
