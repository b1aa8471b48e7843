"""NKI sample: the matrix-multiplication tutorial's last step, every dimension blocked, in both API forms.

``lhsT`` [K, M] (the left operand delivered transposed) times ``rhs`` [K, N]. The N loop is outermost;
for each N block the partial results of every M block stay in SBUF while the K blocks stream past:
each K block loads its ``rhs`` slab once ([128, BLOCK_N] per K tile) and, per M block, its ``lhsT``
slab once, then runs every (m, n) tile's matmuls over the block's K tiles into one PSUM tile and adds
that to the SBUF partial. The results leave SBUF one [128, BLOCK_N] row of tiles at a time.

* ``matmul_blocked_legacy``: the legacy form, block-layout tiles (``nl.par_dim``), ``nl.mgrid``
  index grids, ``t[...] = nl.load(...)`` and ``psum[...] += nisa.nc_matmul(...)``;
* ``matmul_blocked``: the current form, lists of tiles, ``nisa.dma_copy`` / ``nc_matmul(dst=...)`` /
  ``tensor_tensor`` with explicit destinations.

``python sample_workloads/nki/matmul_optimized.py [--small]``.
"""
import sys

import numpy as np

import neuron_stack.nki as nki  # noqa: PLR0402  (the SDK's import, renamed)
import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl

TILE_M = nl.tile_size.gemm_stationary_fmax   # 128
TILE_K = nl.tile_size.pmax                   # 128
TILE_N = nl.tile_size.gemm_moving_fmax       # 512


def _blocks(lhsT, rhs, bm, bn, bk):
    K, M = lhsT.shape
    K2, N = rhs.shape
    assert K == K2, "lhsT and rhs must share the contraction dimension"
    BM, BN, BK = TILE_M * bm, TILE_N * bn, TILE_K * bk
    assert M % BM == 0 and N % BN == 0 and K % BK == 0, f"{M}x{N}x{K} is not a multiple of {BM}x{BN}x{BK}"
    return M, N, BM, BN, M // BM, N // BN, K // BK


@nki.jit
def matmul_blocked_legacy(lhsT, rhs, TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=2):
    """lhsT.T @ rhs with every dimension blocked; legacy block-layout form."""
    M, N, BM, BN, NBM, NBN, NBK = _blocks(lhsT, rhs, TILES_IN_BLOCK_M, TILES_IN_BLOCK_N, TILES_IN_BLOCK_K)
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for n in nl.affine_range(NBN):
        # partial results of this N block: one [128, 512] tile per (m block, m tile, n tile)
        partial = nl.zeros((NBM, TILES_IN_BLOCK_M, TILES_IN_BLOCK_N, nl.par_dim(TILE_M), TILE_N),
                           dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.sequential_range(NBK):
            g = nl.mgrid[0:TILE_K, 0:BN]
            rhs_slab = nl.ndarray((TILES_IN_BLOCK_K, nl.par_dim(TILE_K), BN), dtype=rhs.dtype, buffer=nl.sbuf)
            for kt in nl.affine_range(TILES_IN_BLOCK_K):
                rhs_slab[kt, g.p, g.x] = nl.load(rhs[(k * TILES_IN_BLOCK_K + kt) * TILE_K + g.p, n * BN + g.x])
            for m in nl.affine_range(NBM):
                h = nl.mgrid[0:TILE_K, 0:BM]
                lhs_slab = nl.ndarray((TILES_IN_BLOCK_K, nl.par_dim(TILE_K), BM), dtype=lhsT.dtype,
                                      buffer=nl.sbuf)
                for kt in nl.affine_range(TILES_IN_BLOCK_K):
                    lhs_slab[kt, h.p, h.x] = nl.load(lhsT[(k * TILES_IN_BLOCK_K + kt) * TILE_K + h.p,
                                                          m * BM + h.x])
                s = nl.mgrid[0:TILE_K, 0:TILE_M]
                v = nl.mgrid[0:TILE_K, 0:TILE_N]
                r = nl.mgrid[0:TILE_M, 0:TILE_N]
                for tn in nl.affine_range(TILES_IN_BLOCK_N):
                    for tm in nl.affine_range(TILES_IN_BLOCK_M):
                        acc = nl.zeros((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for kt in nl.affine_range(TILES_IN_BLOCK_K):
                            acc[...] += nisa.nc_matmul(lhs_slab[kt, s.p, tm * TILE_M + s.x],
                                                       rhs_slab[kt, v.p, tn * TILE_N + v.x])
                        partial[m, tm, tn, r.p, r.x] += acc[r.p, r.x]
        for m in nl.affine_range(NBM):
            for tm in nl.affine_range(TILES_IN_BLOCK_M):
                r = nl.mgrid[0:TILE_M, 0:TILE_N]
                row = nl.mgrid[0:TILE_M, 0:BN]
                packed = nl.ndarray((TILE_M, BN), dtype=partial.dtype, buffer=nl.sbuf)
                for tn in nl.affine_range(TILES_IN_BLOCK_N):
                    packed[r.p, tn * TILE_N + r.x] = nl.copy(partial[m, tm, tn, r.p, r.x])
                nl.store(out[(m * TILES_IN_BLOCK_M + tm) * TILE_M + row.p, n * BN + row.x],
                         value=packed[row.p, row.x])
    return out


@nki.jit
def matmul_blocked(lhsT, rhs, TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=2):
    """lhsT.T @ rhs with every dimension blocked; current form (explicit destinations)."""
    M, N, BM, BN, NBM, NBN, NBK = _blocks(lhsT, rhs, TILES_IN_BLOCK_M, TILES_IN_BLOCK_N, TILES_IN_BLOCK_K)
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for n in nl.affine_range(NBN):
        partial = [[[None] * TILES_IN_BLOCK_N for _ in range(TILES_IN_BLOCK_M)] for _ in range(NBM)]
        for m in range(NBM):
            for tm in range(TILES_IN_BLOCK_M):
                for tn in range(TILES_IN_BLOCK_N):
                    t = nl.ndarray((TILE_M, TILE_N), dtype=lhsT.dtype, buffer=nl.sbuf)
                    nisa.memset(dst=t, value=0.0)
                    partial[m][tm][tn] = t
        for k in nl.sequential_range(NBK):
            rhs_slab = []
            for kt in range(TILES_IN_BLOCK_K):
                t = nl.ndarray((TILE_K, BN), dtype=rhs.dtype, buffer=nl.sbuf)
                k0 = (k * TILES_IN_BLOCK_K + kt) * TILE_K
                nisa.dma_copy(dst=t, src=rhs[k0:k0 + TILE_K, n * BN:(n + 1) * BN])
                rhs_slab.append(t)
            for m in nl.affine_range(NBM):
                lhs_slab = []
                for kt in range(TILES_IN_BLOCK_K):
                    t = nl.ndarray((TILE_K, BM), dtype=lhsT.dtype, buffer=nl.sbuf)
                    k0 = (k * TILES_IN_BLOCK_K + kt) * TILE_K
                    nisa.dma_copy(dst=t, src=lhsT[k0:k0 + TILE_K, m * BM:(m + 1) * BM])
                    lhs_slab.append(t)
                for tn in nl.affine_range(TILES_IN_BLOCK_N):
                    for tm in nl.affine_range(TILES_IN_BLOCK_M):
                        acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for kt in nl.affine_range(TILES_IN_BLOCK_K):
                            nisa.nc_matmul(dst=acc, stationary=lhs_slab[kt][:, tm * TILE_M:(tm + 1) * TILE_M],
                                           moving=rhs_slab[kt][:, tn * TILE_N:(tn + 1) * TILE_N])
                        p = partial[m][tm][tn]
                        nisa.tensor_tensor(dst=p, data1=p, data2=acc, op=nl.add)
        for m in nl.affine_range(NBM):
            for tm in nl.affine_range(TILES_IN_BLOCK_M):
                packed = nl.ndarray((TILE_M, BN), dtype=lhsT.dtype, buffer=nl.sbuf)
                for tn in nl.affine_range(TILES_IN_BLOCK_N):
                    nisa.tensor_copy(dst=packed[:, tn * TILE_N:(tn + 1) * TILE_N], src=partial[m][tm][tn])
                row = (m * TILES_IN_BLOCK_M + tm) * TILE_M
                nisa.dma_copy(dst=out[row:row + TILE_M, n * BN:(n + 1) * BN], src=packed)
    return out


def main(argv=None) -> int:
    small = "--small" in (argv if argv is not None else sys.argv[1:])
    K, M, N = (256, 256, 1024) if small else (1024, 512, 2048)
    rng = np.random.default_rng(0)
    lhsT, rhs = rng.standard_normal((K, M), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    want = lhsT.T @ rhs
    ok = True
    for kernel in (matmul_blocked_legacy, matmul_blocked):
        got = kernel(lhsT, rhs)
        good = np.allclose(got, want, rtol=1e-4, atol=1e-3)
        ok &= good
        print(f"{kernel.__name__} {M}x{N}x{K}: {'OK' if good else 'MISMATCH'} vs numpy; simulated device time "
              f"{kernel.last.device_ns / 1e3:.1f} us, {kernel.last.num_instructions} instructions")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
