"""Compile time users do not wait for (issue 20): a cache hit runs no pass and reads no weights,
each pass is timed in the compile log, a clean compile warns nothing, a second process hits."""
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import neuron_stack
from neuron_stack.compiler import driver, schedule
from neuron_stack.isa.neff import NeffError, read_header

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
    monkeypatch.setenv("NEURON_RT_INSPECT_DEVICE_PROFILE", "session")
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


def _rewrite(path: Path, members: dict[str, bytes], pad: int = 0) -> None:
    """Write ``members`` as a plain zip (``writestr``: no alignment), ``pad`` bytes of junk member first."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        if pad:
            z.writestr("pad", b"\0" * pad)
        for name, blob in members.items():
            z.writestr(name, blob)


def test_saved_weights_are_mapped_not_copied_and_checked(cache, tmp_path):
    m, x = _model(), torch.randn(4, 16)
    path = neuron_stack.trace(m, x).save(tmp_path / "m.neff")
    header = read_header(path)
    assert header["checksums"]["weights.bin"].startswith("xxh3_128:")
    nm = neuron_stack.load(path)
    torch.testing.assert_close(nm(x), m(x), rtol=1e-4, atol=1e-5)
    assert str(path) in Path("/proc/self/maps").read_text()     # the tensors share a mapping of the file
    # one flipped weight byte is a one-line error, not wrong numbers
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    blob = bytearray(members["weights.bin"])
    blob[10] ^= 0xFF
    bad = tmp_path / "bad.neff"
    _rewrite(bad, {**members, "weights.bin": bytes(blob)})
    with pytest.raises(NeffError, match="checksum mismatch in member weights.bin") as e:
        neuron_stack.load(bad)
    assert len(str(e.value).splitlines()) == 1


def test_neff_with_sha256_unaligned_weights_still_loads(cache, tmp_path):
    """NEFFs written before the aligned, xxHash-checked weights: read into memory, sha256 checked."""
    m, x = _model(), torch.randn(4, 16)
    path = neuron_stack.trace(m, x).save(tmp_path / "m.neff")
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    header = json.loads(members["neff.json"])
    header["checksums"]["weights.bin"] = hashlib.sha256(members["weights.bin"]).hexdigest()
    members["neff.json"] = json.dumps(header).encode()
    old = tmp_path / "old.neff"
    for pad in (1, 2):
        _rewrite(old, members, pad)
        with zipfile.ZipFile(old) as z:
            start = z.getinfo("weights.bin").header_offset + 30 + len("weights.bin")
        if start % 64:
            break
    assert start % 64, "could not make an unaligned archive"
    torch.testing.assert_close(neuron_stack.load(old)(x), m(x), rtol=1e-4, atol=1e-5)


@pytest.mark.real_python   # it checks what the process imports: a warm one has torch
def test_load_in_a_new_process_imports_no_compiler(cache, tmp_path):
    """Loading and running a saved NEFF needs neither sympy (via torch.fx's symbolic shapes) nor the passes."""
    m, x = _model(), torch.randn(4, 16)
    path = neuron_stack.trace(m, x).save(tmp_path / "m.neff")
    torch.save(x, tmp_path / "x.pt")
    code = textwrap.dedent(f"""
        import sys, torch, neuron_stack
        nm = neuron_stack.load({str(path)!r})
        nm(torch.load({str(tmp_path / "x.pt")!r}))
        print(sorted(m for m in ("sympy", "neuron_stack.compiler.schedule", "neuron_stack.compiler.driver",
                                 "neuron_stack.compiler.lower") if m in sys.modules))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_torch_compile_recompile_of_a_cached_shape_only_looks_up(cache, monkeypatch):
    """After dynamo forgets its graphs (torch._dynamo.reset, a new process), a shape compiled before
    is a cache lookup: no pass runs, the numbers are the same."""
    from neuron_stack import dynamo

    def f(x):
        return torch.tanh(x) * 2
    compiled = torch.compile(f, backend="neuron")
    for n in (3, 5):
        compiled(torch.randn(n, 8))
    torch._dynamo.reset()

    def boom(*a, **k):
        raise AssertionError("a compiler pass ran for a shape already in the cache")
    monkeypatch.setattr(dynamo, "compile_program", boom)
    monkeypatch.setattr(schedule, "build_schedule", boom)
    before = len(dynamo.compile_events())
    compiled = torch.compile(f, backend="neuron")
    for n in (5, 3):
        x = torch.randn(n, 8)
        torch.testing.assert_close(compiled(x), f(x), rtol=1e-4, atol=1e-5)
    events = dynamo.compile_events()[before:]
    assert len(events) == 2 and all(e["cache_hit"] for e in events)
    torch._dynamo.reset()
