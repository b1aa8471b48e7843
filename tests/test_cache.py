"""The persistent compile cache: layout, corrupt entries rebuilt, concurrent compiles, --no_cache."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import neuron_stack

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", str(tmp_path / "cache"))
    monkeypatch.delenv("NEURON_CC_FLAGS", raising=False)
    return tmp_path / "cache"


def entries(cache: Path):
    return [p for p in cache.glob("neuronxcc-*/MODULE_*+*") if p.is_dir()]


def test_corrupt_entry_is_reported_and_rebuilt(cache, capfd):
    torch.manual_seed(0)
    m, x = torch.nn.Linear(8, 4).eval(), torch.randn(2, 8)
    assert not neuron_stack.trace(m, x).cache_hit
    [entry] = entries(cache)
    neff = entry / "model.neff"
    neff.write_bytes(neff.read_bytes()[:100])
    nm = neuron_stack.trace(m, x)
    err = capfd.readouterr().err
    assert "corrupt compile cache entry" in err and "rebuilding it" in err and len(err.strip().splitlines()) == 1
    assert not nm.cache_hit
    assert neuron_stack.trace(m, x).cache_hit       # the rebuilt entry is good
    torch.testing.assert_close(nm(x), m(x), rtol=1e-4, atol=1e-5)


def test_a_hit_reads_the_record_tables_only_when_a_profile_needs_them(cache):
    """Most of an entry's bytes are the profiler's record tables (Flow, SemaphoreUpdate...): a hit leaves them on
    disk, reads them whole and checked on first use, and refuses, in one line, a file changed meanwhile."""
    from neuron_stack.isa.neff import NeffError, RecordTables

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    x = torch.randn(2, 16)
    cold = neuron_stack.trace(m, x)
    warm = neuron_stack.trace(m, x)
    assert warm.cache_hit
    want, got = cold.neff.schedules[0].records, warm.neff.schedules[0].records
    assert isinstance(got, RecordTables) and got._tables is None and "Flow" in want
    assert set(got) == set(want)
    assert all(got[name].equals(t) for name, t in want.items())
    torch.testing.assert_close(warm(x), m(x), rtol=1e-4, atol=1e-5)

    again = neuron_stack.trace(m, x).neff.schedules[0].records
    [entry] = entries(cache)
    (entry / "model.neff").write_bytes(b"gone")
    with pytest.raises(NeffError) as err:
        again["Flow"]
    assert "record tables cannot be read" in str(err.value) and len(str(err.value).splitlines()) == 1


def test_cache_dir_flag_and_no_cache(tmp_path, cache, monkeypatch):
    m, x = torch.nn.Linear(4, 2).eval(), torch.randn(1, 4)
    neuron_stack.trace(m, x, compiler_args="--no_cache")
    assert not cache.exists() or not entries(cache)
    monkeypatch.setenv("NEURON_CC_FLAGS", f"--cache_dir={tmp_path / 'other'}")
    neuron_stack.trace(m, x)
    assert len(entries(tmp_path / "other")) == 1
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", "s3://bucket/cache")   # S3 is tests/test_scale_s3.py's
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")             # nothing listens on the discard port
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "never-printed-secret")
    monkeypatch.delenv("NEURON_CC_FLAGS")
    from traces import objstore
    objstore._session_client.cache_clear()
    with pytest.raises(RuntimeError, match="cannot reach the S3 endpoint http://127.0.0.1:9") as err:
        neuron_stack.trace(m, x)
    assert "never-printed-secret" not in str(err.value) and len(str(err.value).splitlines()) == 1
    objstore._session_client.cache_clear()


SCRIPT = textwrap.dedent("""
    import torch, neuron_stack
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()).eval()
    nm = neuron_stack.trace(m, torch.randn(4, 16))
    print("hit" if nm.cache_hit else "compiled")
""")


def test_two_processes_compile_once(cache):
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = sorted(o[0].strip() for o in outs)
    assert results == ["compiled", "hit"]
    assert len(entries(cache)) == 1
    assert not list(cache.glob("neuronxcc-*/.MODULE_*"))     # no temp dirs left behind
