"""CPU fallback: a model with ops the NeuronCore cannot run.

The Ranker scores items on the device, keeps the positive scores with a boolean mask (a
data-dependent output shape, which a static-shape NeuronCore graph cannot express) and sorts the
scores (forced to the host with PartitionerConfig(ops_to_partition={"aten::sort"}), as
torch_neuronx allows). The compiler cuts the graph into device subgraphs and CPU islands; every
seam is a host<->device transfer. The printed report lists each fallback with its reason and the
source line, and the outputs still match eager PyTorch. With --fixed the two ops are rewritten into
static-shape equivalents that lower to the device (a top-k with fixed k for the sort, a masked sum
and count for the boolean mask): same numbers, no CPU island.
"""
import os

import torch
from common import check, explain, finish, parser
from models import Ranker

import neuron_stack


class StaticRanker(Ranker):
    """The Ranker with its two CPU fallbacks rewritten into device-friendly ops (same weights, same numbers)."""

    def forward(self, x):
        s = self.score(x)
        ranked = s.topk(s.shape[-1], dim=-1).values               # fixed k: sorted descending, on the device
        keep = s > 0                                              # a mask, not a mask *selection*: static shape
        gate = torch.sigmoid(torch.where(keep, s, 0.0).sum() / (keep.sum() + 1))
        return self.mix(ranked) * gate


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--fixed", action="store_true",
                   help="rewrite sort -> topk(k) and s[s > 0] -> a masked sum: no CPU fallback")
    args = p.parse_args()
    explain(__doc__)
    torch.manual_seed(0)
    d, items, batch = (16, 8, 2) if args.small else (256, 64, 32)
    model = (StaticRanker if args.fixed else Ranker)(d, items).eval()
    x = torch.randn(batch, d)
    report = neuron_stack.analyze(model, x)
    print(f"operator support: {report['support_percentage']}")
    cfg = neuron_stack.PartitionerConfig(ops_to_partition={"aten::sort"})
    nm = neuron_stack.trace(model, x, partitioner_config=cfg, compiler_args=f"--auto-cast {args.auto_cast}",
                            target=args.target)
    prog = nm.neff.program
    if not any(n.is_compute and n.placement == "cpu_fallback" for n in prog.nodes):
        print("  no CPU fallback: every op runs on the NeuronCore")
    for n in prog.nodes:
        if n.is_compute and n.placement == "cpu_fallback":
            where = f"{os.path.basename(n.source.file)}:{n.source.line}" if n.source else "?"
            print(f"  CPU fallback {n.target} at {where}: {n.fallback_reason}")
    kinds = [p.kind for p in prog.partitions]
    seams = sum(len(p.transfers) for p in prog.partitions)
    print(f"partitions: {' -> '.join(kinds)} ({seams} host<->device transfers per run)")
    y = nm(x)
    # the rewrite must keep the numbers: compare with the original Ranker in eager PyTorch (same weights)
    original = Ranker(d, items).eval()
    original.load_state_dict(model.state_dict())
    with torch.no_grad():
        finish(check("fallback", y, original(x), args.auto_cast))


if __name__ == "__main__":
    main()
