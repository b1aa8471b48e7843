"""NKI sample: attention forward in the current (explicit-destination) form, two steps of the attention
performance tutorial. q, k, v are [d = 128, seq] (head dim on the partitions); the output is [seq, d].

* ``attn_small``: one 128 x 128 block with the ISA calls and a softmax helper decorated
  ``@nki.jit(mode='trace')`` (inlined into the kernel, its lines profiled as its own);
* ``attn_fused``: the tutorial's last fused loop: per 128-query tile the Q K^T tiles land in PSUM,
  ``nisa.tensor_scalar_reduce`` evacuates each to SBUF while taking its row max, one ``activation``
  per key tile computes exp(s - max) in bf16 and its row sum (``reduce_cmd``), the bf16 scores are
  transposed on the Tensor Engine, P V accumulates in PSUM, and the division by the row sum is applied
  once to the [128, d] output;
* ``attn_pipelined``: the tutorial's last version, the same steps with every buffer placed by hand
  (``address=``, handed out by a small allocator object, ``nl.NKIObject``) and the query-tile loop
  software-pipelined under ``nl.no_reorder()``: while tile i's scores are computed, tile i-1's
  exponentials are taken and transposed (``nisa.dma_transpose``) and tile i-2's P V product
  (``accumulate=`` flags) is finished and stored. The Q K^T tiles rotate over six PSUM banks, the V
  transposes use a seventh and the output the eighth.

``python sample_workloads/nki/attention_tutorial.py [--small]``.
"""
import math
import sys

import numpy as np

import neuron_stack.nki as nki  # noqa: PLR0402  (the SDK's import, renamed)
import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl


@nki.jit(mode="trace")
def softmax_rows(data):
    """Row softmax of an SBUF tile with ISA calls (a helper: called inside a kernel, it is inlined)."""
    col = (data.shape[0], 1)
    row_max = nl.ndarray(col, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=row_max, data=data, op=nl.maximum, axis=(1,))
    e = nl.ndarray(data.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=e, data=data, op0=nl.subtract, operand0=row_max)
    nisa.activation(dst=e, op=nl.exp, data=e)
    total = nl.ndarray(col, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=total, data=e, op=nl.add, axis=(1,))
    inv = nl.ndarray(col, dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv, data=total)
    out = nl.ndarray(data.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out, data=e, op0=nl.multiply, operand0=inv)
    return out


@nki.jit
def attn_small(q, k, v):
    """softmax(Q^T K) V^T for q, k, v [128, 128]."""
    d, s = q.shape
    assert d == s == 128
    out = nl.ndarray((s, d), dtype=q.dtype, buffer=nl.shared_hbm)
    tiles = []
    for src in (q, k, v):
        t = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        tiles.append(t)
    q_sb, k_sb, v_sb = tiles
    qk = nl.ndarray((s, s), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=qk, stationary=q_sb, moving=k_sb)
    qk_sb = nl.ndarray((s, s), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=qk_sb, src=qk)
    probs = softmax_rows(qk_sb)
    probs_t_ps = nl.ndarray((s, s), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=probs_t_ps, data=probs)
    probs_t = nl.ndarray((s, s), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=probs_t, src=probs_t_ps)
    v_t_ps = nl.ndarray((s, d), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=v_t_ps, data=v_sb)
    v_t = nl.ndarray((s, d), dtype=v_sb.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=v_t, src=v_t_ps)
    o = nl.ndarray((s, d), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=o, stationary=probs_t, moving=v_t)
    o_sb = nl.ndarray((s, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o_sb, src=o)
    nisa.dma_copy(dst=out, src=o_sb)
    return out


@nki.jit
def attn_fused(q, k, v):
    """softmax(Q^T K) V^T for q, k, v [128, seq], seq a multiple of 512."""
    d, seq = q.shape
    P, FM = nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    assert d == P and seq % FM == 0
    out = nl.ndarray((seq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    q_sb, k_sb, v_sb = nl.load(q), nl.load(k), nl.load(v)
    n_kv = seq // FM

    v_t = nl.ndarray((P, seq // P, d), dtype=nl.bfloat16, buffer=nl.sbuf)
    for j in nl.affine_range(seq // P):
        ps = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=ps, data=v_sb[:, nl.ds(j * P, P)])
        nisa.tensor_copy(dst=v_t[:, j, :], src=ps)

    for i in nl.sequential_range(seq // P):
        qk_sb = nl.ndarray((P, n_kv, FM), dtype=nl.float32, buffer=nl.sbuf)
        part_max = nl.ndarray((P, n_kv), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(n_kv):
            qk = nl.ndarray((P, FM), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=qk, stationary=q_sb[:, nl.ds(i * P, P)], moving=k_sb[:, nl.ds(j * FM, FM)])
            nisa.tensor_scalar_reduce(dst=qk_sb[:, j, :], data=qk, op0=nl.multiply, operand0=1.0,
                                      reduce_op=nl.maximum, reduce_res=part_max[:, nl.ds(j, 1)])
        neg_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=part_max, axis=(1,), negate=True)

        e = nl.ndarray((P, seq), dtype=nl.bfloat16, buffer=nl.sbuf)
        part_sum = nl.ndarray((P, n_kv), dtype=nl.float32, buffer=nl.sbuf)
        for j in nl.affine_range(n_kv):
            nisa.activation(dst=e[:, nl.ds(j * FM, FM)], op=nl.exp, data=qk_sb[:, j, :], bias=neg_max,
                            reduce_op=nl.add, reduce_res=part_sum[:, nl.ds(j, 1)],
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)

        e_t = nl.ndarray((P, seq // P, P), dtype=nl.bfloat16, buffer=nl.sbuf)
        for j in nl.affine_range(seq // P):
            ps = nl.ndarray((P, P), dtype=nl.bfloat16, buffer=nl.psum)
            nisa.nc_transpose(dst=ps, data=e[:, nl.ds(j * P, P)])
            nisa.tensor_copy(dst=e_t[:, j, :], src=ps)

        o_ps = nl.zeros((P, d), dtype=nl.float32, buffer=nl.psum)
        for j in nl.affine_range(seq // P):
            nisa.nc_matmul(dst=o_ps, stationary=e_t[:, j, :], moving=v_t[:, j, :])
        total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=total, op=nl.add, data=part_sum, axis=(1,))
        inv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=total)
        o = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=o, data=o_ps, op0=nl.multiply, operand0=inv)
        nl.store(dst=out[nl.ds(i * P, P), :], value=o)
    return out


class Arena(nl.NKIObject):
    """Hands out SBUF byte ranges one after the other (32-byte aligned): manual allocation."""

    def __init__(self):
        self.top = 0

    def take(self, shape, dtype):
        t = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf, address=(0, self.top))
        self.top += -(-math.prod(shape[1:]) * (4 if dtype == nl.float32 else 2) // 32) * 32
        return t


class Stages(nl.NKIObject):
    """The pipeline's buffers and sizes, shared by its stage functions."""


def _scores(i, b):
    """Q K^T of query tile i through the rotating PSUM banks into SBUF (slot i % 2), with its row max."""
    for j in nl.static_range(b.n_kv):
        bank = b.s_ps[:, nl.ds((j % 6) * b.FM, b.FM)]
        nisa.nc_matmul(dst=bank, stationary=b.q[:, nl.ds(i * b.P, b.P)], moving=b.k[:, nl.ds(j * b.FM, b.FM)],
                       accumulate=False)
        nisa.tensor_scalar_reduce(dst=b.qk[:, i % 2, j, :], data=bank, op0=nl.multiply, operand0=1.0,
                                  reduce_op=nl.maximum, reduce_res=b.part_max[:, j])
    nisa.tensor_reduce(dst=b.neg_max[:, nl.ds(i % 2, 1)], op=nl.maximum, data=b.part_max, axis=(1,), negate=True)


def _exponentials(i, b):
    """exp(s - max) of tile i in bf16, with the partial row sums (slot i % 2)."""
    for j in nl.static_range(b.n_kv):
        nisa.activation(dst=b.e[:, nl.ds(j * b.FM, b.FM)], op=nl.exp, data=b.qk[:, i % 2, j, :],
                        bias=b.neg_max[:, nl.ds(i % 2, 1)], reduce_op=nl.add, reduce_res=b.part_sum[:, i % 2, j],
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)


def _transpose(b):
    """The exponentials, keys on the partitions, by DMA."""
    for j in nl.static_range(b.n_kv * b.FM // b.P):
        nisa.dma_transpose(dst=b.e_t[:, j, :], src=b.e[:, nl.ds(j * b.P, b.P)], axes=(1, 0))


def _pv(b):
    """P V of the transposed tile, accumulated over the key blocks in PSUM bank 7, copied out on the Vector Engine."""
    blocks = b.n_kv * b.FM // b.P
    for j in nl.static_range(blocks):
        nisa.nc_matmul(dst=b.o_ps, stationary=b.e_t[:, j, :], moving=b.v_t[:, j, :], accumulate=j != 0)
    nisa.tensor_copy(dst=b.o_sb, src=b.o_ps, engine=nisa.vector_engine)


def _finish(i, b):
    """Divide tile i's output rows by their sums and store them."""
    nisa.tensor_reduce(dst=b.total, op=nl.add, data=b.part_sum[:, i % 2, :], axis=(1,))
    nisa.reciprocal(dst=b.inv, data=b.total)
    nisa.tensor_scalar(dst=b.o, data=b.o_sb, op0=nl.multiply, operand0=b.inv, engine=nisa.vector_engine)
    nl.store(dst=b.out[nl.ds(i * b.P, b.P), :], value=b.o)


@nki.jit
def attn_pipelined(q, k, v):
    """softmax(Q^T K) V^T for q, k, v [128, seq], seq a multiple of 512: buffers placed by hand, the query
    tiles software-pipelined (see the module docstring)."""
    d, seq = q.shape
    b = Stages()
    b.P, b.FM = nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    assert d == b.P and seq % b.FM == 0
    b.n_kv, n_q = seq // b.FM, seq // b.P
    b.out = nl.ndarray((seq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    mem = Arena()
    b.q, b.k, v_sb = mem.take((d, seq), q.dtype), mem.take((d, seq), k.dtype), mem.take((d, seq), v.dtype)
    for dst, src in ((b.q, q), (b.k, k), (v_sb, v)):
        nisa.dma_copy(dst=dst, src=src)

    # PSUM by hand: banks 0-5 the score tiles, 6 the V transposes (four slots), 7 the output
    b.s_ps = nl.ndarray((b.P, 6 * b.FM), dtype=nl.float32, buffer=nl.psum, address=(0, 0))
    v_ps = nl.ndarray((b.P, 4 * b.P), dtype=nl.float32, buffer=nl.psum, address=(0, 6 * 2048))
    b.o_ps = nl.ndarray((b.P, d), dtype=nl.float32, buffer=nl.psum, address=(0, 7 * 2048))

    b.v_t = mem.take((b.P, seq // b.P, d), nl.bfloat16)
    for j in nl.affine_range(seq // b.P):
        slot = v_ps[:, nl.ds((j % 4) * b.P, b.P)]
        nisa.nc_transpose(dst=slot, data=v_sb[:, nl.ds(j * b.P, b.P)])
        nisa.tensor_copy(dst=b.v_t[:, j, :], src=slot)

    b.qk = mem.take((b.P, 2, b.n_kv, b.FM), nl.float32)          # two query tiles in flight
    b.part_max = mem.take((b.P, b.n_kv), nl.float32)
    b.neg_max = mem.take((b.P, 2), nl.float32)
    b.part_sum = mem.take((b.P, 2, b.n_kv), nl.float32)
    b.e = mem.take((b.P, seq), nl.bfloat16)
    b.e_t = mem.take((b.P, seq // b.P, b.P), nl.bfloat16)
    b.o_sb, b.o = mem.take((b.P, d), nl.float32), mem.take((b.P, d), nl.float32)
    b.total, b.inv = mem.take((b.P, 1), nl.float32), mem.take((b.P, 1), nl.float32)

    with nl.no_reorder():
        for t in nl.sequential_range(n_q + 2):
            # each stage on its own tile: t (scores), t-1 (exp, transpose), t-2 (P V, store)
            if 1 <= t <= n_q:
                _exponentials(t - 1, b)
            if t < n_q:
                _scores(t, b)
            if t >= 2:
                _pv(b)
            if 1 <= t <= n_q:
                _transpose(b)
            if t >= 2:
                _finish(t - 2, b)
    return b.out


def reference(q, k, v):
    s = q.T @ k
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v.T


def main(argv=None) -> int:
    small = "--small" in (argv if argv is not None else sys.argv[1:])
    rng = np.random.default_rng(0)
    ok = True
    seq = 512 if small else 2048
    for kernel, seq, tol in ((attn_small, 128, 1e-4), (attn_fused, seq, 1e-2), (attn_pipelined, seq, 1e-2)):
        q, k, v = (rng.standard_normal((128, seq), dtype=np.float32) * 0.3 for _ in range(3))
        got = kernel(q, k, v)
        err = float(np.linalg.norm(got - reference(q, k, v)) / np.linalg.norm(reference(q, k, v)))
        ok &= err < tol
        print(f"{kernel.__name__} seq={seq}: {'OK' if err < tol else 'MISMATCH'} vs numpy (relative error "
              f"{err:.1e}); simulated device time {kernel.last.device_ns / 1e3:.1f} us, "
              f"{kernel.last.num_instructions} instructions")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
