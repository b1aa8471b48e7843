"""One runtime entry per process: a process that uses several targets (a trn1 and an inf2 session, each
publishing its own live file) is still one runtime to neuron-monitor, neuron-top and Prometheus.

Before this, such a process was listed twice with the same pid: neuron-top showed two tabs and
counted the process's vCPU twice ("Runtime vCPU 100.98 %" against "System vCPU 50.75 %"), and two
Prometheus series shared one label set, so one value was lost.

>>> a = {"pid": 7, "neuron_runtime_tag": "7", "report": {"neuron_stack": {"cores": [0], "compiles": 1,
...      "target": "trn1"}, "neuron_runtime_vcpu_usage": {"vcpu_usage": {"user": 50.0, "system": 0.5}}}}
>>> b = {"pid": 7, "neuron_runtime_tag": "7", "report": {"neuron_stack": {"cores": [1], "compiles": 2,
...      "target": "inf2"}, "neuron_runtime_vcpu_usage": {"vcpu_usage": {"user": 50.0, "system": 0.5}}}}
>>> (one,) = merge_runtimes([a, b])
>>> one["report"]["neuron_stack"], one["report"]["neuron_runtime_vcpu_usage"]["vcpu_usage"]["user"]
({'cores': [0, 1], 'compiles': 3, 'target': 'trn1,inf2'}, 50.0)
"""
from __future__ import annotations

import copy

from traces.vocab import MONITOR_ENGINES

#: Groups measured per process, not per target: every entry of one pid reports the same value.
_PER_PROCESS = ("neuron_runtime_vcpu_usage",)
#: Keys whose value is not a count: the first entry's stays (a period, a command, a last-seen detail,
#: the replayed profile's own figures, which every run of it carries).
_FIRST = ("period", "error", "command", "last_reason", "last_source", "last_op", "name", "uuid", "profile")


def merge_runtimes(runtimes: list[dict]) -> list[dict]:
    """The runtime entries with the entries of each (pid, tag) merged into one, in first-seen order.

    Counts add up, per-core maps are united (a core both report adds up, utilization capped at
    100 %), model lists and core lists are joined, the per-process vCPU is taken once.
    Example: ``doc["neuron_runtime_data"] = merge_runtimes(entries)``.
    """
    by_pid: dict = {}
    copied: set = set()
    for rt in runtimes:
        # one process and one tag; no pid (an old profile) is never merged
        key = (rt.get("pid"), rt.get("neuron_runtime_tag")) if rt.get("pid") else id(rt)
        if key not in by_pid:
            by_pid[key] = rt     # copied only if another entry merges into it: most processes have one
            continue
        if key not in copied:
            copied.add(key)
            by_pid[key] = copy.deepcopy(by_pid[key])
        into = by_pid[key]["report"]
        for group, block in (rt.get("report") or {}).items():
            if group not in into:
                into[group] = copy.deepcopy(block)
            elif group not in _PER_PROCESS:
                into[group] = _merge(into[group], block, group)
    return list(by_pid.values())


def _merge(a, b, key: str):
    if key in _FIRST:
        return a if a not in ("", None) else b
    if b is None:   # e.g. one target's latency_stats with no execution finished in the period
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _merge(a[k], v, k) if k in a else copy.deepcopy(v)
        return out
    if isinstance(a, list) and isinstance(b, list):
        joined = a + [x for x in b if x not in a]
        return sorted(joined) if key == "cores" else joined
    if key == "target" and isinstance(a, str):
        return ",".join(dict.fromkeys(a.split(",") + b.split(",")))
    if isinstance(a, (str, bool)) or a is None:
        return a if a not in ("", None) else b
    if key == "latency_stats" or key.startswith("p") and key[1:].isdigit():
        return max(a, b)   # percentiles cannot be added; the slower target's is the honest bound
    if key == "neuroncore_utilization" or key in MONITOR_ENGINES:   # percentages
        return min(100.0, a + b)
    return a + b
