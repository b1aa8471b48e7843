"""Data-parallel inference over every NeuronCore of one Neuron device (torch_neuronx.DataParallel style).

Compiles a small MLP classifier for one per-core batch, wraps it in ``DataParallel`` over the
cores of device 0 (2 on trn1/inf2, 4 on trn2), runs a few batches, checks the outputs against
eager PyTorch and prints the projected throughput against one core.

    python sample_workloads/data_parallel.py [--small] [--target trn1] [--cores N]
    NEURON_RT_INSPECT_ENABLE=1 NEURON_RT_INSPECT_DEVICE_PROFILE=session \\
        python sample_workloads/data_parallel.py --small   # with a profile
"""
import argparse
import sys

import torch
from common import check

import neuron_stack
from neuron_stack.device import clock
from neuron_stack.parallel import DataParallel
from neuron_stack.runtime.cores import get_instance


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny model and few iterations (tests)")
    ap.add_argument("--target", default="trn1", choices=["trn1", "inf2", "trn2"])
    ap.add_argument("--cores", type=int, default=None, help="cores to use (default: all cores of device 0)")
    ap.add_argument("--iterations", type=int, default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    width, per_core, iters = (64, 4, 3) if args.small else (1024, 32, 20)
    iters = args.iterations or iters
    model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                torch.nn.Linear(2 * width, width), torch.nn.GELU(), torch.nn.Linear(width, 10)).eval()
    n = args.cores or get_instance(args.target).cores_per_chip
    nm = neuron_stack.trace(model, torch.randn(per_core, width), target=args.target)
    dp = DataParallel(nm, device_ids=list(range(n)))
    x = torch.randn(per_core * n, width)

    nm(x[:per_core]), dp(x)  # warm-up: first executions pay one-time host setup, as on hardware
    t0 = clock.now_ns()
    for _ in range(iters):
        y = nm(x[:per_core])
    one_core = (clock.now_ns() - t0) / iters
    t0 = clock.now_ns()
    for _ in range(iters):
        y = dp(x)
    many = (clock.now_ns() - t0) / iters
    with torch.no_grad():
        ref = model(x)
    print(f"cores: {dp.device_ids}  batch: {x.shape[0]} ({per_core} per core)")
    print(f"projected latency: 1 core {one_core / 1e3:.1f} us per {per_core} samples, "
          f"{n} cores {many / 1e3:.1f} us per {x.shape[0]} samples")
    print(f"projected throughput speed-up: {per_core * n / many / (per_core / one_core):.2f}x over 1 core")
    return 0 if check("data parallel", y, ref) else 1


if __name__ == "__main__":
    sys.exit(main())
