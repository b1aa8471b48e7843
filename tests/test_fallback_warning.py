"""A CPU fallback is never silent: ``trace``, ``torch.compile(backend="neuron")`` and the eager ``neuron``
device warn once per compiled graph (per op signature, eager) naming the ops and the user's lines;
``NEURON_CPU_FALLBACK_WARNING=0`` or a ``warnings`` filter silences it; a model without fallback warns nothing.
"""
import os
import warnings

import pytest
import torch

import neuron_stack
from neuron_stack import CPUFallbackWarning

HERE = os.path.basename(__file__)


class Spectral(torch.nn.Module):
    """A linear layer, then an FFT and an SVD: neither has a NeuronCore lowering."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.lin(x)
        f = torch.fft.rfft(h, dim=-1).abs()  # line FFT
        s = torch.linalg.svdvals(h)  # line SVD
        return f.sum(-1) + s.sum(-1)


def _line(tag: str) -> int:
    with open(__file__) as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# line {tag}"))


def fallback_warnings(fn):
    """Run ``fn`` with every warning recorded; return (its result, the CPUFallbackWarnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [w for w in caught if issubclass(w.category, CPUFallbackWarning)]


@pytest.fixture()
def model():
    torch.manual_seed(0)
    return Spectral().eval(), torch.randn(4, 16)


def test_trace_warns_once_naming_ops_lines_and_share(model, monkeypatch):
    monkeypatch.delenv("NEURON_CPU_FALLBACK_WARNING", raising=False)
    m, x = model
    nm, ws = fallback_warnings(lambda: neuron_stack.trace(m, x))
    assert len(ws) == 1
    text = str(ws[0].message)
    assert "2 of " in text and "ops run on the host CPU" in text
    assert f"{HERE}:{_line('FFT')}  f = torch.fft.rfft(h, dim=-1).abs()\n      aten._fft_r2c.default: FFT" in text
    assert f"{HERE}:{_line('SVD')}  s = torch.linalg.svdvals(h)\n      aten._linalg_svd.default: SVD" in text
    assert "estimated by the cost model" in text and "of each run is off the NeuronCore" in text
    assert ws[0].filename == __file__        # attributed to the trace call, the user's line
    _, ws = fallback_warnings(lambda: [nm(x) for _ in range(3)])
    assert ws == []                          # compile time, not per execution
    _, ws = fallback_warnings(lambda: neuron_stack.trace(m, x))
    assert len(ws) == 1                      # a cache hit is still a model that falls back


def test_switches_silence_it(model, monkeypatch):
    m, x = model
    monkeypatch.setenv("NEURON_CPU_FALLBACK_WARNING", "0")
    _, ws = fallback_warnings(lambda: neuron_stack.trace(m, x))
    assert ws == []
    monkeypatch.delenv("NEURON_CPU_FALLBACK_WARNING")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=neuron_stack.CPUFallbackWarning)
        neuron_stack.trace(m, x)
    assert not [w for w in caught if issubclass(w.category, CPUFallbackWarning)]


def test_no_fallback_no_warning():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    _, ws = fallback_warnings(lambda: neuron_stack.trace(m, torch.randn(2, 8)))
    assert ws == []


def test_torch_compile_warns_once_per_graph(model, monkeypatch):
    monkeypatch.delenv("NEURON_CPU_FALLBACK_WARNING", raising=False)
    torch._dynamo.reset()
    m, x = model
    f = torch.compile(m, backend="neuron")
    with torch.no_grad():
        _, ws = fallback_warnings(lambda: [f(x) for _ in range(3)])
    assert len(ws) == 1
    text = str(ws[0].message)
    assert "Spectral.forward_inference" in text
    assert f"{HERE}:{_line('FFT')}" in text and f"{HERE}:{_line('SVD')}" in text


def test_eager_device_warns_once_per_op_signature(monkeypatch):
    monkeypatch.delenv("NEURON_CPU_FALLBACK_WARNING", raising=False)
    xd = torch.randn(4, 16).to("neuron")

    def run():
        for _ in range(3):
            torch.fft.rfft(xd, dim=-1)  # line EAGER
        return torch.relu(xd)

    _, ws = fallback_warnings(run)
    assert len(ws) == 1
    assert f"{HERE}:{_line('EAGER')}  torch.fft.rfft(xd, dim=-1)\n      aten._fft_r2c.default" in str(ws[0].message)
    assert "no part of this graph runs on the NeuronCore" in str(ws[0].message)


def test_error_filter_makes_a_fallback_fail(model, monkeypatch):
    monkeypatch.delenv("NEURON_CPU_FALLBACK_WARNING", raising=False)
    m, x = model
    xd = torch.randn(3, 8).to("neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CPUFallbackWarning)
        with pytest.raises(CPUFallbackWarning, match="aten._fft_r2c.default"):
            neuron_stack.trace(m, x)
        with pytest.raises(CPUFallbackWarning, match="aten._fft_c2c.default"):
            torch.fft.fft(xd.to(torch.complex64))
