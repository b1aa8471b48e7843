"""``bench/fidelity.py --published`` as a user runs it: the calibration report prints the device
constants' sources, the NKI guide's statements against the schedule, every selected published row
with its projection, ratio and roofline bound, and the geometric mean and Spearman over them."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_published_report(tmp_path):
    out_json = tmp_path / "report.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "fidelity.py"),
            "--published",
            "--quick",
            "--targets",
            "trn1",
            "--json",
            str(out_json),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for source in (
        "nki-dma-bandwidth-guide.rst",
        "trainium_inferentia2_arch.rst",
        "latency_data_decoder.csv",
        "collective-comm.rst",
    ):
        assert source in out
    assert "geometric-mean ratio" in out and "Spearman" in out and "roof" in out
    data = json.loads(out_json.read_text())
    assert data["nki_disagreements"] == 0
    rows = data["rows"]
    assert len(rows) == 2 and {r["target"] for r in rows} == {"trn1"}
    for row in rows:
        for key in ("ttft", "tpot"):
            # no projection beats the roofline of its own row, and none is wildly off the published figure
            assert row[f"{key}_proj"] >= row[f"{key}_roof"], row
            assert 0.1 < row[f"{key}_proj"] / row[f"{key}_pub"] < 10, row
        if row["in"] <= 128 and row["ttft_proj"] < row["ttft_pub"] / 1.5:
            # a short prompt's miss says what a prefill costs per layer beyond a decode step, either side
            assert "per layer the published prefill costs" in row["why"] and "no decode step" in row["why"], row
        # the transformers-neuronx rows ran Neuron 2.18, whose runtime had the Ring (device/collective_cost.py)
        assert row["release"] == "2.18", row
        if "TPOT is" in row["why"]:   # a decode all-reduce of a few KiB: a ring of 2(N - 1) hops under 2.18
            assert "% is collectives (2 all-reduces per layer of " in row["why"] and "Ring of " in row["why"], row
    assert "beyond a decode step (us, published / projected): Llama-3-8B trn1 TP32 B1 " in out
    s = data["summary"]
    assert s["values"] == 4 and 0 < s["geomean_ratio"] < 10 and -1 <= s["spearman"] <= 1
    assert s["geomean_error"] >= max(s["geomean_ratio"], 1 / s["geomean_ratio"])


def test_published_report_refuses_an_unknown_target():
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fidelity.py"), "--published", "--targets", "trn9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "unknown target 'trn9'" in r.stderr and "Traceback" not in r.stderr


def test_the_summary_counts_ttft_and_tpot_of_the_rows_without_fused_speculation():
    # 22 values, as issue 38 counts them: a fused-speculation row's TTFT holds the draft model's prefill too
    sys.path.insert(0, str(ROOT / "bench"))
    import published

    rows = [{"ttft_pub": r[6], "tpot_pub": r[7], "ttft_proj": 3 * r[6] if "speculation" in r[8] else r[6],
             "tpot_proj": r[7], "tpot_modelled": published.modelled(r)} for r in published.ROWS]
    s = published.summary(rows)
    assert s["values"] == 22 and s["within_2x"] == 22 and s["geomean_ratio"] == 1
