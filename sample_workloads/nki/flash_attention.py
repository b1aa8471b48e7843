"""NKI sample: flash-attention forward (online softmax), after the NKI samples' ``flash_fwd`` layout.

q and k are [batch, heads, d, seq] (d on partitions), v is [batch, heads, seq, d]; the launch grid is
[batch, heads] (one SPMD instance per head). Per 128-row query tile the kernel streams 512-column key
tiles: S = q.T k on the Tensor Engine, a running max and sum on the Vector/Scalar engines, P
transposed through PSUM and multiplied with V, the accumulator rescaled - S never reaches HBM.
``python sample_workloads/nki/flash_attention.py [--small]``.
"""
import math
import sys

import numpy as np

import neuron_stack.nki as nki  # noqa: PLR0402  (the SDK's import, renamed)
import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl


@nki.jit
def flash_fwd(q, k, v):
    """o[b, h] = softmax(q[b, h].T @ k[b, h] / sqrt(d)) @ v[b, h]; seq lengths multiples of 512, d <= 128."""
    B, H, d, Sq = q.shape
    Sk = k.shape[3]
    o = nl.ndarray((B, H, Sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    b, h = nl.program_id(0), nl.program_id(1)
    scale = 1.0 / math.sqrt(d)
    KT = 512                                            # key columns per step (one PSUM bank of fp32)
    for qi in nl.affine_range(Sq // 128):
        q_tile = nl.load(q[b, h, :, qi * 128:(qi + 1) * 128])          # [d, 128]: stationary
        m = nl.full((128, 1), -1e30, nl.float32)
        l_sum = nl.zeros((128, 1), nl.float32)
        acc = nl.zeros((128, d), nl.float32)
        for kj in nl.sequential_range(Sk // KT):
            k_tile = nl.load(k[b, h, :, kj * KT:(kj + 1) * KT])         # [d, 512]: moving
            s_psum = nl.ndarray((128, KT), nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=s_psum, stationary=q_tile, moving=k_tile)
            s = nl.ndarray((128, KT), nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=s, data=s_psum, op0=nl.multiply, operand0=scale)
            m_new = nl.maximum(m, nl.max(s, axis=[1]))
            neg_m = nl.multiply(m_new, -1.0)
            p = nl.ndarray((128, KT), q.dtype, buffer=nl.sbuf)
            p_sum = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=p, op=nl.exp, data=s, bias=neg_m, reduce_op=nl.add, reduce_res=p_sum)
            alpha = nl.exp(nl.add(m, neg_m))
            l_sum = nl.add(nl.multiply(l_sum, alpha), p_sum)
            pv = nl.ndarray((128, d), nl.float32, buffer=nl.psum)
            for c in nl.affine_range(KT // 128):
                pT_psum = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
                nisa.nc_transpose(dst=pT_psum, data=p[:, c * 128:(c + 1) * 128])
                pT = nl.ndarray((128, 128), q.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=pT, src=pT_psum)
                v_tile = nl.load(v[b, h, kj * KT + c * 128:kj * KT + (c + 1) * 128, :])   # [128, d]
                nisa.nc_matmul(dst=pv, stationary=pT, moving=v_tile)
            acc = nl.add(nl.multiply(acc, alpha), pv)
            m = m_new
        out = nl.divide(acc, l_sum, dtype=q.dtype)
        nl.store(o[b, h, qi * 128:(qi + 1) * 128, :], value=out)
    return o


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    d = q.shape[2]
    s = np.einsum("bhdq,bhdk->bhqk", q.astype(np.float64), k.astype(np.float64)) / math.sqrt(d)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p, v.astype(np.float64))


def main(argv=None) -> int:
    small = "--small" in (argv if argv is not None else sys.argv[1:])
    B, H, d, S = (1, 2, 64, 512) if small else (1, 4, 128, 2048)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, d, S), dtype=np.float32)
    k = rng.standard_normal((B, H, d, S), dtype=np.float32)
    v = rng.standard_normal((B, H, S, d), dtype=np.float32)
    out = flash_fwd[B, H](q, k, v)
    want = reference(q, k, v)
    err = np.abs(out - want).max() / np.abs(want).max()
    ok = err < 1e-4
    run = flash_fwd.last
    print(f"flash attention b={B} h={H} d={d} s={S}: {'OK' if ok else 'MISMATCH'} vs numpy (relative error "
          f"{err:.1e}); simulated device time {run.device_ns / 1e3:.1f} us, {run.num_instructions} instructions")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
