"""The timeline's Current Selection panel and its annotations (the real tool's selection summary and notes).

The panel's figures are the Summary's over the selected range, its instructions clipped to it (FLOPs
and bytes pro rata): the same ``Profile.figures`` (``window=``), so the Summary and the panel agree for
the whole session (a test says so). Below them, what the range itself holds, clipped to it: busy time
per lane, by op and by source line (:func:`explorer.timeline.range_aggregates`). Annotations
(``traces.annotate``) are stored in the profile file; writing one closes and reopens the profile
(``Registry.write``).

>>> point({"start_ns": 5, "end_ns": 5, "kind": "point", "text": "x", "id": 1})
True
"""
from __future__ import annotations

from dash import dcc, html

from explorer import data, timeline, ui
from explorer.figures import fmt_bytes, fmt_ns, fmt_window
from traces import annotate
from traces.errors import TraceError
from traces.vocab import ENGINE_LABELS


def figures(L: data.Loaded, start: int, end: int, include_warmup: bool | None = None):
    """``Profile.figures`` over ``[start, end)`` (ns since t0), clipped to it."""
    t0 = data.bounds(L)["t0"]
    return L.profile.figures(include_warmup, window=(t0 + start, t0 + end))


def point(a: dict) -> bool:
    return a["kind"] == "point"


def panel(key: str, start: int, end: int, title: str):
    """The Current Selection: the Summary's figures for the range, then busy time by lane, op and line."""
    L = data.resolve(key)
    agg = timeline.range_aggregates(L, start, end)
    f, which = figures(L, agg["start"], agg["end"]), "warm-ups excluded"
    if not f.executions:     # a range over warm-ups alone: their figures, said so
        f, which = figures(L, agg["start"], agg["end"], include_warmup=True), "warm-up executions"
    engines = " · ".join(f"{ENGINE_LABELS.get(e, e)} {pct:.1f}%" for e, pct in f.engine_percent.items() if pct)
    stats = html.Div([
        ui.stat("executions", f"{f.executions}", f"touched by the range ({which})", id="sel-executions"),
        ui.stat("device time", fmt_ns(f.device_ns), f"busy {f.device_busy_percent:.1f}%", id="sel-device"),
        ui.stat("MFU (estimated)", f"{f.mfu_percent:.2f}%", f"{f.model_flops / 1e9:.3g} GFLOP", id="sel-mfu"),
        ui.stat("MBU (estimated)", f"{f.mbu_percent:.2f}%", f"useful reads {f.useful_read_percent:.0f}%",
                id="sel-mbu"),
        ui.stat("HBM traffic", fmt_bytes(f.hbm_read_bytes + f.hbm_write_bytes),
                f"read {fmt_bytes(f.hbm_read_bytes)} · write {fmt_bytes(f.hbm_write_bytes)}", id="sel-hbm"),
        ui.stat("DMA", f"{f.engine_percent.get('dma', 0.0):.1f}% active", "of the device time", id="sel-dma"),
        ui.stat("CPU fallback", fmt_ns(f.fallback_host_ns), "host time in the range"),
    ], className="stats")
    return html.Div([
        html.H3(f"{title}: {fmt_window(agg['start'], agg['end'])}", id="timeline-agg-heading"),
        stats,
        html.Div(f"Engines active (% of device time): {engines or '—'}", className="hint", id="sel-engines"),
        html.H3("Busy in the range, by lane"),
        ui.table([("lane", "lane"), ("busy", lambda r: fmt_ns(r["busy_ns"])),
                  ("busy %", lambda r: f"{r['busy_percent']:.1f}%"), ("instructions", "instructions")],
                 agg["by_engine"], id="timeline-agg-engines", max_rows=24),
        html.H3("Top ops"),
        ui.table([("op", lambda r: dcc.Link(r["op"], href=ui.href("/timeline", profile=key, sel=r["sel"]))),
                  ("module", "module"), ("source", "where"), ("busy", lambda r: fmt_ns(r["busy_ns"])),
                  ("instructions", "instructions")], agg["by_op"], id="timeline-agg-ops"),
        html.H3("Top source lines"),
        ui.table([("line", lambda r: dcc.Link(r["where"], href=ui.href("/source", profile=key, line=r["source_id"]))
                   if r["source_id"] is not None else r["where"]),
                  ("busy", lambda r: fmt_ns(r["busy_ns"])), ("instructions", "instructions")],
                 agg["by_line"], id="timeline-agg-lines"),
    ])


def annotation_list(key: str):
    """Each annotation with a link that zooms to it and a delete button (which asks first)."""
    L = data.resolve(key)
    span = data.bounds(L)["span"]
    items = []
    for a in timeline.annotations(L):
        pad = max((a["end"] - a["start"]) // 10, 5_000)
        go = ui.href("/timeline", profile=key, start=max(a["start"] - pad, 0), end=min(a["end"] + pad, span))
        when = fmt_ns(a["start"]) if point(a) else fmt_window(a["start"], a["end"])
        items.append(html.Li([dcc.Link(a["text"], href=go, className="annotation-go"), f" · {when} ",
                              html.Button("delete", id={"type": "timeline-note-del", "id": a["id"]},
                                          className="btn", n_clicks=0)]))
    return html.Ul(items, id="timeline-notes-list") if items else html.Div(
        "No annotations yet: type a note and press Add (box-select a range first for a range note).",
        className="hint", id="timeline-notes-list")


def add(key: str, start: int, end: int, text: str) -> dict:
    """Store an annotation ``[start, end]`` (ns since t0; a point when equal) in the profile."""
    L = data.resolve(key)
    b = data.bounds(L)
    a = data.parse_int(start, "start", 0, b["span"])
    e = data.parse_int(end, "end", 0, b["span"])
    try:
        annotate.checked_text(text)
        return data.registry().write(key, lambda path: annotate.add(path, b["t0"] + a, b["t0"] + e, text))
    except TraceError as exc:
        raise data.ExplorerError(str(exc)) from None


def delete(key: str, ann_id) -> None:
    """Delete annotation ``ann_id`` from the profile."""
    n = data.parse_int(ann_id, "annotation id", 0, 10**9)
    try:
        data.registry().write(key, lambda path: annotate.delete(path, n))
    except TraceError as exc:
        raise data.ExplorerError(str(exc)) from None
