"""Regions: the Region Highlighter's automatic regions by layer (``layers.3``, ``embeddings``): per region
of one execution its span, instructions, busy share per engine and HFU, each linked to its window on the
timeline; and each region's duration over every measured execution (min, median, max)."""
from __future__ import annotations

from dash import dcc, html

from explorer import data, records, ui
from explorer.figures import fmt_ns

ENGINES_SHOWN = ("tensor", "vector", "scalar", "gpsimd", "dma")


@ui.guarded
def layout(profile=None, exec=None, **_):
    key = ui.profile_key(profile)
    rv = records.regions(data.resolve(key), data.parse_int(exec, "exec"))
    if not rv["rows"]:
        return ui.error_box("this profile holds no instruction rows to cut into regions.",
                            "Record it with profiling on: `neuron-explorer inspect -- python script.py`.")

    def span(r):
        return max(r["end_ns"] - r["start_ns"], 1)

    cols = [("region", lambda r: dcc.Link(r["region"], href=ui.href("/timeline", profile=key, start=r["start_ns"],
                                                                     end=r["end_ns"]))),
            ("start", lambda r: fmt_ns(r["start_ns"])), ("duration", lambda r: fmt_ns(span(r))),
            ("instructions", "instructions"), ("HFU", lambda r: f"{r['hfu_percent'] or 0:.2f}%")]
    cols += [(f"{e} busy", lambda r, e=e: f"{r[f'{e}_busy_percent']:.0f}%") for e in ENGINES_SHOWN]
    pick = [dcc.Link(f"#{i + 1}", href=ui.href("/regions", profile=key, exec=x),
                     className="active" if x == rv["exec_id"] else "") for i, x in enumerate(rv["executions"])]
    return html.Div([
        html.H2(["Regions · ", data.registry().label(key)]),
        html.Div(["Execution: ", *[html.Span([p, " "]) for p in pick[:50]]], className="toolbar", id="regions-execs"),
        html.Div("A region is a layer: the module path up to its first numbered part. Its span runs from its "
                 "first instruction to its last; the scheduler overlaps neighbouring layers, so spans can overlap. "
                 "Busy % sums the engine's instructions over the span (DMA queues run in parallel: above 100% "
                 "is possible).", className="hint"),
        html.Div(ui.table(cols, rv["rows"], id="regions-table"), className="card"),
        html.H3("Duration over the measured executions"),
        html.Div(ui.table([("region", "region"), ("executions", "executions"),
                           ("min", lambda r: fmt_ns(r["min_ns"])), ("median", lambda r: fmt_ns(r["median_ns"])),
                           ("max", lambda r: fmt_ns(r["max_ns"]))], rv["durations"], id="regions-durations"),
                 className="card"),
    ])


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/regions", name="Regions", title="Regions · Neuron Explorer")
