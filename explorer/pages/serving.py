"""Serving: an LLM serving session (``neuron_stack.inference``): per-request waterfalls (queue → prefill
→ decode), TTFT and TPOT distributions, bucket use per sub-model, and the running batch over time.
Every figure comes from the ``traces`` query layer (``Profile.serving_*``); times are projected."""

from __future__ import annotations

import plotly.graph_objects as go
from dash import dcc, html

from explorer import data, ui
from explorer.figures import fmt_ns

PHASES = (("queue", "#bab0ac"), ("prefill", "#4e79a7"), ("decode", "#59a14f"))
MAX_WATERFALL = 200  # requests drawn; the table below lists up to ui.table's limit


def _serving(L):
    def compute():
        p = L.profile
        return {
            "summary": p.serving_summary(),
            "requests": data.rows(p.serving_requests()),
            "steps": data.rows(p.serving_steps()),
            "buckets": data.rows(p.serving_buckets()),
            "request_time": p.serving_request_time(),
        }

    return L.cached("serving", compute)


def waterfall(requests: list[dict]) -> go.Figure:
    """One row per request: queue, prefill and decode as stacked bars (ms since the first arrival)."""
    reqs = requests[:MAX_WATERFALL]
    t0 = min((r["arrival_ns"] for r in reqs), default=0)
    ids = [r["request_id"] for r in reqs]
    spans = {
        "queue": ("arrival_ns", "scheduled_ns"),
        "prefill": ("scheduled_ns", "first_token_ns"),
        "decode": ("first_token_ns", "finish_ns"),
    }
    fig = go.Figure()
    for phase, color in PHASES:
        a, b = spans[phase]
        fig.add_bar(
            y=ids,
            x=[(r[b] - r[a]) / 1e6 for r in reqs],
            base=[(r[a] - t0) / 1e6 for r in reqs],
            orientation="h",
            name=phase,
            marker_color=color,
            customdata=[[r["slot"], r["prompt_tokens"], r["output_tokens"], r["cte_bucket"]] for r in reqs],
            hovertemplate="%{y} " + phase + ": %{x:.3f} ms<br>slot %{customdata[0]}, prompt "
            "%{customdata[1]} tokens (bucket %{customdata[3]}), %{customdata[2]} out"
            "<extra></extra>",
        )
    fig.update_layout(
        barmode="overlay",
        height=max(220, 18 * len(reqs) + 80),
        margin=dict(l=10, r=10, t=10, b=30),
        xaxis_title="ms since the first request arrived (projected clock)",
        yaxis=dict(autorange="reversed", showticklabels=len(reqs) <= 40),
        legend_orientation="h",
    )
    return fig


def distribution(values_ms: list[float], label: str) -> go.Figure:
    fig = go.Figure(go.Histogram(x=values_ms, nbinsx=30, marker_color="#4e79a7", name=label))
    fig.update_layout(
        height=220, margin=dict(l=10, r=10, t=30, b=30), title=label, xaxis_title="ms", yaxis_title="requests"
    )
    return fig


def batch_over_time(steps: list[dict]) -> go.Figure:
    t0 = min((s["start_ns"] for s in steps), default=0)
    x = [(s["end_ns"] - t0) / 1e6 for s in steps]
    fig = go.Figure()
    fig.add_scatter(
        x=x, y=[s["kv_slots_used"] for s in steps], name="running (KV slots used)", line_shape="hv"
    )
    fig.add_scatter(x=x, y=[s["waiting"] for s in steps], name="waiting", line_shape="hv")
    fig.update_layout(
        height=220,
        margin=dict(l=10, r=10, t=10, b=30),
        xaxis_title="ms (projected clock)",
        legend_orientation="h",
    )
    return fig


def request_stat(r: dict):
    """A phase's device time per step with its request time beside it (never one for the other)."""
    if r["request_ns"] is None:
        sub = "request time not recorded (profile before schema 1.6.0)"
    else:
        sub = f"request {fmt_ns(r['request_ns'])} (+{fmt_ns(r['added_ns'])}: launch, host-link copies)"
    return ui.stat(f"{r['phase']} device time / step", fmt_ns(r["device_ns"]), sub,
                   id=f"serving-{r['phase']}-time")


@ui.guarded
def layout(profile=None, **_):
    key = ui.profile_key(profile)
    s = _serving(data.resolve(key))
    summ, reqs = s["summary"], s["requests"]
    if not summ["requests"]:
        return html.Div(
            [
                html.H2("Serving"),
                html.Div(
                    "No LLM serving in this profile: profile a server or engine with "
                    "`neuron-explorer inspect -- inference_demo serve ...` (or NEURON_RT_INSPECT_ENABLE=1).",
                    className="hint",
                ),
            ]
        )

    def pct(metric):
        return " / ".join(fmt_ns(summ[f"{metric}_p{q}_ns"]) for q in (50, 90, 99))

    stats = html.Div(
        [
            ui.stat(
                "requests", summ["requests"], f"{summ['output_tokens']} output tokens", id="serving-requests"
            ),
            ui.stat("output tokens/s", f"{summ['output_tokens_per_s']:.1f}", "over the serving span"),
            ui.stat("TTFT p50/p90/p99", pct("ttft"), id="serving-ttft"),
            ui.stat("TPOT p50/p90/p99", pct("tpot"), id="serving-tpot"),
            ui.stat("E2E p50/p90/p99", pct("e2e")),
            ui.stat(
                "steps", summ["steps"], f"{summ['prefill_steps']} prefill · {summ['decode_steps']} decode"
            ),
            *(request_stat(r) for r in s["request_time"]),
        ],
        className="stats",
    )
    buckets = ui.table(
        [
            ("sub-model", "phase"),
            ("bucket", "bucket"),
            ("steps", "steps"),
            ("tokens", "tokens"),
            ("device time", lambda b: fmt_ns(b["device_ns"])),
            ("request time", lambda b: fmt_ns(b["request_ns"]) if b["request_ns"] is not None else "—"),
            ("mean rows active", lambda b: f"{b['mean_active']:.2f} of {b['batch_size']}"),
        ],
        s["buckets"],
        id="serving-buckets",
    )
    table = ui.table(
        [
            ("request", "request_id"),
            ("slot", "slot"),
            ("prompt", "prompt_tokens"),
            ("bucket", "cte_bucket"),
            ("output", "output_tokens"),
            ("finish", "finish_reason"),
            ("queue", lambda r: fmt_ns(r["queue_ns"])),
            ("TTFT", lambda r: fmt_ns(r["ttft_ns"])),
            ("TPOT", lambda r: fmt_ns(r["tpot_ns"]) if r["tpot_ns"] is not None else "—"),
            ("E2E", lambda r: fmt_ns(r["e2e_ns"])),
        ],
        reqs,
        id="serving-table",
    )
    ttft = [r["ttft_ns"] / 1e6 for r in reqs]
    tpot = [r["tpot_ns"] / 1e6 for r in reqs if r["tpot_ns"] is not None]
    return html.Div(
        [
            html.H2(f"Serving · {summ['requests']} requests"),
            stats,
            html.Div(
                [
                    html.H3("Requests (queue → prefill → decode)"),
                    dcc.Graph(id="serving-waterfall", figure=waterfall(reqs), config={"displaylogo": False}),
                ],
                className="card",
            ),
            html.Div(
                [
                    dcc.Graph(id="serving-ttft-hist", figure=distribution(ttft, "TTFT")),
                    dcc.Graph(id="serving-tpot-hist", figure=distribution(tpot, "TPOT")),
                ],
                className="card two",
            ),
            html.Div([html.H3("Bucket use"), buckets], className="card"),
            html.Div(
                [html.H3("Running batch"), dcc.Graph(id="serving-batch", figure=batch_over_time(s["steps"]))],
                className="card",
            ),
            html.Div([html.H3("Every request"), table], className="card"),
        ]
    )


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/serving", name="Serving", title="Serving · Neuron Explorer")
