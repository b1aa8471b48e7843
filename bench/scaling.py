"""Scaling benchmark: data- and tensor-parallel throughput over 1..N NeuronCores on the projected clock.

The workload is a small pre-norm transformer decoder block (``sample_workloads/tensor_parallel.py``).

- **Data parallel**: the block compiled for a per-core batch, ``DataParallel`` over n cores with
  n times the batch. Calls on 1 core and on n cores are interleaved (so machine load hits both
  alike) and the speed-up is the median over pairs of ``n * t(1 core) / t(n cores)``, with t the
  projected time of a call: device time plus the measured host time of each execution (input
  checks, runtime work), which runs side by side on the cores. It can never honestly exceed n;
  ``device x`` is the same ratio from device time alone (n when the cores get equal chunks).
- **Tensor parallel**: the block sharded Megatron-style over n cores (two stages, each ending in
  a ring all-reduce; two micro-batches so a collective overlaps the other micro-batch's compute).
  Device-time makespan of one block, speed-up vs 1 core, and the collective share: the CC
  engine's busy time over the makespan, and the part of it not hidden behind compute (exposed).
- **Simulator cost**: the simulator's own wall-clock time per call, per simulated core, relative
  to 1 core (<= ~1 means its cost grows no worse than linearly with the cores).

Usage: ``.venv/bin/python bench/scaling.py [--small] [--target trn1] [--dp-cores 1,2,4,8,32]
[--tp-cores 1,2,4,8] [--reps 20] [--json]``. Cores are reserved in a private runtime directory
(``NEURON_STACK_RUNTIME_DIR``), so other processes on the machine do not block a 32-core run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Private core reservations: a benchmark wants every core of the simulated instance.
os.environ.setdefault("NEURON_STACK_RUNTIME_DIR", tempfile.mkdtemp(prefix="neuron_scaling_cores_"))
for _var in ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES"):
    os.environ.pop(_var, None)

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sample_workloads"))
from tensor_parallel import Block, shard  # noqa: E402

import neuron_stack  # noqa: E402
from neuron_stack.device import clock  # noqa: E402
from neuron_stack.parallel import DataParallel, TensorParallel  # noqa: E402
from neuron_stack.runtime.cores import get_instance  # noqa: E402


def timed_call(fn, x) -> tuple[int, int]:
    """(projected ns, wall ns) of one call."""
    p0, w0 = clock.now_ns(), time.perf_counter_ns()
    fn(x)
    return clock.now_ns() - p0, time.perf_counter_ns() - w0


def data_parallel(block, d: int, seq: int, per_core: int, cores: list[int], reps: int, target: str) -> list[dict]:
    """One row per core count: projected speed-up (median of interleaved pairs), device-only
    speed-up and the simulator's wall cost per simulated core, all vs 1 core."""
    nm = neuron_stack.trace(block, torch.randn(per_core, seq, d), target=target)
    one = DataParallel(nm, device_ids=[0])
    x1 = torch.randn(per_core, seq, d)
    dev1 = nm.model.static_device_ns
    rows = []
    for n in cores:
        dp = one if n == 1 else DataParallel(nm, device_ids=list(range(n)))
        xn = torch.randn(per_core * n, seq, d)
        one(x1), dp(xn)   # warm-up: first executions pay one-time setup
        pairs = []
        for _ in range(reps):
            t1, w1 = timed_call(one, x1)
            tn, wn = timed_call(dp, xn)
            pairs.append((t1, tn, w1, wn))
        devn = max(r.static_device_ns for r in dp.replicas)
        rows.append({
            "cores": n, "batch": per_core * n,
            "t1_us": statistics.median(p[0] for p in pairs) / 1e3,
            "tn_us": statistics.median(p[1] for p in pairs) / 1e3,
            "speedup": statistics.median(n * p[0] / p[1] for p in pairs),
            "device_speedup": n * dev1 / devn,
            "device_us": devn / 1e3,
            "sim_wall_per_core_vs_1": statistics.median(p[3] / n / p[2] for p in pairs),
        })
        if dp is not one:
            dp.release()
    one.release()
    return rows


def tensor_parallel(block, x, cores: list[int], reps: int, target: str) -> list[dict]:
    """One row per degree: device makespan of one block, speed-up vs 1 core, collective shares."""
    rows, base = [], None
    for n in cores:
        tp = TensorParallel(shard(block, n), cores=list(range(n)), target=target, micro_batches=2)
        tp(x)   # compiles the shards (through the cache) and warms up
        spans, walls = [], []
        for _ in range(reps):
            w0 = time.perf_counter_ns()
            tp(x)
            walls.append(time.perf_counter_ns() - w0)
            spans.append(tp.report.makespan_ns)
        r = tp.report
        span = statistics.median(spans)
        busiest = max(r.compute_ns.values())
        wall = statistics.median(walls)
        if base is None:
            base = (span, wall)
        rows.append({
            "cores": n, "makespan_us": span / 1e3, "speedup": base[0] / span,
            "compute_us": busiest / 1e3, "collective_us": r.collective_ns / 1e3,
            "collective_share": r.collective_ns / span if span else 0.0,
            "exposed_collective_share": max(span - busiest, 0) / span if span else 0.0,
            "sim_wall_per_core_vs_1": wall / n / base[1],
        })
        tp.release()
    return rows


def _cores(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of core counts, e.g. 1,2,8") from None
    if not vals or min(vals) < 1 or vals[0] != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give core counts >= 1 starting with 1 (the baseline)")
    return vals


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        self.exit(2, f"scaling: error: {message}; see bench/scaling.py --help\n")


def main() -> int:
    p = _Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="a tiny block (tests)")
    p.add_argument("--target", default="trn1", choices=("trn1", "inf2", "trn2"))
    p.add_argument("--dp-cores", type=_cores, default=[1, 2, 4, 8, 32])
    p.add_argument("--tp-cores", type=_cores, default=[1, 2, 4, 8])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)   # one host thread: the simulator's cost per core is what we measure
    d, heads, seq, per_core = (64, 8, 16, 2) if args.small else (256, 8, 64, 4)
    if any(heads % n for n in args.tp_cores):
        p.error(f"--tp-cores: every degree must divide the block's {heads} heads")
    block = Block(d, heads, seq).eval()
    have = get_instance(args.target).num_cores
    if max(args.dp_cores + args.tp_cores) > have:
        p.error(f"{get_instance(args.target).instance_type} has {have} NeuronCores: ask for at most {have}")
    dp = data_parallel(block, d, seq, per_core, args.dp_cores, args.reps, args.target)
    tp = tensor_parallel(block, torch.randn(per_core, seq, d), args.tp_cores, args.reps, args.target)
    result = {"target": args.target, "block": {"d_model": d, "heads": heads, "seq": seq, "per_core_batch": per_core},
              "load_average": os.getloadavg()[0], "data_parallel": dp, "tensor_parallel": tp}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"decoder block d={d} heads={heads} seq={seq} on {args.target}; load average {result['load_average']:.1f}")
    print("\nData parallel (per-core batch %d; medians of %d interleaved pairs)" % (per_core, args.reps))
    print(f"{'cores':>5} {'batch':>5} {'1-core us':>10} {'n-core us':>10} {'speed-up':>9} {'device x':>9} "
          f"{'sim wall/core':>14}")
    for r in dp:
        print(f"{r['cores']:>5} {r['batch']:>5} {r['t1_us']:>10.1f} {r['tn_us']:>10.1f} {r['speedup']:>8.2f}x "
              f"{r['device_speedup']:>8.2f}x {r['sim_wall_per_core_vs_1']:>13.2f}x")
    print("\nTensor parallel (one block, batch %d, 2 micro-batches; device time)" % per_core)
    print(f"{'cores':>5} {'makespan us':>12} {'speed-up':>9} {'compute us':>11} {'all-reduce us':>14} "
          f"{'cc share':>9} {'exposed':>8} {'sim wall/core':>14}")
    for r in tp:
        print(f"{r['cores']:>5} {r['makespan_us']:>12.1f} {r['speedup']:>8.2f}x {r['compute_us']:>11.1f} "
              f"{r['collective_us']:>14.1f} {r['collective_share']:>8.1%} {r['exposed_collective_share']:>8.1%} "
              f"{r['sim_wall_per_core_vs_1']:>13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
