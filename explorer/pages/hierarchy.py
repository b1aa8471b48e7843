"""Hierarchy: module path → ATen op → instruction opcode as an icicle weighted by device time.

Clicking a block zooms into it and offers a link that filters the timeline to that module or op.
"""
from __future__ import annotations

from dash import Input, Output, State, callback, dcc, html

from explorer import data, ui
from explorer.figures import fmt_ns, icicle_figure


@ui.guarded
def layout(profile=None, **_):
    key = ui.profile_key(profile)
    nodes = data.hierarchy(data.resolve(key))
    if len(nodes) <= 1:
        return ui.error_box("this profile has no device instructions to break down",
                            "Record with NEURON_RT_INSPECT_ENABLE=1 (neuron-explorer inspect does this).")
    return html.Div([
        dcc.Store(id="hierarchy-profile", data=key),
        html.H2("Hierarchy: module → ATen op → instructions, by device time"),
        html.Div([
            html.Div(dcc.Graph(id="hierarchy-graph", figure=icicle_figure(nodes), config={"displaylogo": False}),
                     className="card col", style={"flex": "3 1 600px"}),
            html.Div([html.H3("Selection"), html.Div("Click a block.", id="hierarchy-details", className="hint")],
                     className="card col", style={"flex": "1 1 260px"}),
        ], className="row"),
    ])


@callback(Output("hierarchy-details", "children"), Input("hierarchy-graph", "clickData"),
          State("hierarchy-profile", "data"), prevent_initial_call=True)
def pick(click, key):
    """Describe the clicked block and link the timeline filtered to it."""
    point = ((click or {}).get("points") or [{}])[0]
    sel = point.get("customdata")
    try:
        parsed = data.parse_selection(sel)
        L = data.resolve(key)
    except data.ExplorerError as exc:
        return ui.error_box(str(exc))
    node = next((n for n in data.hierarchy(L) if n["id"] == point.get("id")), None)
    if not parsed or node is None:
        return html.Span("The whole model: pick a module or op.", className="hint")
    return html.Div([
        html.Div(html.Strong(node["label"])),
        html.Div(f"{fmt_ns(node['value'])} of device time · {node['instructions']:,} instructions"),
        html.Div(data.describe_selection(L, sel), className="hint"),
        dcc.Link("Show on the timeline →", href=ui.href("/timeline", profile=key, sel=sel), id="hierarchy-to-timeline"),
    ])


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/hierarchy", name="Hierarchy", title="Hierarchy · Neuron Explorer")
