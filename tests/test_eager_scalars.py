"""Eager value scalars are NEFF inputs: an optimizer step whose step size, bias corrections or learning
rate change every step runs the NEFFs compiled on its first step, with CPU eager's numbers."""
from __future__ import annotations

import pytest
import torch

import neuron_stack  # noqa: F401
from neuron_stack.eager import dispatch


@pytest.fixture(autouse=True)
def _cache(compile_cache):
    yield


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.AdamW(p, lr=1e-2),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.01),
], ids=["adamw", "sgd-momentum", "adam-wd"])
def test_optimizer_steps_with_a_scheduler_compile_nothing_after_the_first_steps_and_equal_cpu(make):
    torch.manual_seed(0)
    ref = _mlp()
    dev = _mlp()
    dev.load_state_dict(ref.state_dict())
    dev.to("neuron")
    runs = []
    for model in (dev, ref):
        opt = make(model.parameters())
        runs.append((model, opt, torch.optim.lr_scheduler.ExponentialLR(opt, 0.8)))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    compiled = []
    for _ in range(10):
        for model, opt, sched in runs:
            on = next(model.parameters()).device
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(on)), y.to(on)).backward()
            opt.step()
            sched.step()
        compiled.append(dispatch.stats()["compiled_ops"])
    # step 1 creates the state (SGD's momentum buffer is first used at step 2); after that nothing compiles
    assert compiled[2:] == [compiled[1]] * 8, compiled
    for p, q in zip(dev.parameters(), ref.parameters()):
        assert torch.equal(p.cpu(), q), (p.cpu() - q).abs().max()


def test_lifted_scalars_round_as_cpu_and_structural_ones_stay_in_the_signature():
    torch.manual_seed(1)
    a, b, c = torch.randn(3, 64)
    c = c.abs() + 0.1
    da, db, dc = (t.to("neuron") for t in (a, b, c))
    ops = [lambda a, b, c, v: a * v, lambda a, b, c, v: a / v, lambda a, b, c, v: a.addcdiv(b, c, value=-v),
           lambda a, b, c, v: a.addcmul(b, c, value=v), lambda a, b, c, v: a.add(b, alpha=v),
           lambda a, b, c, v: a.sub(b, alpha=v), lambda a, b, c, v: a.lerp(b, v)]
    for f in ops:
        f(da, db, dc, 0.25)                        # compiled once ...
    before = dispatch.stats()["compiled_ops"]
    for v in (0.0123456789, -3.5, 0.7):
        for f in ops:                              # ... and run with any value, bit for bit as on the CPU
            assert torch.equal(f(da, db, dc, v).cpu(), f(a, b, c, v))
    assert dispatch.stats()["compiled_ops"] == before
    # an exponent and a half-precision scalar are part of what is compiled
    assert torch.equal(da.pow(2.0).cpu(), a.pow(2.0)) and torch.equal(da.pow(3.0).cpu(), a.pow(3.0))
    h, dh = a.half(), da.half()
    assert torch.equal((dh * 0.1).cpu(), h * 0.1) and torch.equal((dh * 0.3).cpu(), h * 0.3)
    assert dispatch.stats()["compiled_ops"] >= before + 4
