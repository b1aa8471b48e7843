"""A GPT-style decoder (written in this repo) with causal attention through neuron_stack.trace.

Pre-norm transformer blocks with a causal mask built from triu on the device, tanh-GELU MLPs and an
LM head tied to the token embedding. The logits for every position are compared with eager
PyTorch, and the greedy next token of each sequence must agree.
"""
import torch
from common import check, explain, finish, parser
from models import GPTDecoder

import neuron_stack


def main() -> None:
    args = parser(__doc__).parse_args()
    explain(__doc__)
    torch.manual_seed(0)
    cfg = dict(vocab=100, hidden=32, layers=2, heads=2, seq=16) if args.small else \
        dict(vocab=8000, hidden=256, layers=4, heads=4, seq=128)
    model = GPTDecoder(**cfg).eval()
    ids = torch.randint(0, cfg["vocab"], (2, cfg["seq"]))
    nm = neuron_stack.trace(model, ids, compiler_args=f"--auto-cast {args.auto_cast}", target=args.target)
    logits = nm(ids)
    with torch.no_grad():
        ref = model(ids)
    ok = check("gpt_decoder", logits, ref, args.auto_cast)
    same_next = bool((logits[:, -1].argmax(-1) == ref[:, -1].argmax(-1)).all())
    print(f"greedy next tokens agree: {same_next}")
    finish(ok and (same_next or args.auto_cast != "none"))


if __name__ == "__main__":
    main()
