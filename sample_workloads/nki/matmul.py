"""NKI sample: tiled matmul ``lhsT.T @ rhs`` (after the SDK's matrix_multiplication example).

The stationary tile is 128 x 128 (gemm_stationary_fmax), the moving tile 128 x 512
(gemm_moving_fmax), K accumulates in one PSUM bank. Run:
``python sample_workloads/nki/matmul.py [--small] [--bf16]``.
"""
import sys

import numpy as np

import neuron_stack.nki as nki  # noqa: PLR0402  (the SDK's import, renamed)
import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl


@nki.jit
def matmul_tiled(lhsT, rhs):
    """result[M, N] = lhsT[K, M].T @ rhs[K, N]; K, M multiples of 128, N of 512."""
    K, M = lhsT.shape
    K_, N = rhs.shape
    assert K == K_, "lhsT and rhs must have the same contraction dimension"
    TM, TK, TN = nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            acc = nl.ndarray((TM, TN), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                lhsT_tile = nl.ndarray((TK, TM), lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((TK, TN), rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lhsT_tile, src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                nisa.dma_copy(dst=rhs_tile, src=rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(dst=acc, stationary=lhsT_tile, moving=rhs_tile)
            res = nl.ndarray((TM, TN), result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=res)
    return result


@nki.jit
def matmul_blocked(lhsT, rhs):
    """The same product with SBUF reuse (after the SDK tutorial's blocked kernels): a K x 2048 block
    of rhs stays in SBUF for every row block, and each row block's lhsT columns are loaded once, so
    HBM traffic drops from once per (m, n, k) tile to about twice the operands."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    BN = min(N, 4 * TN)                                     # rhs columns held in SBUF
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    rhs_blk = nl.ndarray((TK, K // TK, BN), rhs.dtype, buffer=nl.sbuf)
    for nb in nl.affine_range(N // BN):
        for k in nl.affine_range(K // TK):
            nisa.dma_copy(dst=rhs_blk[:, k, :], src=rhs[k * TK:(k + 1) * TK, nb * BN:(nb + 1) * BN])
        for m in nl.affine_range(M // TM):
            lhsT_blk = nl.ndarray((TK, K // TK, TM), lhsT.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(K // TK):
                nisa.dma_copy(dst=lhsT_blk[:, k, :], src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
            for n in nl.affine_range(BN // TN):
                acc = nl.ndarray((TM, TN), nl.float32, buffer=nl.psum)
                for k in nl.affine_range(K // TK):
                    nisa.nc_matmul(dst=acc, stationary=lhsT_blk[:, k, :], moving=rhs_blk[:, k, n * TN:(n + 1) * TN])
                res = nl.ndarray((TM, TN), result.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=res, src=acc)
                col = nb * BN + n * TN
                nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, col:col + TN], src=res)
    return result


@nki.jit
def matmul_legacy(lhsT, rhs):
    """The legacy form: nl.zeros in PSUM, ``acc += nl.matmul(..., transpose_x=True)``, nl.copy."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // 512):
            res_psum = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // 128):
                lhsT_tile = nl.load(lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
                rhs_tile = nl.load(rhs[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])
                res_psum += nl.matmul(lhsT_tile, rhs_tile, transpose_x=True)
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], value=res_sb)
    return result


def main(argv=None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    K, M, N = (256, 256, 1024) if "--small" in argv else (1024, 512, 2048)
    rng = np.random.default_rng(0)
    lhsT, rhs = rng.standard_normal((K, M), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    want = lhsT.T.astype(np.float64) @ rhs
    if "--bf16" in argv:
        import torch
        out = matmul_tiled(torch.from_numpy(lhsT).bfloat16(), torch.from_numpy(rhs).bfloat16()).float().numpy()
        err = np.linalg.norm(out - want) / np.linalg.norm(want)
        ok = err < 1e-2
    else:
        out = matmul_tiled(lhsT, rhs)
        out2 = matmul_legacy(lhsT, rhs)
        out3 = matmul_blocked(lhsT, rhs)
        err = max(np.abs(o - want).max() for o in (out, out2, out3)) / np.abs(want).max()
        ok = err < 1e-4
    run = matmul_tiled.last
    peak = run.trace.p.tensor_peak_flops("bfloat16" if "--bf16" in argv else "float32")
    print(f"matmul {K}x{M}x{N}: {'OK' if ok else 'MISMATCH'} vs numpy (relative error {err:.2e}); simulated "
          f"{run.device_ns / 1e3:.1f} us, {2 * K * M * N / (run.device_ns * 1e-9) / peak:.1%} of TensorE peak")
    if "--bf16" not in argv:
        b = matmul_blocked.last
        print(f"  blocked form: {b.device_ns / 1e3:.1f} us, {2 * K * M * N / (b.device_ns * 1e-9) / peak:.1%} "
              f"of TensorE peak")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
