"""What the nki-samples reference kernels (vision, flash attention backward) need of the simulator, restated in this
project's own words: ragged slices past a tensor's end trimmed by a mask, a legacy ``nisa.nc_matmul`` reading a
transpose's PSUM result, ``nl.loop_reduce`` on a statement spanning lines, and row gathers (indirect DMA) with an
HBM tensor indexed by a tile of row numbers. Each is checked against numpy and misused once."""
import numpy as np
from nki_helpers import raises_at

import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl
from neuron_stack import nki


def test_a_slice_past_the_end_is_legal_once_the_mask_trims_it():
    @nki.jit
    def row_sums(x_t):
        rows, cols = x_t.shape
        out = nl.ndarray((rows, 1), nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range((rows + 127) // 128):
            p = i * 128 + nl.arange(128)[:, None]
            t = nl.ndarray((128, cols), nl.float32)
            nisa.dma_copy(dst=t, src=x_t[i * 128:(i + 1) * 128, :], mask=p < rows)
            nl.store(out[i * 128:(i + 1) * 128, :], nl.sum(t, axis=1, mask=p < rows), mask=p < rows)
        return out

    x = np.random.default_rng(1).random((200, 48), dtype=np.float32)
    np.testing.assert_allclose(row_sums(x)[:, 0], x.sum(1), rtol=1e-5)

    @nki.jit
    def unmasked(x_t):
        t = nl.ndarray((128, 48), nl.float32)
        nisa.dma_copy(dst=t, src=x_t[128:256, :])  # MARK-OOB
        return x_t

    raises_at(unmasked, (x,), "slice 128:256 is out of bounds for dim 0 of size 200", "MARK-OOB")


def test_legacy_matmul_of_a_transposed_psum_tile_copies_it_to_sbuf_first():
    @nki.jit
    def at_b(a_t, b_t):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        a_t_psum = nisa.nc_transpose(nl.load(a_t))          # [K, M] on the Tensor Engine: a PSUM tile
        nl.store(out, nisa.nc_matmul(a_t_psum, nl.load(b_t)))
        return out

    rng = np.random.default_rng(2)
    a, b = rng.random((128, 128), dtype=np.float32), rng.random((128, 64), dtype=np.float32)
    np.testing.assert_allclose(at_b(a, b), a @ b, rtol=1e-4)
    ops = [i.opcode for i in at_b.last.trace.instrs]
    assert ops.index("TENSOR_COPY") < ops.index("MATMUL", ops.index("TENSOR_COPY"))   # evacuated, then multiplied

    @nki.jit
    def explicit(a_t, b_t):
        p = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=p, data=nl.load(a_t))
        res = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(res, p, nl.load(b_t))  # MARK-MM
        return a_t

    raises_at(explicit, (a, b), "nc_matmul stationary is a PSUM tile", "MARK-MM")


def test_loop_reduce_on_a_statement_spanning_lines():
    @nki.jit
    def col_block_sums(x_t):
        out = nl.ndarray((128, 2, 64), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 2, 64), nl.float32)
        for j in nl.affine_range(2):
            for k in nl.affine_range(4):
                part = nl.load(x_t[:, nl.ds(j * 256 + k * 64, 64)])
                acc[:, j, :] = nl.loop_reduce(
                    part, op=np.add,
                    loop_indices=(k,), dtype=nl.float32)
        nl.store(out, acc)
        return out

    x = np.random.default_rng(3).random((128, 512), dtype=np.float32)
    np.testing.assert_allclose(col_block_sums(x), x.reshape(128, 2, 4, 64).sum(2), rtol=1e-5)


def test_hbm_rows_gathered_by_a_tile_of_row_numbers():
    @nki.jit
    def take_rows(table_t, rows_t):
        n = rows_t.shape[0]
        out = nl.ndarray((n, table_t.shape[1]), table_t.dtype, buffer=nl.shared_hbm)
        i_f = nl.arange(table_t.shape[1])[None, :]
        for i in nl.affine_range((n + 127) // 128):
            p = i * 128 + nl.arange(128)[:, None]
            rows = nl.load(rows_t[p, nl.arange(1)[None, :]], mask=p < n)
            got = nl.load(table_t[rows, i_f], mask=p < n)  # MARK-GATHER
            nl.store(out[p, i_f], got, mask=p < n)
        return out

    rng = np.random.default_rng(4)
    table = rng.random((300, 40), dtype=np.float32)
    rows = rng.integers(0, 300, (150, 1)).astype(np.int32)
    np.testing.assert_array_equal(take_rows(table, rows), table[rows[:, 0]])
    ops = [i.opcode for i in take_rows.last.trace.instrs]
    assert ops.count("DMA_INDIRECT") == 2 and ops.count("GATHER") == 2

    rows[7] = 300
    raises_at(take_rows, (table, rows), "indirect DMA row 300 read from SBUF is outside 0..299", "MARK-GATHER")

    @nki.jit
    def float_rows(table_t, rows_t):
        rows = nl.load(rows_t[0:128, :])
        return nl.load(table_t[rows, nl.arange(40)[None, :]])  # MARK-FR

    raises_at(float_rows, (table, rows.astype(np.float32)), "takes row numbers in an integer SBUF tile", "MARK-FR")


def test_fp8_double_row_matmul_contracts_two_row_groups_on_trn2():
    def kernel(a_t, b_t):
        out = nl.ndarray((128, 256), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 256), nl.float32, buffer=nl.psum)
        a, b = nl.load(a_t), nl.load(b_t)                   # [K, 2, M] and [K, 2, N]: K x 2 = 256 rows contracted
        acc[...] += nisa.nc_matmul(a, b, perf_mode=nisa.matmul_perf_mode.double_row)  # MARK-DR
        nl.store(out, nl.copy(acc))
        return out

    rng = np.random.default_rng(5)
    a = nl.static_cast(rng.integers(-4, 5, (128, 2, 128)), nl.float8_e4m3)
    b = nl.static_cast(rng.integers(-4, 5, (128, 2, 256)), nl.float8_e4m3)
    on_trn2 = nki.jit(kernel, platform_target="trn2")
    want = sum(a[:, g].astype(np.float32).T @ b[:, g].astype(np.float32) for g in range(2))
    np.testing.assert_array_equal(on_trn2(a, b), want)
    assert [i.opcode for i in on_trn2.last.trace.instrs].count("MATMUL") == 2

    raises_at(nki.jit(kernel), (a, b), "perf_mode=double_row needs NeuronCore-v3 (trn2)", "MARK-DR")


def test_a_tensor_engine_transpose_moves_data_so_unwritten_rows_stay_out_of_the_result():
    @nki.jit
    def ragged_transpose(x_t):
        rows, cols = x_t.shape                              # rows < 128: the tile's last rows are never written
        out = nl.ndarray((cols, rows), x_t.dtype, buffer=nl.shared_hbm)
        i, j = nl.arange(128)[:, None], nl.arange(cols)[None, :]
        t = nl.ndarray((128, cols), x_t.dtype)
        t[i, j] = nl.load(x_t[i, j], mask=i < rows)
        tt = nl.ndarray((cols, 128), x_t.dtype)
        tt[...] = nisa.nc_transpose(t)                      # a PE-array transpose, not a product with the identity
        p, q = nl.arange(cols)[:, None], nl.arange(128)[None, :]
        nl.store(out[p, q], tt[p, q], mask=q < rows)
        return out

    x = np.random.default_rng(6).random((72, 100), dtype=np.float32)
    np.testing.assert_array_equal(ragged_transpose(x), x.T)


def test_nl_ops_broadcast_a_one_partition_tile_across_partitions():
    @nki.jit
    def shift_rows(x_t, s_t):
        out = nl.ndarray(x_t.shape, x_t.dtype, buffer=nl.shared_hbm)
        s = nl.load(s_t)                                    # [1, 1]: one number in one partition
        col = nl.add(nl.zeros((128, 1), nl.float32), s)     # that number in all 128 partitions
        nl.store(out, nl.add(nl.load(x_t), col))
        return out

    rng = np.random.default_rng(8)
    x, s = rng.random((128, 64), dtype=np.float32), np.array([[2.5]], np.float32)
    np.testing.assert_allclose(shift_rows(x, s), x + 2.5, rtol=1e-6)
