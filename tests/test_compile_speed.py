"""Compile time users do not wait for (issue 20): a cache hit runs no pass and reads no weights,
each pass is timed in the compile log, a clean compile warns nothing, a second process hits."""
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import neuron_stack
from neuron_stack.compiler import driver, schedule
from neuron_stack.isa.neff import NeffError

ROOT = Path(__file__).resolve().parents[1]
PASSES = ("legalize", "partition", "fuse", "lower+schedule", "memory_plan")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", str(tmp_path / "cache"))
    monkeypatch.delenv("NEURON_CC_FLAGS", raising=False)
    return tmp_path / "cache"


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()


def test_warm_hit_runs_no_pass_and_uses_the_models_weights(cache, monkeypatch):
    m, x = _model(), torch.randn(4, 16)
    cold = neuron_stack.trace(m, x)
    assert not cold.cache_hit

    def boom(*a, **k):
        raise AssertionError("a compiler pass ran on a cache hit")
    for name in ("legalize", "partition", "fuse", "compile_program"):
        monkeypatch.setattr(driver, name, boom)
    monkeypatch.setattr(schedule, "build_schedule", boom)
    warm = neuron_stack.trace(m, x)
    assert warm.cache_hit
    torch.testing.assert_close(warm(x), m(x), rtol=1e-4, atol=1e-5)
    assert warm.neff.schedules[0].table.equals(cold.neff.schedules[0].table)
    # the entry holds no weights: the hit ran the traced model's own tensors
    [entry] = [p for p in cache.glob("neuronxcc-*/MODULE_*") if p.is_dir()]
    with pytest.raises(NeffError, match="holds no weights") as e:
        neuron_stack.load(entry / "model.neff")
    assert len(str(e.value).splitlines()) == 1


def test_weights_changed_in_place_miss_the_cache(cache):
    m, x = _model(), torch.randn(4, 16)
    assert not neuron_stack.trace(m, x).cache_hit
    with torch.no_grad():
        m[0].weight.mul_(2)                      # bumps the version counter: the digest is recomputed
    nm = neuron_stack.trace(m, x)
    assert not nm.cache_hit
    torch.testing.assert_close(nm(x), m(x), rtol=1e-4, atol=1e-5)


def test_saved_neff_keeps_its_weights(cache, tmp_path):
    m, x = _model(), torch.randn(4, 16)
    neuron_stack.trace(m, x)
    nm = neuron_stack.trace(m, x)                # a hit: saved with the captured weights
    assert nm.cache_hit
    nm.save(tmp_path / "m.neff")
    torch.testing.assert_close(neuron_stack.load(tmp_path / "m.neff")(x), m(x), rtol=1e-4, atol=1e-5)


def test_pass_times_in_log_stats_and_profile(cache, tmp_path, monkeypatch):
    out = tmp_path / "profile"
    monkeypatch.setenv("NEURON_RT_INSPECT_ENABLE", "1")
    monkeypatch.setenv("NEURON_RT_INSPECT_OUTPUT_DIR", str(out))
    code = textwrap.dedent("""
        import torch, neuron_stack
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU()).eval()
        nm = neuron_stack.trace(m, torch.randn(4, 16))
        nm(torch.randn(4, 16))
        print(repr(nm.compile_log.splitlines()[-2]))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("'pass times: ") and all(f"{p} " in line for p in PASSES)
    import traces
    with traces.open(traces.finalize(out)) as prof:
        [detail] = prof.sql("SELECT detail FROM events WHERE kind = 'compile'").column("detail").to_pylist()
    pass_s = json.loads(detail)["pass_s"]
    assert set(pass_s) == set(PASSES) and all(v >= 0 for v in pass_s.values()) and pass_s["lower+schedule"] > 0


def test_clean_compile_warns_nothing(cache):
    m, x = _model(), torch.randn(4, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        neuron_stack.trace(m, x)
        neuron_stack.trace(m, x)
    assert [str(w.message) for w in caught] == []


def test_torch_compile_second_process_hits_without_lowering(cache):
    code = textwrap.dedent("""
        import torch, neuron_stack
        from neuron_stack.compiler import schedule
        from neuron_stack.dynamo import compile_events
        torch.manual_seed(0)
        w = torch.randn(8, 8)
        f = torch.compile(lambda x, w: torch.tanh(x @ w) * 2, backend="neuron")
        built = []
        real = schedule.build_schedule
        schedule.build_schedule = lambda *a, **k: built.append(1) or real(*a, **k)
        for n in (3, 5, 3):
            x = torch.randn(n, 8)
            torch.testing.assert_close(f(x, w), torch.tanh(x @ w) * 2, rtol=1e-4, atol=1e-5)
        print([e["cache_hit"] for e in compile_events()], len(built))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    assert runs[0].stdout.split()[-1] == "2"            # two shapes lowered once each
    assert runs[1].stdout.strip() == "[True, True] 0"   # the second process lowers nothing
