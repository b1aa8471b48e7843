"""Runtime benchmark: steady-state latency of the fast path (profiling off) vs eager PyTorch.

Same model, same inputs, same process, interleaved repetitions; prints medians and the ratio
(target <= 1.15). Usage: ``.venv/bin/python bench/runtime.py [--layers 4 --reps 30]``.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sample_workloads"))
from models import BertEncoder  # noqa: E402

import neuron_stack  # noqa: E402


def timed(fn, x) -> float:
    t0 = time.perf_counter()
    fn(x)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    os.environ["NEURON_COMPILE_CACHE_URL"] = tempfile.mkdtemp(prefix="bench-cache-")
    os.environ.pop("NEURON_RT_INSPECT_ENABLE", None)
    torch.manual_seed(0)
    model = BertEncoder(vocab=30522, hidden=args.hidden, layers=args.layers, heads=12, seq=args.seq).eval()
    ids = torch.randint(0, 30522, (1, args.seq))
    nm = neuron_stack.trace(model, ids)

    def eager(x):
        with torch.no_grad():
            return model(x)

    for _ in range(3):                       # warm-up both
        eager(ids), nm(ids)
    e, n = [], []
    for _ in range(args.reps):               # interleaved so machine noise hits both alike
        e.append(timed(eager, ids))
        n.append(timed(nm, ids))
    me, mn = statistics.median(e), statistics.median(n)
    print(f"model: BERT-style encoder, {args.layers} layers, hidden {args.hidden}, seq {args.seq}; {args.reps} reps")
    print(f"eager PyTorch (no_grad)           median {me * 1e3:8.2f} ms")
    print(f"neuron_stack fast path (prof off) median {mn * 1e3:8.2f} ms   ratio {mn / me:5.2f}x  (target <= 1.15)")
    # Profiling-on case: the cost-model engineer adds it here (NEURON_RT_INSPECT_ENABLE=1 in a
    # subprocess, ratio of the fast path above and of torch.profiler on eager).


if __name__ == "__main__":
    main()
