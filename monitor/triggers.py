"""neuron-monitor's triggers: when a process's figures in a document cross a bound, attach to it for a window by
itself (:mod:`traces.attach`), so "something is wrong" comes with "here is the trace". Ours; the real tool has none.

A config's ``triggers`` list (docs/monitor.md)::

    "triggers": [{"type": "recompile_storm", "threshold": 5, "duration": "10s"},
                 {"type": "utilization_drop", "threshold": 20, "tag_filter": "^train"}]

Each trigger reads one figure the document already carries, for each process its ``tag_filter`` selects:

==================  ===================================================================  =================
type                fires when                                                           default threshold
==================  ===================================================================  =================
recompile_storm     ``neuron_stack.recompiles.count`` over the last ``window`` >= threshold  5
fallback_burst      ``neuron_stack.cpu_fallbacks.count`` over ``window`` >= threshold       10
utilization_drop    the mean ``neuroncore_utilization`` falls below threshold (%) from   20
                    at or above it in the process's previous report
serving_queue       ``neuron_stack.serving.num_requests_waiting`` >= threshold           16
==================  ===================================================================  =================

``window`` (default 1 minute) is the span a storm or a burst is counted over, from the documents' per-period counts.
A fired trigger asks the process to record ``duration`` seconds into ``output_dir/<trigger>_<tag>_<time>``, at
most one capture at a time per process and none again for that process within ``cooldown``. Every process's last
attach (whoever asked) is its ``neuron_stack.attach`` in the document: state, profile directory, trigger.

>>> t = Trigger("serving_queue", 3.0, 10.0, 300.0, DEFAULT_OUTPUT, None)
>>> t.fires({"neuron_stack": {"serving": {"num_requests_waiting": 4}}}, None)
True
"""
from __future__ import annotations

import collections
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from traces import attach

TYPES = {"recompile_storm": 5.0, "fallback_burst": 10.0, "utilization_drop": 20.0, "serving_queue": 16.0}
#: The metric groups a trigger reads (the config must report them).
NEEDS = {"utilization_drop": ("neuroncore_counters", "neuron_stack")}
DEFAULT_DURATION, DEFAULT_COOLDOWN, DEFAULT_WINDOW = 10.0, 300.0, 60.0
#: The counters a trigger sums over its window: type -> (neuron_stack key, "count").
COUNTED = {"recompile_storm": "recompiles", "fallback_burst": "cpu_fallbacks"}
DEFAULT_OUTPUT = "output/neuron-monitor-captures"
log = logging.getLogger("monitor")


@dataclass(frozen=True)
class Trigger:
    """One configured trigger (see the module docstring)."""

    type: str
    threshold: float
    duration: float
    cooldown: float
    output_dir: str
    tag_filter: object   # compiled RE2
    window: float = DEFAULT_WINDOW

    def fires(self, report: dict, previous_util: float | None, counted: float = 0) -> bool:
        """Whether this trigger fires on one process's ``report`` (``previous_util``: its last mean utilisation;
        ``counted``: the trigger's counter summed over its window, this report included)."""
        ns = report.get("neuron_stack") or {}
        if self.type in COUNTED:
            return counted >= self.threshold
        if self.type == "serving_queue":
            return ((ns.get("serving") or {}).get("num_requests_waiting") or 0) >= self.threshold
        util = mean_utilization(report)
        return util is not None and previous_util is not None and previous_util >= self.threshold > util


def mean_utilization(report: dict) -> float | None:
    """The mean NeuronCore utilisation (%) of one process's report, None without ``neuroncore_counters``.

    >>> mean_utilization({"neuroncore_counters": {"neuroncores_in_use": {"0": {"neuroncore_utilization": 40},
    ...                                                                   "1": {"neuroncore_utilization": 20}}}})
    30.0
    """
    cores = (report.get("neuroncore_counters") or {}).get("neuroncores_in_use")
    if cores is None:
        return None
    vals = [float(c.get("neuroncore_utilization", 0)) for c in cores.values()]
    return sum(vals) / len(vals) if vals else 0.0


class Watch:
    """Applies the triggers to each document's runtimes and adds every process's last attach to its report."""

    def __init__(self, triggers: tuple[Trigger, ...], directory=None):
        self.triggers = triggers
        self.directory = directory
        self._util: dict[int, float] = {}
        self._last: dict[int, float] = {}    # pid -> when a trigger last attached to it
        self._counts: dict[tuple[int, str], collections.deque] = {}   # (pid, counter) -> (when, count) per report

    def apply(self, runtimes: list[dict], started: dict[int, float]) -> None:
        """``runtimes``: the document's ``neuron_runtime_data``; ``started``: each pid's process start time."""
        now = time.time()
        for rt in runtimes:
            pid, report = rt["pid"], rt["report"]
            tag = rt.get("neuron_runtime_tag", "")
            util = mean_utilization(report)
            ns = report.get("neuron_stack") or {}
            for key in set(COUNTED.values()) & set(ns):
                self._counts.setdefault((pid, key), collections.deque()).append((now, ns[key].get("count", 0)))
            for t in self.triggers:
                if not t.tag_filter.search(tag) or now - self._last.get(pid, -1e18) < t.cooldown:
                    continue
                if t.fires(report, self._util.get(pid), self._counted(pid, COUNTED.get(t.type), now - t.window)):
                    self._fire(t, pid, tag, now)
            if util is not None:
                self._util[pid] = util
            if "neuron_stack" in report:
                report["neuron_stack"]["attach"] = self._attach_of(pid, started.get(pid))
        gone = set(self._util) | {k[0] for k in self._counts}
        gone -= {rt["pid"] for rt in runtimes}
        for pid in gone:
            self._util.pop(pid, None)
        for k in [k for k in self._counts if k[0] in gone]:
            del self._counts[k]

    def _counted(self, pid: int, key: str | None, since: float) -> float:
        q = self._counts.get((pid, key))
        if q is None:
            return 0
        while q and q[0][0] < since:
            q.popleft()
        return sum(n for _, n in q)

    def _fire(self, t: Trigger, pid: int, tag: str, now: float) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", tag)[:64] or str(pid)
        out = Path(t.output_dir) / f"{t.type}_{safe}_{pid}_{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            attach.request(pid, out, t.duration, directory=self.directory, by=t.type)
            self._last[pid] = now
        except attach.AttachError as exc:   # already capturing, or gone since the snapshot: try again next time
            log.info("trigger %s on %s: %s", t.type, tag, exc)

    def _attach_of(self, pid: int, started: float | None) -> dict | None:
        st = attach.state(pid, self.directory)
        if not st or (started is not None and st.get("wall", 0) < started):   # a reused pid's old answer
            return None
        return {"state": str(st.get("state", "")), "profile": str(st.get("output_dir", "")),
                "trigger": str(st.get("by", "")), "reason": str(st.get("reason", st.get("framework", "")))}
