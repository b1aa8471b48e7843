"""Issue 15: every number agrees everywhere, on profiles recorded from the sample workloads.

Each sample (``fallback``, ``dynamic_shapes``, ``tensor_parallel``, ``train_mlp`` and one process with a
trn1 and an inf2 session) is recorded once per session, all at the same time, as a user records them
(``NEURON_RT_INSPECT_ENABLE=1``). Then every figure shown by two or more of ``neuron-explorer summary
--json``, the Explorer pages' data (summary, fallbacks, timeline range totals, source lines, hierarchy,
recommendations), ``neuron-top --replay`` (its snapshots), the neuron-monitor replay documents and the
Prometheus exporter's text for those documents is asserted equal. Device time and host (CPU-fallback)
time are separate figures in every tool.

The monitor rounds percentages to two decimals; where a test compares a percentage of a monitor
document with the query layer's nanoseconds it allows exactly that rounding.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from recorded_samples import WORKLOADS

import traces
from explorer import data, recommend, timeline
from monitor.prometheus import Exporter
from monitor.replay import Replay
from top.snapshot import Totals, build_snapshot
from traces.monitor_figures import engine_shares, percent
from traces.q_replay import REPLAY_ENGINES
from traces.vocab import COMPUTE_ENGINES, MONITOR_ENGINES

#: Replay window (profile seconds per monitor document): a few dozen documents per profile.
WINDOW_S = 0.25


@pytest.fixture(scope="module")
def recorded(recorded_samples) -> dict[str, Path]:
    """Every workload, recorded once per test session (conftest: ``recorded_samples``)."""
    return recorded_samples.get(*WORKLOADS)


class Views:
    """What each tool shows for one profile, gathered the way each tool computes it."""

    def __init__(self, path: Path):
        self.path = path
        stdout = io.StringIO()
        from explorer.cli import main
        with contextlib.redirect_stdout(stdout):
            assert main(["summary", str(path), "--json"]) == 0
        self.cli = json.loads(stdout.getvalue())["figures"]        # neuron-explorer summary --json

        reg = data.Registry([path])                                              # the Explorer's pages
        try:
            L = reg.get(reg.default_key())
            self.page = data.summary(L)
            self.figures = self.page["figures"]
            self.fallbacks = data.fallbacks(L)
            self.recompiles = data.recompiles(L)                                 # the Recompiles page's data
            self.op_totals = data.op_totals(L)
            self.line_totals = data.line_totals(L)
            self.hotspots = {r["source_id"]: r for r in data.rows(L.profile.source_hotspots(10**9))}
            self.hierarchy = data.hierarchy(L)
            self.timeline = timeline.range_aggregates(L, 0, data.bounds(L)["span"], limit=10**6)   # the whole profile
            self.recommendations = recommend.recommendations(L)
            self.layers = data.rows(L.profile.layer_engine_time())
        finally:
            reg.close()

        with Replay(path, window_s=WINDOW_S) as replay:                          # neuron-monitor replay
            self.docs = list(replay)
            with traces.open(path) as p:
                self.all = p.figures(include_warmup=True)
                self.per_core: dict[int, dict] = {}   # a core two runs (targets) used: their sum
                for r in p.summary_per_core(include_warmup=True).to_pylist():
                    acc = self.per_core.setdefault(r["core"], {})
                    for k, v in r.items():
                        if k.endswith("_time"):
                            acc[k] = acc.get(k, 0) + (v or 0)
                self.busy: dict[int, int] = {}   # per core index: its busy ns (the union), summed over targets
                for r in p.core_busy(include_warmup=True).to_pylist():
                    self.busy[r["core"]] = self.busy.get(r["core"], 0) + r["active_ns"]
                self.op_summary = p.top_ops(10**9).to_pylist()   # every op row, the unattributed one too
                self.sql = p.sql("SELECT * FROM Summary").to_pylist()[0]              # what SQL users read
                lo = p.sql("SELECT min(start_ns) AS a, max(end_ns) AS b FROM executions").to_pylist()[0]
            # one document over exactly the executions' span: its percentages are the whole run's
            self.exec_span = (lo["a"], lo["b"])
            self.exec_doc = replay.document(lo["a"], lo["b"])
            self.wide_doc = replay.document(lo["a"], 2 * lo["b"] - lo["a"])   # twice the span: idle half
        totals = Totals()                                                        # neuron-top --replay
        self.snaps = [build_snapshot(doc, totals=totals) for doc in self.docs]
        # the exporter's text after the last period that saw the process (a later one, after its close, has none)
        shown = [i for i, doc in enumerate(self.docs) if doc["neuron_runtime_data"]]
        self.prom = prometheus(self.docs[:shown[-1] + 1] if shown else self.docs)

    @property
    def last(self):
        """The last neuron-top frame that shows the process: a replay period can start after its close
        (the profile's span ends a little after the run's last event) and then shows none."""
        return [s for s in self.snaps if s.has_processes][-1]

    @property
    def process(self):
        (process,) = self.last.apps[1].processes
        return process


def prometheus(docs: list[dict]) -> dict[str, list]:
    """The exporter fed every document, scraped as text and parsed: metric name -> samples."""
    exporter = Exporter()
    for doc in docs:
        exporter.update(doc)
    registry = CollectorRegistry()
    registry.register(exporter)
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def prom_value(prom, metric: str, **labels) -> float:
    """A counter's or gauge's value summed over the series matching ``labels``."""
    return sum(s.value for s in prom.get(metric, [])
               if not s.name.endswith("_created") and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture(scope="module", params=list(WORKLOADS))
def views(request, recorded, recorded_samples) -> Views:
    v = Views(recorded[request.param])
    v.live = json.loads(recorded_samples.live_file(request.param).read_text())   # what neuron-monitor read
    return v


def reports(doc: dict) -> list[dict]:
    return [rt["report"] for rt in doc["neuron_runtime_data"]]


def summed(docs, pick) -> int:
    return sum(pick(r) for doc in docs for r in reports(doc))


# ------------------------------------------------------------------------------ headline figures
def test_headline_figures_are_one_computation(views):
    f, cli, page, top = views.figures, views.cli, views.page, views.process.profile
    assert cli == f.as_dict()
    pairs = {  # figure: (summary --json, Explorer Summary page, neuron-top --replay)
        "device time": (cli["device_ns"], page["device_ns"], top.device_ns),
        "device busy %": (cli["device_busy_percent"], page["device_busy_percent"], top.device_busy_percent),
        "engine %": (cli["engine_percent"], page["engines"], top.engine_percent),
        "MFU": (cli["mfu_percent"], page["mfu_estimated_percent"], top.mfu_percent),
        "fallback host time": (cli["fallback_host_ns"], page["cpu_fallback_ns"], top.fallback_host_ns),
        "fallback calls": (cli["fallback_calls"], page["fallback_calls"], top.fallback_calls),
        "compiles": (cli["compiles"], page["compiles"], top.compiles),
        "recompiles": (cli["recompiles"], page["recompiles"], top.recompiles),
        "executions": (cli["executions"], page["executions"], top.executions),
    }
    for name, (a, b, c) in pairs.items():
        assert a == b == c, f"{views.path}: {name}: summary {a}, Explorer {b}, neuron-top --replay {c}"


def test_counts_agree_in_monitor_top_and_prometheus(views):
    f, docs, proc, prom = views.figures, views.docs, views.process, views.prom
    executions = summed(docs, lambda r: r["execution_stats"]["execution_summary"]["completed"])
    assert executions == proc.completed == prom_value(prom, "execution_status", status_type="completed") \
        == views.all.executions, "executions (the monitor counts warm-ups too)"
    compiles = summed(docs, lambda r: r["neuron_stack"]["compiles"])
    assert compiles == proc.compiles == f.compiles, "compiles"
    fallbacks = summed(docs, lambda r: r["neuron_stack"]["cpu_fallbacks"]["count"])
    assert fallbacks == proc.fallbacks.count == prom_value(prom, "neuron_stack_cpu_fallbacks") \
        == f.fallback_calls == sum(r["calls"] for r in views.fallbacks), "CPU-fallback calls"
    recompiles = summed(docs, lambda r: r["neuron_stack"]["recompiles"]["count"])
    assert recompiles == proc.recompiles.count == prom_value(prom, "neuron_stack_recompiles") \
        == f.recompiles, "recompiles"


def check_one_count(v: Views) -> None:
    """Issue 36: graphs, compiles, recompiles, cache hits, compile time, executions, CPU fallbacks and busy
    are one figure in the Summary (``summary --json``), SQL's ``Summary``, the Explorer's Summary, Recompiles
    and Fallbacks pages' data, the neuron-monitor replay documents and neuron-top's replay; what a window
    counts happened inside it, and the graphs loaded before it are a separate, labelled figure."""
    f, cli, sql, page, rec, top = v.figures, v.cli, v.sql, v.page, v.recompiles, v.process
    in_window = [e for e in rec["recompiles"] if not e["before_window"]]
    before = cli["before_window"]
    pairs = {  # figure: every place it is shown
        "graphs": (f.graphs, cli["graphs"], sql["graph_count"], page["graphs"], len(rec["graphs"]),
                   rec["figures"].graphs),
        "compiles": (f.compiles, cli["compiles"], sql["compile_count"], page["compiles"], rec["figures"].compiles,
                     top.compiles, summed(v.docs, lambda r: r["neuron_stack"]["compiles"])),
        "recompiles": (f.recompiles, cli["recompiles"], sql["recompile_count"], page["recompiles"], len(in_window),
                       top.recompiles.count, summed(v.docs, lambda r: r["neuron_stack"]["recompiles"]["count"])),
        "cache hits": (f.cache_hits, cli["cache_hits"], sql["cache_hit_count"], page["cache_hits"],
                       top.cache_hits),
        "compile time": (f.compile_ns, cli["compile_ns"], round(sql["compile_time"] * 1e9), page["compile_wall_ns"],
                         rec["figures"].compile_ns),
        "before the window": (f.before_window, before, {
            "graphs": sql["before_window_graph_count"], "compiles": sql["before_window_compile_count"],
            "recompiles": sql["before_window_recompile_count"], "cache_hits": sql["before_window_cache_hit_count"],
            "compile_ns": round(sql["before_window_compile_time"] * 1e9)}),
        "before the window, labelled": (f.before_window_text(), page["before_window"], rec["before_window"],
                                        top.profile.before_window),
        "executions": (f.executions, cli["executions"], sql["execution_count"], page["executions"],
                       top.profile.executions),
        "all executions": (v.all.executions, top.completed,   # warm-ups included, as a monitor counts
                           summed(v.docs, lambda r: r["execution_stats"]["execution_summary"]["completed"])),
        "CPU-fallback calls": (f.fallback_calls, cli["fallback_calls"], sql["cpu_fallback_count"],
                               page["fallback_calls"], sum(r["calls"] for r in v.fallbacks), top.fallbacks.count),
        "CPU-fallback ops": (f.fallback_ops, sql["cpu_fallback_op_count"], len(v.fallbacks)),
        "device busy %": (f.device_busy_percent, cli["device_busy_percent"], page["device_busy_percent"],
                          top.profile.device_busy_percent),
    }
    for name, shown in pairs.items():
        assert all(x == shown[0] for x in shown), f"{v.path}: {name}: {shown}"
    # before + in the window = every graph: each graph is loaded once, in the window or before it
    assert len(rec["graphs"]) == before["graphs"] + sum(not g["before_window"] for g in rec["graphs"])
    assert len(in_window) + before["recompiles"] == len(rec["recompiles"])
    assert (before["graphs"] > 0) == bool(f.before_window_text()) == bool(rec["before_window"])


def test_one_count_everywhere(views):
    check_one_count(views)


@pytest.fixture(scope="module", params=["eager", "compiled"])
def window_views(request, recorded_samples) -> Views:
    """A torch.profiler window of the AWS-style training script (recorded_samples.PROFILER_WINDOW)."""
    return Views(recorded_samples.windows("eager", "compiled")[request.param])


def test_one_count_everywhere_in_a_torch_profiler_window(window_views):
    """The compiles ran in the steps before the window: the window counts none of them (its own compiles,
    if any, are its own) and names them as before the window, the same in every tool."""
    v = window_views
    check_one_count(v)
    f = v.figures
    assert f.executions > 0 and f.graphs > 0
    with traces.open(v.path) as p:
        first = p.sql("SELECT min(start_ns) AS t FROM executions").to_pylist()[0]["t"]
        run = p.sql("SELECT start_ns FROM runs").to_pylist()[0]["start_ns"]
        ends = p.sql("SELECT max(ts_ns + dur_ns) AS t FROM events WHERE kind = 'compile'").to_pylist()[0]["t"]
    assert ends is None or ends >= min(run, first), "a compile counted in the window ended before it"
    if "compiled" in str(v.path):
        assert f.before_window["compiles"] > 0 and f.before_window["compile_ns"] > 0
        assert "before this window" in v.recompiles["before_window"]


def test_one_runtime_entry_per_process(views):
    pids = {rt["pid"] for doc in views.docs for rt in doc["neuron_runtime_data"]}
    assert len(pids) == 1
    assert all(len(doc["neuron_runtime_data"]) <= 1 for doc in views.docs)
    assert [a.pid for a in views.last.apps[1:]] == list(pids)
    tags = {s.labels["runtime_tag"] for s in views.prom["execution_status"]}
    assert len(tags) == 1
    if "two_targets" in str(views.path):
        # a period in which both sessions ran names both; the last may follow one session's close
        shown = [rt["report"]["neuron_stack"]["target"] for doc in views.docs for rt in doc["neuron_runtime_data"]]
        assert "trn1,inf2" in shown and set(shown) <= {"trn1", "inf2", "trn1,inf2"}, shown


# ------------------------------------------------------------------------------ time per engine and core
def _close(pct: float, ns: float, period_ns: float, what: str) -> None:
    """A monitor percentage (two decimals) against the query layer's nanoseconds over ``period_ns``."""
    expected = min(100.0, 100.0 * ns / period_ns)
    assert abs(pct - expected) <= 0.005 + 1e-9, f"{what}: {pct}% vs {ns} ns of {period_ns}"


def test_busy_and_engines_per_core_agree_with_the_summary(views):
    """One document over the executions' span: per core, utilization is its busy time (the union of its
    executions' device intervals) and engine percentages the per-core Summary's engine active time
    (warm-ups included, as a monitor counts), DMA as the union of its queues; neuron-top and Prometheus
    show the document's values."""
    doc = views.exec_doc
    period = doc["neuron_runtime_data"][0]["report"]["neuroncore_counters"]["period"] * 1e9
    snap = build_snapshot(doc)
    prom = prometheus([doc])
    util = {s.labels["neuroncore"]: s.value for s in prom["neuroncore_utilization_ratio"]}
    engines = {(s.labels["neuroncore"], s.labels["engine"]): s.value
               for s in prom["neuron_stack_engine_utilization_ratio"]}
    seen = set()
    for report in reports(doc):
        for core, c in report["neuroncore_counters"]["neuroncores_in_use"].items():
            s = views.per_core[int(core)]
            _close(c["neuroncore_utilization"], views.busy[int(core)], period, f"core {core} busy")
            assert snap.apps[0].utilization[int(core)] == c["neuroncore_utilization"]
            assert util[core] == pytest.approx(c["neuroncore_utilization"] / 100)
            for e in MONITOR_ENGINES:
                pct = report["neuron_stack"]["engines"][core][e]
                active = s["dma_active_time"] if e == "dma" else s[f"{e}_engine_active_time"]
                _close(pct, active * 1e9, period, f"core {core} {e}")
                assert snap.apps[0].engines[int(core)][e] == pct
                assert engines[(core, e)] == pytest.approx(pct / 100)
            seen.add(int(core))
    assert seen == set(views.per_core)


def test_busy_is_the_union_live_in_the_replay_and_in_the_summary(views):
    """Issue 31: a core's busy time is the union of its executions' device intervals, the same ns in the
    live publisher (what neuron-monitor reads), a replay window and the Summary; tensor_parallel is the
    case where it matters (an all-reduce overlaps the next compute execution on the same core). The
    replay's CC engine share is the live monitor's: the collectives' busy time, over the same span."""
    with traces.open(views.path) as p:
        union = {(r["target"], r["core"]): r["active_ns"] for r in p.core_busy(include_warmup=True).to_pylist()}
        lo, hi = views.exec_span
        w = p.replay_window(lo, hi)
        target = {r["run_id"]: r["target"] for r in p.replay_runs()}
        figures = p.figures(include_warmup=True)
    assert figures.device_busy_percent == pytest.approx(100 * sum(union.values()) / ((hi - lo) * len(union)))
    replay = {(target[r["run_id"]], r["core"]): r for r in w.busy}
    live = {(s["target"], int(c)): st for s in views.live for c, st in s["core_stats"].items()}
    assert set(live) == set(replay) == set(union)
    for key, st in live.items():
        assert st["active_ns"] == replay[key]["busy_ns"] == union[key], key
        assert st["busy_ns"]["cc"] == pytest.approx(replay[key]["cc"], abs=1), key
    if "tensor_parallel" in str(views.path):   # the overlap is there, and counted once
        assert all(st["device_ns"] > st["active_ns"] for st in live.values())
        assert all(st["busy_ns"]["cc"] > 0 for st in live.values())
    # a document over twice the executions' span: busy and engine shares are the live monitor's formulas
    doc, period = views.wide_doc, 2 * (hi - lo)
    by_core: dict[int, list] = {}
    for (_, core), st in live.items():
        by_core.setdefault(core, []).append(st)
    (report,) = reports(doc)
    for core, sts in by_core.items():
        c = report["neuroncore_counters"]["neuroncores_in_use"][str(core)]
        assert c["neuroncore_utilization"] == percent(sum(st["active_ns"] for st in sts), period) <= 100.0
        if len(sts) == 1:   # one target on this core index
            shares = engine_shares(sts[0]["busy_ns"], period)
            assert report["neuron_stack"]["engines"][str(core)] == {e: shares[e] for e in REPLAY_ENGINES}


def test_timeline_totals_agree_with_the_summary(views):
    """The timeline's range totals over the whole profile: per core, each in-order engine's busy time is
    the Summary's (warm-ups included); DMA and CC lanes are per queue, so they sum to at least the union."""
    lanes: dict[tuple, int] = {}
    for r in views.timeline["by_engine"]:
        lanes[(r["core"], r["engine"])] = lanes.get((r["core"], r["engine"]), 0) + r["busy_ns"]
    for core, s in views.per_core.items():
        for e in COMPUTE_ENGINES:
            assert lanes.get((core, e), 0) == round(s[f"{e}_engine_active_time"] * 1e9), (core, e)
        assert lanes.get((core, "dma"), 0) >= round(s["dma_active_time"] * 1e9)
        assert lanes.get((core, "cc"), 0) >= round(s["cc_op_active_time"] * 1e9)
        assert (core, "cpu") not in lanes or lanes[(core, "cpu")] >= 0


def test_ops_lines_and_hierarchy_add_up_to_the_engine_figures(views):
    """Op totals (Hierarchy, Summary's top ops), source lines and the hierarchy's root are the same device
    time; per in-order engine they are the Summary's active time; no CPU op has device time."""
    f = views.figures
    by_engine = {e: sum(t["engines"].get(e, 0) for t in views.op_totals.values()) for e in COMPUTE_ENGINES}
    for e in COMPUTE_ENGINES:
        assert by_engine[e] == round(f.engine_percent[e] * f.device_ns / 100), e
    ops_device = sum(t["device_ns"] for t in views.op_totals.values())
    # instructions of no op (a tensor-parallel all-reduce between stages) are the hierarchy's "(no op)"
    unattributed = sum(r["device_ns"] for r in views.op_summary if r["op_id"] is None)
    assert ops_device + unattributed == sum(r["device_ns"] for r in views.op_summary)
    root = next(n for n in views.hierarchy if n["id"] == "root")
    assert root["value"] == ops_device + unattributed
    assert sum(t["device_ns"] for t in views.line_totals.values()) <= ops_device
    # the Source page's per-line times are the query layer's source hotspots, device and host apart
    for sid, t in views.line_totals.items():
        spot = views.hotspots.get(sid) or {}
        assert (t["device_ns"], t["host_ns"]) == (spot.get("device_ns") or 0, spot.get("cpu_ns") or 0), t
    for fb in views.fallbacks:
        assert views.op_totals.get(fb["op_id"], {}).get("device_ns", 0) == 0, fb["op"]


# ------------------------------------------------------------------- host time, collectives, memory
def test_cpu_fallback_time_has_its_own_figure_everywhere(views):
    f = views.figures
    assert f.step_ns == f.device_ns + f.fallback_host_ns
    per_op = [r["host_ns"] for r in views.fallbacks]
    assert sum(per_op) <= f.fallback_host_ns          # the islands' glue is host time of no fallback op
    assert sum(t["host_ns"] for t in views.line_totals.values()) <= f.fallback_host_ns
    found = [r for r in views.recommendations if r.rule == "cpu_fallback"]
    if views.fallbacks:
        assert f.fallback_host_ns > 0 and found
        assert f"costing {recommend._ms(f.fallback_host_ns)} of host time" in found[0].words
        starved = [r for r in views.recommendations if r.rule == "host_starved"]
        for r in starved:
            assert f"CPU fallbacks took {recommend._ms(f.fallback_host_ns)}" in r.words
    else:
        assert f.fallback_host_ns == 0 and not found


def test_collective_time_is_one_figure_and_recommended(views):
    f = views.figures
    assert f.collective_ns == round(f.engine_percent["cc"] * f.device_ns / 100)
    assert views.cli["collective_ns"] == f.collective_ns
    found = [r for r in views.recommendations if r.rule == "collective_bound"]
    if "tensor_parallel" in str(views.path):
        assert f.collective_ns > 0 and len(found) == 1
        share = 100.0 * f.collective_ns / f.device_ns
        ms = recommend._ms
        assert found[0].words.startswith(f"Collectives took {ms(f.collective_ns)}, {share:.1f}% of "
                                         f"the {ms(f.device_ns)} of device time")
    else:
        assert f.collective_ns == 0 and not found


def test_no_layer_figure_exceeds_the_profile_total(views):
    f = views.figures
    dma_total = f.engine_percent["dma"] * f.device_ns / 100
    for layer in views.layers:
        assert layer["dma_ns"] <= dma_total + 1, layer
        assert layer["cc_ns"] <= f.collective_ns + 1, layer
    for r in views.recommendations:
        if r.rule == "dma_bound":
            dma = re.search(r"\(([\d.]+ (?:µs|ms|s)) of DMA", r.words).group(1)
            value, unit = dma.split()
            ns = float(value) * {"µs": 1e3, "ms": 1e6, "s": 1e9}[unit]
            assert ns <= dma_total * 1.005, r.words   # the words round to three digits


def test_memory_per_core_agrees_in_monitor_top_and_prometheus(views):
    def cores(d):
        return [c for r in reports(d) for c in r["memory_used"]["neuron_runtime_used_bytes"]["usage_breakdown"][
            "neuroncore_memory_usage"]]
    # the last period that saw device memory (the last one may close after the process released it)
    i = max((i for i, d in enumerate(views.docs) if cores(d)), default=len(views.docs) - 1)
    doc = views.docs[i]
    snap, prom = views.snaps[i], prometheus([doc])
    per_core: dict[str, dict] = {}
    for r in reports(doc):
        for core, cats in r["memory_used"]["neuron_runtime_used_bytes"]["usage_breakdown"][
                "neuroncore_memory_usage"].items():
            per_core[core] = cats
        used = r["memory_used"]["neuron_runtime_used_bytes"]
        assert used["neuron_device"] == sum(sum(c.values()) for c in per_core.values())
    assert per_core, "the profile recorded no device memory"
    for core, cats in per_core.items():
        for cat, n in cats.items():
            got = [s.value for s in prom[f"neuroncore_memory_usage_{cat}"] if s.labels["neuroncore"] == core]
            assert got == [n], (core, cat)
    app = snap.apps[0]
    for cat in next(iter(per_core.values())):
        assert app.device_memory[cat] == sum(c[cat] for c in per_core.values()), cat
    tree_total = sum(nd.device_bytes for nd in app.memory_tree)
    assert tree_total == sum(sum(c.values()) for c in per_core.values())
    runtime = [s.value for s in prom["neuron_runtime_memory_used_bytes"]
               if s.labels["memory_location"] == "neuron_device"]
    assert runtime == [tree_total]


# ------------------------------------------------------------------------------ the timeline's order
def test_compiles_and_loads_precede_the_executions_they_serve(views):
    """Per graph: compile end <= load <= first execution start (tensor_parallel used to start its
    executions at the call's start, before the compiles and loads it triggered)."""
    with traces.open(views.path) as p:
        rows = p.sql("""
            SELECT g.graph_id,
                   (SELECT max(ts_ns + coalesce(dur_ns, 0)) FROM events v
                     WHERE v.graph_id = g.graph_id AND v.kind = 'compile') AS compiled,
                   (SELECT max(ts_ns) FROM events v
                     WHERE v.graph_id = g.graph_id AND v.kind = 'load') AS loaded,
                   (SELECT min(start_ns) FROM executions e WHERE e.graph_id = g.graph_id) AS first_run
            FROM graphs g""").to_pylist()
    checked = 0
    for r in rows:
        if r["first_run"] is None:
            continue
        if r["compiled"] is not None:
            assert r["compiled"] <= r["first_run"], r
            checked += 1
        if r["loaded"] is not None:
            assert r["loaded"] <= r["first_run"], r
            if r["compiled"] is not None:
                assert r["compiled"] <= r["loaded"], r
    assert checked, "no compiled graph ran"


def test_a_multi_target_process_is_reported_per_target(recorded, recorded_samples):
    """Issue 31: a process with a trn1 and an inf2 session runs on two simulated instances. Each target has
    its own cores, its own 64 MiB runtime reservation per core, its own peak for its MFU and its instance
    type named, the same in the live monitor, a replay document, neuron-top and the Explorer Summary."""
    from explorer import app as explorer_app
    from explorer.pages import summary as summary_page
    from monitor.collect import Collector
    from neuron_stack.device.profiles import get_profile

    path = recorded["two_targets"]
    with traces.open(path) as p:
        whole = {t["target"]: t for t in p.targets(include_warmup=True)}
        measured = p.targets()
    live = {}   # the live monitor's block of each session, over everything since it started
    for snap in json.loads(recorded_samples.live_file("two_targets").read_text()):
        live.update(Collector._neuron_stack(snap, {"core_stats": {}, "events": {}}, 1.0, 1)["targets"])
    with Replay(path) as replay:
        doc = replay.document(replay.start_ns, replay.end_ns + 1)
    (entry,) = doc["neuron_runtime_data"]
    replayed = entry["report"]["neuron_stack"]["targets"]
    (process,) = build_snapshot(doc).apps[1].processes
    top = {t.target: t for t in process.targets}
    assert list(whole) == list(live) == list(replayed) == list(top) == ["trn1", "inf2"]
    for name, t in whole.items():
        profile = get_profile(name)
        assert t["instance_type"] == profile.instance_type
        assert t["peak_flops"] == profile.tensor_peak_flops("bfloat16")
        assert t["cores"] == [0] and t["runtime_memory_bytes"] == {"0": 64 * 2**20}
        assert t["mfu_percent"] == pytest.approx(100 * t["model_flops"] / (t["peak_flops"] * t["device_ns"] / 1e9))
        for other in (live[name], replayed[name]):
            exact = ("instance_type", "cores", "runtime_memory_bytes", "peak_flops", "model_flops")
            assert {k: other[k] for k in exact} == {k: t[k] for k in exact}, name
            assert other["device_ns"] == pytest.approx(t["device_ns"], abs=2)
            assert other["mfu_percent"] == pytest.approx(t["mfu_percent"], rel=1e-3)
        shown = top[name]
        assert (shown.instance_type, shown.cores, shown.runtime_memory) == (t["instance_type"], (0,), 64 * 2**20)
        assert shown.mfu_percent == replayed[name]["mfu_percent"]

    explorer_app.create_app([path])
    try:
        key = data.registry().default_key()
        assert data.summary(data.resolve(key))["targets"] == measured
        page = str(summary_page.layout(profile=key))
        assert "summary-targets" in page and "trn1.32xlarge" in page and "inf2.48xlarge" in page
    finally:
        data.registry().close()
