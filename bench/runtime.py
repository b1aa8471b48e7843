"""Runtime benchmark: steady-state latency of the fast path (profiling off) vs eager PyTorch.

Same model, same inputs, same process, interleaved repetitions; prints medians, the ratio
(target <= 1.15) and how noisy the machine was (the load average and the spread of the per-pair
ratios). With ``--auto-cast matmult`` the compiled model also rounds every matmul activation to
bf16 (the weights once, at load), work eager fp32 does not do.
Usage: ``.venv/bin/python bench/runtime.py [--layers 4 --reps 30 --auto-cast matmult --threads 1]``.
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
    p.add_argument("--auto-cast", dest="auto_cast", choices=("none", "matmult", "all"), default="none")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0: torch's default); 1 is far less noisy on a busy machine")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ["NEURON_COMPILE_CACHE_URL"] = tempfile.mkdtemp(prefix="bench-cache-")
    os.environ.pop("NEURON_RT_INSPECT_ENABLE", None)
    torch.manual_seed(0)
    model = BertEncoder(vocab=30522, hidden=args.hidden, layers=args.layers, heads=12, seq=args.seq).eval()
    ids = torch.randint(0, 30522, (1, args.seq))
    nm = neuron_stack.trace(model, ids, compiler_args=f"--auto-cast {args.auto_cast}")

    def eager(x):
        with torch.no_grad():
            return model(x)

    for _ in range(3):                       # warm-up both
        eager(ids), nm(ids)
    load0 = os.getloadavg()[0]
    e, n = [], []
    for _ in range(args.reps):               # interleaved so machine noise hits both alike
        e.append(timed(eager, ids))
        n.append(timed(nm, ids))
    load1 = os.getloadavg()[0]
    me, mn = statistics.median(e), statistics.median(n)
    pairs = sorted(b / a for a, b in zip(e, n))
    q1, q3 = pairs[len(pairs) // 4], pairs[3 * len(pairs) // 4]
    print(f"model: BERT-style encoder, {args.layers} layers, hidden {args.hidden}, seq {args.seq}; "
          f"{args.reps} reps; --auto-cast {args.auto_cast}; {torch.get_num_threads()} torch threads")
    print(f"eager PyTorch (no_grad)           median {me * 1e3:8.2f} ms")
    print(f"neuron_stack fast path (prof off) median {mn * 1e3:8.2f} ms   ratio {mn / me:5.2f}x  (target <= 1.15)")
    print(f"noise: 1-min load average {load0:.1f} -> {load1:.1f} on {os.cpu_count()} CPUs; "
          f"per-pair ratio quartiles {q1:.2f} / {statistics.median(pairs):.2f} / {q3:.2f}")
    # Profiling-on case: the cost-model engineer adds it here (NEURON_RT_INSPECT_ENABLE=1 in a
    # subprocess, ratio of the fast path above and of torch.profiler on eager).


if __name__ == "__main__":
    main()
