"""The Dependency Chain of a system event, as the real System Trace Viewer's Dependency Chain Viewer shows
it: the events a selected one depends on (upstream) and the events that depend on it (downstream), across
the framework, ``neuron_rt`` and ``neuron_hw`` tracks.

What relates them, all recorded at capture (``neuron_stack.runtime.recorder``):

- **framework → runtime:** a runtime call is made inside a framework event on the same thread of the same
  run: the framework events enclosing its start are its call stack (torch.profiler's regions, ATen ops and
  Python frames, on the same projected clock);
- **one execution:** ``nrt_execute``, its host↔device copies (``nrt_tensor_write`` → ``dmem_buf_copyin``,
  ``nrt_tensor_read`` → ``dmem_buf_copyout``) and its device runs (``nc_exec_running``, one per device
  partition) share the execution's ``exec_id`` (``nrt_execute`` and ``nc_exec_running`` also share the
  ``flow_id`` the Perfetto export draws): in time order each depends on the one before, copy-in before the
  device run, copy-out after it;
- **one runtime call outside an execution** (an eager copy): the call and the driver copy beneath it,
  same thread, core and start.

A framework event's downstream is every runtime call made inside it with what those calls caused, at most
:data:`MAX_EVENTS` events (``more`` says how many were left out); a call stack keeps its innermost
:data:`MAX_STACK` frames.

>>> import tempfile, traces
>>> d = tempfile.mkdtemp()
>>> with traces.Writer(d, run={"run_id": "r", "host": "i-1", "pid": 7}) as w:
...     w.append("system_events", {"ts_ns": [0, 10, 10], "dur_ns": [100, 50, 50], "thread_id": [7, 7, 7],
...         "name": ["aten::linear", "nrt_execute", "nc_exec_running"], "core": [None, 0, 0],
...         "source": ["framework", "neuron_rt", "neuron_hw"], "exec_id": [None, 3, 3]}, run_id="r")
>>> with traces.open(traces.finalize(d)) as p:
...     rt = [t["track"] for t in tracks(p).to_pylist() if t["source"] == "neuron_rt"][0]
...     c = chain(p, rt, 10, "nrt_execute")
>>> [e["name"] for e in c.events], c.at, c.upstream, c.downstream, c.edges
(['aten::linear', 'nrt_execute', 'nc_exec_running'], 1, [0], [2], [(0, 1), (1, 2)])
"""
from __future__ import annotations

from dataclasses import dataclass, field

from traces.q_system import _has, _source, tracks  # noqa: F401 - tracks: the doctest's

#: A chain lists at most this many events downstream of the selected one (a training step's frame
#: encloses every execution of the step).
MAX_EVENTS = 200
#: The innermost frames of a call stack kept upstream (with_stack records the whole Python stack).
MAX_STACK = 12

_COLS = ("t.track, s.run_id, s.name, s.ts_ns AS start_ns, s.dur_ns, s.source, r.host AS instance_id, "
         "r.pid AS process_id, s.thread_id, s.core AS nc_idx, s.exec_id, s.flow_id")


@dataclass(frozen=True)
class Chain:
    """A selected event's dependency chain. ``events``: every event of the chain in causal order (the
    columns of ``Profile.system_event`` but ``detail``, plus ``run_id``); ``at``: the selected event's
    index; ``upstream`` / ``downstream``: indices of the events it depends on / that depend on it, in
    causal order; ``edges``: ``(i, j)`` pairs, event ``j`` depends directly on event ``i`` (the arrows);
    ``more``: downstream events left out over :data:`MAX_EVENTS`; ``stack_more``: outer frames left out
    over :data:`MAX_STACK`."""

    events: list[dict]
    at: int
    upstream: list[int] = field(default_factory=list)
    downstream: list[int] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    more: int = 0
    stack_more: int = 0


def _select(p, where: str, params: dict, tail: str = "") -> list[dict]:
    return p.sql(f"""SELECT {_COLS} FROM system_events AS s
                     JOIN {_source(p)} AS t ON hash(s.run_id, s.source, s.core, s.thread_id) = t.h
                     LEFT JOIN runs AS r ON r.run_id = s.run_id
                     WHERE {where} ORDER BY s.ts_ns, s.dur_ns DESC {tail}""", params).to_pylist()


def _rank(e: dict) -> int:
    """Order of events starting together: the runtime call, the driver's copy beneath it, the device."""
    return {"framework": 0, "neuron_hw": 3}.get(e["source"], 2 if e["name"].startswith("dmem_") else 1)


def _end(e: dict) -> int:
    return e["start_ns"] + max(e["dur_ns"] or 0, 0)


def _stack(p, e: dict) -> tuple[list[dict], int]:
    """The framework events on ``e``'s thread enclosing it, outermost first (at most :data:`MAX_STACK`),
    and how many outer ones were left out. A runtime call is enclosed where it starts; a framework
    event, over its whole span (not itself)."""
    params = {"run": e["run_id"], "tid": e["thread_id"]}
    longest = p.sql(f"SELECT coalesce(max(max_dur_ns), 0) AS d FROM {_source(p)} WHERE run_id = $run "
                    "AND source = 'framework' AND thread_id = $tid", params).to_pylist()[0]["d"]
    # events are stored in start order: the lower bound lets zone maps skip what started too early
    rows = _select(p, "s.run_id = $run AND s.thread_id = $tid AND s.source = 'framework' AND s.ts_ns <= $ts "
                      "AND s.ts_ns >= $lo AND s.ts_ns + greatest(coalesce(s.dur_ns, 0), 0) >= $end",
                   {**params, "ts": e["start_ns"], "lo": e["start_ns"] - int(longest),
                    "end": _end(e) if e["source"] == "framework" else e["start_ns"] + 1})
    key = (e["track"], e["start_ns"], e["name"], e["dur_ns"])
    rows = [r for r in rows if (r["track"], r["start_ns"], r["name"], r["dur_ns"]) != key]
    return rows[-MAX_STACK:], max(len(rows) - MAX_STACK, 0)


def _groups(rows: list[dict]) -> list[list[dict]]:
    """Runtime and device events in groups that depend on each other, each in causal order: one
    execution (same ``exec_id``), or one call outside an execution (same thread, core and start)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = ("exec", r["exec_id"]) if r["exec_id"] is not None else (
            "call", r["run_id"], r["thread_id"], r["nc_idx"], r["start_ns"])
        groups.setdefault(key, []).append(r)
    out = [sorted(g, key=lambda r: (r["start_ns"], _rank(r))) for g in groups.values()]
    return sorted(out, key=lambda g: (g[0]["start_ns"], _rank(g[0])))


def _caused(p, e: dict, limit: int) -> tuple[list[dict], int]:
    """Runtime and device events of the calls made inside framework event ``e`` (same run and thread),
    with every event of their executions; the first ``limit`` in time order and how many more."""
    where = ("s.run_id = $run AND s.thread_id = $tid AND s.source <> 'framework' AND s.ts_ns >= $ts "
             "AND s.ts_ns <= $end")
    params = {"run": e["run_id"], "tid": e["thread_id"], "ts": e["start_ns"], "end": _end(e)}
    # a frame around the whole program encloses every call: only the first ``limit`` are read, the rest counted
    found = _select(p, where, params, f"LIMIT {int(limit)}")
    total = len(found) if len(found) < limit else p.sql(
        f"SELECT count(*) AS n FROM system_events AS s WHERE {where}", params).to_pylist()[0]["n"]
    execs = sorted({r["exec_id"] for r in found if r["exec_id"] is not None})
    if execs:   # an execution's device runs may be recorded on another thread
        seen = {(r["track"], r["start_ns"], r["name"]) for r in found}
        extra = [r for r in _select(p, "list_contains($execs, s.exec_id)", {"execs": execs})
                 if (r["track"], r["start_ns"], r["name"]) not in seen]
        found += extra
        # those on the thread inside the span were counted already
        total += sum(not (r["run_id"] == e["run_id"] and r["thread_id"] == e["thread_id"] and r["source"] != "framework"
                          and e["start_ns"] <= r["start_ns"] <= _end(e)) for r in extra)
    found.sort(key=lambda r: (r["start_ns"], _rank(r)))
    return found[:limit], max(total - limit, 0)


def _link(events: list[dict], edges: list, stack: list[dict], anchor: int | None = None) -> int | None:
    """Append ``stack`` (outermost first) to ``events``, each frame depending on the one enclosing it,
    the first on ``anchor``; returns the innermost frame's index."""
    for f in stack:
        events.append(f)
        if anchor is not None:
            edges.append((anchor, len(events) - 1))
        anchor = len(events) - 1
    return anchor


def chain(p, track: int, start_ns: int, name: str, limit: int = MAX_EVENTS) -> Chain | None:
    """The dependency chain of the event on ``track`` starting at ``start_ns`` (absolute ns) named
    ``name`` (as ``Profile.system_event`` finds it), or None when there is no such event.

    Example: ``c = p.system_chain(track, ts, "nrt_execute"); [c.events[i]["name"] for i in c.downstream]``.
    """
    found = _select(p, "t.track = $track AND s.ts_ns = $ts AND s.name = $name",
                    {"track": int(track), "ts": int(start_ns), "name": str(name)}, "LIMIT 1") if _has(p) else []
    if not found:
        return None
    sel = found[0]
    events: list[dict] = []
    edges: list[tuple[int, int]] = []
    if sel["source"] == "framework":
        stack, stack_more = _stack(p, sel)
        parent = _link(events, edges, stack)
        at = _link(events, edges, [sel], parent)
        caused, more = _caused(p, sel, limit)
        for g in _groups(caused):
            _link(events, edges, g, at)
        up, down = list(range(at)), list(range(at + 1, len(events)))
        return Chain(events, at, up, down, edges, more, stack_more)
    if sel["exec_id"] is not None:
        group = _select(p, "s.exec_id = $exec", {"exec": sel["exec_id"]})   # a few events per partition
    else:
        group = _select(p, "s.run_id = $run AND s.thread_id = $tid AND s.source <> 'framework' AND s.ts_ns = $ts "
                           "AND s.core IS NOT DISTINCT FROM $core",
                        {"run": sel["run_id"], "tid": sel["thread_id"], "ts": sel["start_ns"], "core": sel["nc_idx"]})
    group = _groups(group)[0] if group else [sel]
    stack, stack_more = _stack(p, group[0])
    _link(events, edges, group, _link(events, edges, stack))
    key = (sel["track"], sel["start_ns"], sel["name"])
    at = next(i for i, e in enumerate(events) if (e["track"], e["start_ns"], e["name"]) == key)
    return Chain(events, at, list(range(at)), list(range(at + 1, len(events))), edges, 0, stack_more)
