"""The published NKI tutorials as kernel writers run them (imports changed only): the optimized matmul in
both forms, layernorm with bn_stats/bn_aggr, the fused self-attention (par_dim block layouts) and the
attention tutorial's fused loop match numpy and profile per kernel line; every misuse is one line
naming the kernel line."""
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from nki_helpers import line_of, sample
from nki_helpers import raises_at as _raises_at

import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl
from neuron_stack import nki
from neuron_stack.nki import core

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_workloads" / "nki"
PUBLISHED = ("matmul_optimized", "layernorm", "sd_attention", "attention_tutorial")


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_samples_match_numpy(name, capsys):
    assert sample(name).main(["--small"]) == 0
    out = capsys.readouterr().out
    assert "MISMATCH" not in out and out.count("OK vs numpy") >= 2, out
    text = (SAMPLES / f"{name}.py").read_text()
    assert "neuron_stack." not in text.replace("neuron_stack.nki", "")      # only the import line differs


def test_fused_attention_profiles_per_kernel_line(tmp_path):
    import traces
    sd = sample("sd_attention")
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((256, 64), dtype=np.float32) for _ in range(3))
    prof = nki.profile(working_directory=tmp_path)(sd.fused_self_attention)
    prof(q, k, v, use_causal_mask=True)
    with traces.open(prof.profile_path) as p:
        rows = p.sql("SELECT nki_source_location AS loc, opcode FROM instructions").to_pylist()
        meta = dict((r["key"], r["value"]) for r in p.sql("SELECT key, value FROM metadata").to_pylist())
    assert meta["timing_model"] == "instruction"
    locs = {r["loc"] for r in rows}
    path = SAMPLES / "sd_attention.py"
    assert all(loc.startswith("sd_attention.py:") for loc in locs)
    assert f"sd_attention.py:{line_of(path, 'nisa.affine_select(pred=')}" in locs
    assert f"sd_attention.py:{line_of(path, 'q_t[j, pd, fs] = nl.load_transpose2d')}" in locs
    assert {"AFFINE_SELECT", "MATMUL", "ACTIVATE", "DMA_DIRECT2D"} <= {r["opcode"] for r in rows}


def test_trace_mode_helper_is_inlined_with_its_own_lines():
    at = sample("attention_tutorial")
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((128, 128), dtype=np.float32) for _ in range(3))
    at.attn_small(q, k, v)
    locs = [i.node for i in at.attn_small.last.trace.instrs]
    path = SAMPLES / "attention_tutorial.py"
    assert f"attention_tutorial.py:{line_of(path, 'nisa.reciprocal(dst=inv, data=total)')}" in locs
    assert f"attention_tutorial.py:{line_of(path, 'nisa.tensor_copy(dst=qk_sb, src=qk)')}" in locs


def test_optimized_matmul_at_the_tutorials_size_fits_sbuf():
    """4096^3 with the tutorial's blocks 16/2/8 (timed, no numbers): the next N block's 64 KiB of partials
    take the previous block's bytes once those are stored, as the compiler's liveness allows."""
    from neuron_stack.nki.kernel import Spec, run_kernel
    mm = sample("matmul_optimized")
    n = 4096
    run = run_kernel(mm.matmul_blocked, (Spec((n, n), "bfloat16"), Spec((n, n), "bfloat16")),
                     dict(TILES_IN_BLOCK_M=16, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=8), execute=False)
    # each DMA counts once per queue it is spread over (18,432 before DMAs were spread)
    assert run.trace.sbuf.peak <= 192 * 1024 and run.num_instructions == 24832
    flops = 2 * n ** 3 / (run.device_ns * 1e-9)
    assert flops / run.trace.p.tensor_peak_flops("bfloat16") > 0.5


def test_pipelined_attention_places_its_buffers_by_hand(tmp_path):
    """The attention tutorial's last version: the kernel's own addresses are where its tiles live (the
    allocator adds none), the stages keep program order, and the profile names the stage helpers' lines."""
    import traces
    at = sample("attention_tutorial")
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((128, 1024), dtype=np.float32) * 0.3 for _ in range(3))
    prof = nki.profile(working_directory=tmp_path)(at.attn_pipelined)
    got = prof(q, k, v)
    want = at.reference(q, k, v)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    allocs = prof.last.trace.allocs
    assert {a for m, _, a, *_ in allocs if m == "psum"} == {0, 6 * 2048, 7 * 2048}
    sbuf = sorted({a for m, _, a, *_ in allocs if m == "sbuf"})
    assert sbuf[0] == 0 and len(sbuf) == 14 and all(a % 32 == 0 for a in sbuf)
    path = SAMPLES / "attention_tutorial.py"
    with traces.open(prof.profile_path) as p:
        locs = set(p.sql("SELECT DISTINCT nki_source_location FROM instructions").column(0).to_pylist())
        placed = p.sql("SELECT count(*) AS n FROM SbufAllocation").to_pylist()[0]["n"]
    assert placed == len(allocs)
    assert f"attention_tutorial.py:{line_of(path, 'nisa.dma_transpose(dst=b.e_t')}" in locs
    assert f"attention_tutorial.py:{line_of(path, 'accumulate=j != 0')}" in locs


def test_load_into_a_view_issues_no_copy():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((2, nl.par_dim(128), 64), nl.float32, buffer=nl.sbuf)
        g = nl.mgrid[0:128, 0:64]
        for b in nl.affine_range(2):
            t[b, g.p, g.x] = nl.load(a[b * 128 + g.p, g.x])
            t[b, g.p, g.x] = nl.exp(t[b, g.p, g.x])
            nl.store(out[b * 128 + g.p, g.x], value=t[b, g.p, g.x])
        return out

    x = np.random.default_rng(0).standard_normal((256, 64), dtype=np.float32)
    np.testing.assert_allclose(k(x), np.exp(x), rtol=1e-5)
    assert [i.opcode for i in k.last.trace.instrs] == ["DMA_DIRECT2D", "ACTIVATE", "DMA_DIRECT2D"] * 2


def test_tile_operators_where_and_vector_transpose():
    @nki.jit
    def k(a):
        out = nl.ndarray((3, 32, 32), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out[0], value=nl.where(t > 0.5, t ** 2, -1.0))
        nl.store(out[1], value=(t <= 0.0) * 1.0)
        tt = nisa.nc_transpose(t, engine=nisa.vector_engine)
        nl.store(out[2], value=tt)
        return out

    x = np.random.default_rng(3).standard_normal((32, 32), dtype=np.float32)
    got = k(x)
    np.testing.assert_allclose(got[0], np.where(x > 0.5, x ** 2, -1.0), rtol=1e-6)
    np.testing.assert_array_equal(got[1], (x <= 0).astype(np.float32))
    np.testing.assert_array_equal(got[2], x.T)
    assert [i.engine for i in k.last.trace.instrs if i.opcode == "TRANSPOSE"] == ["vector"]


def test_nl_var_uses_bn_stats():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=nl.var(nl.load(a), axis=1))
        return out

    x = np.random.default_rng(7).standard_normal((128, 700), dtype=np.float32) * 3
    np.testing.assert_allclose(k(x)[:, 0], x.var(1), rtol=1e-4)
    assert [i.opcode for i in k.last.trace.instrs].count("BN_STATS") == 2


def test_max8_and_find_index8():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        top = nisa.max8(t)
        idx = nisa.nc_find_index8(data=t, vals=top)
        res = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res[:, 0:8], src=top)
        nisa.tensor_copy(dst=res[:, 8:16], src=idx)
        nl.store(out, value=res)
        return out

    x = np.random.default_rng(5).standard_normal((128, 100), dtype=np.float32)
    got = k(x)
    order = np.argsort(-x, axis=1)[:, :8]
    np.testing.assert_array_equal(got[:, :8], np.take_along_axis(x, order, 1))
    np.testing.assert_array_equal(got[:, 8:], order)


def test_bn_stats_new_form_and_bf16_numpy_outputs():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 2), nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        stats = nl.ndarray((128, 12), nl.float32, buffer=nl.sbuf)
        for j in nl.affine_range(2):
            nisa.bn_stats(dst=stats[:, j * 6:(j + 1) * 6], data=t[:, j * 300:(j + 1) * 300])
        mv = nl.ndarray((128, 2), nl.bfloat16, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        nisa.dma_copy(dst=out, src=mv)
        return out

    x = np.random.default_rng(4).standard_normal((128, 600), dtype=np.float32) * 2 + 1
    got = k(x)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), np.stack([x.mean(1), x.var(1)], 1), rtol=1e-2)


def test_benchmark_writes_its_neff_and_trace(tmp_path, monkeypatch):
    import traces
    from neuron_stack.isa.neff import load
    monkeypatch.chdir(tmp_path)

    @nki.benchmark(warmup=1, iters=3, save_neff_name="out/file.neff", save_trace_name="out/profile.ntff")
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.exp(nl.load(a)))  # KERNEL-LINE
        return out

    k(np.ones((128, 64), np.float32))
    neff = load(tmp_path / "out" / "file.neff")
    kline = line_of(Path(__file__), "# KERNEL-LINE")
    assert {o.get("nki_loc") for o in map(__import__("json").loads, neff.schedules[0].table.column("operands")
                                          .to_pylist())} == {f"test_nki_samples.py:{kline}"}
    with traces.open(tmp_path / "out" / "profile.ntff") as p:
        n = p.sql("SELECT count(*) AS n FROM executions").to_pylist()[0]["n"]
    assert n == 4                                        # warmup + iters
    # nki.profile(save_neff_name=) puts the NEFF beside the profile; it carries the kernel's instructions
    prof = nki.profile(working_directory=tmp_path / "prof", save_neff_name="file.neff")(k.fn)
    prof(np.ones((128, 64), np.float32))
    node = next(n for n in load(tmp_path / "prof" / "file.neff").program.nodes if n.op_class == "nki")
    assert [op for op, _ in node.kernel["instrs"]] == ["DMA_DIRECT2D", "ACTIVATE", "DMA_DIRECT2D"]


def test_misuse_is_one_line_naming_the_kernel_line(monkeypatch):
    x = np.zeros((256, 512), np.float32)

    @nki.jit
    def psum_stationary(a):
        t = nl.load(a[0:128, 0:128])
        p = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=p, data=t)
        acc = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=p, moving=t)  # MARK-PSUM-STAT
        return a

    @nki.jit
    def one_d_tile(a):
        return nl.ndarray((128,), nl.float32, buffer=nl.sbuf)  # MARK-1D

    @nki.jit
    def one_d_arange(a):
        return nl.load(a[nl.arange(128), nl.arange(512)])  # MARK-ARANGE

    @nki.jit
    def unbounded(a):
        t = nl.load(a[0:128, 0:512])
        for _ in nl.affine_range(10 ** 9):
            t = nl.exp(t)  # MARK-UNROLL
        return a

    @nki.jit
    def unsupported(a):
        nl.all_reduce(a, op=nl.add)  # MARK-UNSUPPORTED
        return a

    @nki.jit
    def crosses_bank(a):
        t = nl.load(a[0:128, 0:512])
        acc = nl.ndarray((128, 1024), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc[:, 256:768], stationary=t[:, 0:128], moving=t)  # MARK-BANK
        return a

    _raises_at(psum_stationary, (x,), "stationary is a PSUM tile", "MARK-PSUM-STAT")
    _raises_at(one_d_tile, (x,), "needs a partition and a free dimension", "MARK-1D")
    _raises_at(one_d_arange, (x,), "1-D nl.arange", "MARK-ARANGE")
    monkeypatch.setattr(core, "MAX_INSTRUCTIONS", 200)
    _raises_at(unbounded, (x,), "unrolls to more than 200 instructions", "MARK-UNROLL")
    _raises_at(unsupported, (x,), "nl.all_reduce is not supported", "MARK-UNSUPPORTED")
    _raises_at(crosses_bank, (x,), "crosses a 2 KiB PSUM bank", "MARK-BANK")
    assert not hasattr(nisa, "no_such_instruction") and hasattr(nisa, "bn_stats")


def test_manual_allocation_style_of_the_last_attention_tutorial():
    """The tutorial's last version: buffers carried on an ``nl.NKIObject``, ``address=`` hints, one PSUM tile
    over several banks, ``accumulate=`` flags, ``dma_transpose``, a column view ``t[:, j]`` as reduce_res."""
    class Bufs(nl.NKIObject):
        pass

    @nki.jit
    def k(q):
        P, S = q.shape
        b = Bufs()
        b.out = nl.ndarray((S, P), nl.float32, buffer=nl.shared_hbm)
        b.q = nl.ndarray((P, S), q.dtype, buffer=nl.sbuf, address=(0, 0))
        nisa.dma_copy(dst=b.q, src=q)
        b.psum = nl.ndarray((P, 3 * 512), nl.float32, buffer=nl.psum, address=(0, 0))     # three banks
        b.mx = nl.ndarray((P, 3), nl.float32, buffer=nl.sbuf)
        b.sb = nl.ndarray((P, 3, 512), nl.float32, buffer=nl.sbuf)
        with nl.no_reorder():
            for j in nl.static_range(3):
                for kk in nl.static_range(2):
                    nisa.nc_matmul(dst=b.psum[:, nl.ds(j * 512, 512)], stationary=b.q[0:64, nl.ds(kk * 128, 128)],
                                   moving=b.q[0:64, nl.ds(0, 512)], accumulate=kk != 0)
                nisa.tensor_scalar_reduce(dst=b.sb[:, j, :], data=b.psum[:, nl.ds(j * 512, 512)],
                                          op0=nl.multiply, operand0=1.0, reduce_op=nl.maximum, reduce_res=b.mx[:, j])
        t = nl.ndarray((P, P), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=b.sb[:, 0, 0:P], engine=nisa.vector_engine)
        tt = nl.ndarray((P, P), nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(dst=tt, src=t, axes=(1, 0))
        nisa.dma_copy(dst=b.out[0:P, :], src=tt)
        nisa.dma_copy(dst=b.out[P:P + 128, 0:3], src=b.mx)
        return b.out

    q = np.random.default_rng(6).standard_normal((128, 512), dtype=np.float32)
    got = k(q)
    s = q[0:64, 0:128].T @ q[0:64, 0:512] + q[0:64, 128:256].T @ q[0:64, 0:512]
    np.testing.assert_allclose(got[0:128], s[:, 0:128].T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[128:256, 0:3], np.repeat(s.max(1, keepdims=True), 3, 1), rtol=1e-5)


def test_masked_load_into_a_view_writes_only_the_mask():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        t = nl.full((128, 8), 7.0, nl.float32)
        i_p, i_f = nl.arange(128)[:, None], nl.arange(8)[None, :]
        t[i_p, i_f] = nl.load(a[i_p, i_f], mask=(i_p < 100))
        nl.store(out, value=t)
        return out

    x = np.ones((100, 8), np.float32)
    got = k(x)
    assert (got[:100] == 1).all() and (got[100:] == 7).all()
    assert [i.opcode for i in k.last.trace.instrs] == ["MEMSET", "DMA_DIRECT2D", "DMA_DIRECT2D"]
