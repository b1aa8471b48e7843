"""Fallbacks: every op that ran on the CPU, with its reason, call site, calls and host time."""
from __future__ import annotations

from dash import dcc, html

from explorer import data, ui
from explorer.figures import fmt_ns


@ui.guarded
def layout(profile=None, **_):
    key = ui.profile_key(profile)
    rows = data.fallbacks(data.resolve(key))
    if not rows:
        body = html.Div("No op fell back to the CPU: every op of every graph has a device lowering.", className="hint")
    else:
        body = ui.table([
            ("op", lambda r: html.Span(r["op"], className="fallback")),
            ("reason", "reason"),
            ("call site", lambda r: dcc.Link(r["where"], href=ui.href("/source", profile=key, line=r["source_id"]))
             if r["source_id"] is not None else "—"),
            ("code", lambda r: html.Code(r["code"][:80])),
            ("module", "module"), ("graph", "graph"), ("shape", "shape"), ("calls", "calls"),
            ("host time", lambda r: fmt_ns(r["host_ns"])),
            ("timeline", lambda r: dcc.Link("show", href=ui.href("/timeline", profile=key, sel=f"op:{r['op_id']}"))),
        ], rows, id="fallbacks-table")
    return html.Div([
        html.H2(f"CPU fallbacks · {len(rows)} ops"),
        html.Div("Each call leaves the device: inputs go to the host over PCIe, the op runs in PyTorch on the CPU, "
                 "and the result comes back. Red spans on the timeline's host lane mark them.", className="hint"),
        html.Div(body, className="card"),
    ])


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/fallbacks", name="Fallbacks", title="CPU fallbacks · Neuron Explorer")
