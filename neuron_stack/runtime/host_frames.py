"""Which of torch.profiler's host events are the user's, for a window's ``trace.json`` and ``framework`` events.

While a user's op runs on the ``neuron`` device, this project's own Python (the eager dispatcher, compiler,
runtime, cost model and trace writer) runs inside it, and torch.profiler's Python tracer (``with_stack``)
records every frame of it: in a small training loop, two thirds of the window. :func:`user_events` keeps what
the user's program did, their frames and torch's, and drops this project's: a Python frame whose file lies in
one of this project's packages, every event below one on the same thread (the JSON encoder called by the
trace writer, the ATen ops the simulator runs on host tensors) and the threads this project started
(a thread whose frames, but for ``threading.py``'s, are all ours). The event that called into us (an ATen
op, torch's ``PythonSubclass``) stays. What is left is then bounded by :data:`MAX_EVENTS`.

>>> from types import SimpleNamespace as E
>>> ev = [E(name="train.py(3): step", ts=0, dur=100, type="python_function", tid=7),
...       E(name="aten::addmm", ts=10, dur=50, type="cpu_op", tid=7),
...       E(name="neuron_stack/eager/dispatch.py(108): __torch_dispatch__", ts=12, dur=40,
...         type="python_function", tid=7),
...       E(name="json/encoder.py(183): encode", ts=20, dur=5, type="python_function", tid=7)]
>>> [e.name for e in user_events(ev, ours=("neuron_stack/",), get=_get)[0]]
['train.py(3): step', 'aten::addmm']
"""
from __future__ import annotations

import importlib.util
import os
from collections import defaultdict
from pathlib import Path

#: At most this many host events per window (trace.json and ``framework`` events alike). A with_stack
#: training step of a small model is about 1,500 user events, so this holds some 70 steps; a longer window
#: keeps every ATen op and region and the longest Python frames, and says how many it dropped.
MAX_EVENTS = 100_000
#: Kept first when a window is over :data:`MAX_EVENTS`: regions and ops before Python frames.
_RANK = {"user_annotation": 0, "gpu_user_annotation": 0, "cpu_op": 1}
_PACKAGES = ("neuron_stack", "traces", "explorer", "monitor", "top")


def our_prefixes() -> tuple[str, ...]:
    """How torch's Python tracer names the files of this project's packages: the path with the longest
    ``sys.path``/site prefix removed (``torch.profiler.python_tracer._prefix_regex``), plus the full path.

    >>> "neuron_stack/" in our_prefixes()
    True
    """
    from torch.profiler.python_tracer import _prefix_regex
    prefixes = _prefix_regex()
    out = set()
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for loc in spec.submodule_search_locations:
            d = os.path.abspath(loc) + os.sep
            out.add(d)
            out.update(d[len(p):] for p in prefixes if d.startswith(p))
    return tuple(sorted(out))


def _get(e):
    return e.name, e.ts, e.dur, e.type, e.tid


def activity_fields(a):
    """(name, start ns, duration ns, type, thread) of one of ``kineto_results.trace_activities()``; the
    thread is the OS thread id, as in torch's Chrome trace."""
    return a.name(), a.timestamp(), a.duration(), a.type(), abs(a.resource_id())


def user_events(events, ours: tuple[str, ...] | None = None, get=activity_fields, limit: int = MAX_EVENTS):
    """``(kept, dropped)``: the events (in time order) that are the user's and torch's, at most ``limit``
    of them, and how many of the user's were dropped by that bound. ``get(e)`` gives
    ``(name, ts, dur, type, thread)``. Example: ``user_events(results.trace_activities())``."""
    ours = our_prefixes() if ours is None else ours
    threads = defaultdict(list)
    for e in events:
        f = get(e)
        threads[f[4]].append((f[1], -f[2], f, e))
    kept = []
    for rows in threads.values():
        rows.sort(key=lambda r: (r[0], r[1]))
        stack, mine, foreign = [], [], False      # stack: (end, ours) of the enclosing events
        for ts, neg_dur, f, e in rows:
            while stack and stack[-1][0] <= ts:
                stack.pop()
            is_ours = bool(stack and stack[-1][1]) or (f[3] == "python_function" and f[0].startswith(ours))
            stack.append((ts - neg_dur, is_ours))
            if not is_ours:
                mine.append((f, e))
                foreign = foreign or not f[0].startswith("threading.py(")
        if foreign:            # else a thread this project started: its threading.py frames go too
            kept.extend(mine)
    dropped = max(len(kept) - limit, 0)
    if dropped:
        kept.sort(key=lambda fe: (_RANK.get(fe[0][3], 2), -fe[0][2]))
        kept = kept[:limit]
    kept.sort(key=lambda fe: fe[0][1])
    return [e for _, e in kept], dropped


class Filtered:
    """``kineto_results`` with only ``activities``, for torch's streaming Chrome-trace writer
    (``torch.profiler._chrome_trace_export``, what ``export_chrome_trace(use_python_export=True)`` runs)."""

    def __init__(self, results, activities):
        self._results, self._activities = results, activities

    def trace_activities(self):
        return self._activities

    def trace_start_ns(self):
        return self._results.trace_start_ns()


def write_chrome_trace(results, activities, path: Path, metadata: dict[str, str]) -> None:
    """torch's own ``trace.json`` of the window, written from ``activities`` (values of ``metadata`` are JSON)."""
    from torch.profiler._chrome_trace_export import export_chrome_trace
    export_chrome_trace(Filtered(results, activities), str(path), metadata)


_KINDS = ("python_function", "user_annotation", "cpu_op")


def write_framework_events(acts, out: Path, run: dict, dropped: int) -> int:
    """Write a window's host events (``acts``: the user's and torch's, from :func:`user_events`) into ``out`` as
    ``framework`` system events on the projected clock, thread ids the OS's; ``dropped`` of the user's went
    over the window's bound (metadata ``framework_events_dropped``). Returns how many were written. Used by
    torch.profiler windows (:mod:`neuron_stack.profiling`) and attach (:mod:`neuron_stack.runtime.attach`)."""
    import traces
    from neuron_stack.device import clock

    pid = os.getpid()
    rows = {k: [] for k in ("ts_ns", "dur_ns", "name", "thread_id", "detail")}
    for a in acts:
        name, ts, dur, kind, tid = activity_fields(a)
        if a.device_id() != pid or kind not in _KINDS or name.startswith("<built-in"):
            continue   # device activities; Python builtins (with_stack) would outnumber everything else
        start = clock.projected_at(ts)
        end = clock.projected_at(ts + dur)
        rows["ts_ns"].append(start)
        rows["dur_ns"].append(max(end - start, 0))
        rows["name"].append(name)
        rows["thread_id"].append(tid)
        rows["detail"].append(f'{{"category": "{kind}"}}')
    with traces.Writer(out, run=run or None, metadata={"framework_events_dropped": dropped}) as w:
        if rows["ts_ns"]:
            w.append("system_events", rows, run_id=w.run_id, source="framework")
    return len(rows["ts_ns"])
