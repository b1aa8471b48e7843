"""NKI sample: fused self-attention for a small head (d <= 128), the fused self-attention tutorial's kernel
(Stable Diffusion), in the legacy form: ``nl.par_dim`` block layouts, ``nl.load_transpose2d``,
``psum[...] += nisa.nc_matmul(...)``, ``nisa.affine_select`` for the causal mask.

Per 128-row query tile: S = (scale * Q) K^T into one SBUF row of scores (K tiles of 128 keys), the row
max (negated) per key tile then overall, exp(S - max) on the Scalar Engine, the row sums, the scores
transposed tile by tile on the Tensor Engine, P V accumulated in one PSUM tile over the key tiles
(with d on the partitions), and the division by the row sums applied to the transposed output.
Inputs q, k, v are [seq, d]; seq a multiple of 128.

``python sample_workloads/nki/sd_attention.py [--small]``.
"""
import sys

import numpy as np

import neuron_stack.nki as nki  # noqa: PLR0402  (the SDK's import, renamed)
import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl
from neuron_stack.nki import par_dim

SCALE = 0.125


@nki.jit
def fused_self_attention(q_ref, k_ref, v_ref, use_causal_mask=False, mixed_precision=True):
    """softmax(scale * Q K^T) V for q, k, v [seq, d]; bf16 Tensor Engine inputs when mixed_precision."""
    dt = q_ref.dtype
    pe_dt = nl.bfloat16 if mixed_precision else np.float32
    seq, d = q_ref.shape
    assert d <= 128 and seq % 128 == 0 and k_ref.shape == v_ref.shape == q_ref.shape
    out_ref = nl.ndarray((seq, d), dtype=dt, buffer=nl.shared_hbm)
    T = 128
    n = seq // T

    # V as [key, d] tiles side by side, kept for every query tile
    v_all = nl.ndarray((par_dim(T), n, d), dtype=pe_dt)
    pv, fv = nl.arange(T)[:, None], nl.arange(d)[None, :]
    for j in nl.affine_range(n):
        v_all[pv, j, fv] = nl.load(v_ref[j * T + pv, fv], dtype=pe_dt)

    # Q (scaled) and K transposed: d on the partitions, 128 positions per block
    pd, fs = nl.arange(d)[:, None], nl.arange(T)[None, :]
    rows, cols = nl.arange(T)[:, None], nl.arange(d)[None, :]
    q_t = nl.ndarray((n, par_dim(d), T), dtype=pe_dt)
    k_t = nl.ndarray((n, par_dim(d), T), dtype=pe_dt)
    for j in nl.affine_range(n):
        q_t[j, pd, fs] = nl.load_transpose2d(q_ref[j * T + rows, cols], dtype=pe_dt) * SCALE
        k_t[j, pd, fs] = nl.load_transpose2d(k_ref[j * T + rows, cols], dtype=pe_dt)

    for i in nl.affine_range(n):
        scores = nl.ndarray((par_dim(T), seq), dtype=dt)
        neg_max = nl.ndarray((par_dim(T), n), dtype=dt)
        pq, fk = nl.arange(T)[:, None], nl.arange(T)[None, :]
        for j in nl.affine_range(n):
            s_psum = nl.zeros((par_dim(T), T), dtype=np.float32, buffer=nl.psum)
            s_psum[pq, fk] += nisa.nc_matmul(stationary=q_t[i, pd, fs], moving=k_t[j, pd, fs])
            if use_causal_mask:     # keep key <= query, the rest the most negative fp32
                scores[pq, j * T + fk] = nisa.affine_select(pred=(i * T + pq >= j * T + fk),
                                                            on_true_tile=s_psum[pq, fk],
                                                            on_false_value=nl.fp32.min, dtype=dt)
            else:
                scores[pq, j * T + fk] = nl.copy(s_psum[pq, fk], dtype=dt)
            neg_max[pq, j] = nisa.tensor_reduce(np.max, data=scores[pq, j * T + fk], axis=(1,), dtype=dt,
                                                negate=True)
        row_neg_max = nisa.tensor_reduce(np.min, data=neg_max[pq, nl.arange(n)[None, :]], axis=(1,), dtype=dt)

        all_keys = nl.arange(seq)[None, :]
        e = nisa.activation(np.exp, data=scores[pq, all_keys], bias=row_neg_max, scale=1.0)
        row_sum = nisa.tensor_reduce(np.add, data=e, axis=(1,), dtype=dt)
        probs = nl.ndarray((par_dim(T), seq), dtype=pe_dt)
        probs[pq, all_keys] = nl.copy(e, dtype=pe_dt)
        inv = nl.ndarray((par_dim(T), d), dtype=dt)
        inv[pq, cols] = nl.copy((1.0 / row_sum).broadcast_to((T, d)), dtype=dt)

        probs_t = nl.ndarray((par_dim(T), n, T), dtype=pe_dt)
        for j in nl.affine_range(n):
            probs_t[pq, j, fk] = nisa.nc_transpose(probs[pq, j * T + fk])

        o_psum = nl.zeros((par_dim(d), T), dtype=np.float32, buffer=nl.psum)
        for j in nl.affine_range(n):
            o_psum[pd, fs] += nisa.nc_matmul(stationary=v_all[pv, j, fv], moving=probs_t[pq, j, fk])
        o_t = nl.copy(o_psum[pd, fs], dtype=dt)
        o_t = o_t * nisa.nc_transpose(inv[pq, cols])
        nl.store(out_ref[i * T + fs, pd], value=o_t)
    return out_ref


def reference(q, k, v, causal=False):
    s = SCALE * q @ k.T
    if causal:
        s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def main(argv=None) -> int:
    small = "--small" in (argv if argv is not None else sys.argv[1:])
    seq, d = (256, 64) if small else (1024, 64)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((seq, d), dtype=np.float32) for _ in range(3))
    ok = True
    for causal in (False, True):
        got = fused_self_attention(q, k, v, use_causal_mask=causal)
        want = reference(q, k, v, causal)
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        ok &= err < 1e-2
        print(f"fused_self_attention seq={seq} d={d} causal={causal}: {'OK' if err < 1e-2 else 'MISMATCH'} vs "
              f"numpy (relative error {err:.1e}, bf16 matmuls); simulated device time "
              f"{fused_self_attention.last.device_ns / 1e3:.1f} us, "
              f"{fused_self_attention.last.num_instructions} instructions")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
