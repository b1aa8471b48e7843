"""Data-parallel training under torchrun: one NeuronCore per rank, gradients averaged with gloo.

Each rank compiles the model with ``torch.compile(backend="neuron")`` on its own core, trains on
its shard of a synthetic regression set, and averages gradients with
``neuron_stack.runtime.distributed.all_reduce_gradients`` (real gloo data, simulated ring cost).
With ``--device neuron`` the model lives on the ``neuron`` device instead and trains eagerly under
``torch.nn.parallel.DistributedDataParallel`` in a job started with ``init_process_group("neuron")``, whose
all-reduces go through the ``neuron`` backend (the same gloo data and simulated ring). At the
end, rank 0 checks that the weights equal a single-process eager run on the whole batch.

    torchrun --nproc-per-node 2 sample_workloads/ddp_train.py [--small] [--steps N] [--device neuron]
    NEURON_RT_INSPECT_ENABLE=1 NEURON_RT_INSPECT_DEVICE_PROFILE=session NEURON_RT_INSPECT_OUTPUT_DIR=prof \\
        torchrun --nproc-per-node 2 \\
        sample_workloads/ddp_train.py --small --straggler-rank 1
"""
import argparse
import copy
import sys

import torch

from neuron_stack.device import clock
from neuron_stack.runtime import distributed as nd


def make_model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)   # every rank starts from the same weights
    return torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.Tanh(), torch.nn.Linear(2 * width, 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny model, 3 steps (tests)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--target", default="trn1", choices=["trn1", "inf2", "trn2"],
                    help="with --device cpu (the neuron device takes NEURON_CC_FLAGS --target)")
    ap.add_argument("--straggler-rank", type=int, default=-1, help="this rank does extra host work each step")
    ap.add_argument("--straggler-ms", type=float, default=200.0)
    ap.add_argument("--device", choices=["cpu", "neuron"], default="cpu",
                    help="neuron: the model on the neuron device under DistributedDataParallel")
    args = ap.parse_args()
    width, per_rank, steps = (16, 8, 3) if args.small else (256, 64, 20)
    steps = args.steps or steps
    try:
        if args.device == "neuron":    # the neuron torch.distributed backend binds this rank to its core
            torch.distributed.init_process_group("neuron")
            w = nd.world()
        else:
            w = nd.init(target=args.target)
    except (nd.DistributedError, RuntimeError, ValueError) as exc:
        print(f"ddp_train: error: {exc}", file=sys.stderr)
        return 1
    g = torch.Generator().manual_seed(1)
    X = torch.randn(per_rank * w.world_size, width, generator=g)
    Y = X.sum(1, keepdim=True).tanh()
    mine = slice(w.rank * per_rank, (w.rank + 1) * per_rank)

    model = make_model(width)
    reference = copy.deepcopy(model)
    if args.device == "neuron":
        step = torch.nn.parallel.DistributedDataParallel(model.to("neuron"))   # the default group: neuron
        x, y = X[mine].to("neuron"), Y[mine].to("neuron")
    else:
        step = torch.compile(model, backend="neuron")
        x, y = X[mine], Y[mine]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    try:
        for i in range(steps):
            loss = torch.nn.functional.mse_loss(step(x), y)
            loss.backward()
            if w.rank == args.straggler_rank:
                # a slow data loader on this rank, as projected host time (no real sleep needed)
                clock.advance(real_ns=0, simulated_ns=int(args.straggler_ms * 1e6))
            if args.device == "cpu":     # DDP all-reduced the neuron gradients during backward
                nd.all_reduce_gradients(model)
            opt.step()
            opt.zero_grad()
            # one write per line (print writes the newline separately): ranks sharing torchrun's
            # stdout must not run their lines together
            sys.stdout.write(f"rank {w.rank} (node {w.node}, core {w.core}) step {i} loss {loss.item():.5f}\n")
            sys.stdout.flush()
    except nd.DistributedError as exc:
        print(f"ddp_train: error: {exc}", file=sys.stderr)
        return 1
    finally:
        nd.shutdown()

    if w.rank == 0:   # the same steps on one process over the whole batch, in eager PyTorch
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
        for _ in range(steps):
            torch.nn.functional.mse_loss(reference(X), Y).backward()
            ref_opt.step()
            ref_opt.zero_grad()
        diff = max((a.cpu() - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
        print(f"max weight difference vs single-process eager: {diff:.2e}")
        if diff > 1e-4:
            print("MISMATCH against eager PyTorch", file=sys.stderr)
            return 1
        print("weights match eager PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
