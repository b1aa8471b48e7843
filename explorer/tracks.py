"""The timeline's counter tracks (HFU, throttling, device memory) and its search, shaped for the page from the
``traces`` answers (``Profile.hfu_track``, ``throttle_track``, ``memory_track``, ``search``); times in ns since t0.

>>> match_window({"start": 1_000, "dur": 10}, width=100_000, span=10**9)
(0, 100000)
"""
from __future__ import annotations

from explorer import data
from explorer.data import Loaded
from traces.errors import TraceError

#: Buckets of the HFU track (a coarse strip under the lanes).
HFU_BUCKETS = 200


def counters(L: Loaded, start: int, end: int) -> dict:
    """HFU (%) and throttled time (%, None without a limiter) per bucket and device memory steps over
    ``[start, end)`` (ns since t0)."""
    t0 = data.bounds(L)["t0"]
    h = L.profile.hfu_track(t0 + start, t0 + end, HFU_BUCKETS)
    th = L.profile.throttle_track(t0 + start, t0 + end, HFU_BUCKETS)
    w = (end - start) / HFU_BUCKETS
    memory = [(t - t0, b) for t, b in L.profile.memory_track(t0 + start, t0 + end)]
    return {"start": start, "end": end, "hfu_x": [start + (i + 0.5) * w for i in range(HFU_BUCKETS)],
            "hfu": [float(v) for v in h], "throttle": None if th is None else [float(v) for v in th],
            "memory": memory, "target": data.metadata(L).get("target", "")}


def search(L: Loaded, text: str, after: int | None = None, before: int | None = None, limit: int = 20) -> dict:
    """``Profile.search`` with times in ns since t0 and each match's op; a bad text is an ExplorerError."""
    t0 = data.bounds(L)["t0"]
    try:
        r = L.profile.search(text, None if after is None else t0 + after, None if before is None else t0 + before,
                             limit)
    except TraceError as exc:
        raise data.ExplorerError(str(exc)) from None
    info = data.ops(L)
    r["matches"] = [dict(m, start=m.pop("start_ns") - t0, dur=m.pop("dur_ns"),
                         op=data.op_label(info.get(m["op_id"])), where=data.where(info.get(m["op_id"])))
                    for m in r["matches"]]
    return r


def match_window(m: dict, width: int, span: int) -> tuple[int, int]:
    """A window of ``width`` (at least 20 × the match's duration) centred on a match, inside the session."""
    width = max(int(width), 20 * max(int(m["dur"]), 1), 1_000)
    width = min(width, span)
    a = min(max(int(m["start"]) + int(m["dur"]) // 2 - width // 2, 0), span - width)
    return a, a + width
