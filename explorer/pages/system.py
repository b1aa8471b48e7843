"""System Trace: the system profile as the real Explorer's System Trace Viewer shows it.

Tracks of framework (torch.profiler regions and ops), runtime (``neuron_rt``: ``nrt_load``,
``nrt_execute``, tensor reads and writes, host↔device copies) and hardware (``neuron_hw``:
``nc_exec_running``) events, named as the real tool names them (``<instance>/PID:<pid>/neuron_rt/NC:0``),
grouped by one of :data:`GROUPINGS`, filtered by NeuronCore, event type and instance (defaults from
``neuron-explorer view --system-trace-filter-*``), with the host CPU utilisation, host memory and HBM
in use below. Hover an event for its ids and attributes; click one: its details, and for an execution
a link that opens its device timeline window. Figures come from ``Profile.system_events`` /
``host_series`` (``traces.q_system``).
"""
from __future__ import annotations

import json

import plotly.graph_objects as go
from dash import Input, Output, State, callback, dcc, html
from plotly.subplots import make_subplots

from explorer import data, ui
from explorer.figures import fmt_ns

#: Grouping modes: (value, label, the track an event goes on). As the real viewer's Default,
#: CPU vs Device, NeuronCore, Thread, Process and Instance groupings.
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
COLORS = {"framework": "#7e57c2", "neuron_rt": "#1e88e5", "neuron_hw": "#43a047"}

#: Set by ``neuron-explorer view``: the --system-trace-filter-* defaults and the --ignore-* flags.
SETTINGS = {"cores": None, "names": None, "instances": None, "ignore_device": False, "ignore_system": False}


def tracks(rows: list[dict], grouping: str) -> list[str]:
    """Each event's track under ``grouping``.

    >>> e = {"instance_id": "i-1", "process_id": 7, "source": "neuron_rt", "nc_idx": 0, "thread_id": 9}
    >>> tracks([e], "default"), tracks([e], "cpu_device"), tracks([e], "thread")
    (['i-1/PID:7/neuron_rt/NC:0'], ['CPU'], ['TID:9'])
    """
    fn = next(f for v, _, f in GROUPINGS if v == grouping)
    return [fn(e) for e in rows]


def figure(rows: list[dict], series: dict, t0: int, grouping: str) -> go.Figure:
    """Event bars (µs since ``t0``) on their tracks, one trace per source; CPU %, host memory and HBM below."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, row_heights=[0.64, 0.18, 0.18], vertical_spacing=0.04)
    names = tracks(rows, grouping)
    for source, color in COLORS.items():
        idx = [i for i, e in enumerate(rows) if e["source"] == source]
        if not idx:
            continue
        fig.add_trace(go.Bar(
            name=source, orientation="h", marker_color=color, y=[names[i] for i in idx],
            base=[(rows[i]["start_ns"] - t0) / 1e3 for i in idx], x=[max(rows[i]["dur_ns"], 1) / 1e3 for i in idx],
            customdata=[[rows[i]["name"], fmt_ns(rows[i]["dur_ns"]), rows[i]["process_id"], rows[i]["thread_id"],
                         "" if rows[i]["nc_idx"] is None else rows[i]["nc_idx"], rows[i]["instance_id"],
                         "" if rows[i]["exec_id"] is None else str(rows[i]["exec_id"]), i] for i in idx],
            hovertemplate="<b>%{customdata[0]}</b> (" + source + ")<br>%{customdata[1]}<br>instance %{customdata[5]}"
                          " · PID %{customdata[2]} · TID %{customdata[3]} · NC %{customdata[4]}<extra></extra>"),
            row=1, col=1)
    for key, col, label, scale, row in (("cpu", "util_percent", "host CPU %", 1, 2),
                                        ("memory", "used_bytes", "host memory GB", 1e-9, 3),
                                        ("hbm", "hbm_bytes", "HBM in use GB", 1e-9, 3)):
        t = series.get(key)
        if t is not None and t.num_rows:
            xs = [(v - t0) / 1e3 for v in t.column("ts_ns").to_pylist()]
            ys = [v * scale for v in t.column(col).to_pylist()]
            if rows:   # a level holds until the next sample: draw it to the last event
                xs.append(max(xs[-1], (max(e["start_ns"] + e["dur_ns"] for e in rows) - t0) / 1e3))
                ys.append(ys[-1])
            fig.add_trace(go.Scatter(name=label, mode="lines", line_shape="hv", x=xs, y=ys), row=row, col=1)
    fig.update_layout(barmode="overlay", height=620, margin=dict(l=10, r=10, t=10, b=30), legend_orientation="h",
                      clickmode="event")
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    if rows:   # open on the events, not on a load or sample long before them
        lo = min(e["start_ns"] for e in rows) - t0
        hi = max(e["start_ns"] + e["dur_ns"] for e in rows) - t0
        pad = max((hi - lo) * 0.02, 1)
        fig.update_xaxes(range=[(lo - pad) / 1e3, (hi + pad) / 1e3])
    fig.update_xaxes(title_text="µs", row=3, col=1)
    return fig


def _rows(L, cores, names, instances):
    table, more = L.profile.system_events(cores=cores, names=names, instances=instances)
    return table.to_pylist(), more


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
        ], className="toolbar", id="system-controls"),
        dcc.Store(id="system-state", data={"profile": key}),
        html.Div(id="system-status", className="hint"),
        html.Div(dcc.Graph(id="system-graph", config={"displaylogo": False, "scrollZoom": True}), className="card"),
        html.Div([html.H3("Event"), html.Div("Click an event: its details, and for an execution its device "
                                             "timeline.", id="system-details", className="hint")], className="card"),
    ])


@callback(Output("system-graph", "figure"), Output("system-status", "children"),
          Input("system-group", "value"), Input("system-cores", "value"), Input("system-names", "value"),
          Input("system-instances", "value"), State("system-state", "data"))
def _update(group, cores, names, instances, state):
    L = data.resolve(state["profile"])
    rows, more = _rows(L, cores, names, instances)
    t0 = data.bounds(L)["t0"]
    status = f"{len(rows):,} events" + (f" · {more:,} more not drawn: filter by core or event type" if more else "")
    return figure(rows, L.profile.host_series(), t0, group or "default"), status


@callback(Output("system-details", "children"), Input("system-graph", "clickData"),
          State("system-cores", "value"), State("system-names", "value"), State("system-instances", "value"),
          State("system-state", "data"), prevent_initial_call=True)
def _details(click, cores, names, instances, state):
    points = (click or {}).get("points") or []
    if not points or "customdata" not in points[0]:
        return "Click an event bar."
    L = data.resolve(state["profile"])
    rows, _ = _rows(L, cores, names, instances)
    i = int(points[0]["customdata"][-1])
    if not 0 <= i < len(rows):
        return "The event list changed: click again."
    e = rows[i]
    detail = json.loads(e["detail"]) if e["detail"] else {}
    parts = [html.Div([html.Strong(e["name"]), f" · {e['source']} · {fmt_ns(e['dur_ns'])}"]),
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
    return parts


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/system", name="System Trace", title="System Trace · Neuron Explorer")
