"""Eager vs compiled on the ``neuron`` device: the same small MLP trained on ``neuron`` tensors, op by op
(eager: every op a cached one-op NEFF, every transfer over PCIe) or with ``torch.compile`` (one forward and
one backward NEFF), checked against CPU PyTorch at the end.

    python sample_workloads/eager_device.py [--small] [--mode eager|compile]
    neuron-explorer inspect -o out_eager -- python sample_workloads/eager_device.py --small --mode eager
    neuron-explorer inspect -o out_compile -- python sample_workloads/eager_device.py --small --mode compile
    neuron-explorer diff out_eager/*/profile.duckdb out_compile/*/profile.duckdb
"""
import argparse
import copy
import sys

import torch

import neuron_stack  # noqa: F401  (the neuron device; `import torch` alone registers it too)
from neuron_stack.eager.dispatch import stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny model, 3 steps (tests)")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    args = ap.parse_args()
    width, batch, steps = (16, 8, 3) if args.small else (256, 64, 10)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(), torch.nn.Linear(2 * width, 1))
    reference = copy.deepcopy(model)
    X, Y = torch.randn(batch, width), torch.randn(batch, 1)

    model.to("neuron")
    x, y = X.to("neuron"), Y.to("neuron")
    step = torch.compile(model) if args.mode == "compile" else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(steps):
        loss = torch.nn.functional.mse_loss(step(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.neuron.synchronize()
        print(f"step {i} loss {loss.item():.5f}")

    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    for _ in range(steps):
        torch.nn.functional.mse_loss(reference(X), Y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    diff = max((a.cpu() - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
    s = stats()
    print(f"{args.mode}: {s['executions']} eager executions of {s['compiled_ops']} compiled ops, "
          f"{s['host_ops']} on the host, {s['transfers']} transfers ({s['transfer_bytes']} B, "
          f"{s['transfer_ns'] / 1e3:.1f} us PCIe), device {s['device_ns'] / 1e3:.1f} us, "
          f"host dispatch {s['dispatch_ns'] / 1e6:.1f} ms")
    print(f"max weight difference vs CPU: {diff:.2e}")
    if diff > 1e-4:
        print("MISMATCH against CPU PyTorch", file=sys.stderr)
        return 1
    print("weights match CPU PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
