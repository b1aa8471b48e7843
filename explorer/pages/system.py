"""System Trace: the system profile as the real Explorer's System Trace Viewer shows it.

Tracks of framework (torch.profiler regions and ops), runtime (``neuron_rt``: ``nrt_load``,
``nrt_execute``, tensor reads and writes, host↔device copies) and hardware (``neuron_hw``:
``nc_exec_running``) events, named as the real tool names them (``<instance>/PID:<pid>/neuron_rt/NC:0``),
grouped by one of :data:`GROUPINGS`, filtered by NeuronCore, event type and instance (defaults from
``neuron-explorer view --system-trace-filter-*``), with the host CPU utilisation, host memory and HBM
in use below. Zoom and pan (drag, scroll, double-click or **Whole trace**) re-query the window at the
right level of detail (``explorer.system.view`` over ``Profile.system_window``): a track whose
window holds few events draws them one by one, a busier one draws cells shaded by how busy it is,
and the status line says how many events are summarised and that zooming shows them. Hover an event
for its ids and attributes; click one: its details, and for an execution a link that opens its
device timeline window.
"""
from __future__ import annotations

import copy
import json
import math

import dash
import pyarrow.compute as pc
from dash import ALL, ClientsideFunction, Input, Output, State, callback, clientside_callback, ctx, dcc, html
from plotly.subplots import make_subplots

from explorer import data, system, ui
from explorer.figures import fmt_ns, fmt_window
from explorer.pages import system_chain
from explorer.system import GROUPINGS
from traces.q_system import PER_TRACK

COLORS = {"framework": "#7e57c2", "neuron_rt": "#1e88e5", "neuron_hw": "#43a047"}

#: Set by ``neuron-explorer view``: the --system-trace-filter-* defaults and the --ignore-* flags.
SETTINGS = {"cores": None, "names": None, "instances": None, "ignore_device": False, "ignore_system": False}

_HOVER = ("<b>%{customdata[0]}</b> ({source})<br>%{customdata[1]}<br>instance %{customdata[5]}"
          " · PID %{customdata[2]} · TID %{customdata[3]} · NC %{customdata[4]}<extra></extra>")
_CELL_HOVER = "<b>%{customdata[0]}</b> ({source})<br>%{customdata[1]}<br>zoom in to see each<extra></extra>"


def _bars(view: dict, source: str, color: str) -> list[dict]:
    """One source's events (one by one) and cells (shaded by busy fraction), as plain trace dicts:
    plotly's validating objects would cost more than the query."""
    out = []
    mine = [e for e in view["events"] if e["source"] == source]
    if mine:
        out.append(dict(
            type="bar", name=source, legendgroup=source, orientation="h", marker=dict(color=color),
            xaxis="x", yaxis="y", y=[e["track_name"] for e in mine], base=[round(e["start"] / 1e3, 3) for e in mine],
            x=[round(max(e["dur_ns"] or 0, 1) / 1e3, 3) for e in mine],
            customdata=[[e["name"], fmt_ns(e["dur_ns"] or 0), e["process_id"], e["thread_id"],
                         "" if e["nc_idx"] is None else e["nc_idx"], e["instance_id"], "event", e["track"],
                         e["start"]] for e in mine],
            hovertemplate=_HOVER.replace("{source}", source)))
    cells = [c for c in view["cells"] if c[1] == source]
    if cells:
        w = view["cell_ns"]
        out.append(dict(
            type="bar", name=source, legendgroup=source, showlegend=not mine, orientation="h", xaxis="x", yaxis="y",
            marker=dict(color=color, opacity=[round(0.25 + 0.75 * c[3], 2) for c in cells]),
            y=[c[0] for c in cells], base=[round((view["start"] + c[2] * w) / 1e3, 3) for c in cells],
            x=[round(w / 1e3, 3)] * len(cells),
            customdata=[[f"{c[4]:,} events", f"busy {100 * c[3]:.0f}% of {fmt_ns(w)}", "", "", "", "", "cell"]
                        for c in cells],
            hovertemplate=_CELL_HOVER.replace("{source}", source)))
    return out


def _in_window(t, a: int, b: int):
    """A host series' samples in ``[a, b]`` (absolute ns), with the last one before ``a`` (its level holds)."""
    if t is None or not t.num_rows:
        return t
    ts = t["ts_ns"]
    before = pc.filter(ts, pc.less(ts, a))
    lo = pc.max(before).as_py() if len(before) else a
    return t.filter(pc.and_(pc.greater_equal(ts, lo), pc.less_equal(ts, b)))


_LAYOUT: dict = {}


def _layout() -> dict:
    """Three rows sharing one x axis (events; host CPU; host memory and HBM), built by plotly once."""
    if not _LAYOUT:
        fig = make_subplots(rows=3, cols=1, shared_xaxes=True, row_heights=[0.64, 0.18, 0.18], vertical_spacing=0.04)
        fig.update_layout(barmode="overlay", height=620, margin=dict(l=10, r=10, t=10, b=30),
                          legend_orientation="h", clickmode="event")
        fig.update_xaxes(title_text="µs", row=3, col=1)
        _LAYOUT.update(fig.to_plotly_json()["layout"])
    return copy.deepcopy(_LAYOUT)


def figure(view: dict, series: dict, chain: dict | None = None, grouping: str = "default") -> dict:
    """Events and cells (µs since ``t0``) on their tracks, one colour per source; CPU %, host memory and
    HBM below; the x axis exactly the window; a selected event's dependency chain (``explorer.system.chain``)
    outlined with arrows. A Plotly figure dict."""
    lo, hi = view["start"] / 1e3, view["end"] / 1e3
    data_ = []
    if view["tracks"]:   # every track keeps its row, even where the window holds none of its events
        data_.append(dict(type="scatter", x=[lo] * len(view["tracks"]), y=view["tracks"], mode="markers",
                          opacity=0, showlegend=False, hoverinfo="skip", name="tracks", xaxis="x", yaxis="y"))
    for source, color in COLORS.items():
        data_ += _bars(view, source, color)
    chain_traces, curves, heads = system_chain.overlay(view, chain, grouping)
    data_ += chain_traces
    t0 = view["t0"]
    cats = series.get("hbm_category")
    by_cat = [(f"hbm:{c}", "hbm_bytes", f"HBM {c} GB", 1e-9, 3, cats.filter(pc.equal(cats["category"], c)))
              for c in sorted(set(cats["category"].to_pylist()))] if cats is not None and cats.num_rows else []
    for key, col, label, scale, row, t in [(k, c, lab, s, r, series.get(k)) for k, c, lab, s, r in (
            ("cpu", "util_percent", "host CPU %", 1, 2), ("memory", "used_bytes", "host memory GB", 1e-9, 3),
            ("hbm", "hbm_bytes", "HBM in use GB", 1e-9, 3))] + by_cat:
        t = _in_window(t, t0 + view["start"], t0 + view["end"])
        if t is not None and t.num_rows:
            xs = [(v - t0) / 1e3 for v in t.column("ts_ns").to_pylist()]
            ys = [v * scale for v in t.column(col).to_pylist()]
            xs.append(max(xs[-1], hi))   # a level holds until the next sample: draw it to the window's end
            ys.append(ys[-1])
            data_.append(dict(type="scatter", name=label, mode="lines", line=dict(shape="hv"), x=xs, y=ys,
                              xaxis=f"x{row}", yaxis=f"y{row}"))
    layout = _layout()
    layout["yaxis"].update(autorange="reversed", categoryorder="array", categoryarray=view["tracks"])
    for axis in ("xaxis", "xaxis2", "xaxis3"):
        layout[axis]["range"] = [lo, hi]
    if not any(t.get("xaxis") in ("x2", "x3") for t in data_):   # no host samples: the time axis on the events
        layout["xaxis"].update(showticklabels=True, title=dict(text="µs"))
    if curves:   # the dependency chain's arrows
        layout["shapes"] = list(layout.get("shapes") or []) + curves
        layout["annotations"] = list(layout.get("annotations") or []) + heads
    return {"data": data_, "layout": layout}


def status(view: dict) -> str:
    """The status line: events in the window, how many are drawn one by one, and how many are summarised."""
    text = (f"{view['count']:,} events in {fmt_ns(view['end'] - view['start'])}: "
            f"{view['drawn']:,} drawn one by one")
    if view["summarised"]:
        names = view["summarised_tracks"]
        where = ", ".join(names[:3]) + (f" and {len(names) - 3} more tracks" if len(names) > 3 else "")
        text += (f" · {view['summarised']:,} summarised in {fmt_ns(view['cell_ns'])} cells on {where}: "
                 f"zoom in to see each (a track's events are drawn "
                 f"one by one when the window holds at most {PER_TRACK:,})")
    dropped = view.get("dropped") or {}
    if dropped.get("framework"):
        text += (f" · {dropped['framework']:,} framework events not recorded: over the torch.profiler window's "
                 "bound")
    if dropped.get("system"):
        text += f" · {dropped['system']:,} runtime and device events not recorded: over max_events_per_nc"
    return text


def _series(L) -> dict:
    return L.cached("host_series", L.profile.host_series)


def render(key, start=None, end=None, group="default", cores=None, names=None, instances=None, chain=None):
    """Figure, status and state for a window (no ``start``/``end``: the whole trace), with ``chain`` (a
    selected event's dependency chain, ``explorer.system.chain``) drawn on it."""
    L = data.resolve(key)
    view = system.view(L, start, end, group or "default", cores, names, instances)
    state = {"profile": key, "start": view["start"], "end": view["end"]}
    return (figure(view, _series(L), chain, group or "default"), status(view), state,
            fmt_window(view["start"], view["end"]))


def _options(values) -> list[dict]:
    return [{"label": str(v), "value": v} for v in values]


@ui.guarded
def layout(profile=None, group="default", **_):
    key = ui.profile_key(profile)
    L = data.resolve(key)
    if SETTINGS["ignore_system"]:
        return html.Div([html.H2("System Trace"), html.Div(
            "The system profile is ignored (neuron-explorer view --ignore-system-profile).", className="hint")])
    facets = L.profile.system_facets()
    if not facets["names"]:
        return html.Div([html.H2("System Trace"), html.Div(
            "This profile has no system profile: record with NEURON_RT_INSPECT_ENABLE=1 (system profile on by "
            "default) or torch.profiler with neuron_stack.profiling.NeuronConfig(modes=[ProfileMode.RUNTIME]).",
            className="hint", id="system-empty")])
    group = group if group in {v for v, *_ in GROUPINGS} else "default"
    return html.Div([
        html.H2("System Trace"),
        html.Div([
            dcc.RadioItems(id="system-group", value=group, inline=True,
                           options=[{"label": label, "value": v} for v, label, _ in GROUPINGS]),
            dcc.Dropdown(id="system-cores", multi=True, placeholder="all NeuronCores", value=SETTINGS["cores"],
                         options=_options(facets["cores"])),
            dcc.Dropdown(id="system-names", multi=True, placeholder="all event types", value=SETTINGS["names"],
                         options=_options(facets["names"])),
            dcc.Dropdown(id="system-instances", multi=True, placeholder="all instances",
                         value=SETTINGS["instances"], options=_options(facets["instances"])),
            html.Button("Whole trace", id="system-whole", className="btn", title="every system event"),
            html.Strong(id="system-window"),
        ], className="toolbar", id="system-controls"),
        dcc.Store(id="system-state", data={"profile": key}),
        # the x range a drag, scroll or double-click asks for (assets/explorer.js: systemRangeRequest)
        dcc.Store(id="system-request"),
        html.Div(id="system-status", className="hint"),
        html.Div("Drag or scroll to zoom · double-click or Whole trace for everything · busy tracks are drawn as "
                 "cells shaded by how busy they are, and as events one by one once zoomed in", className="hint"),
        html.Div(dcc.Loading(dcc.Graph(id="system-graph", config={"displaylogo": False, "scrollZoom": True}),
                             delay_show=400), className="card"),
        html.Div([html.H3("Event"), html.Div("Click an event: its details, and for an execution its device "
                                             "timeline.", id="system-details", className="hint")], className="card"),
        # the selected event's dependency chain (explorer.system.chain) and the event a link zooms to
        dcc.Store(id="system-chain"), dcc.Store(id="system-focus"),
        html.Div([html.H3("Dependency chain"), html.Div(system_chain.panel(None, group), id="system-chain-panel")],
                 className="card"),
    ])


def _x_range(relayout: dict):
    """The x range (µs) a relayout event asks for, ``"all"`` for autorange, or None. A zoom on any of
    the shared x axes (events, CPU, memory) counts."""
    for axis in ("xaxis", "xaxis2", "xaxis3"):
        if relayout.get(f"{axis}.autorange"):
            return "all"
        pair = relayout.get(f"{axis}.range") or [relayout.get(f"{axis}.range[0]"), relayout.get(f"{axis}.range[1]")]
        if pair[0] is not None and pair[1] is not None:
            try:
                lo, hi = float(pair[0]), float(pair[1])
            except (TypeError, ValueError):
                lo = hi = math.nan
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise data.ExplorerError("the x range must be two finite numbers of µs")
            return lo, hi
    return None


@callback(Output("system-graph", "figure"), Output("system-status", "children"), Output("system-state", "data"),
          Output("system-window", "children"),
          Input("system-group", "value"), Input("system-cores", "value"), Input("system-names", "value"),
          Input("system-instances", "value"), Input("system-request", "data"), Input("system-whole", "n_clicks"),
          Input("system-chain", "data"), Input("system-focus", "data"), State("system-state", "data"))
def _update(group, cores, names, instances, request, _whole, chain, focus, state):
    """Draw the window at the right level of detail: on a filter or grouping change (or a new dependency
    chain) the same window, on a zoom or pan (drag, scroll) the new one, on Whole trace or a double-click
    every event, on a chain's link the window framing that event."""
    start, end = state.get("start"), state.get("end")
    if ctx.triggered_id == "system-whole":
        start = end = None
    elif ctx.triggered_id == "system-focus" and isinstance(focus, dict):
        start, end = focus.get("start"), focus.get("end")
    elif ctx.triggered_id == "system-request":
        try:
            rng = _x_range(request if isinstance(request, dict) else {})
        except data.ExplorerError as exc:
            return dash.no_update, str(exc), dash.no_update, dash.no_update
        if rng is None:
            return (dash.no_update,) * 4
        start, end = (None, None) if rng == "all" else (round(rng[0] * 1e3), round(rng[1] * 1e3))
    try:
        return render(state["profile"], start, end, group, cores, names, instances,
                      chain if isinstance(chain, dict) else None)
    except data.ExplorerError as exc:
        return dash.no_update, str(exc), dash.no_update, dash.no_update


@callback(Output("system-details", "children"), Output("system-chain", "data"), Input("system-graph", "clickData"),
          State("system-state", "data"), prevent_initial_call=True)
def _details(click, state):
    """A clicked event: its details, and its dependency chain (kept until another event is clicked)."""
    points = (click or {}).get("points") or []
    custom = points[0].get("customdata") if points else None
    if not isinstance(custom, list) or len(custom) < 7:
        return "Click an event bar.", dash.no_update
    if custom[6] != "event":
        return f"{custom[0]} in this cell ({custom[1]}): zoom in (drag over it) to see each.", dash.no_update
    L = data.resolve(state["profile"])
    try:
        e = system.event(L, custom[7], custom[8], custom[0])
        chain = system.chain(L, custom[7], custom[8], custom[0]) if e is not None else None
    except data.ExplorerError as exc:
        return ui.error_box(str(exc)), dash.no_update
    if e is None:
        return "That event is not in the profile.", None
    detail = json.loads(e["detail"]) if e["detail"] else {}
    parts = [html.Div([html.Strong(e["name"]), f" · {e['source']} · {fmt_ns(e['dur_ns'] or 0)}"]),
             html.Div(f"instance {e['instance_id']} · PID {e['process_id']} · TID {e['thread_id']} · "
                      f"NC {e['nc_idx'] if e['nc_idx'] is not None else '—'}"
                      + (f" · flow {e['flow_id']}" if e["flow_id"] is not None else "")),
             html.Div(", ".join(f"{k}={v}" for k, v in detail.items()), className="hint")]
    window = L.profile.execution_window(e["exec_id"]) if e["exec_id"] is not None else None
    if window is not None and not SETTINGS["ignore_device"]:
        t0 = data.bounds(L)["t0"]
        parts.append(dcc.Link("Open this execution's device timeline", id="system-drill",
                              href=ui.href("/timeline", profile=state["profile"], start=window[0] - t0,
                                           end=window[1] - t0)))
    has = chain is not None and (chain["upstream"] or chain["downstream"])
    return parts, chain if has else None


@callback(Output("system-chain-panel", "children"), Input("system-chain", "data"), Input("system-group", "value"))
def _chain_panel(chain, group):
    return system_chain.panel(chain if isinstance(chain, dict) else None, group or "default")


@callback(Output("system-focus", "data"), Input({"type": "system-chain-go", "index": ALL}, "n_clicks"),
          State("system-chain", "data"), prevent_initial_call=True)
def _chain_go(clicks, chain):
    """A chain's Show link: the window framing that event (``explorer.system.focus``)."""
    i = (ctx.triggered_id or {}).get("index") if isinstance(ctx.triggered_id, dict) else None
    if not any(clicks or []) or not isinstance(chain, dict) or not isinstance(i, int) \
            or not 0 <= i < len(chain.get("events") or []):
        return dash.no_update
    start, end = system.focus(chain["events"][i])
    return {"start": start, "end": end, "index": i}


clientside_callback(ClientsideFunction("explorer", "systemRangeRequest"), Output("system-request", "data"),
                    Input("system-graph", "relayoutData"), prevent_initial_call=True)


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/system", name="System Trace", title="System Trace · Neuron Explorer")
