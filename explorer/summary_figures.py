"""The real Summary's remaining charts: NKI Engine Statistics, DMA Utilization and Collective Operations Duration
(scatter and box), drawn from ``explorer.data.insights`` (``traces.q_insights``); every axis is labelled.

>>> [(t.name, list(t.y)) for t in nki_figure([{"engine": "tensor", "source": "compiler", "opcode": "MATMUL",
...                                             "instructions": 4}]).data]
[('nki', [0]), ('compiler', [4])]
"""
from __future__ import annotations

import plotly.graph_objects as go

from traces.vocab import ENGINE_LABELS

_SOURCE_COLOR = {"nki": "#59a14f", "compiler": "#4e79a7"}


def nki_figure(stats: list[dict]) -> go.Figure:
    """Stacked bars per engine of NKI and compiler instructions; hover: their opcodes."""
    engines = list(dict.fromkeys(r["engine"] for r in stats))
    fig = go.Figure()
    for source in ("nki", "compiler"):
        counts, hover = [], []
        for e in engines:
            rows = [r for r in stats if r["engine"] == e and r["source"] == source]
            counts.append(sum(r["instructions"] for r in rows))
            hover.append("<br>".join(f"{r['opcode']}: {r['instructions']}" for r in rows[:12]) or "none")
        fig.add_bar(name=source, x=[ENGINE_LABELS.get(e, e) for e in engines], y=counts, customdata=hover,
                    marker_color=_SOURCE_COLOR[source],
                    hovertemplate="%{x} · " + source + ": %{y} instructions<br>%{customdata}<extra></extra>")
    fig.update_layout(barmode="stack", height=230, margin=dict(l=4, r=4, t=24, b=30),
                      legend=dict(orientation="h", y=1.15),
                      xaxis=dict(title="engine"), yaxis=dict(title="instructions"))
    return fig


def dma_figure(rows: list[dict]) -> go.Figure:
    """Per DMA queue (``qSyncIO0(nc0)``): bandwidth % solid, active time beyond it striped (the real chart)."""
    labels = [f"{r['queue']}(nc{r['core']})" for r in rows]
    bw = [min(r["bandwidth_percent"] or 0.0, 100.0) for r in rows]
    beyond = [max((r["active_percent"] or 0.0) - b, 0.0) for r, b in zip(rows, bw)]
    fig = go.Figure()
    fig.add_bar(name="bandwidth", x=labels, y=bw, marker_color="#4e79a7",
                customdata=[[r["transfer_bytes"], r["source_type"]] for r in rows],
                hovertemplate="%{x}: %{y:.2f}% of its bandwidth · %{customdata[0]} bytes · %{customdata[1]}"
                              "<extra></extra>")
    fig.add_bar(name="active, below bandwidth", x=labels, y=beyond, marker=dict(color="#a0cbe8", pattern_shape="/"),
                hovertemplate="%{x}: active %{y:.2f}% more of the time than its bytes need<extra></extra>")
    fig.update_layout(barmode="stack", height=260, margin=dict(l=4, r=4, t=24, b=30),
                      legend=dict(orientation="h", y=1.15),
                      xaxis=dict(title="DMA queue"),
                      yaxis=dict(title="% of the core's device time", rangemode="tozero"))
    return fig


def collective_figures(ops: list[dict], t0: int) -> tuple[go.Figure, go.Figure]:
    """Each collective's duration over time per operation (outliers red) and the box plot per operation."""
    scatter, box = go.Figure(), go.Figure()
    for name in dict.fromkeys(r["operation"] for r in ops):
        mine = [r for r in ops if r["operation"] == name]
        scatter.add_scatter(
            name=name, mode="markers", x=[(r["start_ts"] - t0) / 1e3 for r in mine],
            y=[r["duration_ns"] / 1e3 for r in mine],
            marker=dict(color=["#e15759" if r["outlier"] else "#4e79a7" for r in mine], size=7),
            customdata=[[r["algorithm"], r["input_size"], r["group_median_ns"] / 1e3] for r in mine],
            hovertemplate=name + " (%{customdata[0]}) %{customdata[1]} bytes: %{y:.2f} µs, group median "
                                 "%{customdata[2]:.2f} µs<extra></extra>")
        box.add_box(name=name, y=[r["duration_ns"] / 1e3 for r in mine], boxmean=True)
    scatter.update_layout(height=260, margin=dict(l=4, r=4, t=4, b=30), showlegend=True,
                          xaxis=dict(title="start (µs since the profile's start)"), yaxis=dict(title="duration (µs)"))
    box.update_layout(height=260, margin=dict(l=4, r=4, t=4, b=30), showlegend=False,
                      xaxis=dict(title="operation"), yaxis=dict(title="duration (µs)"))
    return scatter, box
