"""Ranked recommendations for the Summary page: each rule is data (id, title, threshold, check).

A check reads the profile through :mod:`explorer.data` and returns findings; a finding says what is
wrong in words, how much time it costs (``impact_ns``, used for ranking) and where the evidence is
(a page and its query: the Summary links to it). Thresholds follow the real Neuron Explorer's
Summary rules where one exists (reference §3.6: spill reload > 25% of HBM reads).

>>> [r.id for r in RULES][:3]
['host_starved', 'recompile_storm', 'cpu_fallback']
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from explorer import data
from traces.q_insights import OUTLIER_FACTOR
from traces.vocab import DEVICE_ENGINES


@dataclass
class Finding:
    rule: str
    title: str
    words: str
    impact_ns: float
    page: str                       # "timeline", "recompiles", ...
    query: dict = field(default_factory=dict)   # URL query of the evidence (profile added by the page)


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    threshold: float
    check: Callable[[data.Loaded, "Rule"], list[Finding]]
    real: str = ""          # the real Neuron Explorer's rule and threshold this one follows ("" = ours only)


def _ms(ns: float) -> str:
    return f"{ns / 1e9:.3g} s" if ns >= 1e9 else f"{ns / 1e6:.3g} ms" if ns >= 1e6 else f"{ns / 1e3:.3g} µs"


def host_starved(L, rule) -> list[Finding]:
    """Device busy less than ``threshold`` of the time between the first and last execution."""
    s = data.summary(L)
    if not s["span_ns"] or s["device_busy_percent"] >= rule.threshold:
        return []
    gap = L.profile.idle_gap()
    query = {}
    if gap:
        t0 = data.bounds(L)["t0"]
        a, b = gap["prev_end"] - t0, gap["start_ns"] - t0
        pad = max((b - a) // 10, 1)
        query = {"start": max(a - pad, 0), "end": b + pad}
    host = L.profile.compiles_between()
    # the idle time not already a finding of its own (CPU fallbacks, compiles): ranked by what is left
    idle = max(s["span_ns"] * max(s["cores"], 1) - s["device_ns"] - s["cpu_fallback_ns"] - host["compile_ns"], 0)
    # Name what filled the idle time, so the fix is obvious: compiles and fallbacks first.
    parts = []
    if host["compiles"]:
        parts.append(f"{host['compiles']} compile{'s' if host['compiles'] != 1 else ''} took {_ms(host['compile_ns'])}")
    if s["cpu_fallback_ns"]:
        parts.append(f"CPU fallbacks took {_ms(s['cpu_fallback_ns'])}")
    longest = f" (longest gap {_ms(gap['start_ns'] - gap['prev_end'])})" if gap else ""
    rest = ("host Python and data preparation between steps: overlap it with DataLoader workers, or batch more "
            "work per call.")
    filled = (" In that time " + " and ".join(parts) + " — fix those first (see the other findings); the rest is "
              + rest) if parts else " The idle time is " + rest
    return [Finding(rule.id, rule.title,
                    f"The NeuronCores were busy only {s['device_busy_percent']:.1f}% of the {_ms(s['span_ns'])} "
                    f"between the first and last execution{longest}.{filled}", idle, "timeline", query)]


def recompile_storm(L, rule) -> list[Finding]:
    """At least ``threshold`` recompiles: how many compiles, for which input dimension, and the buckets that fix it.

    Words like: "5 compiles for 'ids' dim 1 = 5–20: pad to [8, 16, 32] to compile 3 graphs with 51%
    padding waste (saves 2 compiles, ~103 ms). 4 recompiles spent 197 ms; e.g. tensor 'ids' dim 1: 5 -> 9."
    """
    r = data.recompiles(L)
    n = len(r["recompiles"])
    if n < rule.threshold:
        return []
    cost = sum(e["compile_wall_ns"] for e in r["recompiles"])
    reasons = [e["reason"] for e in r["recompiles"] if e["reason"]]
    words = ""
    for s in r["suggestions"][:1]:
        what = ", ".join(f"'{x}'" for x in s["input_names"])   # as the user named them (data.recompiles)
        lo, hi = min(s["values"]), max(s["values"])
        words = (f"{s['compiles_before']} compiles for {what} dim {s['dim']} = {lo}–{hi}: pad to {s['buckets']} "
                 f"to compile {s['compiles_after']} graphs with {s['padding_percent']:.0f}% padding waste "
                 f"(saves {s['compiles_saved']} compiles, ~{_ms(s['compile_ns_saved'])}). ")
    before = sum(e["before_window"] for e in r["recompiles"])   # the program's, even if the capture began later
    words += f"{n} recompiles spent {_ms(cost)} compiling new graphs"
    words += f" ({before} of them before this window)" if before else ""
    words += f"; e.g. {reasons[0]}." if reasons else "."
    if not r["suggestions"]:
        words += " No input dimension varied: the guards changed (see the reasons); keep them stable."
    return [Finding(rule.id, rule.title, words, cost, "recompiles")]


#: How to bring an op back to the device, by ATen op (prefix match): the fix a porting engineer applies.
FALLBACK_FIXES: tuple[tuple[str, str], ...] = (
    ("aten.sort", "a top-k with fixed k (torch.topk(x, k)) lowers to the device"),
    ("aten.argsort", "a top-k with fixed k (torch.topk(x, k).indices) lowers to the device"),
    ("aten.index.Tensor", "a boolean-mask selection x[mask] has a data-dependent shape: keep it static with "
                          "torch.where(mask, x, 0) and a masked sum/count"),
    ("aten.masked_select", "masked_select has a data-dependent shape: keep it static with torch.where(mask, x, 0) "
                           "and a masked sum/count"),
    ("aten.nonzero", "nonzero has a data-dependent shape: use the mask itself (torch.where, a masked sum) or a "
                     "fixed-size torch.topk over it"),
    ("aten._unique", "unique has a data-dependent size: use torch.bincount(x, minlength=N) or a one-hot with a "
                     "fixed N"),
)
#: When no op-specific fix applies, the fix by the compiler's fallback reason (substring match).
REASON_FIXES: tuple[tuple[str, str], ...] = (
    ("data-dependent size", "shape arithmetic on a data-dependent size: it goes away with the op that made the size"),
    ("shape assertion", "a shape check of a data-dependent size: it goes away with the op that made the size"),
    ("consumes a data-dependent shape", "its input has a data-dependent shape: it returns to the device once the "
                                        "op upstream keeps shapes static"),
    ("ops_to_partition", "forced to the host by partitioner_config.ops_to_partition: drop it from that set"),
)
DEFAULT_FIX = "no device lowering: rewrite it with supported ops (neuron-cc list-operators) or move it outside " \
              "the compiled region"


def fallback_fix(op: str, reason: str) -> str:
    """The fix for one CPU-fallback op, in words.

    >>> fallback_fix("aten.sort.default", "forced")
    'a top-k with fixed k (torch.topk(x, k)) lowers to the device'
    """
    for prefix, fix in FALLBACK_FIXES:
        if op.startswith(prefix):
            return fix
    for needle, fix in REASON_FIXES:
        if needle in (reason or ""):
            return fix
    return DEFAULT_FIX


def cpu_fallback(L, rule) -> list[Finding]:
    """Every op that ran on the CPU: one finding with the total cost, then per call site the op and its fix.

    Words like: "9 ops fall back to the CPU at 3 source lines, costing 305 µs of host time (92% of step
    time) plus host↔device transfers: aten.sort.default at models.py:139 (112 µs) — a top-k with fixed k
    (torch.topk(x, k)) lowers to the device; …" (call sites in source order; the link opens the costliest).
    """
    rows = data.fallbacks(L)
    if len(rows) <= rule.threshold:
        return []
    sites: dict[str, dict] = {}
    for f in rows:
        ns = f["host_ns"]   # host time (traces.Profile.fallbacks): never device time
        site = sites.setdefault(f["where"], {"ns": 0, "ops": [], "source_id": f["source_id"]})
        site["ns"] += ns
        site["ops"].append((ns, f["op"], f["reason"]))
    # the host time is the Summary's figure (Profile.figures: the CPU islands' whole host time, their
    # glue included), so this finding, the Summary and neuron-top cite one number; the sites split it
    f = data.summary(L)["figures"]
    total = f.fallback_host_ns or sum(s["ns"] for s in sites.values())
    # Call sites in source order, read like the code (host times are measured and noisy); the link
    # goes to the costliest one.
    ordered = sorted(sites.items(), key=lambda kv: _site_order(kv[0]))
    costliest = max(sites.values(), key=lambda site: site["ns"])
    step = f.step_ns if f.fallback_host_ns else _step_ns(L, total)
    share = f" ({100.0 * total / step:.0f}% of step time)" if step else ""
    n_ops = len(rows)
    words = (f"{n_ops} op{'s' if n_ops != 1 else ''} fall{'s' if n_ops == 1 else ''} back to the CPU at "
             f"{len(sites)} source line{'s' if len(sites) != 1 else ''}, costing {_ms(total)} of host time{share} "
             f"plus host↔device transfers: ")
    parts = []
    for where, site in ordered:
        ops = site["ops"]
        # Name the op the user wrote (one with its own fix, else an ATen op) rather than the shape
        # arithmetic it caused; cost decides only between equals.
        lead = max(ops, key=lambda o: (any(o[1].startswith(p) for p, _ in FALLBACK_FIXES),
                                       o[1].startswith("aten."), o[0]))
        more = f", +{len(ops) - 1} more there" if len(ops) > 1 else ""
        at = f" at {where}" if where else ""
        parts.append(f"{lead[1]}{at} ({_ms(site['ns'])}{more}) — {fallback_fix(lead[1], lead[2])}")
    words += "; ".join(parts) + "."
    query = {"line": costliest["source_id"]} if costliest["source_id"] is not None else {}
    return [Finding(rule.id, rule.title, words, total, "source" if query else "fallbacks", query)]


def _site_order(where: str) -> tuple:
    """``models.py:139`` sorts by file, then line number; an unknown site goes last."""
    file, _, line = where.rpartition(":")
    return (not where, file, int(line) if line.isdigit() else 0)


def _step_ns(L, fallback_ns: float) -> float:
    """Time of the measured executions: their device time plus the CPU fallbacks' host time, once."""
    return data.summary(L)["device_ns"] + fallback_ns   # the figure's step_ns, with this finding's host time


MAX_LAYERS = 3


def _layers(L) -> list[dict]:
    """Per layer: device engine time, DMA and collectives as the union of the layer's intervals
    (``Profile.layer_engine_time``), so no layer's figure exceeds the profile's total."""
    return L.cached("layer_engine_time", lambda: data.rows(L.profile.layer_engine_time()))


def dma_bound(L, rule) -> list[Finding]:
    """Layers (module paths) whose bandwidth-bound DMA time exceeds ``threshold`` × their compute-engine
    time, ranked by that excess (what fewer bytes could save). Latency-bound transfers, whose fixed
    trigger and descriptor costs outweigh their bytes (``Profile.layer_engine_time``'s
    ``dma_bandwidth_ns``), never make a layer DMA-bound: moving fewer bytes would not shorten them.

    Collectives are neither DMA nor compute here: they have their own rule (``collective_bound``).
    """
    per_layer: dict[str, dict] = {}
    for r in _layers(L):
        layer = r["module_path"] or "(top level)"
        where = f"{r['file'].rsplit('/', 1)[-1]}:{r['line']}" if r.get("file") else ""
        compute = sum(r[f"{e}_ns"] or 0 for e in DEVICE_ENGINES if e not in ("dma", "cc"))
        per_layer[layer] = {"dma": r["dma_ns"] or 0, "bw": r["dma_bandwidth_ns"] or 0, "compute": compute,
                            "where": where, "n": r["dma_transfers"], "lat": r["dma_latency_bound_transfers"],
                            "bytes": r["dma_bytes"]}
    out = []
    total = sum(d["dma"] + d["compute"] for d in per_layer.values()) or 1
    # the few costliest layers only: a list of every layer is noise, not a recommendation
    per_layer = dict(sorted(per_layer.items(), key=lambda kv: -(kv[1]["bw"] - kv[1]["compute"]))[:MAX_LAYERS])
    for layer, d in per_layer.items():
        if d["bw"] > rule.threshold * d["compute"] and (d["bw"] + d["compute"]) > 0.05 * total:
            share = 100.0 * d["bw"] / (d["dma"] + d["compute"])
            sel = {"sel": f"module:{layer}"} if layer != "(top level)" else {}
            top = layer == "(top level)"
            who = "The model's top-level ops" if top else f"Layer {layer}"
            at = f" ({d['where']})" if d["where"] else ""
            lat = f"; {d['lat']} of its {d['n']} transfers are latency-bound and not counted" if d["lat"] else ""
            out.append(Finding(rule.id, rule.title,
                               f"{who}{at} {'are' if top else 'is'} DMA-bound: {share:.0f}% of "
                               f"{'their' if top else 'its'} instruction time is bandwidth-bound "
                               f"data movement ({_ms(d['bw'])} of DMA moving {d['bytes'] / 1e6:.3g} MB against "
                               f"{_ms(d['compute'])} of compute{lat}). Keep weights resident, fuse neighbouring "
                               f"ops or enlarge tiles so each transfer feeds more compute.",
                               d["bw"] - d["compute"], "timeline", sel))
    return out


def collective_bound(L, rule) -> list[Finding]:
    """Collectives (the CC engine's all-reduce/all-gather) take at least ``threshold`` % of device time.

    Words like: "Collectives took 20.9 µs, 31.6% of the 66.3 µs of device time (16 collective
    instructions on 2 cores): ..."; the figures are ``Profile.figures()``'s ``collective_ns`` and
    ``device_ns``, the same the Summary shows.
    """
    s = data.summary(L)
    f = s["figures"]
    if not f.collective_ns or not f.device_ns:
        return []
    share = 100.0 * f.collective_ns / f.device_ns
    if share < rule.threshold:
        return []
    cores = f" on {f.cores} cores" if f.cores > 1 else ""
    return [Finding(rule.id, rule.title,
                    f"Collectives took {_ms(f.collective_ns)}, {share:.1f}% of the {_ms(f.device_ns)} of "
                    f"device time{cores}: the cores wait on the ring instead of computing. Overlap them with "
                    f"compute (more micro-batches: one half's all-reduce runs beside the other's compute), "
                    f"shard so fewer activations cross cores (one all-reduce per block half, sequence "
                    f"parallelism), or use a lower tensor-parallel degree for a model this small.",
                    f.collective_ns, "timeline", {})]


def spills(L, rule) -> list[Finding]:
    """Spill reload bytes above ``threshold`` of HBM reads (the real rule), costed by the spill queues' DMA time."""
    s = data.summary(L)
    reload, hbm = s["spill_reload_bytes"], s["hbm_read_bytes"]
    if not reload or not hbm or reload <= rule.threshold * hbm:
        return []
    row = L.profile.spill_traffic()
    return [Finding(rule.id, rule.title,
                    f"Spill reloads read {reload / 1e6:.3g} MB back into SBUF ({100.0 * reload / hbm:.0f}% of HBM "
                    f"reads; {s['spill_save_bytes'] / 1e6:.3g} MB saved): the working set does not fit in SBUF. "
                    f"Smaller tiles or a lower batch per core keep it resident (Memory Viewer: spill column).",
                    row["ns"], "memory", {})]


def _tensor_flops(L) -> tuple[dict, float]:
    s = data.summary(L)
    return s["flops_breakdown"], s["device_ns"]


def model_vs_active_flops(L, rule) -> list[Finding]:
    """Model FLOPs under ``threshold`` % of the FLOPs the Tensor Engine could do while active (the real rule)."""
    fb, device_ns = _tensor_flops(L)
    active = 100.0 - fb.get("idle", 100.0)
    if active < 1.0 or 100.0 * fb.get("model_flops", 0.0) / active >= rule.threshold:
        return []
    share = 100.0 * fb["model_flops"] / active
    return [Finding(rule.id, rule.title,
                    f"While the Tensor Engine is active ({active:.1f}% of device time) its model FLOPs reach only "
                    f"{share:.0f}% of its peak: it is busy but not doing useful matrix work (small or partial "
                    f"tiles, transposes, pipeline bubbles). Use whole 128×128 tiles and keep matmuls pipelined.",
                    device_ns * (active - fb["model_flops"]) / 100.0, "hierarchy", {})]


def transpose_flops(L, rule) -> list[Finding]:
    """Transpose FLOPs above ``threshold`` of the Tensor Engine's hardware FLOPs (the real rule)."""
    s = data.summary(L)
    hw, tr = s["hardware_flops"], s["transpose_flops"]
    if not hw or tr <= rule.threshold * hw:
        return []
    return [Finding(rule.id, rule.title,
                    f"Transposes are {100.0 * tr / hw:.0f}% of the Tensor Engine's FLOPs ({tr / 1e9:.3g} GFLOP): "
                    f"data is moved through the PE array to change layout. Lay tensors out as their matmuls "
                    f"read them (the contraction dim on partitions) to drop the transposes.",
                    s["device_ns"] * s["flops_breakdown"].get("transpose_flops", 0.0) / 100.0, "hierarchy", {})]


def fp32_matmul(L, rule) -> list[Finding]:
    """Matmuls left in FP32 (``--auto-cast none``) run at a quarter of the BF16 rate."""
    md = data.metadata(L)
    if md.get("auto_cast", "") not in ("none",):
        return []
    tensor = sum(t["engines"].get("tensor", 0) for t in data.op_totals(L).values())
    if tensor < rule.threshold * max(data.summary(L)["device_ns"], 1):
        return []
    return [Finding(rule.id, rule.title,
                    f"Matmuls run in FP32 (compiled with --auto-cast none): the Tensor Engine spends "
                    f"{_ms(tensor)} where BF16 would take about a quarter. Compile with "
                    f"--auto-cast matmult --auto-cast-type bf16 if the accuracy allows.",
                    0.75 * tensor, "hierarchy", {})]


def nki_coverage(L, rule) -> list[Finding]:
    """NKI instruction coverage under ``threshold`` % on the tensor, vector or scalar engine (the real rule).
    Costed by nothing: NKI is an option, not a defect, so this ranks after every finding that costs time. Unlike the
    real rule it fires only on a profile that runs an NKI kernel: a model without one is not told on every run."""
    coverage = data.insights(L)["nki_coverage"]
    low = {e: c for e, c in coverage.items() if c["nki_percent"] < rule.threshold}
    if not low or not any(c["nki"] for c in coverage.values()):
        return []
    parts = ", ".join(f"{e} {c['nki_percent']:.0f}% ({c['nki']} of {c['nki'] + c['compiler']})"
                      for e, c in low.items())
    return [Finding(rule.id, rule.title,
                    f"NKI instruction coverage is under {rule.threshold:.0f}% on {parts}: compiler-generated "
                    f"instructions dominate. Write NKI kernels for the operations that cost the most here "
                    f"(Operators page) and call them from the model (docs/nki.md).", 0.0, "operators", {})]


def throttling(L, rule) -> list[Finding]:
    """Active FLOPs lost to the Tensor Engine's throttle ramp above ``threshold`` % of the peak (the real
    "Active FLOPS throttling detected"; it publishes no number, ours counts any measurable loss)."""
    t = data.insights(L)["throttling"]
    if t["active_throttled_percent"] <= rule.threshold:
        return []
    return [Finding(rule.id, rule.title,
                    f"The Tensor Engine ran throttled while computing: {t['throttle_events']} ramps from 50% after "
                    f"idle gaps cost {_ms(t['throttled_active_ns'])}, {t['active_throttled_percent']:.1f}% of the "
                    f"peak FLOPs (average utilisation limit {t['average_utilization_limit_percent']:.0f}%). Keep it "
                    f"busy: overlap DMA with compute so it does not idle past the ramp window between matmuls.",
                    t["throttled_active_ns"], "timeline", {})]


def collective_outliers(L, rule) -> list[Finding]:
    """Collectives longer than ``threshold`` × the median of their (operation, size) group (the real rule names
    no number: ours, ``traces.q_insights.OUTLIER_FACTOR``)."""
    out = [c for c in data.insights(L)["collectives"] if c["outlier"]]
    if not out:
        return []
    worst = max(out, key=lambda c: c["duration_ns"] / max(c["group_median_ns"], 1))
    excess = sum(c["duration_ns"] - c["group_median_ns"] for c in out)
    return [Finding(rule.id, rule.title,
                    f"{len(out)} collective operation(s) took over {rule.threshold:g}× their group's median: the "
                    f"worst, a {worst['operation']} of {worst['input_size']} bytes, took "
                    f"{_ms(worst['duration_ns'])} against a median of {_ms(worst['group_median_ns'])}. Check what "
                    f"overlaps it on the timeline (a straggling rank, DMA or compute contending for the ring).",
                    float(excess), "timeline", {})]


RULES: tuple[Rule, ...] = (
    Rule("host_starved", "Device starved by host work", 50.0, host_starved),
    Rule("recompile_storm", "Recompile storm", 2, recompile_storm),
    Rule("cpu_fallback", "CPU fallback", 0, cpu_fallback),   # fires on more than `threshold` ops
    Rule("dma_bound", "DMA-bound layer", 1.0, dma_bound),
    Rule("collective_bound", "Collective-bound", 15.0, collective_bound),   # % of device time
    Rule("spills", "SBUF spills", 0.25, spills, real="Spill reload bytes > 25% of total HBM reads"),
    Rule("fp32_matmul", "FP32 matmuls", 0.10, fp32_matmul),
    Rule("model_vs_active_flops", "Tensor Engine active but not computing", 50.0, model_vs_active_flops,
         real="Low Model FLOPS relative to Active FLOPS (< 50%)"),
    Rule("transpose_flops", "Transposes on the Tensor Engine", 0.10, transpose_flops,
         real="Transpose FLOPS > 10% of total hardware FLOPS"),
    Rule("throttling", "Active FLOPs throttling", 0.0, throttling, real="Active FLOPS throttling detected"),
    Rule("collective_outliers", "Collective operation outliers", OUTLIER_FACTOR, collective_outliers,
         real="Collective operation outliers detected"),
    Rule("nki_coverage", "Low NKI instruction coverage", 50.0, nki_coverage,
         real="NKI instruction coverage < 50% on tensor, vector, or scalar engine"),
)
"""Every rule, with the threshold it applies; add a rule by appending here."""


def recommendations(L: data.Loaded) -> list[Finding]:
    """All findings of all rules, costliest first. Example: ``recommendations(data.resolve("mlp"))``."""
    found = [f for rule in RULES for f in rule.check(L, rule)]
    return sorted(found, key=lambda f: -f.impact_ns)


# ------------------------------------------------------------------------------ command line
def register(subparsers) -> None:
    """Add ``neuron-explorer recommend PROFILE [--json] [--ai-recommendation]``: the Summary page's findings in a
    terminal, and (opt-in) the model's answer from Amazon Bedrock (:mod:`explorer.ai_recommend`)."""
    p = subparsers.add_parser("recommend", help="print the Summary's ranked recommendations",
                              description="Run every recommendation rule over a profile and print the findings, "
                                          "costliest first, each with the Explorer page that shows its evidence.")
    p.add_argument("profile", metavar="PROFILE", help="profile.duckdb or its session directory")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    ai = p.add_argument_group("AI recommendation (opt-in: sends the Summary to Amazon Bedrock, billed to your "
                              "AWS account; nothing is sent without --ai-recommendation)")
    ai.add_argument("--ai-recommendation", action="store_true",
                    help="also ask Claude Sonnet 4.5 on Amazon Bedrock (the real tool's recommend), with your "
                         "default AWS credentials (AWS_PROFILE honoured)")
    ai.add_argument("--ai-model", metavar="ID", help="Bedrock model id (default: Claude Sonnet 4.5, US profile)")
    ai.add_argument("--ai-region", metavar="REGION", help="US Region to call (default: your AWS config's, "
                                                          "else us-east-1)")
    ai.add_argument("--nki-source-root", metavar="DIR",
                    help="read the source files the profile names from DIR (as the real flag) instead of the text "
                         "the profile embeds: the prompt quotes the code around the hottest lines")
    ai.add_argument("--print-prompt", action="store_true",
                    help="print the text --ai-recommendation would send, then exit (nothing is contacted)")
    p.set_defaults(func=_recommend_cli)


def _recommend_cli(args) -> int:
    """Example: ``neuron-explorer recommend output/20260101-120000_fallback``."""
    import json
    from urllib.parse import urlencode

    from explorer import ai_recommend
    from explorer.view import resolve_profile

    # a bad model or region is one line before the profile is even opened
    cfg = ai_recommend.settings(args.ai_model, args.ai_region) if args.ai_recommendation else {}
    if args.nki_source_root:
        from explorer import sources

        sources.set_root(args.nki_source_root, "--nki-source-root")
    registry = data.Registry([resolve_profile(args.profile)])
    key = registry.keys()[0]
    answer = None
    try:
        L = registry.get(key)
        found = recommendations(L)
        if args.print_prompt:
            print(ai_recommend.prompt(L, found))
            return 0
        if args.ai_recommendation:
            answer = ai_recommend.recommend_ai(L, found, **cfg)
    finally:
        registry.close()
    pages = {"timeline": "/timeline", "recompiles": "/recompiles", "fallbacks": "/fallbacks",
             "source": "/source", "hierarchy": "/hierarchy", "memory": "/memory"}
    rows = [{"rule": f.rule, "title": f.title, "impact_ns": int(f.impact_ns), "words": f.words,
             "evidence": pages.get(f.page, "/") + "?" + urlencode({"profile": key, **f.query})} for f in found]
    if args.json:
        out = {"profile": key, "recommendations": rows}
        if answer is not None:
            out["ai_recommendation"] = vars(answer)
        print(json.dumps(out, indent=2))
        return _ai_status(answer)
    import textwrap

    print(f"{key}: recommendations, costliest first (simulated profile)")
    for i, r in enumerate(rows, start=1):
        print(f"\n{i}. {r['title']} (~{_ms(r['impact_ns'])})")
        print(textwrap.fill(r["words"], width=100, initial_indent="   ", subsequent_indent="   "))
        print(f"   evidence: neuron-explorer view, then {r['evidence']}")
    if not rows:
        print("No issues found by the rules.")
    if answer is not None and answer.text:
        print(f"\nAI recommendation ({ai_recommend.label(answer)})\n")
        print(answer.text)
    return _ai_status(answer)


def _ai_status(answer) -> int:
    """Exit status: 1, and the one line on stderr, when the AI recommendation was asked for and failed."""
    if answer is None or not answer.error:
        return 0
    import sys

    print(f"neuron-explorer: error: AI recommendation: {answer.error}", file=sys.stderr)
    return 1
