"""A DMA whose HBM start address is read from SBUF when it runs (``nisa.dma_copy``'s dynamic start with hardware or
software descriptor generation): ``nl.load(w[e[0, 0], i_p, i_f])`` reads the slab of an expert number computed on
chip, ``nl.store(g[e[0, 0], ...])`` writes it, and ``w[i_p, e[0, 0] + i_f]`` moves a window along a free dim (MoE
kernels address their expert weights this way). Each restated as a small kernel of our own, checked against
numpy; an offset past the tensor fails the run naming the kernel line."""
import numpy as np
from nki_helpers import raises_at

import neuron_stack.nki.language as nl
from neuron_stack import nki


@nki.jit
def expert_slab(w, e):
    """w[e] (a [128, F] slab of w [E, 128, F]) through a DMA whose start is e, read from SBUF."""
    out = nl.ndarray(w.shape[1:], w.dtype, buffer=nl.shared_hbm)
    idx = nl.load(e, dtype=nl.int32)
    i_p, i_f = nl.mgrid[0:w.shape[1], 0:w.shape[2]]
    t = nl.load(w[idx[0, 0], i_p, i_f])               # MARK-SLAB
    nl.store(out[i_p, i_f], t)
    return out


def test_load_reads_the_slab_at_an_offset_read_from_sbuf():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 128, 1024)).astype(np.float32)      # 512 KiB a slab: cut over the DMA queues
    for e in (2, 0, 1):
        np.testing.assert_array_equal(expert_slab(w, np.array([[e]], np.int32)), w[e])
    dyn = [i for i in expert_slab.last.trace.instrs if i.opcode == "DMA_DIRECT2D" and "side" in i.operands]
    assert dyn and all(i.operands["side"] == "src" for i in dyn)


def test_an_offset_past_the_tensor_fails_naming_the_line():
    w = np.zeros((3, 128, 64), np.float32)
    raises_at(expert_slab, (w, np.array([[3]], np.int32)), "dynamic offset 3 read from SBUF is outside 0..2",
              "MARK-SLAB")


def test_store_and_masked_window_move_with_the_offset():
    """A store into g[e] leaves the other slabs as they were; a window w[:, c + j] under a row mask loads only
    the masked rows, at the column read from SBUF."""
    @nki.jit
    def k(g, w, e, c):
        out = nl.ndarray((128, 32), w.dtype, buffer=nl.shared_hbm)
        idx, col = nl.load(e, dtype=nl.int32), nl.load(c, dtype=nl.int32)
        i_p, i_f = nl.mgrid[0:128, 0:32]
        win = nl.zeros((128, 32), w.dtype)
        win[i_p, i_f] = nl.load(w[i_p, col[0, 0] + i_f], mask=i_p < 100)
        nl.store(g[idx[0, 0], i_p, i_f], win)
        nl.store(out, win)
        return out

    rng = np.random.default_rng(1)
    w = rng.standard_normal((128, 200)).astype(np.float32)
    g = np.full((4, 128, 32), 7.0, np.float32)
    got = k(g, w, np.array([[2]], np.int32), np.array([[150]], np.int32))
    want = np.zeros((128, 32), np.float32)
    want[:100] = w[:100, 150:182]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(g[2], want)
    assert (g[[0, 1, 3]] == 7.0).all()


def test_other_instructions_refuse_a_view_at_a_dynamic_offset():
    """Only the dynamic copies and DMAs move with the offset; any other instruction given such a view (or a
    result assigned into one on chip) fails naming the line instead of reading or writing the static place."""
    @nki.jit
    def k(x_t, e):
        out = nl.ndarray((128, 8), x_t.dtype, buffer=nl.shared_hbm)
        x, idx = nl.load(x_t), nl.load(e, dtype=nl.int32)
        ix, iy = nl.mgrid[0:128, 0:8]
        t = nl.ndarray((128, 64), x_t.dtype)
        t[ix, idx[0, 0] + iy] = nl.exp(x[ix, iy])                        # MARK-ASSIGN
        nl.store(out, t[ix, iy])
        return out

    raises_at(k, (np.ones((128, 8), np.float32), np.array([[3]], np.int32)), "accessed only by", "MARK-ASSIGN")


def test_a_one_element_index_tile_keeps_the_row_dim():
    """``table[idx, :]`` / ``table[idx, i_f]`` with a [1, 1] index tile: one row at the offset, a [1, F] tile (as a
    one-row gather), not the row turned onto the partitions."""
    @nki.jit
    def k(table, e):
        out = nl.ndarray((2, 64), table.dtype, buffer=nl.shared_hbm)
        idx = nl.load(e, dtype=nl.int32)
        a, b = nl.load(table[idx, :]), nl.load(table[idx, nl.arange(64)[None, :]])
        assert a.shape == b.shape == (1, 64)
        nl.store(out[0:1, :], a)
        nl.store(out[1:2, :], b)
        return out

    t = np.random.default_rng(2).standard_normal((10, 64)).astype(np.float32)
    np.testing.assert_array_equal(k(t, np.array([[7]], np.int32)), t[[7, 7]])
