"""The rest of the SDK's nki.isa / nki.language surface, each API run as the docs' example runs it, checked against
numpy, timed with its documented cost, and misused once (one line naming the kernel line)."""
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from nki_helpers import raises_at as _raises_at

import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl
from neuron_stack import nki
from neuron_stack.device.cost import dependent_overhead_ns, local_gather_ns
from neuron_stack.device.profiles import get_profile

HERE = Path(__file__)
TRN1 = get_profile("trn1")


def _ns(kernel, opcode: str) -> float:
    return next(i.dur for i in kernel.last.trace.instrs if i.opcode == opcode)


def test_tensor_tensor_scan_chains_two_halves_through_initial():
    @nki.jit
    def scan(a_tensor, b_tensor):
        c_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
        a, b = nl.load(a_tensor), nl.load(b_tensor)
        c = nl.ndarray(shape=(128, 1024), dtype=nl.float32)
        c[:, 0:512] = nisa.tensor_tensor_scan(a[:, 0:512], b[:, 0:512], initial=0, op0=np.multiply, op1=np.add)
        c[:, 512:1024] = nisa.tensor_tensor_scan(a[:, 512:1024], b[:, 512:1024], initial=c[:, 511],
                                                 op0=np.multiply, op1=np.add)
        nl.store(c_tensor, c)
        return c_tensor

    rng = np.random.default_rng(0)
    a, b = rng.random((128, 1024), dtype=np.float32), rng.random((128, 1024), dtype=np.float32)
    want = np.zeros((128, 1024))
    want[:, 0] = b[:, 0]
    for i in range(1, 1024):
        want[:, i] = a[:, i] * want[:, i - 1] + b[:, i]
    np.testing.assert_allclose(scan(a, b), want, rtol=1e-5)
    ops = [i.opcode for i in scan.last.trace.instrs]
    assert ops.count("TENSOR_TENSOR_SCAN") == 2 and "TENSOR_COPY" not in ops     # written straight into c
    assert _ns(scan, "TENSOR_TENSOR_SCAN") == pytest.approx(2 * 512 / TRN1.vector_clock_ghz)      # 2N cycles

    @nki.jit
    def bad(a_tensor, b_tensor):
        a = nl.load(a_tensor)
        c = nl.ndarray((128, 512), nl.float32)
        nisa.tensor_tensor_scan(c, a[:, 0:512], a[:, 0:256], 0.0, nl.multiply, nl.add)  # MARK-SCAN
        return a_tensor

    _raises_at(bad, (a, b), "elements per partition", "MARK-SCAN")


def test_scalar_tensor_tensor_both_forms_and_the_bf16_fast_path():
    @nki.jit
    def stt(x_t, m_t, y_t):
        out = nl.ndarray(x_t.shape, nl.float32, buffer=nl.shared_hbm)
        x, m, y = nl.load(x_t), nl.load(m_t), nl.load(y_t)
        legacy = nisa.scalar_tensor_tensor(data=x, op0=nl.subtract, operand0=m, op1=nl.multiply, operand1=y,
                                           dtype=nl.float32)
        new = nl.ndarray(x.shape, nl.float32)
        nisa.scalar_tensor_tensor(new, legacy, nl.add, 1.0, nl.subtract, y, reverse1=True)
        nl.store(out, new)
        return out

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((128, 256), dtype=np.float32), rng.standard_normal((128, 256), dtype=np.float32)
    m = rng.standard_normal((128, 1), dtype=np.float32)
    want = y - ((x - m) * y + 1.0)
    np.testing.assert_allclose(stt(x, m, y), want, rtol=1e-5, atol=1e-6)
    fp32 = _ns(stt, "SCALAR_TENSOR_TENSOR")
    assert fp32 == pytest.approx(2 * 256 / TRN1.vector_clock_ghz)
    stt(_bf16(x), m, _bf16(y))
    assert _ns(stt, "SCALAR_TENSOR_TENSOR") == pytest.approx(fp32 / 2)       # bf16 subtract-then-multiply: N

    @nki.jit
    def bad(x_t):
        x = nl.load(x_t)
        return nisa.scalar_tensor_tensor(data=x, op0=nl.bitwise_and, operand0=1, op1=nl.add, operand1=x)  # MARK-STT

    _raises_at(bad, (x,), "not the bitvec operator bitwise_and", "MARK-STT")


def _bf16(a):
    import ml_dtypes
    return a.astype(ml_dtypes.bfloat16)


def test_tensor_partition_reduce_docs_examples():
    @nki.jit
    def par_reduce(a_tensor):
        b_tensor = nl.ndarray((1, 32, 4), nl.float32, buffer=nl.shared_hbm)
        a = nl.load(a_tensor[0:128, 0:32, 0:4])
        b = nisa.tensor_partition_reduce(np.add, a)
        nl.store(b_tensor[0:1, 0:32, 0:4], b)
        return b_tensor

    @nki.jit
    def par_reduce_nd_b(a_tensor):
        b_tensor = nl.ndarray((a_tensor.shape[0], 1) + a_tensor.shape[2:], nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(a_tensor.shape[0]):
            a = nl.load(a_tensor[i])
            b = nl.ndarray((1,) + a_tensor.shape[2:], nl.float32)
            nisa.tensor_partition_reduce(b, nl.maximum, a)
            nl.store(b_tensor[i], b)
        return b_tensor

    rng = np.random.default_rng(2)
    a = rng.random((128, 32, 4), dtype=np.float32)
    np.testing.assert_allclose(par_reduce(a), a.sum(0, keepdims=True), rtol=1e-5)
    assert {i.engine for i in par_reduce.last.trace.instrs if not i.opcode.startswith("DMA")} == {"gpsimd"}
    a4 = rng.random((4, 128, 32, 8), dtype=np.float32)
    np.testing.assert_array_equal(par_reduce_nd_b(a4), a4.max(1, keepdims=True))

    @nki.jit
    def bad(a_tensor):
        return nisa.tensor_partition_reduce(np.multiply, nl.load(a_tensor))  # MARK-PR

    _raises_at(bad, (a,), "op must be nl.add, nl.maximum", "MARK-PR")


def test_select_reduce_running_max_across_instructions():
    @nki.jit
    def sel(p_t, x_t):
        out = nl.ndarray(x_t.shape, nl.float32, buffer=nl.shared_hbm)
        mx = nl.ndarray((x_t.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        p, x = nl.load(p_t), nl.load(x_t)
        d = nl.ndarray(x.shape, nl.float32)
        r = nl.ndarray((x.shape[0], 1), nl.float32)
        nisa.select_reduce(d, p, x, -100.0, reduce_cmd=nisa.reduce_cmd.reset_reduce)       # accumulators only
        nisa.select_reduce(d, p, x, -100.0, reduce_res=r, reduce_cmd=nisa.reduce_cmd.reduce, reverse_pred=True)
        nl.store(out, d)
        nl.store(mx, r)
        return out, mx

    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 64), dtype=np.float32)
    p = (rng.random((128, 64)) < 0.5).astype(np.uint8)
    got, mx = sel(p, x)
    first, second = np.where(p != 0, x, -100.0), np.where(p == 0, x, -100.0)
    np.testing.assert_array_equal(got, second)
    np.testing.assert_array_equal(mx[:, 0], np.maximum(first.max(1), second.max(1)))
    readout = sel.last.trace.instrs[-3]
    # 2N + MIN_II for the read-out, plus the ~100-cycle overhead of a small instruction after the one it waits for
    want_ns = (2 * 64 + TRN1.min_ii_cycles) / TRN1.vector_clock_ghz + dependent_overhead_ns(TRN1, "vector")
    assert readout.dur == pytest.approx(want_ns)

    @nki.jit
    def bad(x_t):
        x = nl.load(x_t)
        d = nl.ndarray(x.shape, nl.float32)
        nisa.select_reduce(d, x, x, 0.0)  # MARK-SEL
        return x_t

    _raises_at(bad, (x,), "predicate is float32; it must be int8, uint8, int16 or uint16", "MARK-SEL")


def test_range_select_docs_example_and_chaining_on_trn2():
    @nki.jit(mode="simulation", platform_target="trn2")
    def rs(on_true, bound0, bound1, range_start):
        select_res = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.hbm)
        reduce_result = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.hbm)
        on_true_tile = nl.load(on_true[...])
        bound0_tile, bound1_tile = nl.load(bound0[...]), nl.load(bound1[...])
        reduce_res_tile = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        result = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.sbuf)
        result[...] = nisa.range_select(on_true_tile=on_true_tile, comp_op0=np.greater_equal, comp_op1=np.less,
                                        bound0=bound0_tile, bound1=bound1_tile,
                                        reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=reduce_res_tile,
                                        reduce_op=np.max, range_start=range_start, on_false_value=nl.fp32.min)
        ones = nl.full(on_true.shape, fill_value=1, dtype=np.float32, buffer=nl.sbuf)
        on_true_tile[...] = nl.add(on_true_tile, ones)
        result[...] = nisa.range_select(on_true_tile=on_true_tile, comp_op0=np.greater_equal, comp_op1=np.less,
                                        bound0=bound0_tile, bound1=bound1_tile, reduce_cmd=nisa.reduce_cmd.reduce,
                                        reduce_res=reduce_res_tile, reduce_op=np.max,
                                        range_start=range_start + 128, on_false_value=nl.fp32.min)
        nl.store(select_res[...], value=result[...])
        nl.store(reduce_result[...], value=reduce_res_tile[...])
        return select_res, reduce_result

    rng = np.random.default_rng(4)
    x = rng.random((128, 512), dtype=np.float32)
    b0, b1 = np.zeros((128, 1), np.float32), np.full((128, 1), 350, np.float32)
    got, red = rs(x, b0, b1, 32)
    sel = []
    for k, start in enumerate((32, 160)):
        i = start + np.arange(512)[None, :]
        sel.append(np.where((i >= b0) & (i < b1), x + k, nl.fp32.min))
    np.testing.assert_array_equal(got, sel[1])
    np.testing.assert_array_equal(red[:, 0], np.maximum(sel[0].max(1), sel[1].max(1)))

    @nki.jit
    def on_trn1(x_t, b_t):
        x, b = nl.load(x_t), nl.load(b_t)
        return nisa.range_select(on_true_tile=x, comp_op0=nl.less, comp_op1=nl.less, bound0=b, bound1=b)  # MARK-RS

    _raises_at(on_trn1, (x, b0), "range_select needs NeuronCore-v3 (trn2)", "MARK-RS")


def test_dropout_keep_ratio_no_rescale_and_seeded_determinism():
    @nki.jit
    def per_partition(a_tensor, b_tensor):
        c_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
        c = nisa.dropout(nl.load(a_tensor), prob=nl.load(b_tensor))
        nl.store(c_tensor, c)
        return c_tensor

    @nki.jit
    def seeded(a_tensor, seed_tensor):
        out = nl.ndarray((2,) + a_tensor.shape, a_tensor.dtype, buffer=nl.shared_hbm)
        a = nl.load(a_tensor)
        for k in nl.static_range(2):
            nl.random_seed(nl.load(seed_tensor))
            nl.store(out[k], nl.dropout(a, 0.3))
        return out

    rng = np.random.default_rng(5)
    a = rng.random((128, 512), dtype=np.float32) + 1.0
    prob = np.linspace(0.0, 0.9, 128, dtype=np.float32)[:, None]
    c = per_partition(a, prob)
    assert np.all((c == 0) | (c == a))                     # kept elements unchanged: no 1/(1-p) rescale
    np.testing.assert_allclose((c == 0).mean(1), prob[:, 0], atol=0.08)
    assert _ns(per_partition, "DROPOUT") == pytest.approx(512 / TRN1.vector_clock_ghz)      # max(MIN_II, N)

    two = seeded(a, np.array([[42]], np.int32))
    dropped = (two == 0).mean()
    assert abs(dropped - 0.3) < 0.01 and np.all((two == 0) | (two == a))
    np.testing.assert_array_equal(two[0], two[1])           # the same seed: the same mask
    other = seeded(a, np.array([[7]], np.int32))
    assert (other[0] != two[0]).any()
    np.testing.assert_array_equal(seeded(a, np.array([[7]], np.int32)), other)     # deterministic runs

    @nki.jit
    def bad(a_tensor):
        return nl.dropout(nl.load(a_tensor), 1.5)  # MARK-DROP

    _raises_at(bad, (a,), "probability 1.5 is outside [0, 1]", "MARK-DROP")


def test_local_gather_docs_example():
    @nki.jit(mode="simulation")
    def gather(src_buffer, index, num_elem_per_idx, num_valid_indices, output_shape):
        output = nl.ndarray(output_shape, dtype=src_buffer.dtype, buffer=nl.shared_hbm)
        output_tile = nisa.local_gather(nl.load(src_buffer), nl.load(index), num_elem_per_idx, num_valid_indices)
        nl.store(output, output_tile)
        return output

    rng = np.random.default_rng(6)
    src = rng.random((128, 512, 4), dtype=np.float32)
    index = np.tile(rng.integers(0, 512, size=(16, 4), dtype=np.uint16), (8, 1))
    got = gather(src, index * 4, 4, 64, (128, 4, 16, 4))
    want = np.empty((128, 64, 4), np.float32)
    for c in range(0, 128, 16):
        want[c:c + 16] = np.take(src[c:c + 16], index[c:c + 16].flatten(order="F")[:64], axis=1)
    np.testing.assert_array_equal(got, want.reshape(128, 4, 16, 4))
    assert _ns(gather, "LOCAL_GATHER") == pytest.approx(local_gather_ns(TRN1, 64, 4, 4))
    assert local_gather_ns(TRN1, 64, 4, 4) == pytest.approx((150 + 256 / (44 / 16)) / TRN1.gpsimd_clock_ghz)

    @nki.jit
    def bad(src_buffer, index):
        return nisa.local_gather(nl.load(src_buffer), nl.load(index), 3)  # MARK-LG

    _raises_at(bad, (src, index), "num_elem_per_idx must be one of 1, 2, 4, 8, 16, 32", "MARK-LG")


def test_all_invert_and_loop_reduce():
    @nki.jit
    def k(x_t, i_t, u_t):
        outs = tuple(nl.ndarray(shape, dt, buffer=nl.shared_hbm) for shape, dt in
                     (((128, 1), nl.uint8), (i_t.shape, i_t.dtype), (u_t.shape, u_t.dtype), ((128, 64), nl.float32)))
        nl.store(outs[0], nl.all(nl.load(x_t), axis=1, dtype=nl.uint8))
        nl.store(outs[1], nl.invert(nl.load(i_t)))
        nl.store(outs[2], nl.invert(nl.load(u_t)))
        b = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        for k_i in nl.affine_range(4):
            a = nl.load(x_t[:, nl.ds(k_i * 64, 64)])
            b = nl.loop_reduce(a, op=np.add, loop_indices=[k_i], dtype=nl.float32)
        nl.store(outs[3], b)
        return outs

    rng = np.random.default_rng(7)
    x = rng.integers(0, 2, (128, 256)).astype(np.float32)
    x[::3] = 1.0
    i = rng.integers(-1000, 1000, (128, 8), dtype=np.int32)
    u = rng.integers(0, 255, (128, 8), dtype=np.uint8)
    al, inv_i, inv_u, s = k(x, i, u)
    np.testing.assert_array_equal(al[:, 0], x.all(1))
    np.testing.assert_array_equal(inv_i, np.invert(i))
    np.testing.assert_array_equal(inv_u, np.invert(u))
    np.testing.assert_array_equal(s, x.reshape(128, 4, 64).sum(1))

    @nki.jit
    def bad_invert(x_t):
        return nl.invert(nl.load(x_t))  # MARK-INV

    @nki.jit
    def bad_loop_reduce(x_t):
        for k_i in nl.affine_range(2):
            c = nl.loop_reduce(nl.load(x_t), op=np.add, loop_indices=[k_i])  # MARK-LR
        return c

    _raises_at(bad_invert, (x,), "nl.invert takes an integer or bool tile", "MARK-INV")
    _raises_at(bad_loop_reduce, (x,), "nl.loop_reduce writes into its destination", "MARK-LR")


def test_shared_identity_matrix_and_shared_constant():
    @nki.jit
    def k(x_t):
        out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
        identity = nl.shared_identity_matrix(n=128, dtype=nl.float32)
        table = nl.load(nl.shared_constant(np.arange(128 * 128, dtype=np.float32).reshape(128, 128)))
        p = nl.matmul(identity, nl.load(x_t), transpose_x=True)       # the docs' use: identity.T @ x
        nl.store(out, nl.add(nl.copy(p), table))
        return out

    x = np.random.default_rng(8).standard_normal((128, 128), dtype=np.float32)
    np.testing.assert_allclose(k(x), x + np.arange(128 * 128).reshape(128, 128), rtol=1e-6)
    assert [i.opcode for i in k.last.trace.instrs].count("AFFINE_SELECT") == 1

    @nki.jit
    def bad(x_t):
        return nl.shared_identity_matrix(256)  # MARK-ID

    _raises_at(bad, (x,), "exceeds the 128 partitions", "MARK-ID")


def test_every_current_sdk_name_exists_or_says_it_is_not_supported():
    """No SDK name is a bare AttributeError: either it works or the error says what is simulated."""
    for mod, names in ((nl, ("dynamic_range", "all_reduce", "prelu")),
                       (nisa, ("rand2", "register_alloc", "core_barrier", "nc_matmul_mx"))):
        for name in names:
            with pytest.raises(AttributeError, match="is not supported by the simulator yet"):
                getattr(mod, name)
    for name in ("tensor_tensor_scan", "scalar_tensor_tensor", "tensor_partition_reduce", "select_reduce",
                 "range_select", "local_gather", "dropout", "set_rng_seed"):
        assert callable(getattr(nisa, name))
    for name in ("random_seed", "dropout", "all", "invert", "shared_constant", "shared_identity_matrix",
                 "loop_reduce"):
        assert callable(getattr(nl, name))


def test_elementwise_extras_rand_rng_and_predicated_copy():
    @nki.jit
    def k(x_t, i_t, p_t, seed_t):
        outs = tuple(nl.ndarray(shape, dt, buffer=nl.shared_hbm) for shape, dt in
                     (((9,) + x_t.shape, nl.float32), ((2,) + i_t.shape, nl.int32), ((2, 128, 64), nl.float32),
                      ((128, 64), nl.uint8), (x_t.shape, nl.float32)))
        x, i = nl.load(x_t), nl.load(i_t)
        for j, f in enumerate((nl.trunc, nl.tan, nl.arctan, nl.mish, nl.gelu_apprx_sigmoid, nl.silu_dx, nl.erf_dx)):
            nl.store(outs[0][j], f(x))
        nl.store(outs[0][7], nl.fmod(x, 0.75))
        nl.store(outs[0][8], nl.mod(x, 0.75))
        nl.store(outs[1][0], nl.left_shift(i, 3))
        nl.store(outs[1][1], nl.right_shift(i, 2))
        for j in nl.static_range(2):
            nl.random_seed(nl.load(seed_t))
            nl.store(outs[2][j], nl.rand((128, 64), dtype=nl.float32))
        bits = nl.ndarray((128, 64), nl.uint8)
        nisa.rng(bits)
        nl.store(outs[3], bits)
        y = nl.zeros(x.shape, nl.float32)
        nisa.tensor_copy_predicated(dst=y, src=x, predicate=nl.load(p_t), reverse_pred=True)
        nl.store(outs[4], y)
        return outs

    rng = np.random.default_rng(9)
    x = rng.uniform(-1.2, 1.2, (128, 64)).astype(np.float32)
    i = rng.integers(0, 1 << 20, (128, 64), dtype=np.int32)
    p = (rng.random((128, 64)) < 0.5).astype(np.uint8)
    f, sh, r, bits, y = k(x, i, p, np.array([[3]], np.int32))
    xt = torch.from_numpy(x)
    s = torch.sigmoid(xt)
    refs = [np.trunc(x), np.tan(x), np.arctan(x), torch.nn.functional.mish(xt).numpy(),
            (xt * torch.sigmoid(1.702 * xt)).numpy(), (s * (1 + xt * (1 - s))).numpy(),
            2 / np.sqrt(np.pi) * np.exp(-x * x), np.fmod(x, 0.75), np.mod(x, 0.75)]
    for got, want in zip(f, refs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(sh[0], i << 3)
    np.testing.assert_array_equal(sh[1], i >> 2)
    np.testing.assert_array_equal(r[0], r[1])                              # reseeded: the same draws
    assert 0.0 <= r.min() and r.max() < 1.0 and abs(r.mean() - 0.5) < 0.02
    assert bits.dtype == np.uint8 and len(np.unique(bits)) > 200
    np.testing.assert_array_equal(y, np.where(p == 0, x, 0.0))

    @nki.jit
    def bad(x_t):
        nisa.rng(nl.load(x_t))  # MARK-RNG
        return x_t

    _raises_at(bad, (x,), "nisa.rng writes an integer tile", "MARK-RNG")


def test_match_replace8_stream_shuffle_and_gathers():
    @nki.jit(mode="simulation", kernel_return=True)
    def match_replace():
        data_tile = nl.rand((4, 16))
        max_vals = nisa.max8(src=data_tile)
        result = nisa.nc_match_replace8(data=data_tile[:, :], vals=max_vals, imm=float("-inf"))
        result_tensor = nl.ndarray([4, 16], dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(result_tensor, value=result)
        return result_tensor

    res = match_replace()
    kept = res[~np.isneginf(res)]
    assert np.all(np.isneginf(res).sum(1) == 8) and np.all((kept >= 0) & (kept < 1))

    @nki.jit
    def shuffle(in_tensor):
        out_tensor = nl.ndarray(in_tensor.shape, in_tensor.dtype, buffer=nl.shared_hbm)
        a = nl.load(in_tensor)
        a_mgrid = nl.mgrid[0:32, 0:128]
        shuffle_mask = [(i - 1) % 32 for i in range(32)]
        nisa.nc_stream_shuffle(src=a[a_mgrid.p, a_mgrid.x], dst=a[a_mgrid.p, a_mgrid.x], shuffle_mask=shuffle_mask)
        nl.store(out_tensor, value=a)
        return out_tensor

    x = np.random.default_rng(10).random((32, 128), dtype=np.float32)
    np.testing.assert_array_equal(shuffle(x), x[[(i - 1) % 32 for i in range(32)]])

    @nki.jit
    def gathers(d_t, i_t, seg_t):
        outs = (nl.ndarray(i_t.shape, d_t.dtype, buffer=nl.shared_hbm), nl.ndarray((1, 2, 32), nl.float32,
                                                                                   buffer=nl.shared_hbm))
        nl.store(outs[0], nl.gather_flattened(nl.load(d_t), nl.load(i_t)))
        nl.store(outs[1], nisa.sequence_bounds(segment_ids=nl.load(seg_t)))
        return outs

    rng = np.random.default_rng(11)
    d = rng.random((128, 512), dtype=np.float32)
    idx = rng.integers(0, 512, (128, 64)).astype(np.uint32)
    seg = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3] + [4] * 20 + [0, 0, 5]], np.float32)
    g, bounds = gathers(d, idx, seg)
    np.testing.assert_array_equal(g, np.take_along_axis(d, idx.astype(np.int64), 1))
    np.testing.assert_array_equal(bounds[0, :, :9], [[32, 1, 1, 3, 3, 3, 32, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]])
    np.testing.assert_array_equal(bounds[0, :, 29:], [[32, 32, 31], [-1, -1, 32]])

    @nki.jit
    def bad(in_tensor):
        a = nl.load(in_tensor)
        nisa.nc_stream_shuffle(src=a[0:16, :], dst=a[16:32, :], shuffle_mask=list(range(32)))  # MARK-SHUF
        return in_tensor

    _raises_at(bad, (x,), "dst starts at partition 16", "MARK-SHUF")


def test_tensor_scalar_cumulative_and_nonzero_with_count():
    @nki.jit(platform_target="trn2")
    def k(x_t):
        outs = (nl.ndarray(x_t.shape, nl.float32, buffer=nl.shared_hbm),
                nl.ndarray(x_t.shape, nl.float32, buffer=nl.shared_hbm),
                nl.ndarray((x_t.shape[0], x_t.shape[1] + 1), nl.int32, buffer=nl.shared_hbm))
        x = nl.load(x_t)
        c = nl.ndarray(x.shape, nl.float32)
        nisa.tensor_scalar_cumulative(c, x, nl.multiply, nl.add, imm0=2.0)
        nl.store(outs[0], c)
        m = nl.ndarray(x.shape, nl.float32)
        nisa.tensor_scalar_cumulative(m, x, nl.add, nl.maximum, imm0=0.0, imm1=0.5,
                                      reduce_cmd=nisa.reduce_cmd.load_reduce)
        nl.store(outs[1], m)
        nz = nl.full((x.shape[0], x.shape[1] + 1), 7, nl.int32)
        nisa.nonzero_with_count(nz, x, index_offset=16, padding_val=-1)
        nl.store(outs[2], nz)
        return outs

    rng = np.random.default_rng(12)
    x = np.where(rng.random((32, 8)) < 0.4, rng.standard_normal((32, 8)), 0).astype(np.float32)
    c, m, nz = k(x)
    np.testing.assert_allclose(c, np.cumsum(2 * x, axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m, np.maximum.accumulate(np.concatenate([np.full((32, 1), 0.5), x], 1), 1)[:, 1:])
    for p in range(32):
        if p % 16:
            assert (nz[p] == 7).all()                                    # other partitions untouched
        else:
            idx = np.flatnonzero(x[p])
            assert nz[p, -1] == len(idx) and (nz[p, :len(idx)] == idx + 16).all() and (nz[p, len(idx):-1] == -1).all()

    @nki.jit
    def on_trn1(x_t):
        x = nl.load(x_t)
        nisa.nonzero_with_count(nl.ndarray((32, 9), nl.int32), x)  # MARK-NZ
        return x_t

    _raises_at(on_trn1, (x,), "nonzero_with_count needs NeuronCore-v3 (trn2)", "MARK-NZ")


def test_tensor_copy_dynamic_src_and_dst_read_offsets_from_sbuf():
    @nki.jit(mode="simulation")
    def gather(in_tensor, idx_tensor):
        out_tensor = nl.ndarray([128, 64], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
        ix, iy = nl.mgrid[0:128, 0:1]
        in_tensor_sbuf = nl.load(in_tensor)
        idx_tensor_sbuf = nl.load(idx_tensor)
        out_sbuf = nl.ndarray([128, 64], dtype=in_tensor.dtype, buffer=nl.sbuf)
        for b_idx in nl.affine_range(idx_tensor_sbuf.shape[1]):
            out_sbuf[ix, b_idx] = nisa.tensor_copy_dynamic_src(in_tensor_sbuf[ix, idx_tensor_sbuf[0, b_idx] + iy])
        nl.store(out_tensor, value=out_sbuf)
        return out_tensor

    @nki.jit
    def scatter(in_tensor, idx_tensor):
        out_tensor = nl.ndarray([128, 512], dtype=in_tensor.dtype, buffer=nl.shared_hbm)
        ix, iy = nl.mgrid[0:128, 0:1]
        src, idx = nl.load(in_tensor), nl.load(idx_tensor)
        out = nl.zeros((128, 512), in_tensor.dtype)
        for j in nl.affine_range(in_tensor.shape[1]):
            nisa.tensor_copy_dynamic_dst(dst=out[ix, idx[0, j] + iy], src=src[ix, j + iy])  # MARK-DYN
        nl.store(out_tensor, out)
        return out_tensor

    rng = np.random.default_rng(13)
    x = rng.random((128, 512), dtype=np.float32)
    idx = (4 + np.arange(64, dtype=np.int32))[None, :]
    np.testing.assert_array_equal(gather(x, idx), np.take(x, idx[0], axis=1))
    ops = [i.opcode for i in gather.last.trace.instrs]
    assert ops.count("TENSOR_COPY_DYNAMIC") == 64 and "TENSOR_COPY" not in ops
    assert _ns(gather, "TENSOR_COPY_DYNAMIC") == pytest.approx(600 / TRN1.vector_clock_ghz)      # MIN_II_DYNAMIC
    src = rng.random((128, 16), dtype=np.float32)
    pos = rng.permutation(512)[:16].astype(np.int32)[None, :]
    want = np.zeros((128, 512), np.float32)
    want[:, pos[0]] = src
    np.testing.assert_array_equal(scatter(src, pos), want)
    pos[0, 3] = 600                                                  # outside the 512 columns: caught at run time
    _raises_at(scatter, (src, pos), "dynamic offset 600 read from SBUF is outside 0..511", "MARK-DYN")


def test_atomic_rmw_and_dma_copy_read_modify_write():
    @nki.jit
    def rmw(in_tensor, value_tensor):
        rmw_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
        nl.store(rmw_tensor, nl.load(in_tensor))
        value = nl.load(value_tensor)
        nl.atomic_rmw(rmw_tensor, value=value, op=np.add)
        nisa.dma_copy(dst=rmw_tensor[0:64, :], src=value[0:64, :], dst_rmw_op=nl.maximum)
        return rmw_tensor

    rng = np.random.default_rng(14)
    a, v = rng.random((128, 512), dtype=np.float32), rng.random((128, 512), dtype=np.float32)
    want = a + v
    want[:64] = np.maximum(want[:64], v[:64])
    np.testing.assert_allclose(rmw(a, v), want, rtol=1e-6)
    # load+store, the value load, the atomic RMW and the RMW copy: four lines of DMAs, each spread over queues
    assert len({i.node for i in rmw.last.trace.instrs if i.opcode == "DMA_DIRECT2D"}) == 4

    @nki.jit
    def indirect(in_tensor, indices_tensor):
        out = nl.ndarray(in_tensor.shape, in_tensor.dtype, buffer=nl.shared_hbm)
        idx = nl.load(indices_tensor)
        nl.atomic_rmw(out[idx, nl.arange(512)[None, :]], value=nl.load(in_tensor), op=np.add)  # MARK-RMW
        return out

    _raises_at(indirect, (a, np.arange(128, dtype=np.int32)[:, None]), "writing them (a scatter, an atomic "
               "update) is not simulated", "MARK-RMW")


def test_dma_compute_sums_sources_in_one_dma():
    @nki.jit
    def k(a_t, b_t, c_t):
        out = nl.ndarray(a_t.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_compute(out, [a_t, b_t, nl.load(c_t)], reduce_op=nl.add)
        return out

    rng = np.random.default_rng(15)
    a, b, c = (rng.random((128, 256), dtype=np.float32) for _ in range(3))
    np.testing.assert_allclose(k(a, b, c), a + b + c, rtol=1e-6)
    assert [op for op, _ in itertools.groupby(i.opcode for i in k.last.trace.instrs)] == ["DMA_DIRECT2D", "DMA_COMPUTE"]

    @nki.jit
    def bad(a_t):
        out = nl.ndarray(a_t.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_compute(out, [a_t, a_t], reduce_op=nl.multiply)  # MARK-DMAC
        return out

    _raises_at(bad, (a,), "reduce_op=nl.add with scales of 1.0 only", "MARK-DMAC")


def test_reduce_results_follow_their_reduce_op():
    """tensor_scalar_reduce's reduce_op=nl.multiply multiplies (the accumulators knew only add/max/min)."""
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        r = nl.ndarray((128, 1), nl.float32)
        nisa.tensor_scalar_reduce(data=nl.load(a), op0=nl.multiply, operand0=2.0, reduce_op=nl.multiply, reduce_res=r)
        nl.store(out, r)
        return out

    x = np.random.default_rng(16).uniform(0.5, 1.5, (128, 8)).astype(np.float32)
    np.testing.assert_allclose(k(x)[:, 0], (2 * x).prod(1), rtol=1e-5)
