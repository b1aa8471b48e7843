"""Legacy NKI forms the contributed kernel libraries lean on (nki-samples ``contributed/neuron-team-kernels``):
masking an operand by indexing it with a predicate, a matmul whose moving tile keeps several free dims, a masked
load that selects nothing, index expressions of different ranks, the ALU's unary arithmetic operators, and the
compiler's allocator decorators. Each restated here as a small kernel of our own, checked against numpy."""
import numpy as np
from nki_helpers import line_of, raises_at

import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl
from neuron_stack import nki


def test_predicate_masked_matmul_operands_accumulate_into_their_box():
    """``w[i_m < M]`` trims the stationary tile to its first M columns: ``acc[...] += nc_matmul(...)`` then adds
    into those M partitions of the accumulator only; the rest keeps its zeros."""
    @nki.jit
    def k(w_t, x_t, m_valid):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        w, x = nl.load(w_t), nl.load(x_t)
        acc = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        i_k, i_m = nl.arange(32)[:, None], nl.arange(128)[None, :]
        i_n = nl.arange(64)[None, :]
        for _ in nl.affine_range(2):
            acc[nl.arange(128)[:, None], i_n] += nisa.nc_matmul(w[i_k, i_m][i_m < m_valid], x[i_n < 64][True])
        nl.store(out, nl.copy(acc))
        return out

    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((32, 128), dtype=np.float32), rng.standard_normal((32, 64), dtype=np.float32)
    want = np.zeros((128, 64), np.float32)
    want[:100] = 2 * (w[:, :100].T @ x)
    np.testing.assert_allclose(k(w, x, 100), want, rtol=1e-5, atol=1e-4)

    @nki.jit
    def empty(w_t):
        w = nl.load(w_t)
        i_m = nl.arange(128)[None, :]
        return w[nl.arange(32)[:, None], i_m][i_m < 0]  # MARK-EMPTY

    raises_at(empty, (w,), "the mask selects nothing", "MARK-EMPTY")


def test_matmul_with_a_multi_dim_moving_tile_keeps_its_free_dims():
    """A moving tile [K, a, b] gives a [M, a, b] product (stationary.T @ moving over the flattened free dims)."""
    @nki.jit
    def k(w_t, x_t):
        out = nl.ndarray((16, 4, 8), nl.float32, buffer=nl.shared_hbm)
        w = nl.load(w_t)
        x = nl.ndarray((32, 4, 8), nl.float32)
        x[...] = nl.load(x_t)
        acc = nl.zeros((16, 4, 8), nl.float32, buffer=nl.psum)
        acc[...] += nisa.nc_matmul(w, x)
        nl.store(out, nl.copy(acc))
        return out

    rng = np.random.default_rng(1)
    w, x = rng.standard_normal((32, 16), dtype=np.float32), rng.standard_normal((32, 4, 8), dtype=np.float32)
    np.testing.assert_allclose(k(w, x), np.einsum("km,kab->mab", w, x), rtol=1e-5, atol=1e-4)


def test_masked_load_that_selects_nothing_writes_nothing():
    """``t[...] = nl.load(src, mask=m)`` with m false everywhere (a row past the end of the tensor) leaves ``t``
    as it was, as the masked instruction is not issued at all."""
    @nki.jit
    def k(a_t):
        out = nl.ndarray((8, 16), nl.float32, buffer=nl.shared_hbm)
        t = nl.zeros((8, 16), nl.float32)
        i_p, i_f = nl.arange(8)[:, None], nl.arange(16)[None, :]
        for r in nl.affine_range(2):            # rows 0..7 exist; the second block (rows 8..15) does not
            t[i_p, i_f] = nl.load(a_t[r * 8 + i_p, i_f], mask=(r * 8 < 8) & (i_f < 16))
        nl.store(out, t)
        return out

    a = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    np.testing.assert_array_equal(k(a), a)


def test_index_expressions_of_lower_rank_name_the_leading_dims():
    """``t[arange(P)[:, None, None], i1, i2, i3]`` beside 4-D expressions: when numpy's leading pad would clash,
    the 3-D expression names the leading dims (as the contributed conv kernel indexes its PSUM tile)."""
    @nki.jit
    def k(a_t):
        out = nl.ndarray((8, 2, 3, 4), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((8, 2, 3, 4), nl.float32)
        i_p = nl.arange(8)[:, None, None]
        i_a, i_b, i_c = (nl.arange(n)[tuple(slice(None) if d == j else None for d in range(4))]
                         for j, n in ((1, 2), (2, 3), (3, 4)))
        t[i_p, i_a, i_b, i_c] = nl.load(a_t)
        nl.store(out, t)
        return out

    a = np.arange(8 * 24, dtype=np.float32).reshape(8, 2, 3, 4)
    np.testing.assert_array_equal(k(a), a)

    @nki.jit
    def clash(a_t):
        t = nl.load(a_t)
        return t[nl.arange(8)[:, None], nl.arange(3)[:, None], nl.arange(4)[None, :]]  # MARK-CLASH

    raises_at(clash, (a.reshape(8, 24)[:, :12].reshape(8, 3, 4).copy(),), "do not broadcast", "MARK-CLASH")


def test_alu_unary_arithmetic_ops_ignore_their_operand():
    """nl.abs, nl.rsqrt and nl.reciprocal are ALU operators too (the docs' table of math operators): in
    tensor_scalar / tensor_scalar_reduce they apply to the data and the scalar operand is ignored."""
    @nki.jit
    def k(x_t):
        outs = [nl.ndarray(s, nl.float32, buffer=nl.shared_hbm) for s in ((128, 64), (128, 1), (128, 64))]
        x = nl.load(x_t)
        absmax = nl.ndarray((128, 1), nl.float32)
        nl.store(outs[0], nisa.tensor_scalar_reduce(data=x, op0=nl.abs, operand0=0.0, reduce_op=nl.max,
                                                    reduce_res=absmax))
        nl.store(outs[1], absmax)
        mag = nisa.tensor_scalar(x, nl.abs, -3.0)
        nl.store(outs[2], nisa.tensor_scalar(nisa.tensor_scalar(mag, nl.rsqrt, 5.0), nl.reciprocal, 7.0))
        return outs

    x = np.random.default_rng(2).standard_normal((128, 64), dtype=np.float32) + 0.5
    a, m, r = k(x)
    np.testing.assert_array_equal(a, np.abs(x))
    np.testing.assert_array_equal(m[:, 0], np.abs(x).max(1))
    np.testing.assert_allclose(r, np.sqrt(np.abs(x)), rtol=1e-5)


def test_allocator_decorators_are_accepted():
    """``@nki.compiler.enable_stack_allocator`` (bare or called) and ``force_auto_alloc`` leave the kernel as
    written: the simulator places every tile by its liveness either way."""
    @nki.compiler.enable_stack_allocator(log_level=20)
    @nki.compiler.skip_middle_end_transformations
    @nki.jit
    def k(a_t):
        out = nl.ndarray(a_t.shape, a_t.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a_t) * 2.0)
        return out

    a = np.ones((4, 8), np.float32)
    np.testing.assert_array_equal(k(a), 2 * a)
    assert nki.compiler.enable_stack_allocator(k) is k and nki.compiler.force_auto_alloc(k) is k


def test_bitcast_view_reads_a_tiles_bytes_as_a_narrower_dtype():
    """``scale.view(nl.float8_e4m3)`` of an fp32 [P, 1] tile is [P, 4]: the scale's four bytes, stored into an
    fp8 tensor they come back bit for bit (how a quantising kernel ships fp32 scales beside fp8 data)."""
    @nki.jit
    def k(s_t):
        out = nl.ndarray((128, 4), nl.float8_e4m3, buffer=nl.shared_hbm)
        halves = nl.ndarray((128, 2), nl.bfloat16, buffer=nl.shared_hbm)
        s = nl.ndarray((2, nl.par_dim(128), 1), nl.float32)
        s[1] = nl.load(s_t)
        nl.store(out, s.view(nl.float8_e4m3)[1, :, :4])
        nl.store(halves, s[1].view(nl.bfloat16))
        return out, halves

    @nki.jit
    def write_through(s_t):
        s = nl.load(s_t)
        s.view(nl.bfloat16)[:, 0:2] = 0.0  # MARK-BCW
        return s_t

    scale = np.random.default_rng(3).uniform(1e-4, 1.0, (128, 1)).astype(np.float32)
    b, h = k(scale)
    np.testing.assert_array_equal(np.ascontiguousarray(b).view(np.uint8), scale.view(np.uint8))
    np.testing.assert_array_equal(np.ascontiguousarray(h).view(np.uint16), scale.view(np.uint16))
    raises_at(write_through, (scale,), "bitcast view is read-only", "MARK-BCW")


def test_legacy_trace_decorator_inlines_a_helper():
    """``from neuronxcc.nki import trace``: a ``@trace`` helper runs inline in the calling kernel, its
    instructions tagged with the helper's own lines, as ``@nki.jit(mode='trace')`` helpers are."""
    @nki.trace
    def double_into(dst, src):
        dst[...] = nl.multiply(src, 2.0)  # MARK-HELPER

    @nki.jit
    def k(a_t):
        out = nl.ndarray(a_t.shape, a_t.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a_t.shape, a_t.dtype)
        double_into(t, nl.load(a_t))
        nl.store(out, t)
        return out

    a = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(k(a), 2 * a)
    line = line_of(test_legacy_trace_decorator_inlines_a_helper, "MARK-HELPER")
    assert f"test_nki_contributed_forms.py:{line}" in {i.node for i in k.last.trace.instrs}


def test_matmul_and_transpose_masks_select_a_box_or_skip_the_instruction():
    """``mask=`` on nc_matmul / nc_transpose: a causal test on loop indices folds to a constant, and False issues
    no instruction (the accumulator keeps its value, the temporary takes no PSUM); a predicate over the input's
    indices (transpose) or the product's (matmul) computes that box only."""
    @nki.jit
    def k(a_t, b_t, n_valid):
        outs = [nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm) for _ in range(2)]
        a, b = nl.load(a_t), nl.load(b_t)
        acc = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
        for q in nl.affine_range(4):
            for j in nl.affine_range(4):            # only j <= q contributes (a causal block mask)
                a_t_ = nisa.nc_transpose(a, mask=q >= j)
                acc[...] += nisa.nc_matmul(nl.copy(a_t_) if q >= j else a, b, mask=q >= j)
        nl.store(outs[0], nl.copy(acc))
        i_p, i_f = nl.arange(128)[:, None], nl.arange(128)[None, :]
        t = nl.zeros((128, 128), nl.float32)
        t[...] = nisa.nc_transpose(a, mask=(i_p < n_valid) & (i_f < 128))     # rows n_valid.. of `a` skipped
        p = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
        p[...] += nisa.nc_matmul(a, b, mask=(i_p < 128) & (i_f < n_valid))    # product columns n_valid.. skipped
        nl.store(outs[1], nl.add(t, p))
        return outs

    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((128, 128), dtype=np.float32), rng.standard_normal((128, 128), dtype=np.float32)
    s, tp = k(a, b, 96)
    np.testing.assert_allclose(s, 10 * (a @ b), rtol=1e-4, atol=1e-3)     # 10 of the 16 (q, j) pairs
    want = np.zeros((128, 128), np.float32)
    want[:, :96] += a[:96].T
    want[:, :96] += (a.T @ b)[:, :96]
    np.testing.assert_allclose(tp, want, rtol=1e-4, atol=1e-3)
