"""The System Trace's Dependency Chain Viewer, as the real one: click an event with dependencies and the
events it depends on (**Upstream events**) and that depend on it (**Downstream events**) are listed, each
with a link that zooms the System Trace to it, and drawn on the timeline: every event of the chain
outlined, an arrow from each event to the one that depends on it across tracks. The chain itself is
``Profile.system_chain`` (``traces.q_chain``: the framework call stack, the runtime call, its execution's
copies and device runs); here only its drawing and its panel.
"""
from __future__ import annotations

from dash import html

from explorer.system import track_name
from traces.timefmt import fmt_ns

CHAIN = "#ff6d00"
SELECTED = "#d50000"


def _rows(view: dict, chain: dict | None, grouping: str) -> list[tuple[int, dict, int]]:
    """The chain's events on rows the view draws (the filters may hide some): ``(index, event, row)``."""
    if not chain:
        return []
    row_of = {name: i for i, name in enumerate(view["tracks"])}
    out = []
    for i, e in enumerate(chain["events"]):
        row = row_of.get(track_name(e, grouping))
        if row is not None:
            out.append((i, e, row))
    return out


def overlay(view: dict, chain: dict | None, grouping: str) -> tuple[list[dict], list[dict], list[dict]]:
    """Plotly traces (the chain's events outlined, a marker at each start so a short one still shows),
    shapes and annotations (a curved arrow per dependency between two rows, both ends inside the window:
    the curve a path shape leaving and reaching its rows vertically, the head an annotation) for ``view``.

    >>> view = {"tracks": ["i/PID:1/neuron_rt/NC:0", "i/PID:1/neuron_hw/NC:0"], "start": 0, "end": 10_000}
    >>> pairs = [("nrt_execute", "neuron_rt"), ("nc_exec_running", "neuron_hw")]
    >>> ev = [dict(name=n, start=1000, dur_ns=2000, source=s, instance_id="i", process_id=1, thread_id=1, nc_idx=0,
    ...            track=k) for k, (n, s) in enumerate(pairs)]
    >>> traces, curves, heads = overlay(view, {"events": ev, "at": 0, "edges": [[0, 1]]}, "default")
    >>> [t["y"] for t in traces][0], [c["path"] for c in curves], [(h["x"], h["y"], h["ay"]) for h in heads]
    (['i/PID:1/neuron_rt/NC:0', 'i/PID:1/neuron_hw/NC:0'], ['M 1.0,0 C 1.0,0.5 1.0,0.5 1.0,1'], [(1.0, 1, -14)])
    """
    rows = _rows(view, chain, grouping)
    if not rows:
        return [], [], []
    names = view["tracks"]
    at = chain["at"]
    custom = [[e["name"], fmt_ns(e["dur_ns"] or 0), e["process_id"], e["thread_id"],
               "" if e["nc_idx"] is None else e["nc_idx"], e["instance_id"], "event", e["track"], e["start"]]
              for _, e, _ in rows]
    hover = "<b>%{customdata[0]}</b> (dependency chain)<br>%{customdata[1]}<extra></extra>"
    y = [names[r] for _, _, r in rows]
    traces = [
        dict(type="bar", name="dependency chain", legendgroup="chain", orientation="h", xaxis="x", yaxis="y", y=y,
             base=[round(e["start"] / 1e3, 3) for _, e, _ in rows],
             x=[round(max(e["dur_ns"] or 0, 1) / 1e3, 3) for _, e, _ in rows],
             marker=dict(color="rgba(255,109,0,0.12)", line=dict(
                 color=[SELECTED if i == at else CHAIN for i, _, _ in rows],
                 width=[3 if i == at else 2 for i, _, _ in rows])),
             customdata=custom, hovertemplate=hover),
        dict(type="scatter", mode="markers", name="dependency chain", legendgroup="chain", showlegend=False,
             xaxis="x", yaxis="y", y=y, x=[round(e["start"] / 1e3, 3) for _, e, _ in rows],
             marker=dict(symbol="diamond", size=[12 if i == at else 9 for i, _, _ in rows],
                         color=[SELECTED if i == at else CHAIN for i, _, _ in rows]),
             customdata=custom, hovertemplate=hover)]
    where = {i: (e, r) for i, e, r in rows}
    lo, hi = view["start"], view["end"]
    curves, heads = [], []
    for a, b in chain["edges"]:
        if a not in where or b not in where or where[a][1] == where[b][1]:
            continue   # hidden by a filter, or on the same row (a call stack): the outline says enough
        (ea, ra), (eb, rb) = where[a], where[b]
        # from where the later event starts inside the earlier one (a call it made), else from its end
        tail = min(max(eb["start"], ea["start"]), ea["start"] + max(ea["dur_ns"] or 0, 0))
        if not (lo <= tail <= hi and lo <= eb["start"] <= hi):
            continue
        x0, x1, mid = tail / 1e3, eb["start"] / 1e3, (ra + rb) / 2
        color = SELECTED if at in (a, b) else CHAIN
        # rows are category positions (0 at the top): a cubic that leaves and reaches them vertically
        curves.append(dict(type="path", path=f"M {x0},{ra} C {x0},{mid} {x1},{mid} {x1},{rb}", xref="x", yref="y",
                           line=dict(color=color, width=1.6), layer="above", name=f"chain {ra}->{rb}"))
        heads.append(dict(x=x1, y=rb, xref="x", yref="y", ax=0, ay=-14 if rb > ra else 14, text="",
                          showarrow=True, arrowhead=2, arrowsize=1.2, arrowwidth=1.6, arrowcolor=color))
    return traces, curves, heads


def _offset(ns: int) -> str:
    """A start relative to the selected event's, signed.

    >>> _offset(-9_000), _offset(0), _offset(23_320)
    ('−9 µs', '0', '+23.3 µs')
    """
    return "0" if ns == 0 else ("−" if ns < 0 else "+") + fmt_ns(abs(ns))


def _table(chain: dict, indices: list[int], grouping: str, which: str):
    events = chain["events"]
    if not indices:
        return html.Div(f"No {which} events.", className="hint")
    columns = [("", lambda i: html.Button("Show", id={"type": "system-chain-go", "index": i}, className="btn",
                                          title="zoom the System Trace to this event")),
               ("event", lambda i: events[i]["name"]),
               ("track", lambda i: track_name(events[i], grouping)),
               ("start", lambda i: fmt_ns(events[i]["start"])),
               ("from the selected", lambda i: _offset(events[i]["start"] - events[chain["at"]]["start"])),
               ("duration", lambda i: fmt_ns(events[i]["dur_ns"] or 0))]
    head = html.Thead(html.Tr([html.Th(h) for h, _ in columns]))
    body = [html.Tr([html.Td(f(i)) for _, f in columns]) for i in indices]
    return html.Table([head, html.Tbody(body)], className="data", id=f"system-chain-{which}")


def panel(chain: dict | None, grouping: str):
    """The Dependency Chain card's contents: the selected event, its upstream and downstream events."""
    if not chain:
        return html.Div("Click an event with dependencies (a framework op that called the runtime, a runtime "
                        "call, a device execution or a copy): what it depends on and what depends on it.",
                        className="hint")
    e = chain["events"][chain["at"]]
    notes = []
    if chain.get("stack_more"):
        notes.append(f"{chain['stack_more']:,} outer frames of the call stack not listed")
    if chain.get("more"):
        notes.append(f"{chain['more']:,} more downstream events not listed: select a narrower framework event")
    return html.Div([
        html.Div([html.Strong(e["name"]), f" · {track_name(e, grouping)} · {fmt_ns(e['dur_ns'] or 0)}"],
                 id="system-chain-selected"),
        html.H4(f"Upstream events ({len(chain['upstream'])})"),
        _table(chain, chain["upstream"], grouping, "upstream"),
        html.H4(f"Downstream events ({len(chain['downstream'])})"),
        _table(chain, chain["downstream"], grouping, "downstream"),
        html.Div(" · ".join(notes), className="hint") if notes else None,
    ])
