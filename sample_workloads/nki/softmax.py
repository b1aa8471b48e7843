"""NKI sample: row softmax with a ragged last tile (masks), in the legacy nl-operator form.

``python sample_workloads/nki/softmax.py [--small]``.
"""
import sys

import numpy as np

import neuron_stack.nki as nki  # noqa: PLR0402  (the SDK's import, renamed)
import neuron_stack.nki.language as nl


@nki.jit
def softmax_kernel(x):
    """softmax over the last axis of x [R, C]; any R (the last row tile is masked), C <= 8192."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    R, C = x.shape
    ic = nl.arange(C)[None, :]
    for i in nl.affine_range((R + 127) // 128):
        ip = i * 128 + nl.arange(128)[:, None]
        tile = nl.load(x[ip, ic], mask=(ip < R))
        row_max = nl.max(tile, axis=[1])
        shifted = nl.subtract(tile, row_max)
        e = nl.exp(shifted)
        row_sum = nl.sum(e, axis=[1])
        y = nl.divide(e, row_sum)
        nl.store(out[ip, ic], value=y, mask=(ip < R))
    return out


def reference(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def main(argv=None) -> int:
    small = "--small" in (argv if argv is not None else sys.argv[1:])
    R, C = (200, 512) if small else (1000, 2048)
    x = np.random.default_rng(0).standard_normal((R, C), dtype=np.float32)
    out = softmax_kernel(x)
    ok = np.allclose(out, reference(x), rtol=1e-4, atol=1e-7)
    print(f"softmax {R}x{C}: {'OK' if ok else 'MISMATCH'} vs numpy; simulated device time "
          f"{softmax_kernel.last.device_ns / 1e3:.1f} us")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
