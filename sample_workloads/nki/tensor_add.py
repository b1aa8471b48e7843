"""NKI sample: elementwise tensor add, tiled 128 x 512 (after the SDK's tensor_addition example).

Written in the real SDK's form: only the three imports differ. Run it to check it against numpy and
print its simulated device time: ``python sample_workloads/nki/tensor_add.py [--small]``.
"""
import sys

import numpy as np

import neuron_stack.nki as nki  # noqa: PLR0402  (the SDK's import, renamed)
import neuron_stack.nki.isa as nisa
import neuron_stack.nki.language as nl


@nki.jit
def tensor_add(a, b):
    """out = a + b for [M, N] tensors, M a multiple of 128 and N of 512."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    M, N = a.shape
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // 512):
            ta = nl.ndarray((128, 512), a.dtype, buffer=nl.sbuf)
            tb = nl.ndarray((128, 512), a.dtype, buffer=nl.sbuf)
            tc = nl.ndarray((128, 512), a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=ta, src=a[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512])
            nisa.dma_copy(dst=tb, src=b[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512])
            nisa.tensor_tensor(dst=tc, data1=ta, data2=tb, op=nl.add)
            nisa.dma_copy(dst=out[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], src=tc)
    return out


@nki.jit
def tensor_add_spmd(a_input, b_input):
    """The legacy SPMD form: one 128 x 512 tile per instance, launched as ``kernel[M // 128, N // 512]``."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    ix = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    iy = nl.program_id(1) * 512 + nl.arange(512)[None, :]
    a_tile = nl.load(a_input[ix, iy])
    b_tile = nl.load(b_input[ix, iy])
    c_tile = a_tile + b_tile
    nl.store(c_output[ix, iy], value=c_tile)
    return c_output


def main(argv=None) -> int:
    small = "--small" in (argv if argv is not None else sys.argv[1:])
    M, N = (256, 1024) if small else (1024, 2048)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((M, N), dtype=np.float32), rng.standard_normal((M, N), dtype=np.float32)
    out = tensor_add(a, b)
    out2 = tensor_add_spmd[M // 128, N // 512](a, b)
    ok = np.allclose(out, a + b, rtol=1e-6) and np.allclose(out2, a + b, rtol=1e-6)
    print(f"tensor_add {M}x{N}: {'OK' if ok else 'MISMATCH'} vs numpy; simulated device time "
          f"{tensor_add.last.device_ns / 1e3:.1f} us ({tensor_add.last.num_instructions} instructions), "
          f"SPMD form {tensor_add_spmd.last.device_ns / 1e3:.1f} us")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
