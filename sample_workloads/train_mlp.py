"""Training through torch.compile(backend="neuron").

An MLP classifier is trained with AdamW. Dynamo captures the model; aot_autograd splits it into a
forward and a backward graph, both compiled to NEFFs and run on the simulated NeuronCore, while the
optimizer step stays in eager PyTorch. An identical eager copy of the model is trained side by side
on the same batches, and the losses and final weights must agree.
"""
import copy

import torch
import torch.nn.functional as F
from common import check, explain, finish, parser
from models import MLP


def main() -> None:
    args = parser(__doc__).parse_args()
    explain(__doc__)
    torch.manual_seed(0)
    d_in, hidden, steps, batch = (16, 32, 3, 8) if args.small else (128, 512, 30, 64)
    model = MLP(d_in, hidden, 10)
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron",
                             options={"compiler_args": f"--auto-cast {args.auto_cast} --target {args.target}"})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    losses, losses_e = [], []
    for step in range(steps):
        x = torch.randn(batch, d_in, generator=gen)
        y = torch.randint(0, 10, (batch,), generator=gen)
        for m, o, out in ((compiled, opt, losses), (eager, opt_e, losses_e)):
            loss = F.nll_loss(m(x), y)
            o.zero_grad()
            loss.backward()
            o.step()
            out.append(loss.detach())
        print(f"step {step}: loss {losses[-1].item():.4f} (eager {losses_e[-1].item():.4f})")
    ok = check("losses", torch.stack(losses), torch.stack(losses_e), args.auto_cast)
    ok &= check("weights", [p.detach() for p in model.parameters()], [p.detach() for p in eager.parameters()],
                args.auto_cast)
    finish(ok)


if __name__ == "__main__":
    main()
