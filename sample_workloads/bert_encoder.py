"""A BERT-style encoder (written in this repo) through neuron_stack.trace.

Token and position embeddings (GpSimd gathers), bidirectional multi-head self-attention (TensorE
matmuls, a Vector/Scalar softmax), post-norm LayerNorms and GELU feed-forward layers. Attention is
a helper function in models.py, so its ops point at that file's lines. With --auto-cast matmult the
matmuls take bf16 inputs with fp32 accumulation and the output stays within 1e-2 relative norm.
"""
import torch
from common import check, explain, finish, parser
from models import BertEncoder

import neuron_stack


def main() -> None:
    args = parser(__doc__).parse_args()
    explain(__doc__)
    torch.manual_seed(0)
    cfg = dict(vocab=100, hidden=32, layers=2, heads=2, seq=16) if args.small else \
        dict(vocab=30522, hidden=256, layers=4, heads=4, seq=128)
    model = BertEncoder(**cfg).eval()
    ids = torch.randint(0, cfg["vocab"], (2, cfg["seq"]))
    nm = neuron_stack.trace(model, ids, compiler_args=f"--auto-cast {args.auto_cast}", target=args.target)
    y = nm(ids)
    with torch.no_grad():
        finish(check("bert_encoder", y, model(ids), args.auto_cast))


if __name__ == "__main__":
    main()
