"""LLM benchmark: full-size Llama projections (compile time, peak RSS, decode latency per bucket) and the
simulator's wall time per simulated decode step.

1. ``neuron-llm project`` of Llama-3-8B and Llama-3-70B, each in its own process (peak RSS is that
   process's), with token-generation buckets 512/1024/2048: wall time, peak RSS, HBM per core and the
   fit verdict, and the decode-step device latency of every bucket.
2. A tiny Llama generating through ``NeuronModelForCausalLM`` (real numbers): host wall time per
   decode step against the simulated device time of that step; and the two-layer 8B decode NEFF run
   on meta tensors (numbers=none): wall time per stamped step.

Usage: ``.venv/bin/python bench/llm.py [--quick]`` (``--quick``: 8B at TP=8 only).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CASES = [
    ("llama-3-8b", 1, "trn1.32xlarge"),
    ("llama-3-8b", 8, "trn1.32xlarge"),
    ("llama-3-8b", 2, "inf2.xlarge"),
    ("llama-3-70b", 8, "trn1.32xlarge"),
    ("llama-3-70b", 32, "trn1.32xlarge"),
]
BUCKETS = ["512", "1024", "2048"]


def projection(model: str, tp: int, instance: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "neuron_stack.llm",
        "project",
        model,
        "--tp",
        str(tp),
        "--instance",
        instance,
        "--sequence-length",
        "2048",
        "--tkg-buckets",
        *BUCKETS,
        "--json",
    ]
    t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    doc = json.loads(r.stdout)
    doc["wall_s"] = wall
    # CPU seconds do not depend on how many other processes share the machine; wall time does
    doc["cpu_s"] = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return doc


def simulator_step_wall() -> tuple[float, float, float]:
    """(host wall ms per real decode step, simulated device us per step, wall ms per meta-stamped step)."""
    from neuron_stack.inference.tiny import tiny_llama
    from neuron_stack.llm import NeuronModelForCausalLM, project
    from neuron_stack.runtime.model import LoadedModel

    os.environ["NEURON_COMPILE_CACHE_URL"] = tempfile.mkdtemp(prefix="bench-llm-")
    # the tiny Llama's GQA shape (4 query heads, 2 KV heads), wider and deeper
    model = tiny_llama(0, vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    nm = NeuronModelForCausalLM.from_pretrained(model, batch_size=1, sequence_length=128)
    prompt = torch.randint(1, 1000, (1, 16))
    nm.generate(prompt, max_new_tokens=4)  # compile both graphs
    steps = 32
    t0 = time.perf_counter()
    nm.generate(prompt, max_new_tokens=steps + 1)
    real_ms = (time.perf_counter() - t0) * 1e3 / (steps + 1)
    device_us = nm.graphs[("token_generation", 128)].model.static_device_ns / 1e3

    p = project("llama-3-8b", tp_degree=8, sequence_length=2048, instance_type="trn1.32xlarge")
    tkg = next(g for g in p.graphs if g.name == "token_generation")
    loaded = LoadedModel(tkg.neffs[1], {"kind": "trace"})
    inputs = [torch.empty(s.shape, dtype=getattr(torch, s.dtype), device="meta") for s in loaded.input_specs]
    loaded.run(inputs)
    t0 = time.perf_counter()
    for _ in range(steps):
        loaded.run(inputs)
    meta_ms = (time.perf_counter() - t0) * 1e3 / steps
    return real_ms, device_us, meta_ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="Llama-3-8B at TP=8 only")
    args = p.parse_args()
    cases = [c for c in CASES if c[:2] == ("llama-3-8b", 8)] if args.quick else CASES
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
        "(wall time grows with it; CPU time does not)"
    )
    print(
        f"{'model':<12} {'TP':>3} {'instance':<14} {'wall s':>7} {'CPU s':>6} {'peak RSS':>9} "
        f"{'HBM/core':>9} {'fits':>5}  "
        f"decode step device ms per bucket (" + "/".join(BUCKETS) + "), context encoding ms"
    )
    for model, tp, instance in cases:
        d = projection(model, tp, instance)
        tkg = {g["bucket"]: g["device_ns"] / 1e6 for g in d["graphs"] if g["name"] == "token_generation"}
        cte = next(g["device_ns"] / 1e6 for g in d["graphs"] if g["name"] == "context_encoding")
        print(
            f"{model:<12} {tp:>3} {instance:<14} {d['wall_s']:>7.1f} {d['cpu_s']:>6.1f} "
            f"{d['peak_rss_bytes'] / 2**30:>7.2f}GB "
            f"{d['hbm_used'] / 2**30:>7.2f}GB {str(d['fits']):>5}  "
            + " / ".join(f"{tkg[int(b)]:.2f}" for b in BUCKETS)
            + f", {cte:.2f}"
        )
    real_ms, device_us, meta_ms = simulator_step_wall()
    print(
        f"\nsimulator, tiny Llama (4 layers, hidden 256), real numbers: {real_ms:.1f} ms wall per "
        "decode step "
        f"for {device_us:.1f} us of simulated device time"
    )
    print(
        f"simulator, Llama-3-8B TP=8 two-layer decode NEFF, numbers=none: {meta_ms:.1f} ms wall per "
        "stamped step"
    )


if __name__ == "__main__":
    main()
