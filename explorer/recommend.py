"""Ranked recommendations for the Summary page: each rule is data (id, title, threshold, check).

A check reads the profile through :mod:`explorer.data` and returns findings; a finding says what is
wrong in words, how much time it costs (``impact_ns``, used for ranking) and where the evidence is
(a page and its query: the Summary links to it). Thresholds follow the real Neuron Explorer's
Summary rules where one exists (reference §3.6: spill reload > 25% of HBM reads).

>>> [r.id for r in RULES][:3]
['host_starved', 'recompile_storm', 'cpu_fallback']
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from explorer import data


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


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3g} ms" if ns >= 1e5 else f"{ns / 1e3:.3g} µs"


def host_starved(L, rule) -> list[Finding]:
    """Device busy less than ``threshold`` of the time between the first and last execution."""
    s = data.summary(L)
    if not s["span_ns"] or s["device_busy_percent"] >= rule.threshold:
        return []
    gap = L.rows("""
        SELECT prev_end, start_ns FROM (
          SELECT start_ns, lag(end_ns) OVER (PARTITION BY core ORDER BY start_ns) AS prev_end FROM executions)
        WHERE prev_end IS NOT NULL ORDER BY start_ns - prev_end DESC LIMIT 1""")
    query = {}
    if gap:
        t0 = data.bounds(L)["t0"]
        a, b = gap[0]["prev_end"] - t0, gap[0]["start_ns"] - t0
        pad = max((b - a) // 10, 1)
        query = {"start": max(a - pad, 0), "end": b + pad}
    idle = s["span_ns"] * max(s["cores"], 1) - s["device_ns"]
    return [Finding(rule.id, rule.title,
                    f"The NeuronCores were busy only {s['device_busy_percent']:.1f}% of the time between the first "
                    f"and last execution: host work (Python, data preparation, CPU fallbacks, compiles) starves "
                    f"the device. The timeline link opens the longest gap.", idle, "timeline", query)]


def recompile_storm(L, rule) -> list[Finding]:
    """At least ``threshold`` recompiles: name the shapes and suggest buckets."""
    r = data.recompiles(L)
    n = len(r["recompiles"])
    if n < rule.threshold:
        return []
    cost = sum(e["compile_wall_ns"] for e in r["recompiles"])
    words = f"{n} recompiles spent {_ms(cost)} compiling new graphs."
    reasons = sorted({e["reason"] for e in r["recompiles"] if e["reason"]})[:3]
    if reasons:
        words += " Reasons: " + "; ".join(reasons) + "."
    for s in r["suggestions"][:1]:
        words += (f" Input '{s['input']}' dim {s['dim']} took {len(s['values'])} values "
                  f"({', '.join(map(str, s['values'][:8]))}); padding it to {s['buckets']} saves "
                  f"{s['compiles_saved']} compiles (~{_ms(s['compile_ns_saved'])}) at "
                  f"{s['padding_percent']:.1f}% padding cost.")
    return [Finding(rule.id, rule.title, words, cost, "recompiles")]


def cpu_fallback(L, rule) -> list[Finding]:
    """Every op that ran on the CPU, grouped by ATen op and call site."""
    groups: dict[tuple, dict] = {}
    for f in data.fallbacks(L):
        g = groups.setdefault((f["op"], f["where"]), {"calls": 0, "host_ns": 0, "reason": f["reason"],
                                                      "source_id": f["source_id"]})
        g["calls"] += f["calls"]
        g["host_ns"] += f["host_ns"]
    out = []
    for (op, where), g in groups.items():
        at = f" at {where}" if where else ""
        query = {"line": g["source_id"]} if g["source_id"] is not None else {}
        out.append(Finding(rule.id, rule.title,
                           f"{op}{at} falls back to the CPU ({g['reason'] or 'no device lowering'}); it ran "
                           f"{g['calls']} times for {_ms(g['host_ns'])} of host time plus transfers. Replace it with "
                           f"a supported op or move it outside the compiled region.",
                           g["host_ns"], "source" if query else "fallbacks", query))
    return out


MAX_LAYERS = 3


def dma_bound(L, rule) -> list[Finding]:
    """Layers (module paths) whose DMA time exceeds ``threshold`` × their compute-engine time."""
    per_layer: dict[str, dict] = {}
    info = data.ops(L)
    for op_id, t in data.op_totals(L).items():
        o = info.get(op_id) or {}
        layer = o.get("module_path") or "(top level)"
        d = per_layer.setdefault(layer, {"dma": 0, "compute": 0, "where": data.where(o)})
        for eng, ns in t["engines"].items():
            d["dma" if eng == "dma" else "compute"] += ns
    out = []
    total = sum(d["dma"] + d["compute"] for d in per_layer.values()) or 1
    # the few costliest layers only: a list of every layer is noise, not a recommendation
    per_layer = dict(sorted(per_layer.items(), key=lambda kv: -(kv[1]["dma"] - kv[1]["compute"]))[:MAX_LAYERS])
    for layer, d in per_layer.items():
        if d["dma"] > rule.threshold * d["compute"] and (d["dma"] + d["compute"]) > 0.05 * total:
            share = 100.0 * d["dma"] / (d["dma"] + d["compute"])
            sel = {"sel": f"module:{layer}"} if layer != "(top level)" else {}
            out.append(Finding(rule.id, rule.title,
                               f"Layer {layer} ({d['where']}) is DMA-bound: {share:.0f}% of its instruction time is "
                               f"data movement. Keep weights resident, fuse neighbouring ops or enlarge tiles "
                               f"so each transfer feeds more compute.", d["dma"] - d["compute"], "timeline", sel))
    return out


def spills(L, rule) -> list[Finding]:
    """Spill/reload traffic (DMA queues named ``*Spill*``) above ``threshold`` of HBM reads."""
    row = L.rows("""SELECT coalesce(sum(bytes_read + bytes_written), 0) AS bytes, coalesce(sum(dur_ns), 0) AS ns
                    FROM instructions WHERE engine = 'dma' AND queue ILIKE '%spill%'""")[0]
    hbm = data.summary(L)["hbm_read_bytes"]
    if not row["bytes"] or not hbm or row["bytes"] < rule.threshold * hbm:
        return []
    return [Finding(rule.id, rule.title,
                    f"Spills move {row['bytes'] / 1e6:.3g} MB ({100.0 * row['bytes'] / hbm:.0f}% of HBM reads) "
                    f"between SBUF and HBM, costing {_ms(row['ns'])} of DMA time: the working set does not fit "
                    f"in SBUF. Smaller tiles or a lower batch per core keep it resident.", row["ns"], "timeline", {})]


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


RULES: tuple[Rule, ...] = (
    Rule("host_starved", "Device starved by host work", 50.0, host_starved),
    Rule("recompile_storm", "Recompile storm", 2, recompile_storm),
    Rule("cpu_fallback", "CPU fallback", 0, cpu_fallback),
    Rule("dma_bound", "DMA-bound layer", 1.0, dma_bound),
    Rule("spills", "SBUF spills", 0.25, spills),
    Rule("fp32_matmul", "FP32 matmuls", 0.10, fp32_matmul),
)
"""Every rule, with the threshold it applies; add a rule by appending here."""


def recommendations(L: data.Loaded) -> list[Finding]:
    """All findings of all rules, costliest first. Example: ``recommendations(data.resolve("mlp"))``."""
    found = [f for rule in RULES for f in rule.check(L, rule)]
    return sorted(found, key=lambda f: -f.impact_ns)
