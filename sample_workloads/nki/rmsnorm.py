"""NKI sample: RMSNorm (after the SDK's RMSNorm tutorial): ``x / sqrt(mean(x**2)) * g`` per row.

``python sample_workloads/nki/rmsnorm.py [--small]``.
"""
import math
import sys

import numpy as np

import neuron_stack.nki as nki  # noqa: PLR0402  (the SDK's import, renamed)
import neuron_stack.nki.language as nl


@nki.jit
def rmsnorm_kernel(a_tensor, g_tensor):
    """a_tensor [R, D] (any R), g_tensor [D]; eps is added to the mean square."""
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    num_rows = a_tensor.shape[0]
    ix = nl.arange(128)[:, None]
    iw = nl.arange(a_tensor.shape[1])[None, :]
    iy = nl.arange(1)[:, None]
    # the weight row is loaded once and broadcast to every partition
    g_tile = nl.load(g_tensor.reshape((1, g_tensor.shape[0]))[iy, iw])
    for i in nl.affine_range(math.ceil(a_tensor.shape[0] / 128)):
        a_tile = nl.load(a_tensor[i * 128 + ix, iw], mask=(i * 128 + ix < num_rows))
        in_square = nl.square(a_tile)
        square_sum = nl.sum(in_square, axis=[1])
        mean = square_sum / a_tensor.shape[1]
        rms_reciprocal = nl.rsqrt(mean + 1e-6)
        out_tile = nl.multiply(a_tile, rms_reciprocal)
        g_bcast = g_tile.broadcast_to((128, g_tensor.shape[0]))
        out_tile[...] = nl.multiply(out_tile, g_bcast, mask=(i * 128 + ix < num_rows))
        nl.store(out_tensor[i * 128 + ix, iw], value=out_tile, mask=(i * 128 + ix < num_rows))
    return out_tensor


def reference(a: np.ndarray, g: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    a64 = a.astype(np.float64)
    return (a64 / np.sqrt((a64 ** 2).mean(axis=1, keepdims=True) + eps) * g).astype(np.float32)


def main(argv=None) -> int:
    small = "--small" in (argv if argv is not None else sys.argv[1:])
    R, D = (300, 256) if small else (4000, 1024)
    rng = np.random.default_rng(0)
    a, g = rng.standard_normal((R, D), dtype=np.float32), rng.standard_normal(D, dtype=np.float32)
    out = rmsnorm_kernel(a, g)
    ok = np.allclose(out, reference(a, g), rtol=1e-4, atol=1e-5)
    print(f"rmsnorm {R}x{D}: {'OK' if ok else 'MISMATCH'} vs numpy; simulated device time "
          f"{rmsnorm_kernel.last.device_ns / 1e3:.1f} us")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
