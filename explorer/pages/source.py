"""Source: every file the profile embeds, each line with its device time, its CPU-fallback host time and
its instruction count, and a heat strip of each. Clicking a line highlights its instructions on the
timeline below (and links the full Timeline page filtered to it); with **range** ticked, a second click
selects every line between the two: their device and host time (each summed over the lines, never added
together) and the window their instructions cover, drawn below and linked to the Timeline. The timeline's
instruction details link back here. ``view --framework-source-root DIR`` shows the current files under DIR
(:mod:`explorer.sources`) instead of the text the profile embeds, and files it names but does not embed.

The two strips share one time scale (the file's longest device or host time) and are never added: a
line whose ops fall back to the CPU is as hot as its host time, in the host strip's colour, so the
evidence of a CPU-fallback finding is the hottest-looking line when the fallback costs most."""
from __future__ import annotations

from pathlib import Path

import dash
from dash import ALL, Input, Output, State, callback, ctx, dcc, html

from explorer import data, timeline, ui
from explorer.figures import fmt_ns, timeline_figure

MAX_LINES = 5000


def _bar(ns, peak, kind):
    """One strip, ``ns`` against the file's ``peak`` (device and host share the scale)."""
    width = f"{100.0 * ns / peak:.1f}%" if peak and ns else "0%"
    return html.Div(style={"width": width}, className=f"heat-{kind}")


def _line_row(r, peak, selected_sid, marked=frozenset()):
    hot = r["source_id"] is not None and (r["device_ns"] or r["instructions"] or r["host_ns"]
                                          or str(r["source_id"]) == selected_sid)
    title = (f"{fmt_ns(r['device_ns'])} device time · {fmt_ns(r['host_ns'])} host time (CPU fallback)"
             if hot else "")
    cells = [html.Span(str(r["line"]), className="src-no"),
             html.Div([_bar(r["device_ns"], peak, "device"), _bar(r["host_ns"], peak, "host")], className="heat",
                      title=title),
             html.Span(fmt_ns(r["device_ns"]) if r["device_ns"] else "", className="src-t"),
             html.Span(fmt_ns(r["host_ns"]) if r["host_ns"] else "", className="src-h"),
             html.Span(f"{r['instructions']:,}" if r["instructions"] else "", className="src-n"),
             html.Span(r["code"] or " ", className="src-code")]
    if not hot:
        return html.Div(cells, className="src-line")
    sid = str(r["source_id"])
    return html.Div(cells, id={"type": "source-line", "sid": sid}, n_clicks=0,
                    className="src-line hot selected" if sid == selected_sid or sid in marked else "src-line hot",
                    title="click: highlight this line's instructions on the timeline")


_HEADER = html.Div([html.Span("line", className="src-no"),
                    html.Span([html.Span("device", className="key-device"), " ",
                               html.Span("host", className="key-host")],
                              className="heat-key", title="device time and CPU-fallback host time, on one scale"),
                    html.Span("device", className="src-t"), html.Span("host", className="src-h"),
                    html.Span("instr.", className="src-n"), html.Span("", className="src-code")],
                   className="src-line src-head")


def _range_panel(key, sel):
    """A range of lines: the sums of their per-line figures and the window their instructions cover."""
    L = data.resolve(key)
    r = data.line_range(L, sel)
    head = [html.Strong(f"lines {Path(r['file']).name}:{r['first']}-{r['last']}"),
            f" · {r['lines']} with ops · {fmt_ns(r['device_ns'])} device time · {fmt_ns(r['host_ns'])} host time "
            f"(CPU fallback) · {r['instructions']:,} instructions"]
    if r["window"] is None:
        return html.Div([html.Div(head, id="source-range"),
                         html.Div("No instruction ran from these lines.", className="hint")])
    a, b = r["window"]
    tl = timeline.timeline(L, start=a, end=b, sel=sel)
    fig = timeline_figure(tl, data.ops(L), height=max(240, 20 * len(tl["lanes"]) + 60), compact=True)
    return html.Div([
        html.Div([*head, f" · their instructions cover {fmt_ns(b - a)} of the measured executions · ",
                  dcc.Link("Open this window on the Timeline →", id="source-to-timeline",
                           href=ui.href("/timeline", profile=key, start=a, end=b, sel=sel))], id="source-range"),
        dcc.Graph(id="source-timeline", figure=fig, config={"displaylogo": False}),
    ])


def _mini_timeline(key, sid):
    if not sid:
        return html.Div("Click a highlighted line to see where its instructions run.", className="hint")
    L = data.resolve(key)
    tl = timeline.timeline(L, sel=f"line:{sid}")
    fig = timeline_figure(tl, data.ops(L), height=max(240, 20 * len(tl["lanes"]) + 60), compact=True)
    return html.Div([
        html.Div([html.Strong(tl["selection_text"]), " · ",
                  dcc.Link("Open on the Timeline page →", href=ui.href("/timeline", profile=key, sel=f"line:{sid}"),
                           id="source-to-timeline")]),
        dcc.Graph(id="source-timeline", figure=fig, config={"displaylogo": False}),
    ])


@ui.guarded
def layout(profile=None, file=None, line=None, lines=None, **_):
    key = ui.profile_key(profile)
    L = data.resolve(key)
    files = data.source_files(L)
    if not files:
        return ui.error_box("the profile embeds no source files",
                            "Source text is recorded by the runtime for files it links ops to; "
                            "neuron-explorer view --framework-source-root DIR reads them from DIR.")
    if lines not in (None, ""):   # a range of lines (lines=a..b): open its file with the range selected
        first = str(lines).split("..")[0]
        line = first if first.isdigit() else line
    selected_sid, t = "", {}
    index = data.parse_int(file, "file", 0, len(files) - 1) or 0
    if line not in (None, ""):
        sid = data.parse_int(line, "line")
        t = data.source_line(L, sid)
        if t is None:
            raise data.ExplorerError(f"no recorded source line with id {sid}")
        if t.get("file") not in files:
            raise data.ExplorerError(f"{Path(t['file']).name}:{t['line']} is a call site whose file the profile "
                                     "does not embed (only files that ops run from are recorded): serve with "
                                     "neuron-explorer view --framework-source-root DIR to read it from DIR")
        index, selected_sid = files.index(t["file"]), str(sid)
    name = files[index]
    rows = data.source_view(L, name)
    origin = data.source_text(L, name)[1]
    panel = _mini_timeline(key, selected_sid)
    marked = set()
    if selected_sid and lines not in (None, ""):
        sel = f"lines:{lines}"
        panel, marked = _range_panel(key, sel), _range_sids(L, sel)
    if selected_sid and t.get("graph_id") is not None:   # a graph's call site: no op of it runs on this line
        for r in rows:
            if r["line"] == t["line"] and r["source_id"] is None:
                r.update(source_id=int(selected_sid), instructions=0)
        panel = html.Div([html.Strong(f"{Path(name).name}:{t['line']} compiled graph {t['graph']}"), " · ",
                          dcc.Link("Show its executions on the Timeline →", id="source-to-timeline",
                                   href=ui.href("/timeline", profile=key, sel=f"graph:{t['graph_id']}"))])
    if not selected_sid:   # open at the hottest line (device plus CPU-fallback host time); explorer.js scrolls to it
        hot = [r for r in rows if r["source_id"] is not None and (r["device_ns"] or r["host_ns"])]
        if hot:
            selected_sid = str(max(hot, key=lambda r: (r["device_ns"] + r["host_ns"], -r["line"]))["source_id"])
    peak = max((max(r["device_ns"], r["host_ns"]) for r in rows), default=0)   # one scale, never a sum
    file_links = [dcc.Link(Path(f).name, href=ui.href("/source", profile=key, file=i), title=f,
                           className="active" if i == index else "", style={"marginRight": "12px"})
                  for i, f in enumerate(files)]
    return html.Div([
        *ui.url_sink("source"),
        dcc.Store(id="source-state", data={"profile": key, "file": index, "line": selected_sid}),
        html.H2(["Source · ", html.Span(name, className="code")]),
        html.Div(f"text from {origin}", className="hint", id="source-origin"),
        html.Div(["Files: ", *file_links, dcc.Checklist([{"label": "range", "value": "range"}], [],
                                                        id="source-range-mode", inline=True)],
                 className="toolbar", id="source-files",
                 title="range: a click selects every line from the selected one to the clicked one"),
        html.Div([
            html.Div(html.Div([_HEADER] + [_line_row(r, peak, selected_sid, marked) for r in rows[:MAX_LINES]],
                              className="source-view",
                              id="source-lines"), className="col", style={"flex": "1 1 520px"}),
            html.Div(html.Div(panel, id="source-selection"), className="card col",
                     style={"flex": "1 1 520px"}),
        ], className="row"),
    ])


def _range_sids(L, sel) -> set[str]:
    """The source ids of the recorded lines a ``lines:a..b`` selection spans (to mark them)."""
    r = data.line_range(L, sel)
    return {str(t["source_id"]) for t in data.line_totals(L).values()
            if t.get("file") == r["file"] and r["first"] <= t["line"] <= r["last"]}


@callback(Output("source-selection", "children"), Output({"type": "source-line", "sid": ALL}, "className"),
          Output("source-state", "data"), Output("source-url", "data"),
          Input({"type": "source-line", "sid": ALL}, "n_clicks"), State("source-state", "data"),
          State("source-range-mode", "value"), prevent_initial_call=True)
def pick_line(clicks, state, mode=None):
    """A click on a line: highlight its instructions on the timeline and mark the line; with **range**
    ticked, mark every line between the selected one and this one."""
    trigger = ctx.triggered_id
    if not isinstance(trigger, dict) or not any(clicks):
        return (dash.no_update,) * 4
    sid = str(trigger.get("sid"))
    anchor = str(state.get("line") or "")
    try:
        data.parse_int(sid, "line")
        if "range" in (mode or []) and anchor and anchor != sid:
            sel = f"lines:{anchor}..{sid}"
            panel, marked = _range_panel(state["profile"], sel), _range_sids(data.resolve(state["profile"]), sel)
            url, new_state = {"lines": f"{anchor}..{sid}", "line": None, "file": None}, state
        else:
            panel, marked = _mini_timeline(state["profile"], sid), {sid}
            url, new_state = {"line": sid, "file": None, "lines": None}, dict(state, line=sid)
    except data.ExplorerError as exc:
        return ui.error_box(str(exc)), dash.no_update, dash.no_update, dash.no_update
    classes = ["src-line hot selected" if str(o["id"]["sid"]) in marked else "src-line hot"
               for o in ctx.outputs_list[1]]
    return panel, classes, new_state, url


ui.register_url_sync("source")


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/source", name="Source", title="Source · Neuron Explorer")
