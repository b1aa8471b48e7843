"""torch.compile(backend="neuron"): inference and training graphs, recompiles with reasons and user
source lines, and no silent eager fallback at the recompile limit."""
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_workloads"))



def _events_for(name, since=0):
    """The backend's compile events for ``name``, from the ``since``-th on (an earlier test in this process,
    such as a sample's training step, may have compiled a graph of the same name)."""
    from neuron_stack.dynamo import compile_events
    return [e for e in compile_events()[since:] if e["name"].startswith(name)]


def scale_shift(x, w):
    return torch.tanh(x @ w) * 2 + 1


def test_recompile_reason_and_call_site():
    f = torch.compile(scale_shift, backend="neuron")
    w = torch.randn(8, 8)
    for n in (3, 3, 5):
        x = torch.randn(n, 8)
        torch.testing.assert_close(f(x, w), scale_shift(x, w), rtol=1e-4, atol=1e-5)   # call site line
    evs = _events_for("test_frontend_dynamo.scale_shift")
    assert [e["recompile"] for e in evs] == [False, True]
    rec = evs[1]
    assert rec["reason"] == "tensor 'x' dim 0: 3 -> 5"
    assert rec["source"].file == __file__ and "f(x, w)" in rec["source"].code


def test_training_forward_and_backward_graphs():
    from models import MLP

    from neuron_stack.dynamo import compile_events
    since = len(compile_events())
    torch.manual_seed(0)
    m = MLP(8, 16, 3)
    ref = MLP(8, 16, 3)
    ref.load_state_dict(m.state_dict())
    cm = torch.compile(m, backend="neuron")
    x = torch.randn(4, 8)
    cm(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    kinds = {e["kind"] for e in _events_for("MLP.forward", since)}
    assert {"forward", "backward"} <= kinds
    bw = next(e for e in _events_for("MLP.forward", since) if e["kind"] == "backward")
    ops = [n for n in bw["model"].program.nodes if n.is_compute]
    # backward ops are on the backward() line; autograd's record gives the forward line each came from
    assert {(os.path.basename(n.source.file), n.source.code) for n in ops} == \
        {("test_frontend_dynamo.py", "cm(x).sum().backward()")}
    assert "models.py" in {os.path.basename(n.fwd_source.file) for n in ops if n.fwd_source}


def test_a_compiled_model_of_torch_code_only_takes_the_call_line_as_eager_does():
    # nn.Sequential's forward is torch's: no node's stack_trace has a user frame, so every op gets the
    # user's call of the compiled model (what eager gives it), and its backward ops that as forward line
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
    cm = torch.compile(m, backend="neuron")
    loss = cm(torch.randn(2, 8)).sum()
    loss.backward()
    from neuron_stack.dynamo import compile_events
    fw, bw = ([n for n in e["model"].program.nodes if n.is_compute] for e in compile_events()[-2:])
    assert {n.source.code for n in fw} == {"loss = cm(torch.randn(2, 8)).sum()"}
    assert {n.module_path for n in fw if n.target == "aten.addmm.default"} == {"0"}
    assert {n.source.code for n in bw} == {"loss.backward()"}
    assert {n.fwd_source.code for n in bw} == {"loss = cm(torch.randn(2, 8)).sum()"}


def test_recompile_limit_is_not_silent_eager():
    import torch._dynamo
    f = torch.compile(lambda x: x * 3, backend="neuron")
    old = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 2
    try:
        f(torch.randn(1))
        f(torch.randn(2))
        with pytest.raises(Exception, match="recompile_limit|FailOnRecompileLimitHit|fail_on_recompile_limit_hit"):
            f(torch.randn(3))
    finally:
        torch._dynamo.config.recompile_limit = old
