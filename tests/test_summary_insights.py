"""The real Summary's remaining figures and insights (issue 39): NKI engine statistics and the NKI-coverage rule on
a model calling an NKI kernel, collective durations and the collective-outlier rule, throttling on trn2, the DMA
utilisation chart, and the Summary page showing them; the rules' thresholds are the real ones."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import traces
from explorer import data, recommend
from explorer.app import create_app
from traces import q_insights, synthetic

ROOT = Path(__file__).resolve().parents[1]


def _inspect(runs: dict[Path, tuple]) -> list[Path]:
    """``neuron-explorer inspect -o OUT -- python SCRIPT --small ARGS`` for each ``{OUT: (SCRIPT, *ARGS)}``,
    side by side: the profiles, in order."""
    procs = {}
    for out, (script, *args) in runs.items():
        # its own simulated instance, so cores other processes hold never refuse it
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NEURON_STACK_RUNTIME_DIR": str(out) + ".cores",
               "NEURON_STACK_LIVE_DIR": str(out) + ".live"}
        procs[out] = subprocess.Popen([sys.executable, "-m", "explorer.cli", "inspect", "-o", str(out), "--",
                                       sys.executable, str(ROOT / "sample_workloads" / script), "--small", *args],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for proc in procs.values():
        text, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, text
    return [next(out.glob("*/profile.duckdb")) for out in runs]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The NKI-kernel sample (trn1), the MLP on trn2 and a synthetic run with collectives, served by the Explorer."""
    root = tmp_path_factory.mktemp("insights")
    nki, trn2 = _inspect({root / "nki": ("nki/rmsnorm_in_model.py", "--kernel"),
                          root / "trn2": ("mlp.py", "--target", "trn2")})
    cc = _collectives(root / "cc")
    create_app([nki, trn2, cc])
    keys = dict(zip(("nki", "trn2", "cc"), data.registry().keys()))
    yield keys
    data.registry().close()


#: (operation, input bytes, duration ns): one AllReduce takes 4× its group's median.
COLLECTIVES = [("AllReduce", 4096, d) for d in (10_000, 11_000, 10_500, 40_000, 10_200)] + \
              [("AllGather", 8192, d) for d in (20_000, 21_000)]


def _collectives(out: Path) -> Path:
    start = 1_750_000_000_000_000_000
    w = traces.Writer(out, run={"run_id": "cc", "tag": "synthetic", "target": "trn1", "start_ns": start,
                                "command": "python model.py"}, metadata=synthetic.TRN1_METADATA)
    synthetic.write_run(out, executions=2, instructions=200, run_id="cc", start_ns=start, writer=w, close=False)
    t = start + 100_000_000
    w.append("events", {
        "ts_ns": [t + i * 100_000 for i in range(len(COLLECTIVES))], "dur_ns": [d for _, _, d in COLLECTIVES],
        "run_id": "cc", "kind": "collective", "core": 0,
        "detail": [json.dumps({"operation": op, "algorithm": "Ring", "num_elements": size // 4, "dtype": "fp32",
                               "input_size": size, "output_size": size}) for op, size, _ in COLLECTIVES]})
    w.close()
    return traces.finalize(out)


def _rule(key, rule_id):
    return [f for f in recommend.recommendations(data.resolve(key)) if f.rule == rule_id]


def test_nki_statistics_and_the_coverage_rule(served):
    p = data.resolve(served["nki"]).profile
    cov = p.nki_coverage()
    nki_rows = p.sql("SELECT engine, count(*) AS n FROM instructions WHERE nki_source_location IS NOT NULL "
                     "AND engine IN ('tensor', 'vector', 'scalar') GROUP BY 1").to_pylist()
    assert nki_rows and all(cov[r["engine"]]["nki"] > 0 for r in nki_rows)
    assert sum(r["instructions"] for r in p.nki_engine_stats().to_pylist() if r["source"] == "nki") \
        <= sum(r["n"] for r in nki_rows)
    low = [e for e, c in cov.items() if c["nki_percent"] < 50]
    [finding] = _rule(served["nki"], "nki_coverage")
    assert all(e in finding.words for e in low) and finding.impact_ns == 0   # listed last: an option, not a loss
    assert next(r for r in recommend.RULES if r.id == "nki_coverage").threshold == 50.0
    # the kernel's lines are the KernelInstructions / KernelStackFrames tables
    assert p.sql("SELECT count(*) FROM KernelStackFrames").column(0)[0].as_py() >= 1
    files = {r["file_path"] for r in p.sql("SELECT DISTINCT file_path FROM KernelInstructions").to_pylist()}
    assert files == {"rmsnorm.py"}


def test_throttling_on_trn2_is_the_throttle_tables(served):
    p = data.resolve(served["trn2"]).profile
    t = p.throttling()
    measured = p.sql("SELECT count(*) FROM Throttle WHERE exec_id IN (SELECT exec_id FROM executions "
                     "WHERE NOT warmup)").column(0)[0].as_py()
    assert t["throttle_events"] == measured > 0
    assert 0 < t["active_throttled_percent"] < 50 and 50 <= t["average_utilization_limit_percent"] < 100
    [finding] = _rule(served["trn2"], "throttling")
    assert f"{t['active_throttled_percent']:.1f}%" in finding.words
    assert _rule(served["nki"], "throttling") == []                          # trn1: no limiter, no finding
    assert data.resolve(served["nki"]).profile.throttling()["throttle_events"] == 0


def test_collective_outliers_against_their_group_median(served):
    p = data.resolve(served["cc"]).profile
    ops = p.collective_ops().to_pylist()
    assert len(ops) == len(COLLECTIVES)
    assert [r["duration_ns"] for r in ops if r["outlier"]] == [40_000]       # 40 µs > 2 × the 10.5 µs median
    stats = {r["operation"]: r for r in p.collective_stats().to_pylist()}
    assert stats["AllReduce"]["median_ns"] == 10_500 and stats["AllGather"]["count"] == 2
    [finding] = _rule(served["cc"], "collective_outliers")
    assert "AllReduce" in finding.words and finding.impact_ns == 40_000 - 10_500
    assert q_insights.OUTLIER_FACTOR == next(r for r in recommend.RULES if r.id == "collective_outliers").threshold


def test_dma_utilization_adds_up_to_the_dma_rows(served):
    p = data.resolve(served["trn2"]).profile
    rows = p.dma_utilization().to_pylist()
    total = p.sql("SELECT sum(greatest(bytes_read, bytes_written)) FROM instructions WHERE engine = 'dma' AND "
                  "exec_id IN (SELECT exec_id FROM executions WHERE NOT warmup)").column(0)[0].as_py()
    assert rows and sum(r["transfer_bytes"] for r in rows) == total
    assert all(0 <= r["bandwidth_percent"] and 0 < r["active_percent"] for r in rows)


def test_summary_page_shows_the_new_charts(served):
    from explorer.pages import summary

    out = str(summary.layout(profile=served["trn2"]))
    for id in ("summary-nki", "summary-dma", "summary-throttle"):
        assert id in out, id
    assert "Tensor Engine ramps" in out and "summary-collectives" not in out
    cc = str(summary.layout(profile=served["cc"]))
    assert "summary-collectives" in cc and "summary-collective-box" in cc
    assert "no throttling" in str(summary.layout(profile=served["nki"]))


def test_regions_by_kernel_and_no_coverage_finding_without_kernels(served):
    p = data.resolve(served["nki"]).profile
    kernels = {r["region"] for r in p.regions("kernel").to_pylist()}
    names = {r["name"] for r in p.sql("SELECT name FROM ops WHERE op_class = 'nki'").to_pylist()}
    assert kernels and kernels <= names
    assert [r["region"] for r in p.region_durations("kernel").to_pylist()] == sorted(kernels)
    assert _rule(served["trn2"], "nki_coverage") == []          # no kernel anywhere: not told to write one
