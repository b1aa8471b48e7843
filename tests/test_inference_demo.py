"""inference_demo run, the way a user calls it: tiny-model, run --benchmark (benchmark_report.json with the
real keys), token matching against eager, and one-line errors."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def demo(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "neuron_stack.inference.demo", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama written once by ``inference_demo tiny-model``, read by every run below."""
    d = tmp_path_factory.mktemp("models")
    assert demo("tiny-model", str(d / "tiny"), cwd=d).returncode == 0
    return d / "tiny"


@pytest.fixture(scope="module")
def tp1(tiny, tmp_path_factory):
    """One TP=1 run with --benchmark, as NxDI's README writes it: its report is checked by
    test_run_benchmark_report, its text against TP=2 by test_tensor_parallel_run_has_real_numbers_equal_to_tp1."""
    d = tmp_path_factory.mktemp("tp1")
    r = demo(
        "--model-type", "llama", "--task-type", "causal-lm", "run", "--model-path", str(tiny),
        "--compiled-model-path", str(d / "out"), "--tp-degree", "1", "--batch-size", "2",
        "--max-context-length", "16", "--seq-len", "32", "--prompt", "Hello",
        "--check-accuracy-mode", "token-matching", "--benchmark", "--num-runs", "2", cwd=d,
    )
    return r, d


def test_run_benchmark_report(tp1):
    r, tmp_path = tp1
    assert r.returncode == 0, r.stderr
    assert "Compiling and tracing time:" in r.stdout and "Total model loading time:" in r.stdout
    assert "token matching against eager Hugging Face generate: passed" in r.stdout
    report = json.loads((tmp_path / "benchmark_report.json").read_text())
    # exactly NxDI's keys; ours beside it
    assert set(report) == {"e2e_model", "context_encoding_model", "token_generation_model"}
    extras = json.loads((tmp_path / "benchmark_report.extras.json").read_text())
    assert extras["clock"] == "simulated device time" and extras["num_runs"] == 2
    keys = {f"latency_ms_p{p}" for p in (50, 90, 95, 99, 100)} | {"latency_ms_avg", "throughput"}
    for sub in report.values():
        assert set(sub) == keys and sub["latency_ms_p50"] > 0
    # simulated device time: deterministic per call, and a run is its calls
    tkg = report["token_generation_model"]
    assert tkg["latency_ms_p50"] == tkg["latency_ms_p100"]
    e2e = report["e2e_model"]["latency_ms_avg"]
    # NxDI's inputs, not --prompt: random prompts of max_context_length (16), then generating up to seq_len 32:
    # one context encoding, then 32 - 16 - 1 token-generation calls
    assert extras["generated_tokens_per_run"] == 16
    per_run = report["context_encoding_model"]["latency_ms_avg"] + 15 * tkg["latency_ms_avg"]
    assert abs(e2e - per_run) < 1e-6 * e2e
    assert report["e2e_model"]["throughput"] == 2 * 32 * 2 / (2 * e2e / 1e3)


def test_tensor_parallel_run_has_real_numbers_equal_to_tp1(tiny, tp1, tmp_path):
    """--tp-degree 2 on a model with weights: sharded over two cores as NxDI shards it, the collectives run
    with numbers and are costed; the text equals TP=1 (and eager). The first line says the mode."""
    runs = {1: tp1[0]}
    runs[2] = demo(  # the TP=1 run's batch of 2, so that both rows' text is compared
        "run", "--model-path", str(tiny), "--compiled-model-path", str(tmp_path / "c2"),
        "--tp-degree", "2", "--batch-size", "2", "--max-context-length", "16", "--seq-len", "32",
        "--prompt", "Hello", "--check-accuracy-mode", "token-matching", "--benchmark", "--num-runs", "1",
        "--benchmark-report-path", str(tmp_path / "tp2.json"), cwd=tmp_path,
    )
    outs = {}
    for tp, r in runs.items():
        assert r.returncode == 0, r.stderr
        first = r.stdout.splitlines()[0]
        assert first == f"mode: real numbers (tp_degree={tp} over {tp} NeuronCore{'s' if tp > 1 else ''})"
        assert "token matching against eager Hugging Face generate: passed" in r.stdout
        outs[tp] = [x for x in r.stdout.splitlines() if x.startswith("Output ")]
    assert outs[1] == outs[2] and len(outs[1]) == 2
    # the TP=2 call includes its collectives' time: more device time per token than the ranks' compute alone
    report = json.loads((tmp_path / "tp2.json").read_text())
    assert report["token_generation_model"]["latency_ms_p50"] > 0
    r = demo("run", "--model-path", str(tiny), "--tp-degree", "2", "--projection",
             "--seq-len", "32", "--max-context-length", "16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "mode: projection (numbers=none, tp_degree=2): asked (--projection)"


def test_speculative_decoding_tokens_equal_greedy(tiny, tmp_path):
    """--speculation-length with a draft model: the target checks k draft tokens per call; the tokens are
    the target's greedy ones whatever the draft proposes; the acceptance rate and TPOT are reported."""
    assert demo("tiny-model", str(tmp_path / "other"), "--seed", "1", cwd=tmp_path).returncode == 0
    rates = {}
    for name in ("tiny", "other"):  # the target itself as draft (all accepted), then an unrelated one
        r = demo(
            "run", "--model-path", str(tiny), "--compiled-model-path", str(tmp_path / f"c-{name}"),
            "--draft-model-path", str(tiny if name == "tiny" else tmp_path / name), "--speculation-length", "3",
            "--batch-size", "1", "--max-context-length", "16", "--seq-len", "32", "--prompt", "Hello",
            "--check-accuracy-mode", "token-matching", "--benchmark-report-path", str(tmp_path / "report.json"),
            *(["--benchmark", "--num-runs", "1"] if name == "tiny" else []), cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr
        assert "token matching against eager Hugging Face generate: passed" in r.stdout
        rates[name] = float(re.search(r"^speculation: acceptance rate ([\d.]+) ", r.stdout, re.M).group(1))
    assert rates["tiny"] == 1.0 and rates["other"] < 1.0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["speculation_model"]["latency_ms_p50"] > 0
    sp = json.loads((tmp_path / "report.extras.json").read_text())["speculation"]
    assert sp["speculation_length"] == 3 and sp["acceptance_rate"] == 1.0
    assert sp["tpot_ms"] > 0 and sp["tpot_ms_without_speculation"] > 0
    r = demo("run", "--model-path", str(tiny), "--speculation-length", "3", cwd=tmp_path)
    assert r.returncode == 2 and "needs both --speculation-length K and --draft-model-path" in r.stderr


def test_errors_are_one_line(tmp_path):
    r = demo("run", "--model-path", str(tmp_path / "nothing"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such model config" in r.stderr
    r = demo("run", "--model-path", "x", "--seq-len", "16", "--max-context-length", "64", cwd=tmp_path)
    assert r.returncode == 2 and "max_context_length (64) exceeds seq_len (16)" in r.stderr
    assert "Traceback" not in r.stderr


def test_projection_compares_tp_degrees(tmp_path):
    """A full-size Llama-3-8B from its config alone: TTFT/TPOT and HBM per core for two TP degrees."""
    reports = {}
    for tp in (8, 32):
        path = tmp_path / f"tp{tp}.json"
        r = demo(
            "run",
            "--model-path",
            "llama-3-8b",
            "--tp-degree",
            str(tp),
            "--instance-type",
            "trn1.32xlarge",
            "--seq-len",
            "256",
            "--max-context-length",
            "128",
            "--torch-dtype",
            "bfloat16",
            "--benchmark",
            "--benchmark-report-path",
            str(path),
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr
        assert f"with TP={tp}" in r.stdout and "TTFT" in r.stdout and "TPOT" in r.stdout
        reports[tp] = (json.loads(path.read_text()), r.stdout)
    for report, _ in reports.values():
        assert report["context_encoding_model"]["latency_ms_p50"] > 0
        assert report["token_generation_model"]["latency_ms_p50"] > 0
    weights = {tp: float(re.search(r"^\s+weights\s+([\d.]+) MiB", out, re.M).group(1))
               for tp, (_, out) in reports.items()}
    assert weights[32] < weights[8] / 3  # MiB per core: each rank holds ~1/TP of the weights
