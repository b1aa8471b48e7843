"""neuron_stack.nki: kernels in the real SDK's form run, match numpy/torch eager, obey the tile rules
with errors naming the kernel line, and land in profiles with their kernel source lines."""
import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from nki_helpers import line_of, sample
from nki_helpers import raises_at as _raises_at

import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl
from neuron_stack import nki

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_workloads" / "nki"


@pytest.mark.parametrize("name", ["tensor_add", "matmul", "softmax", "rmsnorm", "flash_attention"])
def test_sample_kernels_match_numpy(name, capsys):
    assert sample(name).main(["--small"]) == 0
    assert "OK vs numpy" in capsys.readouterr().out


def test_samples_import_only_the_nki_modules():
    """The promise: a kernel written for the SDK runs after changing only its imports."""
    for name in ("tensor_add", "matmul", "softmax", "rmsnorm", "flash_attention"):
        f = SAMPLES / f"{name}.py"
        text = f.read_text()
        assert "import neuron_stack.nki as nki" in text
        assert "neuron_stack." not in text.replace("neuron_stack.nki", ""), f


def test_bf16_matmul_within_tolerance_of_torch():
    mm = sample("matmul")
    a, b = torch.randn(256, 128), torch.randn(256, 512)
    got = mm.matmul_tiled(a.bfloat16(), b.bfloat16())
    assert got.dtype == torch.bfloat16
    want = a.T @ b
    assert (torch.linalg.norm(got.float() - want) / torch.linalg.norm(want)).item() < 1e-2


def test_legacy_and_new_isa_forms_agree():
    x = np.random.default_rng(1).standard_normal((128, 256)).astype(np.float32)

    @nki.jit
    def new_form(a):
        out = nl.ndarray((128, 6), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        e = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.tanh, data=t, scale=0.5, reduce_op=nl.add, reduce_res=s)
        r = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.maximum, data=t, axis=[1])
        d = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=t, data2=e, op=nl.subtract)
        q = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=q, op=nl.add, data=d, axis=[1])
        ts = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=ts, data=t, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=r)
        w = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=w, op=nl.add, data=ts, axis=[1])
        io = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.iota(io, [[0, 1]], offset=3, channel_multiplier=2)
        ms = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=ms, value=7.0)
        tp = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=tp, data=t[:, 0:128])
        tt = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=tt, src=tp)
        col = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=col, op=nl.add, data=tt, axis=[1])
        for i, v in enumerate((s, r, q, w, io, col)):
            nisa.dma_copy(dst=out[:, i:i + 1], src=v)
        return out

    @nki.jit
    def legacy_form(a):
        out = nl.ndarray((128, 6), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        s = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        e = nisa.activation(nl.tanh, t, scale=0.5, reduce_op=nl.add, reduce_res=s)
        r = nisa.tensor_reduce(nl.maximum, t, axis=[1])
        q = nisa.tensor_reduce(nl.add, nisa.tensor_tensor(t, e, nl.subtract), axis=[1])
        w = nisa.tensor_reduce(nl.add, nisa.tensor_scalar(t, nl.multiply, 2.0, op1=nl.add, operand1=r), axis=[1])
        i_p = nl.arange(128)[:, None]
        io = nisa.iota(i_p * 2 + 3, dtype=nl.float32)
        col = nisa.tensor_reduce(nl.add, nisa.tensor_copy(nisa.nc_transpose(t[:, 0:128])), axis=[1])
        for i, v in enumerate((s, r, q, w, io, col)):
            nl.store(out[:, i:i + 1], value=v)
        return out

    a, b = new_form(x), legacy_form(x)
    np.testing.assert_allclose(a, b, rtol=1e-5)
    np.testing.assert_allclose(a[:, 0], np.tanh(0.5 * x).sum(1), rtol=1e-4)
    np.testing.assert_allclose(a[:, 1], x.max(1), rtol=1e-6)
    np.testing.assert_allclose(a[:, 3], (2 * x + x.max(1, keepdims=True)).sum(1), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(a[:, 4], 3 + 2 * np.arange(128))
    np.testing.assert_allclose(a[:, 5], x[:, :128].sum(0), rtol=1e-4, atol=1e-4)


def test_tile_rules_name_the_kernel_line():
    x = np.zeros((256, 512), np.float32)

    @nki.jit
    def too_many_partitions(a):
        t = nl.load(a)  # MARK-P
        return t

    @nki.jit
    def psum_too_wide(a):
        acc = nl.ndarray((128, 8192), nl.float32, buffer=nl.psum)  # MARK-PSUM
        return acc

    @nki.jit
    def stationary_too_wide(a):
        l_ = nl.load(a[0:128, 0:256])
        r = nl.load(a[0:128, 0:512])
        acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, l_, r)  # MARK-MM
        return acc

    @nki.jit
    def moving_too_wide(a):
        l_ = nl.load(a[0:128, 0:128])
        r = nl.ndarray((128, 1024), nl.float32)
        acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, l_, r)  # MARK-MOV
        return acc

    @nki.jit
    def sbuf_full(a):
        keep = []
        for i in range(20):
            keep.append(nl.ndarray((128, 4096), nl.float32))  # MARK-SBUF
        return keep

    _raises_at(too_many_partitions, (x,), "exceeds architecture limitation of 128", "MARK-P")
    _raises_at(psum_too_wide, (x,), "2 KiB bank", "MARK-PSUM")
    _raises_at(stationary_too_wide, (x,), "gemm_stationary_fmax 128", "MARK-MM")
    _raises_at(moving_too_wide, (x,), "gemm_moving_fmax 512", "MARK-MOV")
    _raises_at(sbuf_full, (x,), "SBUF is full", "MARK-SBUF")


def test_uninitialised_memory_reads_nan_and_bf16_rounds():
    @nki.jit
    def partial(a):
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8), nl.float32)
        nisa.memset(t[:, 0:4], 1.0)
        nl.store(out, value=t)
        return out

    got = partial(np.zeros((1,), np.float32))
    assert (got[:, :4] == 1).all() and np.isnan(got[:, 4:]).all()

    @nki.jit
    def to_bf16(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a, dtype=nl.bfloat16)
        nl.store(out, value=nl.copy(t, dtype=nl.float32))
        return out

    x = np.array([[1.0 + 2 ** -10, 3.14159265]], np.float32)
    want = torch.from_numpy(x).bfloat16().float().numpy()
    np.testing.assert_array_equal(to_bf16(x), want)


def test_masked_ragged_tile_and_outside_kernel_error():
    sm = sample("softmax")
    x = np.random.default_rng(2).standard_normal((130, 64)).astype(np.float32)
    np.testing.assert_allclose(sm.softmax_kernel(x), sm.reference(x), rtol=1e-4, atol=1e-7)
    with pytest.raises(nki.NKIError, match="only work inside a kernel"):
        nl.load(x)


def test_benchmark_percentiles_are_the_simulated_device_time():
    mm = sample("matmul")
    bench = nki.benchmark(warmup=1, iters=4)(mm.matmul_tiled)
    bench(np.ones((128, 128), np.float32), np.ones((128, 512), np.float32))
    lat = bench.benchmark_result.nc_latency
    assert lat.get_latency_percentile(50) == pytest.approx(bench.last.device_ns / 1e3)
    assert lat.get_latency_percentile(99) == lat.get_latency_percentile(0) > 0
    with pytest.raises(nki.NKIError, match="percentile 42"):
        lat.get_latency_percentile(42)


def test_profile_links_instructions_to_kernel_lines(tmp_path):
    import traces
    mm = sample("matmul")
    prof = nki.profile(working_directory=tmp_path)(mm.matmul_tiled)
    lhsT, rhs = np.ones((256, 128), np.float32), np.ones((256, 512), np.float32)
    np.testing.assert_allclose(prof(lhsT, rhs), np.full((128, 512), 256.0))
    mm_line = line_of(mm.matmul_tiled.fn, "nisa.nc_matmul(dst=acc")
    with traces.open(prof.profile_path) as p:
        rows = p.sql("""SELECT i.opcode, i.nki_source_location AS loc, s.file, s.line, s.code, o.op_class
                        FROM instructions i JOIN ops o USING (op_id) JOIN sources s USING (source_id)""").to_pylist()
        assert {r["op_class"] for r in rows} == {"nki"}
        mms = [r for r in rows if r["opcode"] == "MATMUL"]
        assert len(mms) == 2 and all(r["loc"] == f"matmul.py:{mm_line}" and r["line"] == mm_line for r in mms)
        assert "nc_matmul" in mms[0]["code"]
        assert p.source_text(mms[0]["file"]).splitlines()[mm_line - 1].strip().startswith("nisa.nc_matmul")
        hot = p.source_hotspots(20).to_pylist()
        assert any(h["line"] == mm_line and h["device_ns"] > 0 for h in hot)
    with pytest.raises(nki.NKIError, match="overwrite=True"):
        prof(lhsT, rhs)


def test_loop_variables_are_recorded_per_instruction(tmp_path):
    """KernelIterationVariables: each MATMUL of the tiled matmul knows its m, n and k, linked outer to inner."""
    import traces
    mm = sample("matmul")
    prof = nki.profile(working_directory=tmp_path)(mm.matmul_tiled)
    prof(np.ones((256, 128), np.float32), np.ones((256, 512), np.float32))
    with traces.open(prof.profile_path) as p:
        var = {r["iteration_variable_id"]: r for r in p.sql("SELECT * FROM KernelIterationVariables").to_pylist()}
        mms = p.sql("""SELECT DISTINCT k.iteration_variables_id AS v, k.iteration_variable_depth AS d
                       FROM KernelInstructions k JOIN main.instructions i JOIN main.executions x USING (exec_id)
                       ON k.kernel_instruction_name = i.queue || '.' || i.pc || ':' || x.graph_id
                       WHERE i.opcode = 'MATMUL'""").to_pylist()

    def chain(v):
        out = []
        while v is not None:
            out.append(var[v])
            v = var[v]["parent_iteration_variable_id"]
        return [(r["variable_name"], r["variable_value"], r["line_number"]) for r in out[::-1]]

    lines = [line_of(mm.matmul_tiled.fn, f"for {v} in nl.affine_range") for v in "mnk"]
    assert sorted(chain(r["v"]) for r in mms) == [list(zip("mnk", (0, 0, k), lines)) for k in (0, 1)]
    assert {r["d"] for r in mms} == {3}
    assert all(r["file_path"].endswith("matmul.py") for r in var.values())


def test_kernel_under_neuron_explorer_inspect(tmp_path):
    script = tmp_path / "run_kernel.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(SAMPLES)!r})\n"
        "import numpy as np\n"
        "from rmsnorm import rmsnorm_kernel\n"
        "for _ in range(3):\n"
        "    rmsnorm_kernel(np.ones((130, 64), np.float32), np.ones(64, np.float32))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NEURON_RT_VISIBLE_CORES="")
    env.pop("NEURON_RT_VISIBLE_CORES")
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "explorer.cli", "inspect", "-o", str(out), "--", sys.executable,
                    str(script)], env=env, check=True, capture_output=True, text=True, timeout=300)
    import traces
    prof = next(out.rglob("profile.duckdb"))
    with traces.open(prof) as p:
        locs = p.sql("SELECT DISTINCT nki_source_location AS loc FROM instructions").column("loc").to_pylist()
        assert any(loc and loc.startswith("rmsnorm.py:") for loc in locs)
        assert p.sql("SELECT count(*) AS n FROM graphs WHERE kind = 'nki'").column("n")[0].as_py() == 1
        ex = p.sql("SELECT iteration, warmup FROM executions ORDER BY iteration").to_pylist()
        assert ex == [{"iteration": 0, "warmup": True}, {"iteration": 1, "warmup": False},
                      {"iteration": 2, "warmup": False}]


def test_flash_attention_bf16_close_to_torch_sdpa():
    fa = sample("flash_attention")
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 64, 512, generator=g), torch.randn(1, 1, 64, 512, generator=g)
    v = torch.randn(1, 1, 512, 64, generator=g)
    got = fa.flash_fwd[1, 1](q.bfloat16(), k.bfloat16(), v.bfloat16()).float()
    want = torch.nn.functional.scaled_dot_product_attention(q.transpose(2, 3), k.transpose(2, 3), v)
    assert (torch.linalg.norm(got - want) / torch.linalg.norm(want)).item() < 1e-2
    assert math.isfinite(fa.flash_fwd.last.device_ns)


def test_reused_sbuf_waits_for_the_previous_tiles_readers():
    @nki.jit
    def reuse(a):
        out = nl.ndarray((2, 128, 40000), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 40000), nl.float32)          # 156 KiB of the 192 KiB per partition
        nisa.memset(t, 1.0)
        nisa.dma_copy(dst=out[0], src=t)
        del t                                             # its bytes are free: the next tile lands there
        u = nl.ndarray((128, 40000), nl.float32)
        nisa.memset(u, 2.0)
        nisa.dma_copy(dst=out[1], src=u)
        return out

    got = reuse(np.zeros(1, np.float32))
    assert (got[0] == 1).all() and (got[1] == 2).all()
    run = reuse.last
    ops_ = [i.opcode for i in run.trace.instrs]
    # each 20 MB store is spread over the 16 DMA queues (one piece per 8 partitions)
    assert ops_ == ["MEMSET"] + ["DMA_DIRECT2D"] * 16 + ["MEMSET"] + ["DMA_DIRECT2D"] * 16
    assert set(range(1, 17)) <= set(run.trace.instrs[17].deps)     # write-after-read on the reused bytes
    t = run.schedule.table
    start, dur = t.column("rel_start_ns").to_pylist(), t.column("dur_ns").to_pylist()
    assert start[17] >= max(start[i] + dur[i] for i in range(1, 17))


def test_explorer_links_kernel_lines_and_instructions_both_ways(tmp_path):
    """Source page: the kernel file with time per line; timeline: an instruction names its kernel line."""
    from explorer import data
    from explorer import timeline as tline
    fa = sample("flash_attention")
    prof = nki.profile(working_directory=tmp_path)(fa.flash_fwd[1, 1])
    rng = np.random.default_rng(3)
    q, k = (rng.standard_normal((1, 1, 64, 512), dtype=np.float32),
            rng.standard_normal((1, 1, 64, 512), dtype=np.float32))
    prof(q, k, rng.standard_normal((1, 1, 512, 64), dtype=np.float32))
    reg = data.Registry([prof.profile_path])
    data.set_registry(reg)
    try:
        L = data.resolve(reg.default_key())
        kfile = str(SAMPLES / "flash_attention.py")
        assert data.source_files(L) == [kfile]
        rows = {r["line"]: r for r in data.source_view(L, kfile)}
        mm_line = line_of(fa.flash_fwd.fn, "nisa.nc_matmul(dst=s_psum")
        assert rows[mm_line]["device_ns"] > 0
        inst = next(i for i in tline.timeline(L)["instructions"] if i["opcode"] == "MATMUL")
        got = tline.instruction_at(L, inst["core"], inst["engine"], inst["start"], inst["pc"])
        assert got["file"] == kfile and got["nki_source_location"] == f"flash_attention.py:{got['line']}"
    finally:
        reg.close()


def test_fp8_rounding_psum_capacity_and_device_print(capsys):
    @nki.jit
    def to_fp8(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a, dtype=nl.float8_e4m3)
        nl.device_print("fp8 tile", t)
        nl.store(out, value=nl.copy(t, dtype=nl.float32))
        return out

    x = np.array([[0.1, 1.3, 3.14159, 300.0]], np.float32)
    want = torch.from_numpy(x).to(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(to_fp8(x), want)
    assert "fp8 tile" in capsys.readouterr().out

    @nki.jit
    def nine_banks(a):
        keep = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]  # MARK-BANKS
        return keep

    _raises_at(nine_banks, (x,), "PSUM is full", "MARK-BANKS")


def test_tiles_live_from_allocation_to_last_use(tmp_path):
    """A loop body's tile is dead after its last use, so the next iteration's tile takes its bytes (the
    compiler's liveness; Python still holds the old one when the new one is allocated) and waits for its
    reader; tiles genuinely live together must fit, else the line allocating the one that overflows is named."""
    @nki.jit
    def big_per_iteration(a):
        out = nl.ndarray((4, 128, 30000), nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(4):
            t = nl.ndarray((128, 30000), nl.float32)      # 117 KiB of the 192 KiB per partition: two never fit
            nisa.memset(t, float(i))                        # MARK-LIVE
            nisa.dma_copy(dst=out[i], src=t)
        return out

    prof = nki.profile(working_directory=tmp_path)(big_per_iteration)
    got = prof(np.zeros(1, np.float32))
    assert all((got[i] == i).all() for i in range(4))
    run = prof.last
    assert {a[2] for a in run.trace.allocs} == {0} and len(run.trace.allocs) == 4
    instrs = run.trace.instrs
    # each copy is spread over the DMA queues in pieces (one row per queue)
    assert [op for op, _ in itertools.groupby(i.opcode for i in instrs)] == ["MEMSET", "DMA_DIRECT2D"] * 4
    sets = [j for j, i in enumerate(instrs) if i.opcode == "MEMSET"]
    for k in range(1, 4):   # write-after-read on the reused bytes: every piece of the last copy
        assert set(range(sets[k - 1] + 1, sets[k])) <= set(instrs[sets[k]].deps)
    import traces
    with traces.open(prof.profile_path) as p:
        rows = p.sql("SELECT start_address, end_address, memory, node FROM SbufAllocation "
                     "ORDER BY start_ts").to_pylist()
    assert len(rows) == 4 and {(r["start_address"], r["end_address"], r["memory"]) for r in rows} == {
        (0, 119999, "SBUF")}
    assert rows[0]["node"] == f"test_nki.py:{line_of(big_per_iteration.fn, 'MARK-LIVE')}"

    @nki.jit
    def both_live(a):
        out = nl.ndarray((2, 128, 30000), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 30000), nl.float32)
        nisa.memset(t, 1.0)
        u = nl.ndarray((128, 30000), nl.float32)          # MARK-BOTH
        nisa.memset(u, 2.0)
        nisa.dma_copy(dst=out[0], src=t)
        nisa.dma_copy(dst=out[1], src=u)
        return out

    _raises_at(both_live, (np.zeros(1, np.float32),), "SBUF is full", "MARK-BOTH")


def test_address_places_a_tile_and_the_allocator_keeps_off_it():
    @nki.jit
    def placed(a):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf, address=(0, 4096))
        nisa.dma_copy(dst=x, src=a)
        y = nl.ndarray((128, 512), nl.float32)
        nisa.activation(dst=y, op=nl.exp, data=x)
        acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 2048 * 7))
        nisa.tensor_copy(dst=acc, src=y)
        nisa.tensor_copy(dst=y, src=acc)
        nisa.dma_copy(dst=out, src=y)
        return out

    a = np.random.default_rng(0).standard_normal((128, 512)).astype(np.float32)
    np.testing.assert_allclose(placed(a), np.exp(a), rtol=1e-5)
    allocs = {(m, addr) for m, _, addr, *_ in placed.last.trace.allocs}
    assert ("sbuf", 4096) in allocs and ("psum", 2048 * 7) in allocs
    y_addr = next(addr for m, _, addr, *_ in placed.last.trace.allocs if m == "sbuf" and addr != 4096)
    assert y_addr + 2048 <= 4096 or y_addr >= 4096 + 2048

    @nki.jit
    def outside(a):
        return nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 15000))  # MARK-ADDR

    _raises_at(outside, (a,), "does not place this (128, 512) float32 tile inside PSUM", "MARK-ADDR")


def test_saved_kernel_neff_runs_in_a_fresh_process(tmp_path):
    """``nki.benchmark(save_neff_name=...)`` then ``neuron-explorer capture -n file.neff`` in another process
    that never imports the kernel's module: the NEFF carries the kernel's instructions."""
    (tmp_path / "negate.py").write_text(
        "import numpy as np\n"
        "import neuron_stack.nki as nki\n"
        "import neuron_stack.nki.language as nl\n\n\n"
        "@nki.jit\n"
        "def negate(a):\n"
        "    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)\n"
        "    nl.store(out, value=nl.negative(nl.load(a)))\n"
        "    return out\n\n\n"
        "nki.benchmark(warmup=1, iters=2, save_neff_name='file.neff')(negate)(np.ones((128, 64), np.float32))\n")
    env = {**os.environ, "NEURON_COMPILE_CACHE_URL": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "negate.py"], cwd=tmp_path, env=env, check=True, timeout=300, capture_output=True)
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    np.save(tmp_path / "x.npy", x)
    explorer = str(Path(sys.executable).parent / "neuron-explorer")
    r = subprocess.run([explorer, "capture", "-n", "file.neff", "-s", "prof", "a", "x.npy", "--save-output-npy",
                        "outs"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "outs" / "output0.npy"), -x)
    import traces
    with traces.open(tmp_path / "prof" / "profile.duckdb") as p:
        lines = p.sql("SELECT DISTINCT nki_source_location FROM instructions").column(0).to_pylist()
    assert lines == ["negate.py:9"]
