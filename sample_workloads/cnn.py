"""A small CNN (convolution, batch norm, pooling) through neuron_stack.trace.

Convolutions lower to TensorE matmuls over im2col tiles, batch norm (inference) and pooling to the
Vector engine, ReLU to Scalar-engine epilogues. The compiled model's logits are compared with eager
PyTorch; the compile log (printed with --verbose) shows every lowering and fusion decision.
"""
import torch
from common import check, explain, finish, parser
from models import CNN

import neuron_stack


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--verbose", action="store_true", help="print the compile log")
    args = p.parse_args()
    explain(__doc__)
    torch.manual_seed(0)
    batch, size, width = (2, 16, 8) if args.small else (16, 64, 32)
    model = CNN(10, width).eval()
    x = torch.randn(batch, 3, size, size)
    nm = neuron_stack.trace(model, x, compiler_args=f"--auto-cast {args.auto_cast}", target=args.target)
    if args.verbose:
        print(nm.compile_log)
    y = nm(x)
    with torch.no_grad():
        finish(check("cnn", y, model(x), args.auto_cast))


if __name__ == "__main__":
    main()
