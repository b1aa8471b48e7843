"""What the published NKI samples needed (issue 43), each in this project's own words and checked against numpy:
multi-axis reductions, lazily initialised PSUM accumulators, block-layout PSUM tiles placed block by block,
``nl.matmul`` on a PSUM operand, ``nl.spmd_dim`` grids; and the opt-in compat runner that runs an SDK script with
its own imports (``import nki``, ``neuronxcc.nki``, ``torch_xla``, ``torch_neuronx``) unchanged."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl
from neuron_stack import nki

ROOT = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(0)


def test_sum_over_two_interleaved_axes_is_one_reduce_over_a_permuted_access_pattern():
    @nki.jit
    def pool(x):                    # 2x2 average pooling of [C, H, W]: the window axes are 2 and 4
        C, H, W = x.shape
        out = nl.ndarray((C, H // 2, W // 2), x.dtype, buffer=nl.shared_hbm)
        i0, i1, i2, i3, i4 = nl.mgrid[0:C, 0:H // 2, 0:2, 0:W // 2, 0:2]
        t = nl.load(x)
        nl.store(out, value=nl.sum(t[i0, 2 * i1 + i2, 2 * i3 + i4], axis=[2, 4]) / 4)
        return out

    x = RNG.standard_normal((8, 6, 10)).astype(np.float32)
    got = pool(x)
    assert np.allclose(got, x.reshape(8, 3, 2, 5, 2).mean(axis=(2, 4)), atol=1e-6)
    assert [i.opcode for i in pool.last.trace.instrs].count("REDUCE") == 1


def test_lazily_initialised_psum_accumulator_needs_no_memset():
    def build(lazy):
        @nki.jit
        def mm(aT, b):                  # aT [K, 128], b [K, 128], K = 4 tiles accumulated with +=
            out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
            acc = nl.zeros((nl.par_dim(128), 128), nl.float32, buffer=nl.psum, lazy_initialization=lazy)
            for k in nl.affine_range(aT.shape[0] // 128):
                acc[:, :] += nl.matmul(nl.load(aT[k * 128:(k + 1) * 128, :]), nl.load(b[k * 128:(k + 1) * 128, :]),
                                       transpose_x=True)
            nl.store(out, value=nl.copy(acc))
            return out
        return mm

    aT, b = RNG.standard_normal((512, 128), dtype=np.float32), RNG.standard_normal((512, 128), dtype=np.float32)
    for lazy in (False, True):
        k = build(lazy)
        assert np.allclose(k(aT, b), aT.T @ b, rtol=1e-4, atol=1e-3)
        assert ("MEMSET" in [i.opcode for i in k.last.trace.instrs]) != lazy


def test_block_layout_psum_tile_larger_than_psum_is_placed_block_by_block():
    @nki.jit
    def cols(a, b):
        out = nl.ndarray((128, 4096), nl.float32, buffer=nl.shared_hbm)
        ps = nl.ndarray((32, nl.par_dim(128), 128), nl.float32, buffer=nl.psum)     # 64 KiB declared, 16 KiB PSUM
        at = nl.load(a)
        for i in nl.affine_range(32):
            ps[i] = nisa.nc_matmul(at, nl.load(b[:, i * 128:(i + 1) * 128]))
            nl.store(out[:, i * 128:(i + 1) * 128], value=nl.copy(ps[i]))
        return out

    a, b = RNG.standard_normal((128, 128), dtype=np.float32), RNG.standard_normal((128, 4096), dtype=np.float32)
    assert np.allclose(cols(a, b), a.T @ b, rtol=1e-4, atol=1e-3)
    psum = [a for a in cols.last.trace.allocs if a[0] == "psum"]
    assert len(psum) == 32 and max(a[2] + a[3] for a in psum) <= 16 * 1024


def test_nl_matmul_copies_a_psum_operand_to_sbuf_and_spmd_dim_grids_run():
    @nki.jit
    def qkv(q, v):
        out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
        s = nl.copy(nl.matmul(nl.load(q), nl.load(q), transpose_x=True))
        nl.store(out, value=nl.matmul(s, nl.transpose(nl.load(v))))      # the moving operand is in PSUM
        return out

    q, v = RNG.standard_normal((128, 128), dtype=np.float32), RNG.standard_normal((128, 128), dtype=np.float32)
    assert np.allclose(qkv(q, v), (q.T @ q) @ v.T, rtol=1e-3, atol=1e-2)

    @nki.jit
    def add(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        rows = nl.program_id(0) * 128
        nl.store(out[rows:rows + 128, :], value=nl.load(a[rows:rows + 128, :]) + 1.0)
        return out

    a = RNG.standard_normal((512, 64), dtype=np.float32)
    assert np.allclose(add[nl.spmd_dim(2, nl.nc(2))](a), a + 1)


SCRIPT = '''
import numpy as np
import nki
import nki.isa as nisa
import nki.language as nl
import neuronxcc.nki.language as legacy_nl
import torch
import torch_neuronx
import torch_xla.core.xla_model as xm
from torch_neuronx.profiling import NeuronConfig


@nki.jit
def add(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=t, data1=nl.load(a), data2=nl.load(b), op=nl.add)
    nl.store(out, value=t)
    return out


device = xm.xla_device()
a, b = torch.ones((128, 512)).to(device), torch.full((128, 512), 2.0).to(device)
assert bool((add(a, b) == 3).all()) and legacy_nl is nl and callable(torch_neuronx.trace)
print("sdk script ran", NeuronConfig.__name__)
'''


def _run(args, tmp_path, extra_path=""):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (extra_path, str(ROOT)) if p)}
    return subprocess.run([sys.executable, "-m", "neuron_stack.compat", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_compat_runner_runs_an_sdk_script_unchanged_and_only_when_asked(tmp_path):
    script = tmp_path / "sdk_sample.py"
    script.write_text(SCRIPT)
    r = _run([str(script)], tmp_path)
    assert r.returncode == 0 and "sdk script ran NeuronConfig" in r.stdout, r.stderr[-2000:]
    # never installed: outside the runner (a fresh interpreter: a test in this one may run it in process) the SDK
    # names do not import
    names = ("nki", "neuronxcc", "torch_neuronx", "torch_xla")
    fresh = subprocess.run([sys.executable, "-c", f"import importlib.util as u; print(any(u.find_spec(n) for n in "
                            f"{names!r}))"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert fresh.stdout.strip() == "False", fresh.stderr
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert plain.returncode != 0 and "No module named 'nki'" in plain.stderr


def test_compat_runner_refuses_over_a_real_sdk_and_a_missing_script(tmp_path):
    fake = tmp_path / "site"
    (fake / "torch_neuronx").mkdir(parents=True)
    (fake / "torch_neuronx" / "__init__.py").write_text("")
    (tmp_path / "s.py").write_text("print('ran')\n")
    r = _run(["s.py"], tmp_path, extra_path=str(fake))
    assert r.returncode != 0 and "ran" not in r.stdout
    assert r.stderr.strip().count("\n") == 0 and "real SDK's 'torch_neuronx' is importable" in r.stderr
    r = _run(["missing.py"], tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == textwrap.dedent(r.stderr.strip()) and "no such file" in r.stderr


def test_inspect_compat_profiles_an_unchanged_sdk_script(tmp_path):
    script = tmp_path / "sdk_sample.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NEURON_RT_VISIBLE_CORES", None)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "explorer.cli", "inspect", "--compat", "-o", str(out), "--",
                        sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "sdk script ran" in r.stdout, r.stderr[-2000:]
    import traces
    with traces.open(next(out.rglob("profile.duckdb"))) as p:
        locs = p.sql("SELECT DISTINCT nki_source_location AS loc FROM instructions").column("loc").to_pylist()
    assert any(loc and loc.startswith("sdk_sample.py:") for loc in locs)
    r = subprocess.run([sys.executable, "-m", "explorer.cli", "inspect", "--compat", "-o", str(out), "--", "ls"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "--compat runs a Python script" in r.stderr and r.stderr.count("\n") == 1
