"""A tensor-parallel decoder block over 2 or 8 NeuronCores (Megatron-style sharding).

Attention heads and the MLP's hidden features are split over the cores: Q/K/V and the first MLP
layer are column-parallel, the attention output projection and the second MLP layer are
row-parallel, and each half of the block ends in one all-reduce (a ring over the cores,
recorded as cc-engine instructions). Two micro-batches let the all-reduce of one overlap the
compute of the other. The output is checked against the eager block.

    python sample_workloads/tensor_parallel.py [--small] [--tp 2|8] [--target trn1]
    NEURON_RT_INSPECT_ENABLE=1 NEURON_RT_INSPECT_DEVICE_PROFILE=session \\
        python sample_workloads/tensor_parallel.py --small --tp 8
"""
import argparse
import math
import sys

import torch
from common import check
from torch import nn

from neuron_stack.parallel import Stage, TensorParallel, column_parallel, row_parallel


class Block(nn.Module):
    """A pre-norm decoder block: causal self-attention and a GELU MLP, each with a residual."""

    def __init__(self, d: int, heads: int, seq: int):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("mask", torch.full((seq, seq), -1e9).triu(1))

    def attend(self, h, q, k, v, o, heads):
        b, t, _ = h.shape
        split = lambda z: z(h).view(b, t, heads, self.hd).transpose(1, 2)  # noqa: E731
        att = (split(q) @ split(k).transpose(-2, -1)) / math.sqrt(self.hd) + self.mask[:t, :t]
        y = (att.softmax(-1) @ split(v)).transpose(1, 2).reshape(b, t, heads * self.hd)
        return o(y)

    def forward(self, x):
        x = x + self.attend(self.ln1(x), self.q, self.k, self.v, self.o, self.heads)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class AttentionShard(nn.Module):
    """One core's heads: LayerNorm (replicated), its Q/K/V columns, its rows of the output projection."""

    def __init__(self, block: Block, i: int, n: int):
        super().__init__()
        self.block_ln, self.heads, self.hd = block.ln1, block.heads // n, block.hd
        self.q, self.k, self.v = (column_parallel(lin, n)[i] for lin in (block.q, block.k, block.v))
        self.o = row_parallel(block.o, n)[i]
        self.register_buffer("mask", block.mask.clone())
        self._attend = Block.attend

    def forward(self, x):
        return self._attend(self, self.block_ln(x), self.q, self.k, self.v, self.o, self.heads)


class MLPShard(nn.Module):
    """One core's slice of the MLP hidden features: column-parallel fc1, row-parallel fc2."""

    def __init__(self, block: Block, i: int, n: int):
        super().__init__()
        self.ln = block.ln2
        self.fc1, self.fc2 = column_parallel(block.fc1, n)[i], row_parallel(block.fc2, n)[i]

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


def shard(block: Block, n: int) -> list[Stage]:
    """The block as two tensor-parallel stages, each ending in an all-reduce + bias + residual."""
    return [
        Stage("attention", [AttentionShard(block, i, n) for i in range(n)], "all_reduce",
              combine=lambda inp, s: inp[0] + s + block.o.bias),
        Stage("mlp", [MLPShard(block, i, n) for i in range(n)], "all_reduce",
              combine=lambda inp, s: inp[0] + s + block.fc2.bias),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny block (tests)")
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel degree: cores to shard over")
    ap.add_argument("--target", default="trn1", choices=["trn1", "inf2", "trn2"])
    ap.add_argument("--micro-batches", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    d, heads, seq, batch = (64, 8, 16, 2) if args.small else (512, 16, 128, 4)
    if heads % args.tp:
        print(f"tensor_parallel: error: {heads} heads do not split over --tp {args.tp}: use a divisor of {heads}",
              file=sys.stderr)
        return 2
    block = Block(d, heads, seq).eval()
    x = torch.randn(batch, seq, d)
    tp = TensorParallel(shard(block, args.tp), cores=list(range(args.tp)), target=args.target,
                        micro_batches=args.micro_batches)
    y = tp(x)
    with torch.no_grad():
        ref = block(x)
    r = tp.report
    busiest = max(r.compute_ns.values())
    print(f"tensor parallel over cores {tp.cores}: projected block latency {r.makespan_ns / 1e3:.1f} us")
    print(f"per-core compute {busiest / 1e3:.1f} us, all-reduce {r.collective_ns / 1e3:.1f} us "
          f"({len(r.collectives)} collectives, busbw {r.collectives[-1]['bus_bandwidth']:.1f} GB/s), "
          f"overlap {(busiest + r.collective_ns - r.makespan_ns) / 1e3:.1f} us")
    return 0 if check("tensor parallel", y, ref) else 1


if __name__ == "__main__":
    sys.exit(main())
