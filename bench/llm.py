"""LLM benchmark: how long a full-size projection takes (issue 24 item 8) and the simulator's wall time
per simulated decode step.

1. ``neuron-llm project`` on the §2.12 settings (bench/published.py ``ROWS``) of Llama-3-8B (TP=32,
   trn1.32xlarge, int8 weights, 128 in / 3,968 out) and Llama-3.1-405B (TP=64, trn2.48xlarge, 10,000
   in / 1,500 out), each in its own process (peak RSS is that process's): wall and CPU seconds and
   peak RSS, each as a ratio to the issue's budget (8B 30 s, 405B 90 s, 1 GB), and the projected
   prefill and decode device times. The buckets are the ones serving those requests uses
   (``inference.projection.project_serving``): the context bucket of the prompt, and every decode
   bucket the generated positions fall in.
2. A tiny Llama generating through ``NeuronModelForCausalLM`` (real numbers): host wall time per
   decode step against the simulated device time of that step; and the two-layer decode NEFF of
   Llama-3-8B TP=32 run on meta tensors (numbers=none): wall time per stamped step.

Usage: ``.venv/bin/python bench/llm.py [--quick|--smoke] [--write]`` (``--quick``: 8B only; ``--smoke``: the
shortest published row and 4 decode steps, what the suite runs; ``--write``: also
write the projection table into docs/llm.md's generated block).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from published import INSTANCE, PRESET, ROWS, row_settings, write_docs  # noqa: E402

from neuron_stack.inference.config import generate_buckets, get_target_bucket  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: (published model, target, TP, input, output, wall budget s): issue 24 item 8
CASES = [("Llama-3-8B", "trn1", 32, 128, 3968, 30.0), ("Llama-3.1-405B", "trn2", 64, 10000, 1500, 90.0)]
#: --smoke (the suite's run): the shortest published row, two buckets; it checks the bench runs, measures nothing
SMOKE_CASE = ("Llama-3-70B", "inf2", 24, 128, 128, 30.0)
#: the issue's peak-RSS budget, 1 GB = 10**9 bytes (peak RSS is printed in GiB, 2**30 bytes, as it is)
RSS_BUDGET = 10**9
#: the simulator's tiny Llama: decoder layers at the full size (--smoke: one)
TINY_LAYERS = 4
DOCS = Path(__file__).resolve().parent.parent / "docs" / "llm.md"
DOCS_BEGIN = "<!-- begin: written by bench/llm.py --write; do not edit by hand -->"
DOCS_END = "<!-- end: written by bench/llm.py --write -->"


def command(model: str, target: str, tp: int, n_in: int, n_out: int) -> list[str]:
    """The ``neuron-llm project`` command of a §2.12 row, as ``project_serving`` projects it."""
    row = next(r for r in ROWS if r[:3] == (model, target, tp) and r[4:6] == (n_in, n_out))
    seq = n_in + n_out
    tkg = sorted({get_target_bucket(generate_buckets(128, seq), p + 1, what="seq_len") for p in range(n_in, seq - 1)})
    cmd = [sys.executable, "-m", "neuron_stack.llm", "project", PRESET[model], "--tp", str(tp),
           "--instance", INSTANCE[target], "--sequence-length", str(seq), "--context-length", str(n_in),
           "--tkg-buckets", *map(str, tkg), "--json"]
    sp = ["--sequence-parallel-enabled"] if row_settings(row)[1].sequence_parallel_enabled else []
    return cmd + (["--quantization-dtype", "int8"] if "int8" in row[8] else []) + sp


def projection(cmd: list[str]) -> dict:
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


def simulator_step_wall(steps: int = 32, smoke: bool = False) -> tuple[float, float, float]:
    """(host wall ms per real decode step, simulated device us per step, wall ms per meta-stamped step).

    ``smoke``: one decoder layer and a 256-token KV cache, not four and 2,048 (it checks the path runs;
    capture and compile time grow with both, and the smoke run measures nothing)."""
    from neuron_stack.inference.tiny import tiny_llama
    from neuron_stack.llm import NeuronModelForCausalLM, project
    from neuron_stack.runtime.model import LoadedModel

    os.environ["NEURON_COMPILE_CACHE_URL"] = tempfile.mkdtemp(prefix="bench-llm-")
    # the tiny Llama's GQA shape (4 query heads, 2 KV heads), wider and deeper
    model = tiny_llama(0, vocab_size=1000, hidden_size=256, intermediate_size=512,
                       num_hidden_layers=1 if smoke else TINY_LAYERS)
    nm = NeuronModelForCausalLM.from_pretrained(model, batch_size=1, sequence_length=128)
    prompt = torch.randint(1, 1000, (1, 16))
    nm.generate(prompt, max_new_tokens=4)  # compile both graphs
    t0 = time.perf_counter()
    nm.generate(prompt, max_new_tokens=steps + 1)
    real_ms = (time.perf_counter() - t0) * 1e3 / (steps + 1)
    device_us = nm.graphs[("token_generation", 128)].model.static_device_ns / 1e3

    p = project("llama-3-8b", tp_degree=32, sequence_length=256 if smoke else 2048, instance_type="trn1.32xlarge")
    tkg = next(g for g in p.graphs if g.name == "token_generation")
    loaded = LoadedModel(tkg.compile_layers(2), {"kind": "trace"})   # the two-layer NEFF (neffs[1]) alone
    inputs = [torch.empty(s.shape, dtype=getattr(torch, s.dtype), device="meta") for s in loaded.input_specs]
    loaded.run(inputs)
    t0 = time.perf_counter()
    for _ in range(steps):
        loaded.run(inputs)
    meta_ms = (time.perf_counter() - t0) * 1e3 / steps
    return real_ms, device_us, meta_ms


def markdown(rows: list[tuple], load: tuple[float, float]) -> str:
    """The projection rows as the table ``--write`` puts into docs/llm.md."""
    out = [
        f"On this 2-CPU machine at load average {load[0]:.1f} (start) / {load[1]:.1f} (end); wall time grows "
        "with the load,\nCPU time much less. Budget (issue 24): 8B 30 s, 405B 90 s wall, peak RSS < 1 GB.",
        "",
        "| model | TP | instance | in/out | wall s | / budget | CPU s | peak RSS | / 1 GB | prefill ms | decode ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (model, target, tp, n_in, n_out, budget), d in rows:
        out.append(
            f"| {model} | {tp} | {INSTANCE[target]} | {n_in}/{n_out} | {d['wall_s']:.0f} | "
            f"{d['wall_s'] / budget:.2f} | {d['cpu_s']:.0f} | {d['peak_rss_bytes'] / 2**30:.2f} GiB | "
            f"{d['peak_rss_bytes'] / RSS_BUDGET:.2f} | {_prefill_ms(d):.2f} | {_decode(d)} |"
        )
    return "\n".join(out)


def _prefill_ms(d: dict) -> float:
    return next(g["device_ns"] / 1e6 for g in d["graphs"] if g["name"] == "context_encoding")


def _decode(d: dict) -> str:
    return " / ".join(f"{g['device_ns'] / 1e6:.2f}" for g in d["graphs"] if g["name"] == "token_generation")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="Llama-3-8B only")
    p.add_argument("--write", action="store_true", help=f"write the projection table into {DOCS.name}")
    p.add_argument("--smoke", action="store_true", help="the shortest published row and 4 steps (the suite's run)")
    args = p.parse_args()
    if args.smoke and args.write:
        p.error("--smoke is not the issue's settings: do not --write it")
    cases = [SMOKE_CASE] if args.smoke else CASES[:1] if args.quick else CASES
    load0 = os.getloadavg()[0]
    print(f"load average {load0:.1f} on {os.cpu_count()} CPUs (wall time grows with it; CPU time much less)")
    print(
        f"{'model':<15} {'TP':>3} {'instance':<14} {'wall s':>7} {'/budget':>7} {'CPU s':>6} {'peak RSS':>9} "
        f"{'/1GB':>5}  prefill ms, decode ms per bucket"
    )
    rows = []
    for case in cases:
        model, target, tp, n_in, n_out, budget = case
        d = projection(command(model, target, tp, n_in, n_out))
        rows.append((case, d))
        print(
            f"{model:<15} {tp:>3} {INSTANCE[target]:<14} {d['wall_s']:>7.1f} {d['wall_s'] / budget:>7.2f} "
            f"{d['cpu_s']:>6.1f} {d['peak_rss_bytes'] / 2**30:>6.2f}GiB {d['peak_rss_bytes'] / RSS_BUDGET:>5.2f}  "
            f"{_prefill_ms(d):.2f}, {_decode(d)}"
        )
    load1 = os.getloadavg()[0]
    print(f"load average at the end {load1:.1f}")
    if args.write:
        write_docs(str(DOCS), markdown(rows, (load0, load1)), DOCS_BEGIN, DOCS_END)
        print(f"wrote the table into {DOCS}")
    real_ms, device_us, meta_ms = simulator_step_wall(4 if args.smoke else 32, args.smoke)
    print(
        f"\nsimulator, tiny Llama ({1 if args.smoke else TINY_LAYERS} layers, hidden 256), real numbers: "
        f"{real_ms:.1f} ms wall per decode step for {device_us:.1f} us of simulated device time"
    )
    print(
        f"simulator, Llama-3-8B TP=32 two-layer decode NEFF ({256 if args.smoke else 2048}-token KV cache), "
        f"numbers=none: {meta_ms:.1f} ms wall per stamped step"
    )


if __name__ == "__main__":
    main()
