"""Summary: the device profile, total time, engine activity, MFU, HBM traffic, top ops and lines,
fallback and recompile counts, the ranked recommendations with links to their evidence, and the real
Summary's NKI engine statistics, DMA utilisation, throttling and collective charts."""
from __future__ import annotations

from dash import Input, Output, State, callback, dcc, html, no_update

from explorer import ai_recommend, data, recommend, ui
from explorer.figures import engine_bars, fmt_bytes, fmt_ns, share_bars
from explorer.summary_figures import collective_figures, dma_figure, nki_figure

PAGE_FOR = {"timeline": "/timeline", "recompiles": "/recompiles", "fallbacks": "/fallbacks", "source": "/source",
            "hierarchy": "/hierarchy", "memory": "/memory", "operators": "/operators"}


def _profiles_list():
    reg = data.registry()
    if not reg.keys():
        return ui.error_box("no profiles to show.",
                            "Record one with `neuron-explorer inspect -- python script.py`, then run "
                            "`neuron-explorer view output/<session>/profile.duckdb`.")
    return html.Div([html.H2("Profiles"), ui.table(
        [("profile", lambda e: dcc.Link(reg.label(e.key), href=ui.href("/", profile=e.key))),
         ("file", lambda e: e.path.name),
         ("session", lambda e: e.path.parent.name), ("status", lambda e: e.error or "ok")],
        list(reg.entries.values()), id="summary-profiles")], className="card")


@ui.guarded
def layout(profile=None, **_):
    if profile is None and len(data.registry().keys()) != 1:
        return _profiles_list()
    key = ui.profile_key(profile)
    L = data.resolve(key)
    s = data.summary(L)
    recos = recommend.recommendations(L)
    targets = s["targets"]
    several = len(targets) > 1   # a process with several targets: each is its own instance
    stats = html.Div([
        ui.stat("device profile", " + ".join(t["target"] for t in targets) if several else s["device_profile"],
                f"{' + '.join(t['instance_type'] for t in targets) if several else s['instance_type']} · simulated",
                id="summary-target"),
        ui.stat("total time", fmt_ns(s["device_ns"]), f"on-device, {s['executions']} executions "
                                                      f"({s['warmup_executions']} warm-up)", id="summary-total"),
        ui.stat("MFU (estimated)", f"{s['mfu_estimated_percent']:.1f}%", f"{s['model_flops'] / 1e9:.3g} GFLOP",
                id="summary-mfu"),
        ui.stat("HBM traffic", fmt_bytes(s["hbm_read_bytes"] + s["hbm_write_bytes"]),
                f"read {fmt_bytes(s['hbm_read_bytes'])} · write {fmt_bytes(s['hbm_write_bytes'])}"),
        ui.stat("MBU (estimated)", f"{s['mbu_estimated_percent']:.2f}%",
                f"of {fmt_bytes(s['total_bandwidth_available'])} available · useful reads "
                f"{s['useful_read_percent']:.0f}%", id="summary-mbu"),
        ui.stat("device busy", f"{s['device_busy_percent']:.1f}%", "of the time between first and last execution"),
        html.A(ui.stat("CPU fallbacks", f"{s['fallback_ops']} ops", f"{s['fallback_calls']} calls · "
                       f"{fmt_ns(s['cpu_fallback_ns'])}", id="summary-fallbacks"),
               href=ui.href("/fallbacks", profile=key)),
        html.A(ui.stat("recompiles", str(s["recompiles"]),
                       f"{s['graphs']} graphs · {s['compiles']} compiles · {fmt_ns(s['compile_wall_ns'])} compiling"
                       + (f" · {s['before_window']}" if s["before_window"] else ""),
                       id="summary-recompiles"), href=ui.href("/recompiles", profile=key)),
        ui.stat("instructions", f"{s['instructions']:,}", s["timing_model"] and f"timing model: {s['timing_model']}"),
    ], className="stats")
    reco_items = [html.Div([
        html.Span(f"{i}. {f.title}", className="reco-title"),
        html.Span(f"~{fmt_ns(f.impact_ns)}", className="reco-impact"),
        html.Div(f.words),
        dcc.Link("Evidence →", href=ui.href(PAGE_FOR.get(f.page, "/"), profile=key, **f.query),
                 id=f"summary-evidence-{i}"),
    ], className="reco") for i, f in enumerate(recos, start=1)] or [html.Div("No issues found by the rules.",
                                                                             className="hint")]
    top_ops = ui.table([
        ("op", lambda r: dcc.Link(r["op"], href=ui.href("/timeline", profile=key, sel=r["sel"]))),
        ("module", "module"), ("graphs", "graphs"),
        ("source", lambda r: dcc.Link(r["where"], href=ui.href("/source", profile=key, line=r["source_id"]))
                             if r["source_id"] is not None else ""),
        ("device time", lambda r: fmt_ns(r["device_ns"])), ("instructions", "instructions")],
        data.top_ops(L, 10), id="summary-top-ops")
    top_lines = ui.table([
        ("line", lambda r: dcc.Link(r["where"], href=ui.href("/source", profile=key, line=r["source_id"]))),
        ("code", lambda r: html.Code(r["code"].strip()[:70])), ("device time", lambda r: fmt_ns(r["device_ns"])),
        ("instructions", "instructions")], data.top_lines(L, 10), id="summary-top-lines")
    per_target = html.Div([html.H3("Per target (one simulated instance each)"), ui.table([
        ("target", "target"), ("instance", "instance_type"), ("cores", lambda t: ", ".join(map(str, t["cores"]))),
        ("runtime reservation", lambda t: " · ".join(f"core {c}: {fmt_bytes(b)}"
                                                     for c, b in t["runtime_memory_bytes"].items())),
        ("peak BF16", lambda t: f"{t['peak_flops'] / 1e12:.1f} TFLOP/s"),
        ("device time", lambda t: fmt_ns(t["device_ns"])),
        ("MFU (estimated)", lambda t: f"{t['mfu_percent']:.1f}%")], targets, id="summary-targets")],
        className="card")
    verdict = s["capture"]
    capture = html.Div([html.Div([html.Strong(f"{verdict.status}: "), line]) for line in verdict.lines],
                       className="error-box" if verdict.status == "incomplete" else "hint", id="summary-capture",
                       role="alert" if verdict.status == "incomplete" else "status") if verdict.lines else None
    return html.Div([
        html.H2(["Summary · ", data.registry().label(key), html.Span("is_simulation = true", className="sim-badge")]),
        capture, stats, *([per_target] if several else []),
        html.Div([
            html.Div([html.H3("Recommendations (costliest first)"), html.Div(reco_items, id="summary-recommendations"),
                      _ai_block(key)], className="card col"),
            html.Div([html.H3("Engine active time (% of device time)"),
                      dcc.Graph(figure=engine_bars(s["engines"]), config={"displayModeBar": False},
                                id="summary-engines")],
                     className="card col"),
        ], className="row"),
        html.Div([
            html.Div([html.H3("Tensor Engine FLOPs (% of peak over the device time)"),
                      dcc.Graph(figure=share_bars(s["flops_breakdown"]), config={"displayModeBar": False},
                                id="summary-flops")], className="card col"),
            html.Div([html.H3("Memory bandwidth (of total_bandwidth_available)"),
                      dcc.Graph(figure=share_bars(s["bandwidth_breakdown"]), config={"displayModeBar": False},
                                id="summary-bandwidth")], className="card col"),
        ], className="row"),
        *_insight_cards(L),
        html.Div([html.Div([html.H3("Top ops by device time"), top_ops], className="card col"),
                  html.Div([html.H3("Top source lines by device time"), top_lines], className="card col")],
                 className="row"),
    ])


def _graph(fig, id):
    return dcc.Graph(figure=fig, config={"displayModeBar": False}, id=id)


def _insight_cards(L) -> list:
    """The real Summary's NKI Engine Statistics, DMA Utilization, throttling and Collective Operations Duration."""
    ins = data.insights(L)
    if not ins["nki_stats"] and not ins["dma"]:
        return []
    t = ins["throttling"]
    cov = " · ".join(f"{e} {c['nki_percent']:.0f}%" for e, c in ins["nki_coverage"].items())
    throttle = (f"{t['throttle_events']} Tensor Engine ramps · active throttled {t['active_throttled_percent']:.2f}% "
                f"of peak FLOPs ({fmt_ns(t['throttled_active_ns'])}) · average utilisation limit "
                f"{t['average_utilization_limit_percent']:.1f}%" if t["throttle_events"]
                else "no throttling: this target's cost model has no Tensor Engine limiter (trn2 has)")
    cards = [html.Div([
        html.Div([html.H3("NKI engine statistics (instructions)"), html.Div(f"NKI coverage: {cov}", className="hint"),
                  _graph(nki_figure(ins["nki_stats"]), "summary-nki")], className="card col"),
        html.Div([html.H3("DMA utilization (per queue)"), html.Div(throttle, className="hint", id="summary-throttle"),
                  _graph(dma_figure(ins["dma"]), "summary-dma")], className="card col"),
    ], className="row")]
    if ins["collectives"]:
        scatter, box = collective_figures(ins["collectives"], data.bounds(L)["t0"])
        cards.append(html.Div([html.Div([html.H3("Collective operations duration"),
                                         _graph(scatter, "summary-collectives")], className="card col"),
                               html.Div([html.H3("Collective durations per operation"),
                                         _graph(box, "summary-collective-box")], className="card col")],
                              className="row"))
    return cards


#: Answers already paid for, by (profile, model): shown again when the Summary reopens (bounded).
_ANSWERS: dict[tuple[str, str], ai_recommend.Answer] = {}
_MAX_ANSWERS = 64


def _ai_block(key: str) -> html.Div:
    """The model's answer beside the rules: a button when ``view --ai-recommendation`` enabled it, else one hint."""
    cfg = ai_recommend.SETTINGS
    if not cfg.get("enabled"):
        return html.Div(["AI recommendation: off. ", html.Code("neuron-explorer view --ai-recommendation"),
                         " adds a button that sends this Summary to Amazon Bedrock (billed to your AWS account); "
                         "nothing is sent otherwise."], className="hint", id="summary-ai-off")
    cached = _ANSWERS.get((key, cfg["model"]))
    return html.Div([
        html.H3("AI recommendation (Amazon Bedrock)"),
        html.Button("Get AI recommendation", id="summary-ai-button", className="btn",
                    title=f"sends this Summary to {cfg['model']} in {cfg['region']} (up to a minute)"),
        dcc.Store(id="summary-ai-profile", data=key),
        dcc.Loading(html.Div(_ai_answer(cached) if cached else None, id="summary-ai")),
    ], id="summary-ai-card", className="ai-card")


def _ai_answer(a: ai_recommend.Answer) -> html.Div:
    if a.error:
        return html.Div([html.Strong("AI recommendation failed: "), html.Span(a.error),
                         html.Div("The rule-based recommendations above do not depend on it.", className="hint")],
                        className="error-box", role="alert", id="summary-ai-error")
    return html.Div([html.Div(ai_recommend.label(a), className="hint", id="summary-ai-label"),
                     dcc.Markdown(a.text, id="summary-ai-text")], className="ai-answer")


@callback(Output("summary-ai", "children"), Input("summary-ai-button", "n_clicks"), State("summary-ai-profile", "data"),
          running=[(Output("summary-ai-button", "disabled"), True, False)],   # one billed request at a time
          prevent_initial_call=True)
def ask_ai(n_clicks, key):
    """Get AI recommendation: one Bedrock request for the shown profile; a failure is one line."""
    cfg = ai_recommend.SETTINGS
    if not n_clicks or not cfg.get("enabled"):
        return no_update
    try:
        L = data.resolve(key)
    except data.ExplorerError as exc:
        return _ai_answer(ai_recommend.Answer(cfg["model"], cfg["region"], error=str(exc)))
    answer = ai_recommend.recommend_ai(L, recommend.recommendations(L), cfg["model"], cfg["region"],
                                       cfg["max_tokens"])
    if not answer.error and len(_ANSWERS) < _MAX_ANSWERS:
        _ANSWERS[(key, cfg["model"])] = answer
    return _ai_answer(answer)


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/", name="Summary", title="Summary · Neuron Explorer")
