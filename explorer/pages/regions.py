"""Regions: the Region Highlighter's automatic regions, cut one of three ways as the real one cuts them: by layer
(``layers.3``, ``embeddings``), by NKI kernel (each kernel invocation) or by collective (each core's stretches
between collectives). Per region its span, instructions, busy share per engine and HFU, each linked to its window
on the timeline; each region's duration over its occurrences (min, median, max); and up to three regions
compared side by side."""
from __future__ import annotations

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, callback, dcc, html

from explorer import data, records, ui
from explorer.figures import fmt_ns
from traces.q_timeline import fit_window

ENGINES_SHOWN = ("tensor", "vector", "scalar", "gpsimd", "dma")
KINDS = (("layer", "by layer"), ("kernel", "by NKI kernel"), ("collective", "between collectives"))
HINTS = {
    "layer": "A region is a layer: the module path up to its first numbered part. Its span runs from its first "
             "instruction to its last; the scheduler overlaps neighbouring layers, so spans can overlap.",
    "kernel": "A region is an NKI kernel's invocation: the instructions its lines issued in one execution.",
    "collective": "A region is a stretch of one core's timeline between two collectives, named by the collective "
                  "that closes it; it can span executions.",
}
MAX_COMPARE = 3


def _span(r):
    return max(r["end_ns"] - r["start_ns"], 1)


def _parse_cmp(cmp, n: int) -> list[int]:
    """``"3,7"`` → ``[3, 7]``: at most three region indexes, each in range."""
    if not cmp:
        return []
    out = [data.parse_int(x, "compared region", 0, max(n - 1, 0)) for x in str(cmp).split(",")[:MAX_COMPARE] if x]
    return list(dict.fromkeys(out))


def _compare(key, by, rows: list[dict]) -> html.Div:
    """The chosen regions side by side: the per-region figures in a table and the busy share per engine."""
    metrics = [("duration", lambda r: fmt_ns(_span(r))), ("start", lambda r: fmt_ns(r["start_ns"])),
               ("core", lambda r: str(r["core"])), ("instructions", lambda r: f"{r['instructions']:,}"),
               ("HFU", lambda r: f"{r['hfu_percent'] or 0:.2f}%")]
    metrics += [(f"{e} busy", lambda r, e=e: f"{r[f'{e}_busy_percent']:.0f}%") for e in ENGINES_SHOWN]
    table = html.Table([html.Thead(html.Tr([html.Th("")] + [html.Th(f"#{r['index']} {r['region']}") for r in rows])),
                        html.Tbody([html.Tr([html.Th(name)] + [html.Td(f(r)) for r in rows])
                                    for name, f in metrics])], className="data", id="regions-compare-table")
    fig = go.Figure([go.Bar(name=f"#{r['index']} {r['region']}", x=list(ENGINES_SHOWN),
                            y=[r[f"{e}_busy_percent"] for e in ENGINES_SHOWN]) for r in rows])
    fig.update_layout(barmode="group", height=260, margin=dict(l=4, r=4, t=24, b=30),
                      legend=dict(orientation="h", y=1.15), xaxis=dict(title="engine"),
                      yaxis=dict(title="busy % of the region's span"))
    return html.Div([html.H3("Compared regions"),
                     dcc.Link("clear", href=ui.href("/regions", profile=key, by=by)),
                     table, dcc.Graph(figure=fig, config={"displayModeBar": False}, id="regions-compare-graph")],
                    className="card", id="regions-compare")


@ui.guarded
def layout(profile=None, exec=None, by=None, cmp=None, **_):
    key = ui.profile_key(profile)
    by = by or "layer"
    rv = records.regions(data.resolve(key), data.parse_int(exec, "exec"), by)
    chosen = _parse_cmp(cmp, len(rv["all"]))
    kinds = html.Div(["Regions: ", *[html.Span([dcc.Link(label, href=ui.href("/regions", profile=key, by=k),
                                                         className="active" if k == by else "",
                                                         id=f"regions-by-{k}"), " "]) for k, label in KINDS]],
                     className="toolbar", id="regions-kinds")
    head = [html.H2(["Regions · ", data.registry().label(key)]), kinds]
    if not rv["rows"]:
        return html.Div(head + [ui.error_box(
            {"layer": "this profile holds no instruction rows to cut into regions.",
             "kernel": "this profile runs no NKI kernel: no kernel regions.",
             "collective": "this profile has no collectives on its cores: no regions between them."}[by],
            "Record it with profiling on: `neuron-explorer inspect -- python script.py`.")])

    def compare_link(r):
        idx = r["index"]
        now = [i for i in chosen if i != idx] if idx in chosen else (chosen + [idx])[-MAX_COMPARE:]
        return dcc.Link("remove" if idx in chosen else "compare",
                        href=ui.href("/regions", profile=key, by=by, exec=rv["exec_id"],
                                     cmp=",".join(map(str, now))), className="active" if idx in chosen else "")

    span = data.bounds(data.resolve(key))["span"]

    def highlight(r):
        """The timeline around the region (the fitted window's margin) with the region shaded and named."""
        a, b = fit_window(r["start_ns"], r["end_ns"], (0, span))
        return dcc.Link(r["region"], title="open the timeline on this region, shaded",
                        href=ui.href("/timeline", profile=key, start=a, end=b, region=f"{by}:{r['index']}"))

    cols = [("region", highlight),
            ("core", "core"), ("start", lambda r: fmt_ns(r["start_ns"])), ("duration", lambda r: fmt_ns(_span(r))),
            ("instructions", "instructions"), ("HFU", lambda r: f"{r['hfu_percent'] or 0:.2f}%")]
    cols += [(f"{e} busy", lambda r, e=e: f"{r[f'{e}_busy_percent']:.0f}%") for e in ENGINES_SHOWN]
    cols.append(("", compare_link))
    labels = data.execution_labels(data.resolve(key))
    # values as text: exec ids are 63-bit, a JavaScript number would round them
    pick = [{"label": f"#{i + 1} · {labels.get(x, f'execution {x}')}", "value": str(x)}
            for i, x in enumerate(rv["executions"])]
    by_index = {r["index"]: r for r in rv["all"]}
    return html.Div(head + [
        html.Div(["Execution: ", dcc.Dropdown(id="regions-exec", options=pick, value=str(rv["exec_id"]),
                                              clearable=False, className="wide-pick"),
                  dcc.Store(id="regions-where", data={"profile": key, "by": by, "exec": str(rv["exec_id"])})],
                 className="toolbar", id="regions-execs") if pick else None,
        html.Div(HINTS[by] + " Busy % sums the engine's instructions over the span (DMA queues run in parallel: "
                 "above 100% is possible). Pick up to three regions to compare.", className="hint"),
        _compare(key, by, [by_index[i] for i in chosen]) if chosen else None,
        html.Div(ui.table(cols, rv["rows"], id="regions-table", max_rows=300), className="card"),
        html.H3("Duration over the occurrences"),
        html.Div(ui.table([("region", "region"), ("occurrences", "executions"),
                           ("min", lambda r: fmt_ns(r["min_ns"])), ("median", lambda r: fmt_ns(r["median_ns"])),
                           ("max", lambda r: fmt_ns(r["max_ns"]))], rv["durations"], id="regions-durations"),
                 className="card"),
    ])


@callback(Output("app-url", "href", allow_duplicate=True), Input("regions-exec", "value"),
          State("regions-where", "data"), prevent_initial_call=True)
def pick_execution(exec_id, where):
    """Another execution: the page again on its regions."""
    if exec_id is None or not isinstance(where, dict) or str(exec_id) == where.get("exec"):
        return dash.no_update
    return ui.href("/regions", profile=where.get("profile"), by=where.get("by"),
                   exec=data.parse_int(exec_id, "exec"))


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/regions", name="Regions", title="Regions · Neuron Explorer")
