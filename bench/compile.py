"""Compile-time benchmark: a BERT-base-sized encoder (12 layers, hidden 768, seq 128, random init).

Prints cold compile time (neuron_stack.trace with an empty cache) as a ratio of plain
``torch.export`` + ``run_decompositions`` measured in the same run, and warm compile time (a cache
hit) as a ratio of cold. Usage: ``.venv/bin/python bench/compile.py [--layers 12]``.
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sample_workloads"))
from models import BertEncoder  # noqa: E402

import neuron_stack  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args()
    os.environ["NEURON_COMPILE_CACHE_URL"] = tempfile.mkdtemp(prefix="bench-cache-")
    torch.manual_seed(0)
    model = BertEncoder(vocab=30522, hidden=args.hidden, layers=args.layers, heads=12, seq=args.seq).eval()
    ids = torch.randint(0, 30522, (1, args.seq))
    torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))    # pay the one-time export warm-up

    t0 = time.perf_counter()
    torch.export.export(model, (ids,)).run_decompositions()
    export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cold = neuron_stack.trace(model, ids)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = neuron_stack.trace(model, ids)
    warm_s = time.perf_counter() - t0
    assert warm.cache_hit and not cold.cache_hit
    st = cold.neff.program.stats
    print(f"model: {args.layers} layers, hidden {args.hidden}, seq {args.seq}; {st['num_ops']} ops, "
          f"{st['num_instructions']} instructions ({st['timing_model']} timing)")
    print(f"torch.export + run_decompositions: {export_s:7.2f} s")
    print(f"cold compile (neuron_stack.trace):  {cold_s:7.2f} s   ratio to export+decomp: {cold_s / export_s:5.2f}x")
    print(f"warm compile (cache hit):           {warm_s:7.2f} s   ratio to cold:          {warm_s / cold_s:5.2f}x")


if __name__ == "__main__":
    main()
