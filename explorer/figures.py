"""Plotly figures the pages share: the timeline (raw or level-of-detail), the hierarchy icicle, small bars.

The timeline's x axis is microseconds since the profile's start, its ticks labelled with units
(``traces.timefmt.time_ticks``: "20 µs", "1.5 s", or "+20 µs" after a named instant when zoomed far
from zero); lanes are rows (y = lane index, top to bottom). In raw mode each instruction is a bar
coloured by the ATen op it came from; in level-of-detail mode each lane is a heat strip of busy
fraction per time bucket, so the browser never receives more cells than the screen has pixels.

>>> fmt_ns(1500)
'1.5 µs'
"""
from __future__ import annotations

import json
import os
import zlib

import plotly.graph_objects as go

from explorer import data, timeline
from traces.timefmt import fmt_ns, fmt_window, time_ticks
from traces.vocab import DEVICE_ENGINES, ENGINE_LABELS

__all__ = ["fmt_ns", "fmt_window", "fmt_bytes", "timeline_figure", "shift_x", "counter_figure", "icicle_figure",
           "engine_bars", "op_color", "share_bars", "memory_figure"]

PALETTE = ("#4e79a7", "#59a14f", "#9c755f", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#af7aa1",
           "#86bcb6", "#8cd17d", "#499894", "#d4a6c8", "#a0cbe8", "#79706e", "#bab0ac", "#f1ce63")
FALLBACK_RED = "#e15759"
RECOMPILE_ORANGE = "#f28e2b"
COMPILE_BLUE = "#7aa6d6"
SELECT_GOLD = "#ffbf00"
ANNOTATION_PURPLE = "#7645a0"
REGION_AMBER = "#b5610b"
MAX_LEGEND_OPS = 10


def fmt_bytes(n) -> str:
    n = float(n or 0)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def op_color(label: str) -> str:
    """A stable colour per ATen op name, the same on every page and every profile."""
    return PALETTE[zlib.crc32(label.encode()) % len(PALETTE)]


def _lane_index(lanes) -> dict[str, int]:
    return {lane.key: i for i, lane in enumerate(lanes)}


class _Fig:
    """A figure as plain dicts: plotly's validating objects cost more than the query for 4000 bars."""

    def __init__(self):
        self.data: list[dict] = []
        self.layout: dict = {}

    def add_trace(self, trace: dict) -> None:
        self.data.append(trace)

    def to_dict(self) -> dict:
        return {"data": self.data, "layout": self.layout}


def timeline_figure(tl: dict, ops: dict, height: int | None = None, compact: bool = False) -> dict:
    """The timeline for one :func:`explorer.timeline.timeline` answer, as a Plotly figure dict.

    Raw instruction bars carry ``customdata = [core, engine, start_ns, pc, op_id]`` so a click can
    ask for the instruction; highlighted (selected) instructions form the trace named ``selection``.
    """
    lanes = tl["lanes"]
    index = _lane_index(lanes)
    fig = _Fig()
    chosen = set(tl.get("selection") or [])
    if tl["mode"] == "raw":
        _raw_bars(fig, tl, ops, index, chosen)
    else:
        _lod_heat(fig, tl, ops, index, chosen)
    _span_bars(fig, tl, index)
    n = len(lanes)
    ticks = time_ticks(tl["start"], tl["end"])
    fig.layout = dict(
        height=height or max(260, 26 * n + 90), margin=dict(l=10, r=10, t=28 if not compact else 8, b=36),
        barmode="overlay", bargap=0.15, dragmode="zoom", hovermode="closest", plot_bgcolor="#fbfbfd",
        showlegend=not compact, legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0, font=dict(size=10)),
        xaxis=dict(title=dict(text=ticks.title, font=dict(size=11)),
                   range=[tl["start"] / 1e3, tl["end"] / 1e3],
                   tickmode="array", tickvals=[v / 1e3 for v in ticks.values_ns], ticktext=ticks.labels,
                   showgrid=True, zeroline=False),
        yaxis=dict(tickmode="array", tickvals=list(range(n)), ticktext=[lane.label for lane in lanes],
                   range=[n - 0.5, -0.5], fixedrange=True, showgrid=False, automargin=True),
        uirevision=f"{tl['start']}-{tl['end']}",
    )
    _annotations(fig, tl.get("annotations") or ())
    _region(fig, tl.get("region"), lanes)
    return fig.to_dict()


def counter_figure(c: dict) -> dict:
    """The counter tracks under the timeline (:func:`explorer.tracks.counters`): HFU (%), the Tensor Engine's
    throttled time (%, on a target with the limiter) and device memory in use (MB) over the same window, each
    with its axis labelled."""
    ticks = time_ticks(c["start"], c["end"])
    mem = c["memory"]
    throttle = c.get("throttle")
    # top to bottom: HFU, throttled (when there is a limiter), device memory
    domains = ([0.7, 1], [0.36, 0.64], [0, 0.3]) if throttle is not None else ([0.56, 1], None, [0, 0.44])
    fig = _Fig()
    fig.add_trace(dict(type="scatter", mode="lines", name="HFU", x=[x / 1e3 for x in c["hfu_x"]], y=c["hfu"],
                       line=dict(color="#4e79a7", width=1.5, shape="hvh"), fill="tozeroy",
                       hovertemplate="HFU %{y:.1f}%<extra></extra>", xaxis="x2", yaxis="y"))
    fig.add_trace(dict(type="scatter", mode="lines", name="device memory", x=[t / 1e3 for t, _ in mem],
                       y=[b / 1e6 for _, b in mem], line=dict(color="#f28e2b", width=1.5, shape="hv"),
                       hovertemplate="%{y:.3g} MB in use<extra></extra>", yaxis="y2"))
    if throttle is not None:
        fig.add_trace(dict(type="scatter", mode="lines", name="throttled", x=[x / 1e3 for x in c["hfu_x"]],
                           y=throttle, line=dict(color="#e15759", width=1.5, shape="hvh"), fill="tozeroy",
                           hovertemplate="Tensor Engine throttled %{y:.1f}% of the time<extra></extra>",
                           xaxis="x2", yaxis="y3"))
    fig.layout = dict(
        height=250 if throttle is not None else 190, margin=dict(l=70, r=10, t=8, b=36), showlegend=False,
        hovermode="x", plot_bgcolor="#fbfbfd",
        xaxis=dict(range=[c["start"] / 1e3, c["end"] / 1e3], tickmode="array",
                   tickvals=[v / 1e3 for v in ticks.values_ns], ticktext=ticks.labels,
                   title=dict(text=ticks.title, font=dict(size=11)), anchor="y2"),
        xaxis2=dict(matches="x", anchor="y", showticklabels=False),
        yaxis=dict(domain=domains[0], title=dict(text="HFU %", font=dict(size=10)), rangemode="tozero",
                   fixedrange=True),
        yaxis2=dict(domain=domains[2], title=dict(text="HBM in use (MB)", font=dict(size=10)), rangemode="tozero",
                    fixedrange=True),
        uirevision=f"{c['start']}-{c['end']}")
    if throttle is not None:
        fig.layout["yaxis3"] = dict(domain=domains[1], title=dict(text="throttled %", font=dict(size=10)),
                                    range=[0, 100], fixedrange=True)
    return fig.to_dict()


def shift_x(fig: dict, by_us: float) -> dict:
    """Move a timeline figure's x values by ``by_us`` (bars' bases, heat cells, markers, annotations): the
    Compare page draws each profile from its own first busy execution. Example: ``shift_x(fig, -2000.0)``."""
    for t in fig["data"]:
        if t.get("type") == "bar" and t.get("orientation") == "h":
            t["base"] = [b + by_us for b in t["base"]]
        elif t.get("x") is not None:
            t["x"] = [x + by_us if x is not None else None for x in t["x"]]
    for shape in fig["layout"].get("shapes", []):
        shape["x0"] += by_us
        shape["x1"] += by_us
    for label in fig["layout"].get("annotations", []):
        label["x"] += by_us
    return fig


def _annotations(fig, notes) -> None:
    """The user's annotations: a dashed line at a point, a shaded band over a range, the text on top."""
    shapes, labels = [], []
    for a in notes:
        x0, x1 = a["start"] / 1e3, a["end"] / 1e3
        shapes.append(dict(type="line", x0=x0, x1=x0, yref="paper", y0=0, y1=1,
                           line=dict(color=ANNOTATION_PURPLE, width=1.5, dash="dash")) if a["kind"] == "point" else
                      dict(type="rect", x0=x0, x1=x1, yref="paper", y0=0, y1=1, layer="below", line=dict(width=0),
                           fillcolor="rgba(118, 69, 160, 0.10)"))
        labels.append(dict(x=x0, y=1, yref="paper", yanchor="top", xanchor="left", showarrow=False,
                           text=f"✎ {a['text'][:60]}", bgcolor="rgba(255,255,255,0.8)",
                           font=dict(size=10, color=ANNOTATION_PURPLE)))
    if shapes:
        fig.layout["shapes"] = shapes
        fig.layout["annotations"] = labels


def _region(fig, mark, lanes) -> None:
    """A region from the Regions page (:func:`explorer.timeline.region_mark`): its span shaded under the bars
    over its core's lanes (all lanes when none of them is drawn), its name at the foot of the band."""
    if not mark:
        return
    x0, x1 = mark["start"] / 1e3, mark["end"] / 1e3
    mine = [i for i, lane in enumerate(lanes) if lane.key.split(":")[1:2] == [str(mark["core"])]]
    # lanes run top to bottom (the y axis is reversed): the band covers the core's, its label sits at their foot
    y = dict(yref="y", y0=min(mine) - 0.5, y1=max(mine) + 0.5) if mine else dict(yref="paper", y0=0, y1=1)
    fig.layout.setdefault("shapes", []).append(
        dict(type="rect", x0=x0, x1=x1, layer="below", name="region", **y,
             line=dict(color=REGION_AMBER, width=1), fillcolor="rgba(242, 142, 43, 0.16)"))
    fig.layout.setdefault("annotations", []).append(
        dict(x=x0, y=y["y1"] if mine else 0, yref=y["yref"], yanchor="bottom", xanchor="left", showarrow=False,
             name="region", text=f"▣ {mark['name'][:60]} (core {mark['core']})", bgcolor="rgba(255,255,255,0.85)",
             font=dict(size=11, color=REGION_AMBER)))


def _raw_bars(fig, tl, ops, index, chosen):
    by_op: dict[str, list] = {}
    for r in tl["instructions"]:
        lane = timeline.lane_key(r["core"], r["engine"], r["queue"])
        if lane not in index:
            continue
        label = data.op_label(ops.get(r["op_id"]))
        by_op.setdefault(label, []).append((r, index[lane]))
    ranked = sorted(by_op, key=lambda k: -sum(r["dur"] for r, _ in by_op[k]))
    legend_ops = set(ranked[:MAX_LEGEND_OPS])
    groups: dict[str, list] = {}
    for label in ranked:
        groups.setdefault(label if label in legend_ops else "other ops", []).extend(by_op[label])
    for label, items in groups.items():
        rest = [(r, y) for r, y in items if r["op_id"] not in chosen]
        if rest:
            fig.add_trace(_bar_trace(label, rest, ops, "#bbbbbb" if label == "other ops" else op_color(label),
                                     opacity=0.35 if chosen else 0.95))
    picked = [(r, index[timeline.lane_key(r["core"], r["engine"], r["queue"])]) for r in tl["instructions"]
              if r["op_id"] in chosen and timeline.lane_key(r["core"], r["engine"], r["queue"]) in index]
    if picked:
        t = _bar_trace("selection", picked, ops, SELECT_GOLD, opacity=1.0)
        t["marker"]["line"] = dict(color="#5a3d00", width=1.5)
        fig.add_trace(t)


def _bar_trace(name, items, ops, color, opacity):
    xs, base, ys, custom, text = [], [], [], [], []
    for r, y in items:
        o = ops.get(r["op_id"]) or {}
        xs.append(max(r["dur"], 1) / 1e3)
        base.append(r["start"] / 1e3)
        ys.append(y)
        custom.append([r["core"], r["engine"], r["start"], r["pc"], r["op_id"]])
        text.append(f"<b>{r['opcode']}</b> pc {r['pc']} · {fmt_ns(r['dur'])}<br>op {data.op_label(o)} "
                    f"({o.get('name', '?')})<br>module {o.get('module_path') or '—'}<br>source "
                    f"{data.where(o) or '—'}<br>{(o.get('code') or '').strip()[:80]}")
    return dict(type="bar", name=name, orientation="h", x=xs, base=base, y=ys, customdata=custom, hovertext=text,
                hovertemplate="%{hovertext}<extra></extra>", marker=dict(color=color), opacity=opacity, width=0.8)


def _lod_heat(fig, tl, ops, index, chosen):
    n_buckets = max((b for cells in tl["buckets"].values() for b, *_ in cells), default=0) + 1
    width, origin = tl["bucket_ns"], tl.get("bucket_origin", tl["start"])
    xs = [(origin + (i + 0.5) * width) / 1e3 for i in range(n_buckets)]
    z = [[None] * n_buckets for _ in index]
    text = [[""] * n_buckets for _ in index]
    when: dict[int, str] = {}      # a bucket's time label, made once for all its lanes
    for lane_key, cells in tl["buckets"].items():
        y = index.get(lane_key)
        if y is None:
            continue
        label = tl["lanes"][y].label
        for b, frac, n, top in cells:
            z[y][b] = frac
            o = ops.get(top)
            if b not in when:
                when[b] = fmt_window(origin + b * width, origin + (b + 1) * width)
            text[y][b] = (f"<b>{label}</b> {when[b]}"
                          f"<br>busy {100 * frac:.0f}% · {n} instructions"
                          + (f"<br>longest from {data.op_label(o)} {data.where(o)}" if o else ""))
    fig.add_trace(dict(type="heatmap", name="busy", x=xs, y=list(range(len(index))), z=z, text=text, zmin=0, zmax=1,
                       hovertemplate="%{text}<extra></extra>", showscale=False, xgap=0, ygap=3,
                       colorscale=[[0, "#dbe6f3"], [0.5, "#6f9bd1"], [1, "#1f4e8c"]]))
    if chosen and tl.get("highlight"):
        hx, hy, ht = [], [], []
        for lane_key, cells in tl["highlight"].items():
            y = index.get(lane_key)
            if y is None:
                continue
            for b, n in cells:
                hx.append((origin + (b + 0.5) * width) / 1e3)
                hy.append(y - 0.32)
                ht.append(f"{n} selected instructions")
        fig.add_trace(dict(type="scatter", name="selection", x=hx, y=hy, mode="markers", hovertext=ht,
                           hovertemplate="%{hovertext}<extra></extra>",
                           marker=dict(symbol="square", size=7, color=SELECT_GOLD,
                                       line=dict(color="#5a3d00", width=1))))


def _span_bars(fig, tl, index):
    groups = {"exec": [], "cpu_fallback": [], "host_transfer": [], "compile": [], "recompile": [], "cache_hit": []}
    for s in tl["spans"]:
        kind = s.get("kind") or s.get("name")
        if s["lane"] in index and kind in groups:
            groups[kind].append(s)
    style = {"exec": ("executions", "#9fb3c8"), "cpu_fallback": ("CPU fallback", FALLBACK_RED),
             "host_transfer": ("host↔device transfer", "#bab0ac"), "compile": ("compile", COMPILE_BLUE),
             "recompile": ("recompile", RECOMPILE_ORANGE), "cache_hit": ("compile cache hit", "#8cd17d")}
    for kind, spans in groups.items():
        if not spans:
            continue
        name, color = style[kind]
        text = []
        for s in spans:
            extra = (f"graph {s['name']} · iteration {s.get('iteration')}" if kind == "exec"
                     else _transfer_text(s.get("detail")) if kind == "host_transfer" else (s.get("detail") or ""))
            text.append(f"<b>{name}</b> {fmt_ns(s['dur'])}<br>{str(extra)[:160]}")
        # customdata ["span", start, dur]: a click zooms the timeline to the span (pages/timeline.py)
        custom = [["span", s["start"], s["dur"]] for s in spans]
        fig.add_trace(dict(type="bar", name=name, orientation="h", x=[max(s["dur"], 1) / 1e3 for s in spans],
                           base=[s["start"] / 1e3 for s in spans], y=[index[s["lane"]] for s in spans],
                           customdata=custom, hovertext=[t + "<br><i>click to zoom to it</i>" for t in text],
                           hovertemplate="%{hovertext}<extra></extra>",
                           marker=dict(color=color), width=0.7, opacity=0.9))
        if kind == "recompile":   # a marker so a recompile shows even when its span is a sliver
            fig.add_trace(dict(type="scatter", name="recompile marker", x=[s["start"] / 1e3 for s in spans],
                               y=[index[s["lane"]] for s in spans], mode="markers", showlegend=False,
                               customdata=custom, hovertext=text, hovertemplate="%{hovertext}<extra></extra>",
                               marker=dict(symbol="triangle-down", size=11, color=RECOMPILE_ORANGE,
                                           line=dict(color="#7a3e00", width=1))))


def _transfer_text(detail) -> str:
    """A copy's hover line: direction, size and the user's line (``host_transfer`` detail)."""
    try:
        d = json.loads(detail or "{}")
    except ValueError:
        return str(detail)
    arrow = {"to_device": "host → device (nrt_tensor_write)", "to_host": "device → host (nrt_tensor_read)"}
    where = os.path.basename(d.get("source") or "") or d.get("value") or ""
    return f"{arrow.get(d.get('direction'), d.get('direction'))} · {fmt_bytes(d.get('bytes'))} · {where}"


def icicle_figure(nodes: list[dict]) -> go.Figure:
    """Module path → ATen op → opcode, sized by device time; ``customdata`` holds each node's selection."""
    fig = go.Figure(go.Icicle(
        ids=[n["id"] for n in nodes], parents=[n["parent"] for n in nodes], labels=[n["label"] for n in nodes],
        values=[n["value"] for n in nodes], branchvalues="total", customdata=[n["sel"] for n in nodes],
        text=[f"{fmt_ns(n['value'])} · {n['instructions']} instructions" for n in nodes],
        hovertemplate="<b>%{label}</b><br>%{text}<br>%{percentRoot:.1%} of device time<extra></extra>",
        tiling=dict(orientation="v"), root=dict(color="#eef2f7")))
    fig.update_layout(margin=dict(l=4, r=4, t=4, b=4), height=560)
    return fig


def engine_bars(engines: dict[str, float]) -> go.Figure:
    """Horizontal bars of engine active %, in the real tool's engine order."""
    names = [e for e in DEVICE_ENGINES if e in engines]
    fig = go.Figure(go.Bar(x=[engines[e] for e in names], y=[ENGINE_LABELS[e] for e in names], orientation="h",
                           text=[f"{engines[e]:.1f}%" for e in names], textposition="auto",
                           marker=dict(color=["#4e79a7" if e != "dma" else "#f28e2b" for e in names]),
                           hovertemplate="%{y}: %{x:.1f}% active<extra></extra>"))
    fig.update_layout(height=230, margin=dict(l=4, r=4, t=4, b=30), xaxis=dict(range=[0, 100], title="active %"),
                      yaxis=dict(autorange="reversed"))
    return fig


def share_bars(shares: dict[str, float]) -> go.Figure:
    """Horizontal bars of named percentages (a Summary breakdown: FLOPs, memory bandwidth), in the given order."""
    names = list(shares)
    fig = go.Figure(go.Bar(x=[shares[k] for k in names], y=names, orientation="h",
                           text=[f"{shares[k]:.2f}%" for k in names], textposition="auto",
                           marker=dict(color=["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#bab0ac"][:len(names)]),
                           hovertemplate="%{y}: %{x:.2f}%<extra></extra>"))
    fig.update_layout(height=200, margin=dict(l=4, r=4, t=4, b=30), xaxis=dict(range=[0, 100], title="%"),
                      yaxis=dict(autorange="reversed"))
    return fig


def memory_figure(rows: list[dict], t: int | None = None) -> dict:
    """The Memory Viewer: each allocation a block (x: its occupancy in µs since t0, y: its address range
    per partition), filled by its op's colour (``op_color``), outlined red when spill traffic moved it;
    a marker at each block's centre carries the hover text and ``customdata = [row index]``; ``t``
    (ns since t0) draws a vertical line (the instant the timeline linked from)."""
    fig = _Fig()
    by_op: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_op.setdefault(r["op"], []).append(i)
    for op, idx in by_op.items():
        xs, ys = [], []
        for i in idx:
            r = rows[i]
            x0, x1 = r["start_ts"] / 1e3, max(r["end_ts"], r["start_ts"] + 1) / 1e3
            y0, y1 = r["start_address"], r["end_address"] + 1
            xs += [x0, x1, x1, x0, x0, None]
            ys += [y0, y0, y1, y1, y0, None]
        fig.add_trace(dict(type="scatter", mode="lines", x=xs, y=ys, fill="toself", name=op, hoverinfo="skip",
                           fillcolor=op_color(op), opacity=0.75, line=dict(color=op_color(op), width=1)))
    spilled = [r for r in rows if r["spill"]]
    if spilled:
        xs, ys = [], []
        for r in spilled:
            x0, x1 = r["start_ts"] / 1e3, max(r["end_ts"], r["start_ts"] + 1) / 1e3
            y0, y1 = r["start_address"], r["end_address"] + 1
            xs += [x0, x1, x1, x0, x0, None]
            ys += [y0, y0, y1, y1, y0, None]
        fig.add_trace(dict(type="scatter", mode="lines", x=xs, y=ys, name="moved by spill traffic",
                           hoverinfo="skip", line=dict(color=FALLBACK_RED, width=2)))
    fig.add_trace(dict(
        type="scatter", mode="markers", name="allocations", showlegend=False,
        x=[(r["start_ts"] + r["end_ts"]) / 2e3 for r in rows],
        y=[(r["start_address"] + r["end_address"] + 1) / 2 for r in rows],
        customdata=[[i] for i in range(len(rows))], marker=dict(size=6, color="rgba(0,0,0,0.35)"),
        hovertext=[f"<b>{r['tensor_name']}</b> ({r['op']})<br>{fmt_ns(r['start_ts'])} – {fmt_ns(r['end_ts'])} · "
                   f"{fmt_ns(r['end_ts'] - r['start_ts'])}<br>address {r['start_address']:#x} – {r['end_address']:#x}"
                   f" · partitions {r['partition']}–{r['partition'] + r['partition_count'] - 1}<br>{r['opcode']}"
                   + (f" on {r['queue_name']}" if r["queue_name"] else "") + (f" · spill {r['spill']}" if r["spill"]
                                                                              else "") for r in rows],
        hovertemplate="%{hovertext}<extra></extra>"))
    shapes = [dict(type="line", x0=t / 1e3, x1=t / 1e3, yref="paper", y0=0, y1=1,
                   line=dict(color=SELECT_GOLD, width=2))] if t is not None else []
    lo = min((r["start_ts"] for r in rows), default=0)
    hi = max((r["end_ts"] for r in rows), default=1)
    ticks = time_ticks(lo, max(hi, lo + 1))
    fig.layout = dict(height=520, margin=dict(l=70, r=10, t=10, b=40), shapes=shapes, hovermode="closest",
                      xaxis=dict(title=dict(text=ticks.title), tickmode="array",
                                 tickvals=[v / 1e3 for v in ticks.values_ns], ticktext=ticks.labels),
                      legend=dict(orientation="h"),
                      yaxis=dict(title=dict(text="address (bytes per partition)"), tickformat="#x"))
    return fig.to_dict()
