"""The timeline's data: its lanes, the window it opens on, what a window draws, range aggregates.

Shapes the ``traces`` timeline answers (``Profile.timeline_bounds``, ``window_count``,
``lane_cells``, ``spans`` ...) for ``explorer/pages/timeline.py`` and ``explorer/figures.py``;
nothing here writes SQL or decides a window rule. Windows are ns since the profile's ``t0``.

>>> lane_key(0, "dma", "qSyncIO0"), lane_key(1, "tensor", None)
('dma:0:qSyncIO0', 'eng:1:tensor')
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from explorer import data
from explorer.data import Loaded, parse_int
from traces.q_timeline import fit_window
from traces.vocab import ENGINE_LABELS, HOST_TRANSFER_QUEUE, LANE_ORDER

#: Instructions drawn one by one only when the visible window holds at most this many.
RAW_CAP = 4000
#: Spans (executions, host and compile events) drawn one by one up to this many per window.
SPAN_CAP = 3000
#: Time buckets per lane in level-of-detail mode: about one per two screen pixels.
MAX_BUCKETS = 800


def clamp_window(L: Loaded, start=None, end=None, sel=None) -> tuple[int, int]:
    """A validated [start, end) window in ns since t0; with neither end given (or an empty window),
    the window the timeline opens on: the busy executions (``data.bounds(L)["fit"]``), or with a
    selection the busy executions of the graphs that hold it (:func:`focus`)."""
    b = data.bounds(L)
    span = b["span"]
    a = parse_int(start, "start", 0, span) if start is not None else None
    e = parse_int(end, "end", 0, span) if end is not None else None
    if a is None and e is None:
        return focus(L, sel) or b["fit"]
    a = 0 if a is None else a
    e = span if e is None else e
    return (a, e) if e > a else b["fit"]


def focus(L: Loaded, sel) -> tuple[int, int] | None:
    """The window a selection opens on: the busy executions of the graphs holding its ops
    (``Profile.graph_fit``, the timeline's one fit rule), in ns since t0; None without a selection or
    when none of those graphs ran."""
    chosen = data.selection_ops(L, sel) if sel else set()
    graphs = {(data.ops(L).get(o) or {}).get("graph_id") for o in chosen} - {None}
    fit = L.profile.graph_fit(sorted(graphs)) if graphs else None
    t0 = data.bounds(L)["t0"]
    return (fit[0] - t0, fit[1] - t0) if fit else None


def within_session(L: Loaded, start: float, end: float) -> tuple[int, int]:
    """``[start, end)`` moved (not shrunk) to lie inside the session, at most the session wide:
    a pan past either end stops there instead of failing validation."""
    span = data.bounds(L)["span"]
    width = min(max(int(end - start), 1), span)
    a = min(max(int(start), 0), span - width)
    return a, a + width


@dataclass
class Lane:
    key: str           # the figure's id: "host", "compile", "exec:0", "eng:0:tensor", "dma:0:qSyncIO0"
    label: str         # as the real tool names it: Tensor(nc0), qSyncIO0(nc0)
    kind: str          # host | compile | exec | engine | dma
    core: int | None = None
    engine: str | None = None
    queue: str | None = None


def lanes(L: Loaded) -> list[Lane]:
    """Timeline lanes top to bottom: compile, host, then per core its executions, DMA lanes (its host<->device
    copies, then its instruction queues) and engines."""
    def compute():
        out = [Lane("compile", "Compile", "compile"), Lane("host", "Host (CPU)", "host")]
        found = data.rows(L.profile.lanes())
        for core in sorted({r["core"] for r in found if r["core"] is not None}):
            out.append(Lane(f"exec:{core}", f"Executions(nc{core})", "exec", core))
            mine = [r for r in found if r["core"] == core and r["engine"] is not None]
            # the core's host<->device copies first, then its instruction queues
            dma = sorted({r["queue"] or "qDMA" for r in mine if r["engine"] == "dma"},
                         key=lambda q: (q != HOST_TRANSFER_QUEUE, _natural(q)))
            out += [Lane(f"dma:{core}:{q}", f"{q}(nc{core})", "dma", core, "dma", q) for q in dma]
            engines = {r["engine"] for r in mine if r["engine"] != "dma"}
            for eng in [e for e in LANE_ORDER if e in engines] + sorted(engines - set(LANE_ORDER)):
                out.append(Lane(lane_key(core, eng, None), lane_label(core, eng, None), "engine", core, eng))
        return out
    return L.cached("lanes", compute)


def _natural(text: str):
    """Sort key so qSyncIO2 comes before qSyncIO10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def lane_key(core, engine, queue) -> str:
    """The figure's id of an instruction lane."""
    return f"dma:{core}:{queue or 'qDMA'}" if engine == "dma" else f"eng:{core}:{engine}"


def lane_label(core, engine, queue) -> str:
    """An instruction lane as the real tool names it: ``Tensor(nc0)``, ``qSyncIO0(nc0)``."""
    return (f"{queue or 'qDMA'}(nc{core})" if engine == "dma"
            else f"{ENGINE_LABELS.get(engine, engine)}(nc{core})")


def _instruction(r: dict, t0: int) -> dict:
    r = dict(r)
    r["start"], r["dur"] = r.pop("start_ns") - t0, r.pop("dur_ns")
    return r


_REGION = re.compile(r"(layer|kernel|collective):(\d{1,9})")


def region_mark(L: Loaded, spec) -> dict | None:
    """The region a Regions page link names (``layer:12``: a kind and the region's index among that kind's
    regions, as that page numbers them) to highlight on the timeline: ``{"spec", "by", "index", "name", "core",
    "start", "end"}`` (ns since t0); None without one. Example: ``region_mark(L, "layer:3")["name"]``."""
    if spec in (None, ""):
        return None
    m = _REGION.fullmatch(str(spec))
    if not m:
        raise data.ExplorerError("region must look like layer:<n>, kernel:<n> or collective:<n> "
                                 "(a link from the Regions page)")
    from explorer import records

    by = m.group(1)
    rows = records.regions(L, None, by)["all"]
    if not rows:
        raise data.ExplorerError(f"this profile has no regions by {by}")
    r = rows[parse_int(m.group(2), "region", 0, len(rows) - 1)]
    return {"spec": f"{by}:{r['index']}", "by": by, "index": r["index"], "name": r["region"], "core": r["core"],
            "start": r["start_ns"], "end": max(r["end_ns"], r["start_ns"] + 1)}


def timeline(L: Loaded, start=None, end=None, sel=None, buckets: int = MAX_BUCKETS, fold: bool = True,
             region=None) -> dict:
    """What the timeline draws for a window: raw instructions when few, else level-of-detail buckets.

    Without ``start``/``end`` the window is the busy executions (:func:`clamp_window`). With ``fold``,
    lanes with nothing in the window (mostly idle DMA queues) are left out and counted in ``folded``.
    Returns ``{"start", "end", "fit", "span", "mode": "raw"|"lod", "lanes": [...],
    "instructions": [...] (raw),
    "buckets": {lane_key: [(bucket, busy_fraction, count, top_op_id)]} (lod), "bucket_ns",
    "spans": [...], "highlight": ...}``. Never more than ``RAW_CAP`` instructions or
    ``lanes × buckets`` cells, whatever the profile's size. The level of detail is the ``traces``
    rule (``Profile.lane_cells``): the grid is exactly ``buckets`` cells over the window. ``region``
    (:func:`region_mark`) is shaded as ``"region"``; without a window the timeline opens on it, with the margin
    the fitted window has.
    """
    mark = region_mark(L, region)
    if mark and start is None and end is None:
        start, end = fit_window(mark["start"], mark["end"], (0, data.bounds(L)["span"]))
    a, b = clamp_window(L, start, end, sel)
    buckets = max(10, min(int(buckets), MAX_BUCKETS))
    bounds = data.bounds(L)
    t0 = bounds["t0"]
    A, B = t0 + a, t0 + b
    chosen = data.selection_ops(L, sel)
    n_in = L.profile.window_count(A, B)
    out = {"start": a, "end": b, "t0": t0, "fit": bounds["fit"], "span": bounds["span"], "lanes": lanes(L),
           "count": n_in, "selection": sorted(chosen),
           "selection_text": data.describe_selection(L, sel) if sel else ""}
    if n_in <= RAW_CAP:
        out["mode"] = "raw"
        found = data.rows(L.profile.window_instructions(A, B, RAW_CAP))
        out["instructions"] = [_instruction(r, t0) for r in found]
    else:
        out["mode"] = "lod"
        out.update(_lod(L, A, B, buckets, chosen))
    out["spans"] = _spans(L, A, B, t0)
    # the cap keeps the longest spans; say how many it left out rather than stop a lane silently
    out["spans_hidden"] = max(0, L.profile.span_count(A, B) - len(out["spans"]))
    out["annotations"] = [n for n in annotations(L) if n["start"] <= b and n["end"] >= a]
    out["region"] = mark
    out["folded"] = 0
    if fold:
        used = ({lane_key(r["core"], r["engine"], r["queue"]) for r in out.get("instructions", ())}
                | set(out.get("buckets", {})) | {s["lane"] for s in out["spans"]})
        kept = [lane for lane in out["lanes"] if lane.key in used]
        out["folded"], out["lanes"] = len(out["lanes"]) - len(kept), kept
    return out


def annotations(L: Loaded) -> list[dict]:
    """The profile's annotations (``Profile.annotations``) with ``start``/``end`` in ns since t0."""
    t0 = data.bounds(L)["t0"]
    return [dict(a, start=a["start_ns"] - t0, end=a["end_ns"] - t0) for a in L.profile.annotations()]


def _lod(L, A, B, buckets, chosen) -> dict:
    """Busy fraction, instruction count and longest op per lane and cell, plus where the selected ops ran."""
    cells = L.profile.lane_cells(A, B, buckets)
    width = cells.width
    out: dict[str, list] = {}
    lane_rows = cells.lanes.to_pylist()
    for i, r in enumerate(lane_rows):
        busy, count, top = cells.busy[i], cells.count[i], cells.top_op[i]
        for k in busy.nonzero()[0]:
            out.setdefault(lane_key(r["core"], r["engine"], r["queue"]), []).append(
                (int(k), min(float(busy[k]) / width, 1.0), int(count[k]),
                 int(top[k]) if top[k] >= 0 else None))
    hl: dict[str, list] = {}
    if chosen:
        for r in data.rows(L.profile.selected_counts(A, B, buckets, chosen)):
            hl.setdefault(lane_key(r["core"], r["engine"], r["queue"]), []).append((r["bucket"], r["n"]))
    return {"bucket_ns": width, "bucket_origin": A - data.bounds(L)["t0"], "buckets": out, "highlight": hl,
            "lod_source": cells.source}


def _spans(L, A, B, t0) -> list[dict]:
    """Executions, CPU-fallback/host and compile spans in the window (capped; biggest kept); a host<->device
    copy goes on its core's ``host_to_device_transfers`` DMA lane."""
    ex, ev = L.profile.spans(A, B, SPAN_CAP)
    out = []
    for r in data.rows(ex):
        core = r.pop("core")
        r.update(lane=f"exec:{core}", start=r.pop("start_ns") - t0, kind="exec")
        out.append(r)
    for r in data.rows(ev):
        kind, core = r["kind"], r.pop("core", None)
        lane = ("compile" if kind in ("compile", "recompile", "cache_hit")
                else f"dma:{core}:{HOST_TRANSFER_QUEUE}" if kind == "host_transfer" and core is not None
                else "host")
        r.update(lane=lane, start=r.pop("start_ns") - t0, name=kind)
        out.append(r)
    return out


def instruction_at(L: Loaded, core: int, engine: str, start: int, pc: int | None = None) -> dict | None:
    """One instruction by lane and start time (ns since t0), with its op and source line."""
    t0 = data.bounds(L)["t0"]
    found = L.profile.instruction_at(int(core), str(engine), t0 + int(start), pc)
    if found is None:
        return None
    r = _instruction({k: data._plain(v) for k, v in found.items()}, t0)
    o = data.ops(L).get(r["op_id"])
    r.update(op=data.op_label(o), module=(o or {}).get("module_path", ""), where=data.where(o),
             source_id=(o or {}).get("source_id"), file=(o or {}).get("file"), line=(o or {}).get("line"))
    return r


def range_aggregates(L: Loaded, start=None, end=None, limit: int = 12) -> dict:
    """What a brushed range holds: busy time by lane, by op and by source line (time clipped to the range)."""
    a, b = clamp_window(L, start, end)
    t0 = data.bounds(L)["t0"]
    A, B = t0 + a, t0 + b
    by_engine = data.rows(L.profile.range_by_lane(A, B))
    for r in by_engine:
        r["lane"] = lane_label(r["core"], r["engine"], r["queue"])
        r["busy_percent"] = 100.0 * r["busy_ns"] / max(b - a, 1)
    info = data.ops(L)
    by_line: dict[str, dict] = {}
    paths: dict[str, dict] = {}
    for r in data.rows(L.profile.range_by_op(A, B)):
        o = info.get(r["op_id"]) or {}
        key = data.op_path_key(o)
        d = paths.setdefault(key, {"sel": f"path:{key}", "op": data.op_label(o),
                                   "module": o.get("module_path", ""),
                                   "where": data.where(o), "busy_ns": 0, "instructions": 0})
        d["busy_ns"] += r["busy_ns"]
        d["instructions"] += r["instructions"]
        key = data.where(o) or "(no source)"
        d = by_line.setdefault(key, {"where": key, "source_id": o.get("source_id"), "busy_ns": 0,
                                     "instructions": 0})
        d["busy_ns"] += r["busy_ns"]
        d["instructions"] += r["instructions"]
    lines = sorted(by_line.values(), key=lambda r: -r["busy_ns"])
    by_op = sorted(paths.values(), key=lambda r: -r["busy_ns"])
    return {"start": a, "end": b, "by_engine": by_engine, "by_op": by_op[:limit], "by_line": lines[:limit]}


#: rows per table in a window's CSV export (a bound on what one click writes)
CSV_MAX_ROWS = 1_000_000


def window_csv_zip(L: Loaded, start: int, end: int, sampled: bool = True) -> tuple[bytes, list[str]]:
    """The window ``[start, end)`` (ns since t0) as the real tool's CSV export: a zip of ``Instruction.csv``,
    ``DmaPacket.csv``, ``CcInstruction.csv``, ``SemaphoreUpdate.csv`` (each row first with its
    ``timeline_track``) and ``SbufAllocation.csv``; and the names of the tables cut at ``CSV_MAX_ROWS``.
    ``sampled``: one event per track and timeline bucket (``MAX_BUCKETS`` across the window, about what the
    timeline draws), as the real tool's default; else every event."""
    import io
    import zipfile

    import pyarrow.csv as pacsv

    from traces.export import window_tables

    a, b = clamp_window(L, start, end)
    t0 = data.bounds(L)["t0"]
    buf, cut = io.BytesIO(), []
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, (table, truncated) in window_tables(L.profile, t0 + a, t0 + b, CSV_MAX_ROWS,
                                                        MAX_BUCKETS if sampled else None).items():
            out = io.BytesIO()
            pacsv.write_csv(table, out)
            z.writestr(f"{name}.csv", out.getvalue())
            if truncated:
                cut.append(name)
    return buf.getvalue(), cut
