"""Every recommendation rule (explorer/recommend.py: RULES) on a profile that triggers it and one that does not.

Each finding must name its evidence (numbers, call sites, shapes) and the fix in words a porting
engineer acts on. The profiles are the Explorer tests' small real profiles (``build_tables``: a
two-layer MLP on two cores, four sequence lengths, one CPU-fallback op, written through
``traces.Writer`` + ``traces.finalize``), each changed in one way to flip one rule. The sample
workloads trigger and clear the two rules a port meets first (CPU fallback, recompile storm) in
``tests/test_walkthrough.py``, through ``neuron-explorer recommend`` as typed; ``tensor_parallel`` and
``dynamic_shapes`` profiles recorded here (``recorded_samples``) check the collective and DMA rules'
figures against the profile's totals.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_explorer_profiles import build_tables, write_profile

import traces
from explorer import data, recommend

EXE = Path(sys.executable).parent / "neuron-explorer"


def findings(tmp_path: Path, name: str, change=None, **kw) -> list[recommend.Finding]:
    """Build a profile (``change`` edits its Arrow tables first) and run every rule over it."""
    tables = build_tables(**kw)
    if change:
        change(tables)
    path = write_profile(tmp_path / f"20260101-000000_{name}", tables)
    reg = data.Registry([path])
    data.set_registry(reg)
    try:
        return recommend.recommendations(reg.get(reg.keys()[0]))
    finally:
        data.set_registry(data.Registry([]))


def rule(found, rule_id):
    return [f for f in found if f.rule == rule_id]


def words(f: recommend.Finding) -> str:
    return " ".join(f.words.split())


def _set_column(table: pa.Table, name: str, values) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))


def _metadata(tables, **changes):
    md = dict(zip(tables["metadata"]["key"].to_pylist(), tables["metadata"]["value"].to_pylist()))
    md.update(changes)
    tables["metadata"] = pa.table({"key": list(md), "value": list(md.values())}, schema=tables["metadata"].schema)


def test_every_rule_is_covered_here():
    assert {r.id for r in recommend.RULES} == {"host_starved", "recompile_storm", "cpu_fallback", "dma_bound",
                                               "collective_bound", "spills", "fp32_matmul",
                                               "model_vs_active_flops", "transpose_flops", "throttling",
                                               "collective_outliers", "nki_coverage"}
    # the real Summary's insight rules we follow carry their condition and threshold beside ours
    real = {r.id: r.real for r in recommend.RULES if r.real}
    assert real == {"spills": "Spill reload bytes > 25% of total HBM reads",
                    "model_vs_active_flops": "Low Model FLOPS relative to Active FLOPS (< 50%)",
                    "transpose_flops": "Transpose FLOPS > 10% of total hardware FLOPS",
                    "throttling": "Active FLOPS throttling detected",
                    "collective_outliers": "Collective operation outliers detected",
                    "nki_coverage": "NKI instruction coverage < 50% on tensor, vector, or scalar engine"}


# --------------------------------------------------------------------------------- host_starved
def test_host_starved_names_the_gap_and_what_filled_it(tmp_path):
    found = rule(findings(tmp_path, "gappy"), "host_starved")
    assert len(found) == 1
    w = words(found[0])
    assert re.search(r"busy only \d+\.\d% of the [\d.]+ (ms|µs|s) between the first and last execution "
                     r"\(longest gap [\d.]+ (ms|µs)\)", w), w
    assert re.search(r"3 compiles took [\d.]+ ms", w), w        # the 3 recompiles fall between executions
    assert "CPU fallbacks took" in w and "DataLoader workers" in w
    assert found[0].page == "timeline" and found[0].query["end"] > found[0].query["start"]


def _no_host_work(t):
    """No CPU-fallback spans, and every execution starts 500 ns after the previous one ends."""
    t["events"] = t["events"].filter(pc.not_equal(t["events"]["kind"], "cpu_fallback"))
    ex = t["executions"].sort_by("start_ns")
    shift, prev_end, shifts = 0, None, {}
    for e in ex.to_pylist():
        if prev_end is not None:
            shift += e["start_ns"] - shift - (prev_end + 500)
        shifts[e["exec_id"]] = shift
        prev_end = e["end_ns"] - shift
    for col in ("start_ns", "end_ns", "wall_start_ns", "wall_end_ns"):
        ex = _set_column(ex, col, [v - shifts[i] for v, i in zip(ex[col].to_pylist(), ex["exec_id"].to_pylist())])
    t["executions"] = ex
    i = t["instructions"]
    t["instructions"] = _set_column(i, "start_ns", [v - shifts[e] for v, e in zip(i["start_ns"].to_pylist(),
                                                                                i["exec_id"].to_pylist())])


def test_host_starved_quiet_when_executions_run_back_to_back(tmp_path):
    found = findings(tmp_path, "busy", _no_host_work, seqs=(64,), cores=1)
    assert rule(found, "host_starved") == [], [f.words for f in found]


# ------------------------------------------------------------------------------ recompile_storm
def test_recompile_storm_gives_compiles_range_buckets_and_waste(tmp_path):
    found = rule(findings(tmp_path, "storm"), "recompile_storm")
    assert len(found) == 1
    w = words(found[0])
    # 4 shapes (57, 64, 100, 128) -> power-of-two buckets [64, 128]: 2 graphs
    assert re.search(r"^4 compiles for 'x' dim 1 = 57–128: pad to \[64, 128\] to compile 2 graphs with \d+% "
                     r"padding waste \(saves 2 compiles, ~[\d.]+ ms\)\.", w), w
    assert "3 recompiles spent" in w and "e.g. tensor 'x' dim 1: 57 -> 64" in w
    assert found[0].page == "recompiles"


def test_recompile_storm_quiet_below_two_recompiles(tmp_path):
    assert rule(findings(tmp_path, "bucketed", seqs=(64, 128)), "recompile_storm") == []


def test_recompile_storm_uses_the_argument_names_of_the_reasons_for_positional_signatures(tmp_path):
    def positional(t):   # what torch.compile graphs record: "(4, 57, 512) float32"
        sigs = [re.sub(r"x: float32\[(.*)\]", r"(\1) float32", s) for s in t["graphs"]["input_signature"].to_pylist()]
        t["graphs"] = _set_column(t["graphs"], "input_signature", sigs)
    w = words(rule(findings(tmp_path, "positional", positional), "recompile_storm")[0])
    assert w.startswith("4 compiles for 'x' dim 1 = 57–128"), w


# --------------------------------------------------------------------------------- cpu_fallback
def test_cpu_fallback_names_cost_share_call_site_and_rewrite(tmp_path):
    found = rule(findings(tmp_path, "fallback"), "cpu_fallback")
    assert len(found) == 1
    w = words(found[0])
    assert re.search(r"^4 ops fall back to the CPU at 1 source line, costing [\d.]+ (µs|ms) of host time "
                     r"\(\d+% of step time\)", w), w
    assert "aten.nonzero.default at model.py:16" in w
    assert "nonzero has a data-dependent shape: use the mask itself" in w
    assert found[0].page == "source" and found[0].query["line"]


def _on_device(t):
    t["ops"] = t["ops"].filter(pc.not_equal(t["ops"]["placement"], "cpu_fallback"))
    t["events"] = t["events"].filter(pc.not_equal(t["events"]["kind"], "cpu_fallback"))


def test_cpu_fallback_quiet_when_every_op_is_on_the_device(tmp_path):
    assert rule(findings(tmp_path, "nofallback", _on_device), "cpu_fallback") == []


@pytest.mark.parametrize("op, reason, fix", [
    ("aten.sort.default", "aten::sort is in partitioner_config.ops_to_partition", "torch.topk(x, k)"),
    ("aten.index.Tensor", "consumes a data-dependent shape", "torch.where(mask, x, 0)"),
    ("aten._unique2.default", "data-dependent", "torch.bincount"),
    ("operator.ge", "shape arithmetic on a data-dependent size: runs on the host", "goes away with the op"),
    ("aten.sum.dim_IntList", "consumes a data-dependent shape: a NeuronCore graph needs static shapes",
     "once the op upstream keeps shapes static"),
    ("aten.cumprod.default", "aten::cumprod is in partitioner_config.ops_to_partition", "drop it from that set"),
    ("aten.fancy_new_op.default", "no device lowering", "neuron-cc list-operators"),
])
def test_every_fallback_gets_a_fix_in_words(op, reason, fix):
    assert fix in recommend.fallback_fix(op, reason)


# ------------------------------------------------------------------------------------ dma_bound
#: trn1's DMA figures as a profile's metadata publishes them (17 B/ns per engine, 1300 ns trigger latency)
_TRN1_DMA = {"dma_ddr_bandwidth": "272.0", "num_dma_engines_per_neuroncore": "16", "dma_fixed_latency_ns": "1300.0"}


def test_dma_bound_names_the_layer_and_its_dma_against_compute(tmp_path):
    # 64 KiB transfers of 1.3 us: bandwidth-bound (3.9 us of bytes at 17 B/ns outweigh the 1.3 us fixed cost)
    found = rule(findings(tmp_path, "dma", lambda t: _metadata(t, **_TRN1_DMA)), "dma_bound")
    assert found and len(found) <= recommend.MAX_LAYERS
    w = words(found[0])
    assert re.search(r"^Layer (fc1|fc2) \(model\.py:1[35]\) is DMA-bound: \d+% of its instruction time is "
                     r"bandwidth-bound data movement \([\d.]+ (µs|ms) of DMA moving [\d.]+ MB against "
                     r"[\d.]+ (µs|ms) of compute\)", w), w
    assert "Keep weights resident" in w and found[0].query["sel"].startswith("module:fc")
    # ranked by what it would save: the bandwidth-bound DMA time beyond the layer's compute
    layers = {r["module_path"]: r for r in data.rows(_profile_layers(tmp_path / "20260101-000000_dma"))}
    fc = layers[found[0].query["sel"].removeprefix("module:")]
    compute = sum(fc[f"{e}_ns"] for e in ("tensor", "vector", "scalar", "gpsimd", "sync"))
    assert found[0].impact_ns == fc["dma_bandwidth_ns"] - compute > 0


def _profile_layers(path):
    with traces.open(path) as p:
        return p.layer_engine_time()


def _small_transfers(t):
    """The same DMA time, but each transfer moves 512 bytes: its fixed cost dominates (latency-bound)."""
    _metadata(t, **_TRN1_DMA)
    i = t["instructions"]
    for col in ("bytes_read", "bytes_written"):
        small = pc.if_else(pc.equal(i["engine"], "dma"), 512, i[col])
        i = _set_column(i, col, small.to_pylist())
    t["instructions"] = i


def test_dma_bound_quiet_when_the_transfers_are_latency_bound(tmp_path):
    found = findings(tmp_path, "latency", _small_transfers)
    assert rule(found, "dma_bound") == []
    layers = data.rows(_profile_layers(tmp_path / "20260101-000000_latency"))
    # the DMA time is still there (the layers spend it), only none of it is bandwidth-bound
    assert all(r["dma_bandwidth_ns"] == 0 and r["dma_latency_bound_transfers"] == r["dma_transfers"] for r in layers)
    assert any(r["dma_ns"] > 0 for r in layers)


def _fast_dma(t):
    i = t["instructions"]
    dur = pc.if_else(pc.equal(i["engine"], "dma"), pc.divide(i["dur_ns"], 100), i["dur_ns"])
    t["instructions"] = _set_column(i, "dur_ns", dur.to_pylist())


def test_dma_bound_quiet_when_transfers_are_short(tmp_path):
    assert rule(findings(tmp_path, "compute", _fast_dma), "dma_bound") == []


# --------------------------------------------------------------------------------------- spills
def _spill_bytes(factor):
    """Each execution's spill reloads: its spill-queue DMA bytes × ``factor`` (what the runtime records)."""
    def change(t):
        i = t["instructions"].to_pylist()
        per = {}
        for r in i:
            if r["opcode"] == "DMA_SPILL":
                per[r["exec_id"]] = per.get(r["exec_id"], 0) + r["bytes_read"] * factor
        e = t["executions"]
        t["executions"] = _set_column(e, "spill_reload_bytes", [per.get(x, 0) for x in e["exec_id"].to_pylist()])
    return change


def test_spills_names_bytes_share_and_the_fix(tmp_path):
    found = rule(findings(tmp_path, "spilly", _spill_bytes(4)), "spills")
    assert len(found) == 1
    w = words(found[0])
    assert re.search(r"^Spill reloads read [\d.]+ MB back into SBUF \(\d+% of HBM reads; [\d.]+ MB saved\)", w), w
    assert "Smaller tiles or a lower batch per core" in w and found[0].page == "memory"


def test_spills_quiet_below_a_quarter_of_hbm_reads(tmp_path):
    # one 96 KiB spill per 640 KiB of HBM reads (15%), under the real tool's 25% threshold
    assert rule(findings(tmp_path, "fits", _spill_bytes(1)), "spills") == []


# ----------------------------------------------------------------------- Tensor Engine FLOPs rules
def _flops(model_share, transpose_share):
    """Executions whose model FLOPs and transpose FLOPs are the given shares of the hardware FLOPs."""
    def change(t):
        i = t["instructions"].to_pylist()
        hw = {}
        for r in i:
            if r["engine"] == "tensor":
                hw[r["exec_id"]] = hw.get(r["exec_id"], 0) + (r["flops"] or 0)
        e = t["executions"]
        ids = e["exec_id"].to_pylist()
        t["executions"] = _set_column(_set_column(e, "flops", [int(hw.get(x, 0) * model_share) for x in ids]),
                                      "transpose_flops", [int(hw.get(x, 0) * transpose_share) for x in ids])
    return change


def test_tensor_flops_rules_fire_on_transposes_and_idle_matmuls(tmp_path):
    found = findings(tmp_path, "transposy", _flops(0.001, 0.5))
    (tr,) = rule(found, "transpose_flops")
    assert re.search(r"^Transposes are 50% of the Tensor Engine's FLOPs", words(tr)), words(tr)
    (act,) = rule(found, "model_vs_active_flops")
    assert re.search(r"^While the Tensor Engine is active \([\d.]+% of device time\) its model FLOPs reach only "
                     r"\d+% of its peak", words(act)), words(act)


def _busy_matmuls(t):
    """Model FLOPs at the Tensor Engine's peak whenever it is active (its instructions do not overlap)."""
    md = dict(zip(t["metadata"]["key"].to_pylist(), t["metadata"]["value"].to_pylist()))
    peak = float(md["tensor_engine_peak_bf16_flops"])
    busy = {}
    for r in t["instructions"].to_pylist():
        if r["engine"] == "tensor":
            busy[r["exec_id"]] = busy.get(r["exec_id"], 0) + r["dur_ns"]
    e = t["executions"]
    t["executions"] = _set_column(e, "flops", [int(peak * busy.get(x, 0) / 1e9) for x in e["exec_id"].to_pylist()])


def test_tensor_flops_rules_quiet_without_transposes(tmp_path):
    assert rule(findings(tmp_path, "plain", _flops(1.0, 0.0)), "transpose_flops") == []


# ---------------------------------------------------------------------------------- fp32_matmul
def test_fp32_matmul_names_tensor_time_and_the_flag(tmp_path):
    found = rule(findings(tmp_path, "fp32"), "fp32_matmul")
    assert len(found) == 1
    w = words(found[0])
    assert re.search(r"the Tensor Engine spends [\d.]+ (µs|ms) where BF16 would take about a quarter", w), w
    assert "--auto-cast matmult --auto-cast-type bf16" in w and found[0].page == "hierarchy"


def test_fp32_matmul_quiet_with_auto_cast(tmp_path):
    assert rule(findings(tmp_path, "bf16", lambda t: _metadata(t, auto_cast="matmult")), "fp32_matmul") == []


# ------------------------------------------------------------------------ the CLI, as typed
def test_recommend_cli_prints_ranked_findings_and_json(tmp_path):
    path = write_profile(tmp_path / "20260101-000000_cli", build_tables())
    out = subprocess.run([str(EXE), "recommend", str(path.parent)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("20260101-000000_cli: ") and "costliest first" in out.stdout
    assert re.search(r"^1\. .+ \(~[\d.]+ (µs|ms|s)\)$", out.stdout, re.M)
    assert "evidence: neuron-explorer view, then /recompiles?profile=20260101-000000_cli" in out.stdout
    js = subprocess.run([str(EXE), "recommend", str(path), "--json"], capture_output=True, text=True)
    doc = json.loads(js.stdout)
    impacts = [r["impact_ns"] for r in doc["recommendations"]]
    assert impacts == sorted(impacts, reverse=True)
    assert {r["rule"] for r in doc["recommendations"]} >= {"recompile_storm", "cpu_fallback", "fp32_matmul"}


def test_recommend_cli_bad_input_is_one_line(tmp_path):
    out = subprocess.run([str(EXE), "recommend", str(tmp_path / "nope")], capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "no such file" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "bad.duckdb").write_text("not a database")
    out = subprocess.run([str(EXE), "recommend", str(tmp_path / "bad.duckdb")], capture_output=True, text=True)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr


def test_recommend_cli_says_when_nothing_is_found(tmp_path):
    """A profile no rule fires on: one shape, back-to-back executions, all ops on the device, short DMAs, bf16."""
    tables = build_tables(seqs=(64,), cores=1)
    for change in (_no_host_work, _on_device, _fast_dma, lambda t: _metadata(t, auto_cast="matmult"), _busy_matmuls):
        change(tables)
    path = write_profile(tmp_path / "20260101-000000_clean", tables)
    out = subprocess.run([str(EXE), "recommend", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["20260101-000000_clean: recommendations, costliest first (simulated profile)",
                                       "No issues found by the rules."]


# ------------------------------------------------------------------------- collectives, on real profiles
def _real(recorded_samples, name):
    path = recorded_samples.get(name)[name]
    reg = data.Registry([path])
    try:
        L = reg.get(reg.keys()[0])
        layers = data.rows(L.profile.layer_engine_time())
        return recommend.recommendations(L), data.summary(L)["figures"], layers
    finally:
        reg.close()


def test_collective_bound_cites_the_profiles_collective_time(recorded_samples):
    found, f, _ = _real(recorded_samples, "tensor_parallel")
    (finding,) = rule(found, "collective_bound")
    share = 100.0 * f.collective_ns / f.device_ns
    assert share >= 15.0 and f.collective_ns == round(f.engine_percent["cc"] * f.device_ns / 100)
    ms = recommend._ms
    assert words(finding).startswith(f"Collectives took {ms(f.collective_ns)}, {share:.1f}% of the "
                                     f"{ms(f.device_ns)} of device time on 2 cores"), words(finding)
    assert "micro-batches" in finding.words and finding.impact_ns == f.collective_ns
    # collectives are not a layer's DMA: the DMA findings no longer take the all-reduce for data movement
    assert found.index(finding) < min((found.index(x) for x in rule(found, "dma_bound")), default=len(found))


def test_collective_bound_quiet_without_collectives(tmp_path):
    assert rule(findings(tmp_path, "plain"), "collective_bound") == []


def test_no_recommendation_states_a_layer_figure_above_the_profile_total(recorded_samples):
    """A layer's DMA time is the union of its transfers (overlapping queues counted once), as the
    profile's DMA total is: on dynamic_shapes a layer once read "284 µs of DMA" in a 263 µs profile.
    Both samples move a few KiB a transfer, so every transfer is latency-bound (its ~1.3 µs fixed cost
    outweighs its bytes) and no layer is DMA-bound (issue 36: they once all were)."""
    for name in ("dynamic_shapes", "tensor_parallel"):
        found, f, layers = _real(recorded_samples, name)
        total = f.engine_percent["dma"] * f.device_ns / 100
        assert layers and all(r["dma_bandwidth_ns"] <= r["dma_ns"] <= total + 1 for r in layers), name
        assert all(r["dma_latency_bound_transfers"] == r["dma_transfers"] for r in layers), name
        assert rule(found, "dma_bound") == [], name
