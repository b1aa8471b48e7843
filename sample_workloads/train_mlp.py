"""Training through torch.compile(backend="neuron").

An MLP classifier is trained with AdamW. Dynamo captures the model; aot_autograd splits it into a
forward and a backward graph, both compiled to NEFFs and run on the simulated NeuronCore, while the
optimizer step stays in eager PyTorch. An identical eager copy of the model is trained side by side
on the same batches. Three checks: the losses of every step (compiled forward graph, element-wise);
the gradients of every step against eager PyTorch's on the same weights (compiled backward graph,
element-wise); the final weights, per tensor by relative norm error. Weights are not compared
element-wise: AdamW moves a weight by lr * m / (sqrt(v) + eps), which is steep where a gradient is
near eps (1e-8), so a 1e-9 difference from summing in another order moves such a weight by up to 5e-5
whatever the gradient's correctness; on a weight near zero that is a large relative error.
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
    losses, losses_e, grads, grads_ref = [], [], [], []
    for step in range(steps):
        x = torch.randn(batch, d_in, generator=gen)
        y = torch.randint(0, 10, (batch,), generator=gen)
        grads_ref.append(reference_grads(eager, model, x, y))   # before the step changes the weights
        for m, o, out in ((compiled, opt, losses), (eager, opt_e, losses_e)):
            loss = F.nll_loss(m(x), y)
            o.zero_grad()
            loss.backward()
            if m is compiled:
                grads.append([p.grad.clone() for p in model.parameters()])
            o.step()
            out.append(loss.detach())
        print(f"step {step}: loss {losses[-1].item():.4f} (eager {losses_e[-1].item():.4f})")
    ok = check("losses", torch.stack(losses), torch.stack(losses_e), args.auto_cast)
    ok &= check("gradients", grads, grads_ref, args.auto_cast)
    ok &= check("weights", [p.detach() for p in model.parameters()], [p.detach() for p in eager.parameters()],
                args.auto_cast, measure="norm")
    finish(ok)


def reference_grads(eager: torch.nn.Module, model: torch.nn.Module, x, y) -> list[torch.Tensor]:
    """Eager PyTorch's gradients at ``model``'s current weights (the side-by-side copy's drift apart by
    rounding, so comparing the compiled backward graph with them would mix in the optimizer)."""
    params = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
    loss = F.nll_loss(torch.func.functional_call(eager, params, (x,)), y)
    return list(torch.autograd.grad(loss, list(params.values())))


if __name__ == "__main__":
    main()
