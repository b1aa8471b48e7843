"""Compare: two profiles aligned by source line (``file.py:line``) and op path (``module / aten op``),
with per-line and per-op deltas of device time (B − A)."""
from __future__ import annotations

from dash import dcc, html

from explorer import data, ui
from explorer.figures import fmt_ns


def _delta(ns):
    cls = "delta-up" if ns > 0 else "delta-down" if ns < 0 else ""
    return html.Span(("+" if ns > 0 else "") + fmt_ns(ns), className=cls)


@ui.guarded
def layout(profile=None, a=None, b=None, **_):
    keys = data.registry().keys()
    if len(keys) < 2:
        return ui.error_box("Compare needs two profiles",
                            "Start the Explorer with both: `neuron-explorer view A/profile.duckdb B/profile.duckdb`.")
    a = a or profile or keys[0]
    b = b or next(k for k in keys if k != a)
    c = data.compare(data.resolve(a), data.resolve(b))
    label = data.registry().label
    pickers = html.Div(["A: ", *[dcc.Link(label(k), href=ui.href("/compare", profile=profile, a=k, b=b),
                                          className="active" if k == a else "", style={"marginRight": "8px"})
                                 for k in keys],
                        " · B: ", *[dcc.Link(label(k), href=ui.href("/compare", profile=profile, a=a, b=k),
                                             className="active" if k == b else "", style={"marginRight": "8px"})
                                    for k in keys]],
                       className="toolbar", id="compare-pickers")
    totals = ui.table([("metric", lambda r: r[0]), ("A", lambda r: _fmt(r[0], r[1]["a"])),
                       ("B", lambda r: _fmt(r[0], r[1]["b"])), ("B − A", lambda r: _fmt(r[0], r[1]["delta"]))],
                      list(c["totals"].items()), id="compare-totals")
    cols = [("A", lambda r: fmt_ns(r["a_ns"])), ("B", lambda r: fmt_ns(r["b_ns"])),
            ("Δ", lambda r: _delta(r["delta_ns"])),
            ("Δ %", lambda r: "" if r["delta_percent"] is None else f"{r['delta_percent']:+.1f}%"),
            ("instructions A → B", lambda r: f"{r['a_instructions']:,} → {r['b_instructions']:,}")]
    return html.Div([
        html.H2(f"Compare · A = {label(a)} · B = {label(b)}"), pickers,
        html.Div([html.H3("Why"), html.Ul([html.Li(line) for line in c["why"]["lines"]], id="compare-why")],
                 className="card"),
        html.Div(totals, className="card"),
        html.Div([
            html.Div([html.H3("By source line"), ui.table(
                [("line", "line"), ("code", lambda r: html.Code((r.get("code") or "")[:60]))] + cols,
                c["by_line"], id="compare-lines")], className="card col"),
            html.Div([html.H3("By op path"), ui.table([("op path", "op_path")] + cols, c["by_op"], id="compare-ops")],
                     className="card col"),
        ], className="row"),
        html.Div([html.H3("Backward ops by the forward line they came from"),
                  html.P("A backward op's line is the backward() call that ran it; autograd records the forward "
                         "line it differentiates."),
                  ui.table([("forward line", "line")] + cols, c["by_fwd_line"], id="compare-backward")],
                 className="card"),
    ])


def _fmt(metric, v):
    if metric.endswith("_ns"):
        return fmt_ns(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/compare", name="Compare", title="Compare · Neuron Explorer")
