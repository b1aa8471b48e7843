"""Compare: any number of profiles against a chosen base, as the real tool's Profile Comparison.

Stacked, synchronised timelines (zoom or pan one, all follow: each shows the same span of time after its
own first busy execution, so steps line up whatever each profile did before them), the headline figures
with deltas against the base, and the structural diff no other tool has: time by source line
(``file.py:line``), op path (``module / aten op``) and forward line of backward ops, per profile
(``traces.q_compare``). ``/compare?keys=a,b,c&base=a``; the old ``a=``/``b=`` still open two.
"""
from __future__ import annotations

import dash
from dash import ALL, Input, Output, State, callback, ctx, dcc, html

from explorer import data, timeline, ui
from explorer.figures import fmt_ns, shift_x, timeline_figure
from traces.timefmt import time_ticks

#: Profiles a comparison shows at most (a stacked timeline each).
MAX_PROFILES = 8


def _delta(ns):
    cls = "delta-up" if ns > 0 else "delta-down" if ns < 0 else ""
    return html.Span(("+" if ns > 0 else "") + fmt_ns(ns), className=cls)


def chosen(keys=None, base=None, a=None, b=None, profile=None) -> tuple[list[str], str]:
    """The profiles compared and the base, from the URL (``keys=a,b,c&base=a``, or ``a=``/``b=``), every
    key checked against the served ones; by default the first two served."""
    served = data.registry().keys()
    if keys:
        picked = [k for k in str(keys).split(",") if k][:MAX_PROFILES]
    else:
        first = a or profile or served[0]
        picked = [first, b or next((k for k in served if k != first), first)]
    for k in picked:
        if k not in served:
            raise data.ExplorerError(f"unknown profile {k[:60]!r}; compare some of: {', '.join(served)}")
    picked = list(dict.fromkeys(picked))
    if len(picked) < 2:
        raise data.ExplorerError("Compare needs two profiles or more: add one with the + links")
    base = base if base in picked else picked[0]
    return picked, base


@ui.guarded
def layout(profile=None, a=None, b=None, keys=None, base=None, **_):
    served = data.registry().keys()
    if len(served) < 2:
        return ui.error_box("Compare needs two profiles",
                            "Start the Explorer with both: `neuron-explorer view A/profile.duckdb B/profile.duckdb`.")
    picked, base = chosen(keys, base, a, b, profile)
    label = data.registry().label
    Ls = [data.resolve(k) for k in picked]
    bi = picked.index(base)
    c = data.compare_n(Ls, bi)

    def link(text, ks, bk, **kw):
        return dcc.Link(text, href=ui.href("/compare", profile=profile, keys=",".join(ks), base=bk), **kw)

    pickers = html.Div([html.Span([
        html.Strong(label(k)) if k in picked else html.Span(label(k), className="hint"), " ",
        (link("− remove", [x for x in picked if x != k], base if base != k else None,
              id=f"compare-remove-{i}") if k in picked and len(picked) > 2 else
         link("+ add", picked + [k], base, id=f"compare-add-{i}") if k not in picked else None), " ",
        (html.Span("base", className="pill") if k == base else
         link("make base", picked, k, id=f"compare-base-{i}") if k in picked else None),
    ], className="compare-pick") for i, k in enumerate(served)], className="toolbar", id="compare-pickers")
    names = [label(k) for k in picked]
    if len(picked) == 2:   # two profiles: each value, then the difference in a column of its own
        oi = 1 - bi
        cols = [(f"{letter(i)}: {names[i]}{' (base)' if i == bi else ''}", lambda r, i=i: _fmt(r[0], r[1]["values"][i]))
                for i in range(2)] + [(f"{letter(oi)} − {letter(bi)}", lambda r: _fmt(r[0], r[1]["delta"][oi]))]
    else:
        cols = [(f"{letter(i)}: {n}{' (base)' if i == bi else ''}", lambda r, i=i: _fmt(r[0], r[1]["values"][i])
                 if i == bi else html.Span([_fmt(r[0], r[1]["values"][i]), " ", _signed(r[0], r[1]["delta"][i])]))
                for i, n in enumerate(names)]
    totals = ui.table([("metric", lambda r: r[0])] + cols, list(c["totals"].items()), id="compare-totals")
    why = [html.Li(f"{letter(i)} against {letter(bi)}: " + "; ".join(data.why(Ls[bi], Ls[i], (letter(bi), letter(i)))))
           for i in range(len(Ls)) if i != bi]
    store = {"keys": picked, "window": None}
    return html.Div([
        html.H2(f"Compare {len(picked)} profiles · "
                + " · ".join(f"{letter(i)} = {n}" for i, n in enumerate(names)) + f" · base {letter(bi)}",
                id="compare-title"), pickers,
        html.Div([html.H3("Why"), html.Ul(why, id="compare-why")], className="card"),
        html.Div(totals, className="card"),
        dcc.Store(id="compare-state", data=store),
        html.Div([html.H3("Timelines (zoom or pan one: all follow; time since each one's first busy execution)"),
                  *[dcc.Graph(id={"type": "compare-tl", "i": i}, figure=fig, config={"displaylogo": False})
                    for i, fig in enumerate(_figures(picked, None))]], className="card", id="compare-timelines"),
        html.Div([
            html.Div([html.H3("By source line"), ui.table(
                [("line", "line"), ("code", lambda r: html.Code((r.get("code") or "")[:60]))] + _cols(names, bi),
                c["by_line"], id="compare-lines")], className="card col"),
            html.Div([html.H3("By op path"), ui.table([("op path", "op_path")] + _cols(names, bi), c["by_op"],
                                                      id="compare-ops")], className="card col"),
        ], className="row"),
        html.Div([html.H3("Backward ops by the forward line they came from"),
                  html.P("A backward op's line is the backward() call that ran it; autograd records the forward "
                         "line it differentiates."),
                  ui.table([("forward line", "line")] + _cols(names, bi), c["by_fwd_line"], id="compare-backward")],
                 className="card"),
    ])


def letter(i: int) -> str:
    """A profile's letter in a comparison: A, B, C … (the ``diff`` command's too)."""
    return chr(ord("A") + i) if i < 26 else f"P{i + 1}"


def _cols(names, bi):
    def cell(r, i):
        if not r["present"][i]:
            return html.Span("—", className="hint")
        if i == bi:
            return fmt_ns(r["ns"][i])
        pct = r["delta_percent"][i]
        return html.Span([fmt_ns(r["ns"][i]), " ", _delta(r["delta_ns"][i]),
                          f" ({pct:+.1f}%)" if pct is not None else ""])
    return [(f"{n}{' (base)' if i == bi else ''}", lambda r, i=i: cell(r, i)) for i, n in enumerate(names)]


def _figures(keys: list[str], window) -> list[dict]:
    """One compact timeline per profile over ``window`` = (lo, hi) ns after its first busy execution
    (None: the longest of their opening windows), its x axis shifted so every profile starts at 0."""
    Ls = [data.resolve(k) for k in keys]
    fits = [data.bounds(L)["fit"] for L in Ls]
    lo, hi = window or (0, max(e - s for s, e in fits))
    ticks = time_ticks(lo, hi)
    out = []
    for k, L, (s, _e) in zip(keys, Ls, fits):
        span = data.bounds(L)["span"]
        a = min(max(s + lo, 0), span - 1)
        b = max(min(s + hi, span), a + 1)     # the part of the span this profile recorded
        tl = timeline.timeline(L, a, b)
        fig = timeline_figure(tl, data.ops(L), height=max(160, 18 * len(tl["lanes"]) + 70), compact=True)
        shift_x(fig, -s / 1e3)
        fig["layout"]["xaxis"].update(range=[lo / 1e3, hi / 1e3], tickvals=[v / 1e3 for v in ticks.values_ns],
                                      ticktext=ticks.labels, title=dict(text=ticks.title.replace(
                                          "profile start", "first busy execution"), font=dict(size=10)))
        fig["layout"]["title"] = dict(text=data.registry().label(k), x=0, font=dict(size=12))
        fig["layout"]["margin"]["t"] = 26
        out.append(fig)
    return out


@callback(Output({"type": "compare-tl", "i": ALL}, "figure"), Output("compare-state", "data"),
          Input({"type": "compare-tl", "i": ALL}, "relayoutData"), State("compare-state", "data"),
          prevent_initial_call=True)
def synchronise(relayouts, state):
    """A zoom or pan on one timeline moves them all to the same span after each one's first busy execution."""
    trigger = ctx.triggered_id
    keep = ([dash.no_update] * len(relayouts), dash.no_update)   # a wildcard output takes one per graph
    if not isinstance(trigger, dict):
        return keep
    r = relayouts[int(trigger.get("i", 0))] or {}
    if r.get("xaxis.autorange"):
        window = None
    else:
        lo = r.get("xaxis.range[0]", (r.get("xaxis.range") or [None, None])[0])
        hi = r.get("xaxis.range[1]", (r.get("xaxis.range") or [None, None])[1])
        try:
            window = (max(int(float(lo) * 1e3), -10**12), int(float(hi) * 1e3))
        except (TypeError, ValueError):
            return keep
        if window[1] <= window[0]:
            return keep
    keys = [k for k in state.get("keys", []) if k in data.registry().keys()]
    return _figures(keys, window), dict(state, window=window)


def _fmt(metric, v):
    if metric.endswith("_ns"):
        return fmt_ns(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _signed(metric, d):
    if not d:
        return ""
    return html.Span(f"({'+' if d > 0 else '−'}{_fmt(metric, abs(d))})",
                     className="delta-up" if d > 0 else "delta-down")


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/compare", name="Compare", title="Compare · Neuron Explorer")
