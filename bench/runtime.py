"""Runtime benchmark: steady-state latency of the fast path (profiling off) vs eager PyTorch.

Same model, same inputs, same process, interleaved repetitions; prints medians, the ratio
(target <= 1.15) and how noisy the machine was (the load average and the spread of the per-pair
ratios). With ``--auto-cast matmult`` the compiled model also rounds every matmul activation to
bf16 (the weights once, at load), work eager fp32 does not do.
Then (``--no-profiling`` skips it) the profiling-on case: per-instruction profiling
(``NEURON_RT_INSPECT_ENABLE=1``) vs eager (target <= 1.5) beside torch.profiler(with_stack=True),
and instruction rows recorded per second.
``--write`` puts everything it printed into docs/runtime.md and docs/cost_model.md between their
``written by bench/runtime.py`` markers (on a quiet machine).

Usage: ``.venv/bin/python bench/runtime.py [--layers 4 --reps 30 --auto-cast matmult --threads 1] [--write]``.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_workloads"))
from _docs import conditions, write_block  # noqa: E402
from models import BertEncoder  # noqa: E402

import neuron_stack  # noqa: E402


def timed(fn, x) -> float:
    t0 = time.perf_counter()
    fn(x)
    return time.perf_counter() - t0


def build(args):
    """(input ids, traced module, eager no-grad call) of ``args``' BERT-style encoder, seeded, with
    ``--threads`` applied and a fresh compile cache (the profiling child reads its parent's: the same model,
    compiled once; it times executions, not the compile). Example: ``ids, nm, eager = build(args)``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.profiling_child:
        os.environ["NEURON_COMPILE_CACHE_URL"] = tempfile.mkdtemp(prefix="bench-cache-")
    torch.manual_seed(0)
    model = BertEncoder(vocab=30522, hidden=args.hidden, layers=args.layers, heads=12, seq=args.seq).eval()
    ids = torch.randint(0, 30522, (1, args.seq))
    nm = neuron_stack.trace(model, ids, compiler_args=f"--auto-cast {args.auto_cast}")

    def eager(x):
        with torch.no_grad():
            return model(x)

    return ids, nm, eager


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--auto-cast", dest="auto_cast", choices=("none", "matmult", "all"), default="none")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0: torch's default); 1 is far less noisy on a busy machine")
    p.add_argument("--no-profiling", action="store_true", help="skip the profiling-on case")
    p.add_argument("--write", action="store_true", help="write what it prints into docs/runtime.md and "
                                                        "docs/cost_model.md")
    p.add_argument("--profiling-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.profiling_child:
        return _profiling_child(args)
    os.environ.pop("NEURON_RT_INSPECT_ENABLE", None)
    ids, nm, eager = build(args)
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
    lines = [f"model: BERT-style encoder, {args.layers} layers, hidden {args.hidden}, seq {args.seq}; "
             f"{args.reps} reps; --auto-cast {args.auto_cast}; {torch.get_num_threads()} torch threads",
             f"eager PyTorch (no_grad)           median {me * 1e3:8.2f} ms",
             f"neuron_stack fast path (prof off) median {mn * 1e3:8.2f} ms   ratio {mn / me:5.2f}x  (target <= 1.15)",
             f"noise: 1-min load average {load0:.1f} -> {load1:.1f} on {os.cpu_count()} CPUs; "
             f"per-pair ratio quartiles {q1:.2f} / {statistics.median(pairs):.2f} / {q3:.2f}"]
    print("\n".join(lines))
    if not args.no_profiling:
        lines += profiling_case(args).rstrip("\n").split("\n")
    if args.write:
        flags = " ".join(a for a in sys.argv[1:] if a != "--write")
        block = "\n".join([conditions(f"bench/runtime.py {flags} --write".replace("  ", " "),
                                      (load0, os.getloadavg()[0])) + ":", "", "```text", *lines, "```"])
        for page in ("runtime.md", "cost_model.md"):
            write_block(ROOT / "docs" / page, "bench/runtime.py", block)


# ================================================================================================
# Profiling-on case (owner: cost-model engineer). Per-instruction recording is switched on by the
# environment when the runtime session starts, so it runs in a child process with
# NEURON_RT_INSPECT_ENABLE=1; the child times eager PyTorch, our profiled runtime and eager under
# torch.profiler(with_stack=True) on the same model in the same process, in interleaved blocks.
# ================================================================================================

def profiling_case(args) -> str:
    """Run the profiling-on comparison in a child process, print its lines and return them.

    Example: ``.venv/bin/python bench/runtime.py --layers 4 --threads 1`` prints it after the fast path.
    """
    import subprocess

    out_dir = tempfile.mkdtemp(prefix="bench-inspect-")
    env = dict(os.environ, NEURON_RT_INSPECT_ENABLE="1",
               NEURON_RT_INSPECT_DEVICE_PROFILE="session", NEURON_RT_INSPECT_OUTPUT_DIR=out_dir)
    cmd = [sys.executable, __file__, "--profiling-child", "--layers", str(args.layers), "--hidden",
           str(args.hidden), "--seq", str(args.seq), "--reps", str(args.reps), "--auto-cast", args.auto_cast,
           "--threads", str(args.threads)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode:
        sys.stderr.write(r.stderr[-2000:])
        raise SystemExit(f"runtime bench: the profiling-on child failed (exit {r.returncode})")
    return r.stdout


def _profiling_child(args) -> None:
    import shutil

    from torch.profiler import ProfilerActivity, profile

    import traces

    out_dir = os.environ["NEURON_RT_INSPECT_OUTPUT_DIR"]
    ids, nm, eager = build(args)
    for _ in range(3):                       # warm-up (our first execution is recorded as warm-up)
        eager(ids), nm(ids)
    block = 5                                # torch.profiler spans a block; its exit-time processing is not timed
    e, n, tp = [], [], []
    t_ours = 0.0
    for _ in range(max(1, args.reps // block)):
        e += [timed(eager, ids) for _ in range(block)]
        t0 = time.perf_counter()
        n += [timed(nm, ids) for _ in range(block)]
        t_ours += time.perf_counter() - t0
        with profile(activities=[ProfilerActivity.CPU], with_stack=True):
            tp += [timed(eager, ids) for _ in range(block)]
    me, mn, mt = statistics.median(e), statistics.median(n), statistics.median(tp)
    # close the writer (flushes what is buffered) and count the rows that really landed
    from neuron_stack.runtime.session import Session
    for s in list(Session._instances.values()):
        s.close()
    t0 = time.perf_counter()
    db = traces.finalize(out_dir)
    t_fin = time.perf_counter() - t0
    with traces.open(db) as prof:
        rows = prof.sql("SELECT count(*) AS n FROM instructions").column("n")[0].as_py()
        nexec = prof.sql("SELECT count(*) AS n FROM executions").column("n")[0].as_py()
    per_exec = rows // max(1, nexec)
    print(f"\nprofiling on (NEURON_RT_INSPECT_ENABLE=1), same model, {len(n)} reps, "
          f"{torch.get_num_threads()} torch threads:")
    print(f"eager PyTorch (no_grad)                  median {me * 1e3:8.2f} ms")
    print(f"neuron_stack, per-instruction profiling  median {mn * 1e3:8.2f} ms   ratio {mn / me:5.2f}x  "
          "(target <= 1.5)")
    print(f"eager under torch.profiler(with_stack)   median {mt * 1e3:8.2f} ms   ratio {mt / me:5.2f}x  "
          f"(ours {'<=' if mn <= mt else '>'} torch.profiler)")
    print(f"instruction rows: {per_exec} per execution x {nexec} executions = {rows} rows; "
          f"{per_exec * len(n) / t_ours:,.0f} rows/s while executing; finalize {t_fin:.1f} s")
    shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
