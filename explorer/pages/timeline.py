"""Timeline: a lane per core × engine and DMA queue, host and compile lanes, executions as spans.

The page opens fitted to the executions (``Profile.timeline_bounds().fit``, the one window rule of
``traces.q_timeline``), not on the whole session, whose compiles can dwarf the device work; **Fit**
comes back to it and **Whole session** shows everything. Zoom and pan (the keys in :data:`KEYS`, drag
on the plot, scroll, or the URL's ``start``/``end``) re-query DuckDB: the page gets raw
instructions only when the window holds at most ``timeline.RAW_CAP`` of them, otherwise
busy-fraction buckets. Box-select (toolbar) a range to see its aggregates by lane, op and source
line; click an instruction for its op and source line.
"""
from __future__ import annotations

import json
import math
import time

import dash
from dash import ALL, ClientsideFunction, Input, Output, State, callback, clientside_callback, ctx, dcc, html

from explorer import data, records, selection, timeline, tracks, ui
from explorer.figures import counter_figure, fmt_ns, fmt_window, timeline_figure
from traces import annotate
from traces.q_timeline import fit_window
from traces.vocab import ENGINES

GRAPH_CONFIG = {"scrollZoom": True, "displaylogo": False,
                "modeBarButtonsToRemove": ["lasso2d", "autoScale2d", "toImage"]}

#: The timeline's keys, as in Perfetto: (key, what it does, action, amount). The one table: the
#: help line below, docs/explorer.md and assets/timeline_keys.js (which reads it from the page) use
#: it. ``zoom`` multiplies the window's width around the mouse (or the centre); ``pan`` moves the
#: window by that fraction of its width; ``fit`` clicks Fit. Ignored while typing in an input.
KEYS = (
    ("W", "zoom in", "zoom", 0.5),
    ("S", "zoom out", "zoom", 2.0),
    ("A", "pan left", "pan", -0.25),
    ("D", "pan right", "pan", 0.25),
    ("F", "fit to the busy executions", "fit", 0),
)


def keys_help() -> str:
    """The help line's key list: ``W zoom in · S zoom out · …``."""
    return " · ".join(f"{k} {what}" for k, what, *_ in KEYS)


def _status(tl: dict) -> str:
    hidden, folded = tl.get("spans_hidden", 0), tl.get("folded", 0)
    more = f" · {hidden:,} more spans not drawn — zoom in" if hidden else ""
    more += f" · {folded} empty lane{'s' * (folded != 1)} folded" if folded else ""
    if tl["mode"] == "raw":
        return f"{tl['count']:,} instructions in {fmt_ns(tl['end'] - tl['start'])}, drawn one by one{more}"
    return (f"{tl['count']:,} instructions in {fmt_ns(tl['end'] - tl['start'])}: level of detail, "
            f"{fmt_ns(tl['bucket_ns'])} per bucket; zoom in below {timeline.RAW_CAP:,} to see each "
            f"instruction{more}")


def render(key, start=None, end=None, sel=None, fold=True, region=None):
    """Figure, normalised state, status text, selection words and window label for a window
    (the callbacks' shared path; no ``start``/``end``: fitted to the busy executions, or to the
    selection's, or to ``region``'s). ``fold``: leave out the lanes with nothing in the window;
    ``region``: a Regions page region (``layer:3``) shaded with its name."""
    L = data.resolve(key)
    tl = timeline.timeline(L, start, end, sel, fold=fold, region=region)
    state = {"profile": key, "start": tl["start"], "end": tl["end"], "sel": sel or "", "fold": fold,
             "region": (tl["region"] or {}).get("spec", "")}
    return (timeline_figure(tl, data.ops(L)), state, _status(tl), tl.get("selection_text", ""),
            fmt_window(tl["start"], tl["end"]))


@ui.guarded
def layout(profile=None, start=None, end=None, sel=None, lanes=None, region=None, **_):
    key = ui.profile_key(profile)
    fig, state, status, sel_text, window = render(key, start, end, sel, fold=lanes != "all", region=region)
    span_us = data.bounds(data.resolve(key))["span"] / 1e3
    keys = [{"key": k.lower(), "action": action, "amount": amount} for k, _what, action, amount in KEYS]
    return html.Div([
        *ui.url_sink("timeline"),
        dcc.Store(id="timeline-state", data=state),
        # the x range asked for: by a key (assets/timeline_keys.js) or a drag/scroll/double-click (the
        # graph's relayout events, filtered in assets/explorer.js so an autosize event that follows a
        # request cannot replace it before the server has answered)
        dcc.Store(id="timeline-request"),
        html.Div(id="timeline-keys", hidden=True, **{"data-keys": json.dumps(keys), "data-span-us": span_us}),
        html.Div([
            html.Button("Fit", id="timeline-fit", className="btn", title="fit the window to the executions"),
            html.Button("Whole session", id="timeline-whole", className="btn",
                        title="everything recorded: compiles, loads and executions"),
            html.Button("Show empty lanes" if state["fold"] else "Fold empty lanes", id="timeline-fold",
                        className="btn", title="lanes with nothing in this window (mostly idle DMA queues)"),
            html.Button("CSV of this window", id="timeline-csv", className="btn",
                        title="Instruction.csv, DmaPacket.csv, CcInstruction.csv, SemaphoreUpdate.csv (each with "
                              "timeline_track), SbufAllocation.csv"),
            html.Span(dcc.Checklist([{"label": "sampled", "value": "sampled"}], ["sampled"],
                                    id="timeline-csv-sampled", inline=True),
                      title="sample at the timeline's resolution: one event per track and bucket, about what is "
                            "drawn; clear it for every event in the window"),
            dcc.Download(id="timeline-download"),
            html.Strong(window, id="timeline-window"),
            html.Span(status, id="timeline-status"),
            html.Span([html.Span(sel_text, id="timeline-selection"), " ",
                       html.Button("clear", id="timeline-clear", className="btn")],
                      className="pill", hidden=not sel_text, id="timeline-selection-pill"),
            _region_pill(key, state["region"]),
        ], className="toolbar"),
        html.Div(f"Keys: {keys_help()} · drag or scroll to zoom · double-click to fit · "
                 "click an execution, compile or fallback to zoom to it · "
                 "box-select (toolbar) to aggregate a range · click an instruction for its source line",
                 className="hint", id="timeline-help"),
        html.Div([dcc.Input(id="timeline-search-text", type="search", maxLength=100, debounce=True,
                            placeholder="search: opcode (MATMUL), op (addmm), line (model.py:15), tensor"),
                  html.Button("Find", id="timeline-search-go", className="btn"),
                  html.Button("◀ previous", id="timeline-search-prev", className="btn"),
                  html.Button("next ▶", id="timeline-search-next", className="btn"),
                  html.Span(id="timeline-search-status", className="hint")], className="toolbar"),
        html.Div(id="timeline-search-results"),
        html.Div(dcc.Loading(dcc.Graph(id="timeline-graph", figure=fig, config=GRAPH_CONFIG), delay_show=400),
                 className="card"),
        html.Div([dcc.Graph(id="timeline-counters", config={"displaylogo": False, "displayModeBar": False}),
                  html.Div(_throttle_note(key), className="hint", id="timeline-throttle")], className="card"),
        html.Div([
            html.H3("Annotations"),
            html.Div([dcc.Input(id="timeline-note-text", type="text", maxLength=annotate.MAX_TEXT, debounce=False,
                                placeholder="a note: box-select a range first, or click an instruction for a point"),
                      html.Button("Add", id="timeline-note-add", className="btn"),
                      html.Span(id="timeline-note-status", className="hint")], className="toolbar"),
            html.Div(selection.annotation_list(key), id="timeline-notes"),
            dcc.Store(id="timeline-note-pending"),
            dcc.ConfirmDialog(id="timeline-note-confirm"),
        ], className="card", id="timeline-notes-card"),
        html.Div([
            html.Div([html.H3("Instruction"), html.Div("Click an instruction bar.", id="timeline-details",
                                                       className="hint")], className="card col"),
            html.Div([html.H3(id="timeline-agg-title", children="Current Selection"),
                      html.Div(id="timeline-aggregates")], className="card col"),
        ], className="row"),
    ])


def _region_pill(key, spec) -> html.Span:
    """The highlighted region named, with what it was cut by and its span, and a button that drops it."""
    mark = timeline.region_mark(data.resolve(key), spec)
    text = (f"region {mark['name']} · core {mark['core']} · {fmt_ns(mark['end'] - mark['start'])} "
            f"({dict(layer='by layer', kernel='NKI kernel', collective='between collectives')[mark['by']]})"
            if mark else "")
    return html.Span([html.Span(text, id="timeline-region"), " ",
                      html.Button("clear", id="timeline-region-clear", className="btn")],
                     className="pill region", hidden=not mark, id="timeline-region-pill")


def _throttle_note(key) -> str:
    """What the throttling track shows, or why there is none (a target whose cost model has no limiter)."""
    md = data.metadata(data.resolve(key))
    target = md.get("target", "this device")
    ramp = float(md.get("tensor_engine_throttle_ramp_ns") or 0)
    if ramp:
        return (f"Throttled %: the share of time the Tensor Engine ran under {target}'s power limiter (the "
                "Throttle view: after an idle gap it restarts at 50 % of the peak rate, ramping back to 100 % "
                f"over {fmt_ns(ramp)}), averaged over the cores' PE arrays.")
    return (f"No throttling track: the cost model of {target} has no Tensor Engine power limiter, so nothing "
            "throttles (trn2's has).")


@callback(Output("timeline-counters", "figure"), Input("timeline-state", "data"))
def counter_tracks(state):
    """HFU and device memory in use over the timeline's window (``explorer.tracks.counters``)."""
    return counter_figure(tracks.counters(data.resolve(state["profile"]), state["start"], state["end"]))


@callback(Output("timeline-request", "data", allow_duplicate=True), Output("timeline-search-status", "children"),
          Output("timeline-search-results", "children"),
          Input("timeline-search-go", "n_clicks"), Input("timeline-search-prev", "n_clicks"),
          Input("timeline-search-next", "n_clicks"), Input("timeline-search-text", "n_submit"),
          State("timeline-search-text", "value"), State("timeline-state", "data"), prevent_initial_call=True)
def search(_go, _prev, _next, _submit, text, state):
    """Find instructions by opcode, op, line or tensor: list the first matches and zoom to one (Find: the
    first in or after the window; previous / next: around the window's centre)."""
    key, width = state["profile"], state["end"] - state["start"]
    centre = (state["start"] + state["end"]) // 2
    L = data.resolve(key)
    try:
        if ctx.triggered_id == "timeline-search-next":
            found = tracks.search(L, text, after=centre, limit=1)
        elif ctx.triggered_id == "timeline-search-prev":
            found = tracks.search(L, text, before=centre - 1, limit=1)
        else:
            found = tracks.search(L, text, after=state["start"] - 1, limit=40)
    except data.ExplorerError as exc:
        return dash.no_update, str(exc), dash.no_update
    why = ", ".join(f"{n} op{'s' * (n != 1)} by {k}" for k, n in found["ops"].items())
    said = f"{found['count']:,} instructions match {found['text']!r}" + (f" ({why})" if why else "")
    if not found["matches"]:
        return dash.no_update, said + ": none further that way", dash.no_update
    span = data.bounds(L)["span"]
    a, b = tracks.match_window(found["matches"][0], width if ctx.triggered_id != "timeline-search-go"
                               else min(width, 200 * max(found["matches"][0]["dur"], 1)), span)
    listing = dash.no_update
    if ctx.triggered_id not in ("timeline-search-next", "timeline-search-prev"):
        listing = html.Ul([html.Li(dcc.Link(f"{fmt_ns(m['start'])} · {m['opcode']} · {m['op']} {m['where']} · "
                                            f"{timeline.lane_label(m['core'], m['engine'], m['queue'])}",
                                            href=ui.href("/timeline", profile=key, sel=state.get("sel"),
                                                         start=tracks.match_window(m, width, span)[0],
                                                         end=tracks.match_window(m, width, span)[1])))
                           for m in found["matches"]], id="timeline-search-list", className="search-results")
    return {"xaxis.range": [a / 1e3, b / 1e3], "n": time.time()}, said, listing


def _window_from_relayout(relayout: dict, state: dict):
    """The new [start, end) in ns since t0 from a Plotly relayout event or a key's request (both in µs;
    ``(None, None)``: fit), or None if the x range did not change."""
    if not relayout:
        return None
    if relayout.get("xaxis.autorange"):   # double-click: back to the fitted window
        return None, None
    lo = relayout.get("xaxis.range[0]", (relayout.get("xaxis.range") or [None, None])[0])
    hi = relayout.get("xaxis.range[1]", (relayout.get("xaxis.range") or [None, None])[1])
    if lo is None or hi is None:
        return None
    try:
        lo, hi = float(lo) * 1e3, float(hi) * 1e3
    except (TypeError, ValueError):
        lo = hi = math.nan
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise data.ExplorerError("the x range must be two finite numbers of µs")
    # a pan (keys A/D, drag) past either end of the session stops there
    return timeline.within_session(data.resolve(state["profile"]), lo, hi)


@callback(Output("timeline-graph", "figure"), Output("timeline-state", "data"), Output("timeline-status", "children"),
          Output("timeline-selection", "children"), Output("timeline-selection-pill", "hidden"),
          Output("timeline-url", "data"), Output("timeline-window", "children"),
          Output("timeline-fold", "children"),
          Input("timeline-request", "data"), Input("timeline-fit", "n_clicks"),
          Input("timeline-whole", "n_clicks"), Input("timeline-clear", "n_clicks"),
          Input("timeline-fold", "n_clicks"), Input("timeline-graph", "clickData"),
          State("timeline-state", "data"), prevent_initial_call=True)
def zoom(request, _fit, _whole, _clear, _fold, click, state):
    """Zoom, pan (keys, drag, scroll), fit, whole session, fold or show empty lanes, clear the selection, or
    a click on an execution / compile / fallback span (zoom to it): re-query the window at the right
    level of detail (the highlighted region, if any, stays)."""
    start, end, sel = state.get("start"), state.get("end"), state.get("sel")
    fold = state.get("fold", True)
    if ctx.triggered_id == "timeline-fit":
        start, end = None, None
    elif ctx.triggered_id == "timeline-whole":
        start, end = 0, data.bounds(data.resolve(state["profile"]))["span"]
    elif ctx.triggered_id == "timeline-clear":
        sel = ""
    elif ctx.triggered_id == "timeline-fold":
        fold = not fold
    elif ctx.triggered_id == "timeline-graph":
        try:
            window = _span_window(click, state)
        except data.ExplorerError as exc:
            return (dash.no_update,) * 2 + (str(exc),) + (dash.no_update,) * 5
        if window is None:
            return (dash.no_update,) * 8
        start, end = window
    else:
        try:
            window = _window_from_relayout(request if isinstance(request, dict) else {}, state)
        except data.ExplorerError as exc:
            return (dash.no_update,) * 2 + (str(exc),) + (dash.no_update,) * 5
        if window is None:
            return (dash.no_update,) * 8
        start, end = window
    try:
        fig, new_state, status, sel_text, label = render(state["profile"], start, end, sel, fold, state.get("region"))
    except data.ExplorerError as exc:
        return (dash.no_update,) * 2 + (str(exc),) + (dash.no_update,) * 5
    url = {"start": new_state["start"], "end": new_state["end"], "sel": new_state["sel"],
           "lanes": "" if fold else "all", "region": new_state["region"]}
    return (fig, new_state, status, sel_text, not sel_text, url, label,
            "Show empty lanes" if fold else "Fold empty lanes")


@callback(Output("timeline-state", "data", allow_duplicate=True),
          Output("timeline-request", "data", allow_duplicate=True), Output("timeline-region-pill", "hidden"),
          Input("timeline-region-clear", "n_clicks"), State("timeline-state", "data"), prevent_initial_call=True)
def clear_region(_clicks, state):
    """Drop the highlighted region: the same window asked for again (:func:`zoom` redraws it without)."""
    if not isinstance(state, dict) or not state.get("region"):
        return dash.no_update, dash.no_update, True
    return ({**state, "region": ""}, {"xaxis.range": [state["start"] / 1e3, state["end"] / 1e3], "n": time.time()},
            True)


def _span_window(click, state):
    """The window a click on a span (an execution, compile, recompile or CPU fallback: customdata
    ``["span", start, dur]``) zooms to: the span with the timeline's fit margin; None for anything else."""
    point = ((click or {}).get("points") or [{}])[0]
    custom = point.get("customdata")
    if not (isinstance(custom, list) and len(custom) == 3 and custom[0] == "span"):
        return None
    L = data.resolve(state["profile"])
    span = data.bounds(L)["span"]
    a = data.parse_int(custom[1], "start", 0, span)
    e = a + max(data.parse_int(custom[2], "duration", 0, span), 1)
    return fit_window(a, e, (0, span))


@callback(Output("timeline-aggregates", "children"), Output("timeline-agg-title", "children"),
          Input("timeline-graph", "selectedData"), Input("timeline-state", "data"))
def aggregates(selected, state):
    """The Current Selection: the Summary's figures over the brushed range (or the window), clipped to it,
    then busy time by lane, op and source line clipped to it (``explorer.selection.panel``)."""
    start, end, title = state["start"], state["end"], "Current Selection (this window)"
    rng = _brushed(selected) if ctx.triggered_id == "timeline-graph" else None
    if rng:
        (start, end), title = rng, "Current Selection (box-selected range)"
    try:
        return selection.panel(state["profile"], start, end, "Figures"), title
    except data.ExplorerError as exc:
        return ui.error_box(str(exc)), title


def _brushed(selected):
    """The x range of a box selection, ns since t0, or None."""
    rng = (selected or {}).get("range", {}).get("x")
    if not rng:
        return None
    try:
        return max(int(float(rng[0]) * 1e3), 0), max(int(float(rng[1]) * 1e3), 1)
    except (TypeError, ValueError, IndexError):
        return None


@callback(Output("timeline-notes", "children"), Output("timeline-note-status", "children"),
          Output("timeline-graph", "figure", allow_duplicate=True), Output("timeline-note-text", "value"),
          Input("timeline-note-add", "n_clicks"), Input("timeline-note-confirm", "submit_n_clicks"),
          State("timeline-note-text", "value"), State("timeline-graph", "selectedData"),
          State("timeline-graph", "clickData"), State("timeline-note-pending", "data"),
          State("timeline-state", "data"), prevent_initial_call=True)
def notes(_add, _confirm, text, selected, click, pending, state):
    """Add an annotation (the box-selected range, else a point at the clicked instruction, else the
    window's centre) or delete the one confirmed; store it in the profile and redraw."""
    key = state["profile"]
    try:
        if ctx.triggered_id == "timeline-note-confirm":
            selection.delete(key, pending)
            said = "deleted"
        else:
            rng = _brushed(selected)
            custom = (((click or {}).get("points") or [{}])[0]).get("customdata")
            at = custom[2] if isinstance(custom, list) and len(custom) == 5 else (state["start"] + state["end"]) // 2
            a, e = rng or (at, at)
            note = selection.add(key, a, e, text)
            said = f"added a {note['kind']} note"
        fig, *_ = render(key, state["start"], state["end"], state.get("sel"), state.get("fold", True),
                         state.get("region"))
    except data.ExplorerError as exc:
        return dash.no_update, str(exc), dash.no_update, dash.no_update
    return selection.annotation_list(key), said, fig, "" if said != "deleted" else dash.no_update


@callback(Output("timeline-note-confirm", "displayed"), Output("timeline-note-confirm", "message"),
          Output("timeline-note-pending", "data"),
          Input({"type": "timeline-note-del", "id": ALL}, "n_clicks"), prevent_initial_call=True)
def ask_delete(clicks):
    """A delete button asks first (the note is removed from the profile file)."""
    trigger = ctx.triggered_id
    if not isinstance(trigger, dict) or not any(clicks or []):
        return dash.no_update, dash.no_update, dash.no_update
    return True, "Delete this annotation from the profile?", trigger.get("id")


@callback(Output("timeline-details", "children"), Input("timeline-graph", "clickData"),
          State("timeline-state", "data"), prevent_initial_call=True)
def details(click, state):
    """The clicked instruction: opcode, timing, bytes, its op, module and a link to its source line."""
    point = ((click or {}).get("points") or [{}])[0]
    custom = point.get("customdata")
    if not isinstance(custom, list) or len(custom) != 5:
        return html.Span("Click an instruction bar (zoom in until instructions are drawn one by one).",
                         className="hint")
    key = state["profile"]
    try:
        core = data.parse_int(custom[0], "core", 0, 4096)
        start = data.parse_int(custom[2], "start")
        pc = data.parse_int(custom[3], "pc", 0, 2**31)
        engine = str(custom[1])
        if engine not in ENGINES:
            raise data.ExplorerError(f"unknown engine {engine[:20]!r}")
        r = timeline.instruction_at(data.resolve(key), core, engine, start, pc)
    except data.ExplorerError as exc:
        return ui.error_box(str(exc))
    if not r:
        return html.Span("That instruction is not in the profile.", className="hint")
    rows = [("opcode", r["opcode"]), ("engine / queue", f"{r['engine']} {r['queue'] or ''}"), ("pc", r["pc"]),
            ("start", fmt_ns(r["start"])), ("duration", fmt_ns(r["dur"])), ("FLOPs", f"{r['flops']:,}"),
            ("bytes read / written", f"{r['bytes_read']:,} / {r['bytes_written']:,}"),
            ("semaphore wait", fmt_ns(r["sem_wait_ns"])), ("op", r["op"]), ("module", r["module"] or "—")]
    if r.get("nki_source_location"):
        rows.append(("NKI kernel line", r["nki_source_location"]))     # docs/nki.md
    link = (dcc.Link(f"Open {r['where']} →", href=ui.href("/source", profile=key, line=r["source_id"]),
                     id="timeline-open-source") if r["source_id"] is not None else html.Span("no source line recorded"))
    return html.Div([ui.table([("field", lambda x: x[0]), ("value", lambda x: str(x[1]))],
                              [(a, b) for a, b in rows], class_name="data"), html.Div(link),
                     _dependencies(key, r, state)])


def _dependencies(key: str, r: dict, state: dict):
    """The Dependencies panel: predecessors and successors (Flow) with a link that centres the timeline on
    each, the panel's data as JSON for the clipboard, and links to the Memory and Tensor Viewers."""
    L = data.resolve(key)
    d = records.dependencies(L, r["core"], r["queue"], r["pc"], r["start"])
    if not d:
        return html.Div([html.H3("Dependencies"), html.Span("No dependency records (a profile from before schema "
                                                            "1.3.0, or a CPU op).", className="hint")])
    half = max((state.get("end", 0) - state.get("start", 0)) // 2, 1_000)

    def jump(x):
        return dcc.Link(f"{x['opcode']} {x['queue']} pc {x['pc']}",
                        href=ui.href("/timeline", profile=key, start=max(x["start_ns"] - half, 0),
                                     end=x["start_ns"] + half))

    cols = [("instruction", jump), ("type", lambda x: x["dependency_type"].replace("_DEPENDENCE", "").lower()),
            ("gap", lambda x: fmt_ns(x["gap_time"])), ("via", lambda x: x["via"] or "—"), ("op", "op")]
    node = (data.ops(L).get(r["op_id"]) or {}).get("name")
    me = d["instruction"]
    return html.Div([
        html.H3(["Dependencies ", dcc.Clipboard(target_id="timeline-deps-json", id="timeline-deps-copy",
                                                title="copy as JSON", className="btn")]),
        html.Pre(json.dumps(d, default=str), id="timeline-deps-json", hidden=True),
        html.Div(f"{len(d['predecessors'])} predecessors", className="hint"),
        ui.table(cols, d["predecessors"], id="timeline-deps-pred", max_rows=50),
        html.Div(f"{len(d['successors'])} successors", className="hint"),
        ui.table(cols, d["successors"], id="timeline-deps-succ", max_rows=50),
        html.Div([dcc.Link("Memory Viewer at this instant →", id="timeline-open-memory",
                           href=ui.href("/memory", profile=key, exec=me["exec_id"], t=me["start_ns"])), " · ",
                  dcc.Link("Tensors of this op →", id="timeline-open-tensors",
                           href=ui.href("/tensors", profile=key, node=node)) if node else None]),
    ], id="timeline-deps")


@callback(Output("timeline-download", "data"), Output("timeline-status", "children", allow_duplicate=True),
          Input("timeline-csv", "n_clicks"), State("timeline-state", "data"), State("timeline-csv-sampled", "value"),
          prevent_initial_call=True)
def download(_clicks, state, sampled):
    """The visible window's rows per table as a zip of CSV files (``timeline.window_csv_zip``), sampled at the
    timeline's resolution unless the box is cleared."""
    try:
        blob, cut = timeline.window_csv_zip(data.resolve(state["profile"]), state["start"], state["end"],
                                            sampled="sampled" in (sampled or []))
    except data.ExplorerError as exc:
        return dash.no_update, str(exc)
    note = (f"CSV cut at {timeline.CSV_MAX_ROWS:,} rows in {', '.join(cut)}: zoom in for the rest"
            if cut else dash.no_update)
    name = f"{state['profile']}_{state['start']}-{state['end']}.zip"
    return dcc.send_bytes(blob, name), note


ui.register_url_sync("timeline")
clientside_callback(ClientsideFunction("explorer", "xRangeRequest"), Output("timeline-request", "data"),
                    Input("timeline-graph", "relayoutData"), prevent_initial_call=True)


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/timeline", name="Timeline", title="Timeline · Neuron Explorer")
