"""The System Trace's data: its tracks under a grouping, the window it opens on, what a window draws.

Shapes ``Profile.system_window`` (``traces.q_system``: per track, events one by one when the window
holds few, else busy and count cells from the ``system_lod`` pyramid) for
``explorer/pages/system.py``; nothing here writes SQL or decides a level of detail. Windows are ns
since the profile's ``t0`` (``data.bounds``), as on the timeline (:func:`origin`).

>>> e = {"instance_id": "i-1", "process_id": 7, "source": "neuron_rt", "nc_idx": 0, "thread_id": 9}
>>> track_name(e, "default"), track_name(e, "cpu_device"), track_name(e, "thread")
('i-1/PID:7/neuron_rt/NC:0', 'CPU', 'TID:9')
"""
from __future__ import annotations

from explorer import data
from explorer.data import Loaded, parse_int

#: Grouping modes: (value, label, the track an event goes on). As the real viewer's Default,
#: CPU vs Device, NeuronCore, Thread, Process and Instance groupings. Every one is a function of
#: the ``traces`` track (run, source, core, thread), so a track's cells merge into one group.
GROUPINGS = (
    ("default", "Default", lambda e: f"{e['instance_id']}/PID:{e['process_id']}/{e['source']}/" + (
        f"NC:{e['nc_idx']}" if e["source"] != "framework" and e["nc_idx"] is not None else f"TID:{e['thread_id']}")),
    ("cpu_device", "CPU vs Device", lambda e: ("Device/NC:" + str(e["nc_idx"])) if e["source"] == "neuron_hw"
     else "CPU"),
    ("core", "NeuronCore", lambda e: f"NC:{e['nc_idx']}" if e["nc_idx"] is not None else "host"),
    ("thread", "Thread", lambda e: f"TID:{e['thread_id']}"),
    ("process", "Process", lambda e: f"{e['instance_id']}/PID:{e['process_id']}"),
    ("instance", "Instance", lambda e: str(e["instance_id"])),
)
#: Cells per track across the window when a track is summarised: about one per two screen pixels.
BUCKETS = 600


def track_name(e: dict, grouping: str) -> str:
    """The track an event (or a ``traces`` track) is drawn on under ``grouping``."""
    fn = next((f for v, _, f in GROUPINGS if v == grouping), GROUPINGS[0][2])
    return fn(e)


def origin(L: Loaded) -> int:
    """The absolute ns the page's times count from: the profile's ``t0`` (as on the timeline), or the
    first system event's start in a profile that recorded nothing else."""
    def compute():
        b = data.bounds(L)
        found = L.profile.system_extent()
        return found[0] if found is not None and b["t0"] == 0 and b["instructions"] == 0 else b["t0"]
    return L.cached("system_origin", compute)


def extent(L: Loaded) -> tuple[int, int] | None:
    """The system events' first start and last end, ns since :func:`origin` (None without events)."""
    def compute():
        found = L.profile.system_extent()
        t0 = origin(L)
        return None if found is None else (found[0] - t0, found[1] - t0)
    return L.cached("system_extent", compute)


def clamp(L: Loaded, start=None, end=None) -> tuple[int, int]:
    """A validated window (ns since ``t0``) inside the system events' extent, at least 1 µs wide; a
    pan past either end stops there. Without ``start``/``end``: the whole extent."""
    ext = extent(L) or (0, 1)
    if start is None or end is None:
        return ext
    lo, hi = ext
    a, b = parse_int(start, "start", lo - (hi - lo), hi), parse_int(end, "end", lo, hi + (hi - lo))
    width = min(max(b - a, 1_000), hi - lo)
    a = min(max(a, lo), hi - width)
    return a, a + width


def view(L: Loaded, start=None, end=None, grouping: str = "default", cores=None, names=None, instances=None,
         buckets: int = BUCKETS) -> dict:
    """What the System Trace draws for a window, under ``grouping`` and the filters.

    Returns ``{"start", "end", "t0", "tracks": [every track's name, in order, even when empty],
    "events": [{..., "track_name"}] (tracks with few events, one by one), "cells": [(track_name,
    source, cell, busy_fraction, count)] (the other tracks), "cell_ns", "count", "drawn", "summarised",
    "summarised_tracks", "source", "dropped": {"framework": n, "system": n}}`` (events the capture's
    bounds left out, ``Profile.dropped_events``). A track's budget is its own (``traces.q_system.PER_TRACK``), so a
    framework thread of a million frames never hides the runtime and device tracks.
    """
    a, b = clamp(L, start, end)
    t0 = origin(L)
    w = L.profile.system_window(t0 + a, t0 + b, buckets, cores=cores or None, names=names or None,
                                instances=instances or None)
    fine = data.rows(w.tracks)
    names_of = [track_name(r, grouping) for r in fine]
    order = sorted(set(names_of), key=lambda n: min(i for i, m in enumerate(names_of) if m == n))
    events = []
    for r in data.rows(w.events):
        r["track_name"] = track_name(r, grouping)
        r["start"] = r.pop("start_ns") - t0
        events.append(r)
    cells: dict[tuple, list] = {}
    for i, r in enumerate(fine):
        if r["exact"]:
            continue
        busy, count = w.busy[i], w.count[i]
        for k in ((busy > 0) | (count > 0)).nonzero()[0].tolist():   # tracks merged by the grouping add up
            cell = cells.setdefault((names_of[i], r["source"], k), [0.0, 0])
            cell[0] += float(busy[k]) / w.width
            cell[1] += int(count[k])
    summarised = sorted({names_of[i] for i, r in enumerate(fine) if not r["exact"] and r["events"]})
    dropped = L.cached("dropped_events", L.profile.dropped_events)
    return {"start": a, "end": b, "t0": t0, "tracks": order, "events": events, "dropped": dropped,
            "cells": [(n, s, k, min(v[0], 1.0), v[1]) for (n, s, k), v in sorted(cells.items())],
            "cell_ns": w.width, "count": sum(r["events"] for r in fine), "drawn": len(events),
            "summarised": w.summarised, "summarised_tracks": summarised, "source": w.source}


def event(L: Loaded, track, start, name) -> dict | None:
    """One event by its ``traces`` track, start (ns since :func:`origin`) and name, with its detail."""
    t0 = origin(L)
    found = L.profile.system_event(parse_int(track, "track", 0, 2**31), t0 + parse_int(start, "start"),
                                   str(name)[:500])
    if found is None:
        return None
    found = {k: data._plain(v) for k, v in found.items()}
    found["start"] = found.pop("start_ns") - t0
    return found


def chain(L: Loaded, track, start, name) -> dict | None:
    """The Dependency Chain of one event (``Profile.system_chain``) as the page keeps it (JSON, starts in ns
    since :func:`origin`): ``{"events": [...], "at", "upstream", "downstream", "edges", "more", "stack_more"}``,
    or None without such an event."""
    t0 = origin(L)
    track, start = parse_int(track, "track", 0, 2**31), parse_int(start, "start", -2**62, 2**62)
    if track is None or start is None or not name:
        raise data.ExplorerError("an event is its track, start and name: pass all three")
    c = L.profile.system_chain(track, t0 + start, str(name)[:500])
    if c is None:
        return None
    events = []
    for e in c.events:
        e = {k: data._plain(v) for k, v in e.items() if k != "run_id"}
        e["start"] = e.pop("start_ns") - t0
        events.append(e)
    return {"events": events, "at": c.at, "upstream": c.upstream, "downstream": c.downstream,
            "edges": [list(x) for x in c.edges], "more": c.more, "stack_more": c.stack_more}


def focus(e: dict, pad: float = 1.0) -> tuple[int, int]:
    """The window (ns since :func:`origin`) that frames one event: its span with ``pad`` of its length
    (at least 2 µs) either side.

    >>> focus({"start": 10_000, "dur_ns": 4_000})
    (6000, 18000)
    """
    d = max(int(e.get("dur_ns") or 0), 0)
    side = max(int(d * pad), 2_000)
    return e["start"] - side, e["start"] + d + side
