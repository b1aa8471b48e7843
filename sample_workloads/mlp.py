"""MLP inference through neuron_stack.trace.

A three-layer perceptron is captured with torch.export, compiled ahead of time into a NEFF for a
simulated NeuronCore (the linear layers become TensorE matmuls, ReLU/GELU are fused into them as
epilogues) and run by the runtime. The outputs are compared with eager PyTorch. Run it under
`neuron-explorer inspect -- python sample_workloads/mlp.py` to get a profile with one row per
device instruction.
"""
import torch
from common import check, explain, finish, parser
from models import MLP

import neuron_stack


def main() -> None:
    args = parser(__doc__).parse_args()
    explain(__doc__)
    torch.manual_seed(0)
    batch, d_in, hidden = (4, 32, 64) if args.small else (64, 256, 1024)
    model = MLP(d_in, hidden, 10).eval()
    x = torch.randn(batch, d_in)
    nm = neuron_stack.trace(model, x, compiler_args=f"--auto-cast {args.auto_cast}", target=args.target)
    for _ in range(3 if args.small else 20):
        y = nm(x)
    with torch.no_grad():
        ok = check("mlp", y, model(x), args.auto_cast)
    print(f"compiled {nm.neff.header['name']} for {nm.neff.target} (cache hit: {nm.cache_hit}), "
          f"ran on NeuronCore {nm.model.core}")
    finish(ok)


if __name__ == "__main__":
    main()
