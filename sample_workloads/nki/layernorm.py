"""NKI sample: LayerNorm over the last axis, two ways (the layernorm tutorial's two steps).

* ``layernorm_nl``: language ops only: mean and E[x^2] - mean^2 with ``nl.mean``, then
  ``(x - mean) * rsqrt(var + eps) * gamma + beta`` with tile operators;
* ``layernorm_bn``: the statistics from the Vector Engine's ``nisa.bn_stats`` (one per 512-column
  slice, each writing its 6 numbers into a shared stats tile) and one ``nisa.bn_aggr``, then the shift
  and scale as one two-operator ``nisa.tensor_scalar``.

Rows are tiled by 128 with a mask on the ragged last tile.
``python sample_workloads/nki/layernorm.py [--small]``.
"""
import math
import sys

import numpy as np

import neuron_stack.nki as nki  # noqa: PLR0402  (the SDK's import, renamed)
import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl


def _params(gamma, beta, D):
    one = nl.arange(1)[:, None]
    cols = nl.arange(D)[None, :]
    g = nl.load(gamma.reshape((1, D))[one, cols]).broadcast_to((nl.tile_size.pmax, D))
    b = nl.load(beta.reshape((1, D))[one, cols]).broadcast_to((nl.tile_size.pmax, D))
    return g, b


@nki.jit
def layernorm_nl(x, eps, gamma, beta):
    """LayerNorm of x [R, D] with nl ops; any R."""
    R, D = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g, b = _params(gamma, beta, D)
    rows, cols = nl.arange(nl.tile_size.pmax)[:, None], nl.arange(D)[None, :]
    for i in nl.affine_range(math.ceil(R / nl.tile_size.pmax)):
        r = i * nl.tile_size.pmax + rows
        t = nl.load(x[r, cols], mask=(r < R))
        mean = nl.mean(t, axis=1)
        var = nl.mean(nl.square(t), axis=1) - mean * mean
        y = (t - mean) * nl.rsqrt(var + eps) * g + b
        nl.store(out[r, cols], value=y, mask=(r < R))
    return out


@nki.jit
def layernorm_bn(x, eps, gamma, beta):
    """LayerNorm of x [R, D] with bn_stats / bn_aggr; any R, any D."""
    R, D = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g, b = _params(gamma, beta, D)
    P, FMAX = nl.tile_size.pmax, nl.tile_size.bn_stats_fmax
    rows, cols = nl.arange(P)[:, None], nl.arange(D)[None, :]
    n_slices = math.ceil(D / FMAX)
    for i in nl.affine_range(math.ceil(R / P)):
        r = i * P + rows
        t = nl.load(x[r, cols], mask=(r < R))
        stats = nl.ndarray((P, 6 * n_slices), dtype=nl.float32)
        six, part = nl.arange(6)[None, :], nl.arange(FMAX)[None, :]
        for j in nl.affine_range(n_slices):
            stats[rows, j * 6 + six] = nisa.bn_stats(t[rows, j * FMAX + part], mask=(j * FMAX + part < D),
                                                     dtype=nl.float32)
        mean_var = nisa.bn_aggr(stats[rows, nl.arange(6 * n_slices)[None, :]])
        mean, var = mean_var[rows, 0], mean_var[rows, 1]
        inv_std = nl.rsqrt(var + eps)
        y = nisa.tensor_scalar(data=t, op0=np.subtract, operand0=mean, op1=np.multiply, operand1=inv_std)
        nl.store(out[r, cols], value=y * g + b, mask=(r < R))
    return out


def reference(x, eps, gamma, beta):
    mean = x.mean(axis=1, keepdims=True)
    var = x.var(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def main(argv=None) -> int:
    small = "--small" in (argv if argv is not None else sys.argv[1:])
    R, D = (200, 1000) if small else (1000, 4096)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((R, D), dtype=np.float32) * 3 + 1
    gamma, beta = rng.standard_normal(D, dtype=np.float32), rng.standard_normal(D, dtype=np.float32)
    want = reference(x, 1e-5, gamma, beta)
    ok = True
    for kernel in (layernorm_nl, layernorm_bn):
        got = kernel(x, 1e-5, gamma, beta)
        good = np.allclose(got, want, rtol=1e-3, atol=1e-3)
        ok &= good
        print(f"{kernel.__name__} {R}x{D}: {'OK' if good else 'MISMATCH'} vs numpy; simulated device time "
              f"{kernel.last.device_ns / 1e3:.1f} us, {kernel.last.num_instructions} instructions")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
