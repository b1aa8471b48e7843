"""NKI in a model: a projection + RMSNorm block, the norm either in PyTorch or as the NKI kernel.

``python sample_workloads/nki/rmsnorm_in_model.py [--kernel] [--small]`` compiles the block with
``neuron_stack.trace`` and runs it. Profile both forms and compare them line by line::

    neuron-explorer inspect -o torch_norm -- python sample_workloads/nki/rmsnorm_in_model.py
    neuron-explorer inspect -o nki_norm -- python sample_workloads/nki/rmsnorm_in_model.py --kernel
    neuron-explorer diff torch_norm nki_norm
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rmsnorm import rmsnorm_kernel

import neuron_stack


class Block(torch.nn.Module):
    """Linear, then RMSNorm (eps 1e-6) with a learned scale, then a residual add."""

    def __init__(self, dim: int, use_kernel: bool):
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.use_kernel = use_kernel

    def forward(self, x):
        h = self.proj(x)
        if self.use_kernel:
            n = rmsnorm_kernel(h, self.weight)
        else:
            n = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return x + n


def main(argv=None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    use_kernel = "--kernel" in argv
    rows, dim = (256, 256) if "--small" in argv else (1024, 1024)
    torch.manual_seed(0)
    model = Block(dim, use_kernel).eval()
    reference = Block(dim, use_kernel=False).eval()      # the same weights, the norm in PyTorch, eager
    reference.load_state_dict(model.state_dict())
    x = torch.randn(rows, dim)
    with torch.no_grad():
        eager = reference(x)
        traced = neuron_stack.trace(model, x)
        out = traced(x)
    err = ((out - eager).abs().max() / eager.abs().max()).item()
    ok = err < 1e-4
    form = "NKI kernel" if use_kernel else "PyTorch ops"
    print(f"RMSNorm block with the norm as {form}: {'OK' if ok else 'MISMATCH'} vs eager PyTorch "
          f"(relative error {err:.1e}); simulated device time "
          f"{sum(s.device_ns for s in traced.neff.schedules.values()) / 1e3:.1f} us")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
