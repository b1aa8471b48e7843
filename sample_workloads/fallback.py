"""CPU fallback: a model with ops the NeuronCore cannot run.

The Ranker scores items on the device, keeps the positive scores with a boolean mask (a
data-dependent output shape, which a static-shape NeuronCore graph cannot express) and sorts the
scores (forced to the host with PartitionerConfig(ops_to_partition={"aten::sort"}), as
torch_neuronx allows). The compiler cuts the graph into device subgraphs and CPU islands; every
seam is a host<->device transfer. The printed report lists each fallback with its reason and the
source line, and the outputs still match eager PyTorch.
"""
import os

import torch

import neuron_stack
from common import check, explain, finish, parser
from models import Ranker


def main() -> None:
    args = parser(__doc__).parse_args()
    explain(__doc__.split("\n\n", 1)[1])
    torch.manual_seed(0)
    d, items, batch = (16, 8, 2) if args.small else (256, 64, 32)
    model = Ranker(d, items).eval()
    x = torch.randn(batch, d)
    report = neuron_stack.analyze(model, x)
    print(f"operator support: {report['support_percentage']}")
    cfg = neuron_stack.PartitionerConfig(ops_to_partition={"aten::sort"})
    nm = neuron_stack.trace(model, x, partitioner_config=cfg, compiler_args=f"--auto-cast {args.auto_cast}",
                            target=args.target)
    prog = nm.neff.program
    for n in prog.nodes:
        if n.is_compute and n.placement == "cpu_fallback":
            where = f"{os.path.basename(n.source.file)}:{n.source.line}" if n.source else "?"
            print(f"  CPU fallback {n.target} at {where}: {n.fallback_reason}")
    kinds = [p["kind"] for p in prog.partitions]
    seams = sum(len(p["transfers"]) for p in prog.partitions)
    print(f"partitions: {' -> '.join(kinds)} ({seams} host<->device transfers per run)")
    y = nm(x)
    with torch.no_grad():
        finish(check("fallback", y, model(x), args.auto_cast))


if __name__ == "__main__":
    main()
