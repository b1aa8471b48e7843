"""Recompiles: each recompiled graph with the old and new input signature side by side (the changed
dimension highlighted), the reason, the compile time, and a bucketing suggestion per graph family."""
from __future__ import annotations

from dash import dcc, html

from explorer import data, ui
from explorer.figures import fmt_ns


def _shape(shape, changed):
    if shape is None:
        return html.Span("(new input)")
    parts = []
    for i, d in enumerate(shape):
        parts.append(html.Span(str(d), className="dim-changed" if i in changed else None))
        if i < len(shape) - 1:
            parts.append(", ")
    return html.Span(["[", *parts, "]"])


def changed_inputs(diff: list[dict]) -> list[dict]:
    """The inputs a recompile changed (a dimension, the dtype, or new); the rest are noise in the table.

    >>> changed_inputs([{"name": "x", "changed": [1], "dtype_changed": False},
    ...                 {"name": "mask", "changed": [], "dtype_changed": False}])[0]["name"]
    'x'
    """
    return [d for d in diff if d["changed"] or d.get("dtype_changed")]


def _signature(diff, side):
    shown = changed_inputs(diff)
    rows = [html.Div([f"{d['name']}: {d['dtype']}", _shape(d[side], d["changed"])], className="sig")
            for d in shown]
    if len(shown) < len(diff):
        rows.append(html.Div(f"+ {len(diff) - len(shown)} unchanged input(s)", className="hint"))
    return html.Div(rows)


@ui.guarded
def layout(profile=None, **_):
    key = ui.profile_key(profile)
    r = data.recompiles(data.resolve(key))
    suggestions = [html.Div([
        html.Div(html.Strong(f"Pad input {', '.join(repr(n) for n in s['input_names'])} dimension {s['dim']} "
                             f"to {s['buckets']}")),
        html.Div(f"Graph {s['graph']} was compiled for {s['compiles_before']} values of that dimension "
                 f"({', '.join(map(str, s['values'][:12]))}). With these buckets it compiles "
                 f"{s['compiles_after']} times: {s['compiles_saved']} compiles saved (~{fmt_ns(s['compile_ns_saved'])} "
                 f"of compile time), at a padding cost of {s['padding_percent']:.1f}% more elements along that "
                 f"dimension, weighted by how often each shape ran."),
    ], className="reco") for s in r["suggestions"]]
    table = ui.table([
        ("graph", "name"),
        ("reason", "reason"),
        ("previous signature", lambda e: _signature(e["diff"], "old")),
        ("new signature", lambda e: _signature(e["diff"], "new")),
        ("compile time", lambda e: fmt_ns(e["compile_wall_ns"]) + (" (cache hit)" if e["cache_hit"] else "")),
        ("when", lambda e: "before this window" if e["before_window"] else "in this window"),
        ("call site", lambda e: dcc.Link(e["where"], href=ui.href("/source", profile=key, line=e["source_id"]))
         if e["source_id"] is not None else "—"),
        ("timeline", lambda e: dcc.Link("show", href=ui.href("/timeline", profile=key, sel=f"graph:{e['graph_id']}"))),
    ], r["recompiles"], id="recompiles-table")
    f = r["figures"]   # the Summary's counts: what happened inside the recording window
    before = [html.Div(r["before_window"], className="hint", id="recompiles-before")] if r["before_window"] else []
    return html.Div([
        html.H2(f"Recompiles · {f.recompiles} of {f.graphs} graphs · {f.compiles} compiles "
                f"({f.cache_hits} cache hits) · {fmt_ns(f.compile_ns)} compiling in this window",
                id="recompiles-count"),
        *before,
        html.Div(suggestions or [html.Div("No bucketing suggestion: no input dimension varied between compiles.",
                                          className="hint")], id="recompiles-suggestions"),
        html.Div(table if r["recompiles"] else html.Div("No recompiles: every graph compiled once.", className="hint"),
                 className="card"),
    ])


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/recompiles", name="Recompiles", title="Recompiles · Neuron Explorer")
