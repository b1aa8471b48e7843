"""NKI benchmark: kernels against the compiler on the same shapes, and the simulator's own speed.

1. The tiled bf16 matmul kernel (``sample_workloads/nki/matmul.py``, the SDK tutorial's tiling) and its
   blocked form (SBUF reuse) at M = N = K = 4096: achieved / peak TensorE FLOP/s, beside the compiler's
   own matmul
   (``neuron_stack.trace`` of ``a.T @ b`` with bf16 inputs) in the same run. Both are timed by the same
   scheduler and cost model *without numbers*: the interpreter would need minutes for 4096^3.
2. Simulator wall time per simulated instruction: trace + schedule, and interpreter execution, on
   the 1024 x 512 x 2048 fp32 matmul kernel (numbers checked against numpy).
3. The flash-attention forward kernel against the compiler's ``scaled_dot_product_attention`` on the
   same shapes (batch 1, 4 heads, d 128, sequence 2048, bf16), simulated device time of each.

Usage: ``.venv/bin/python bench/nki.py [--size 4096] [--seq 2048] [--target trn1]``.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sample_workloads" / "nki"))
from flash_attention import flash_fwd
from matmul import matmul_blocked, matmul_tiled

import neuron_stack
from neuron_stack.device.profiles import get_profile
from neuron_stack.nki import run_kernel
from neuron_stack.nki.kernel import Spec


def compiled_ns(model, *inputs, target: str) -> tuple[int, int]:
    """(simulated device ns, instructions) of the compiler's NEFF for ``model`` (compiled, not run)."""
    traced = neuron_stack.trace(model, inputs, target=target)
    scheds = traced.neff.schedules.values()
    return sum(s.device_ns for s in scheds), sum(s.table.num_rows for s in scheds)


class MatmulT(torch.nn.Module):
    def forward(self, lhsT, rhs):
        return lhsT.T @ rhs


class Attention(torch.nn.Module):
    def forward(self, q, k, v):           # [b, h, s, d] each, contiguous (the compiler's natural layout)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--target", default="trn1", choices=("trn1", "inf2", "trn2"))
    args = p.parse_args()
    prof = get_profile(args.target)
    peak = prof.tensor_peak_flops("bfloat16")
    n = args.size
    flops = 2 * n ** 3

    t0 = time.perf_counter()
    run = run_kernel(matmul_tiled, (Spec((n, n), "bfloat16"), Spec((n, n), "bfloat16")), execute=False,
                     target=args.target)
    trace_s = time.perf_counter() - t0
    blk = run_kernel(matmul_blocked, (Spec((n, n), "bfloat16"), Spec((n, n), "bfloat16")), execute=False,
                     target=args.target)
    t0 = time.perf_counter()
    comp_ns, comp_instr = compiled_ns(MatmulT(), torch.zeros(n, n, dtype=torch.bfloat16),
                                      torch.zeros(n, n, dtype=torch.bfloat16), target=args.target)
    comp_s = time.perf_counter() - t0
    k_eff, c_eff = flops / (run.device_ns * 1e-9) / peak, flops / (comp_ns * 1e-9) / peak
    print(f"bf16 matmul {n}^3 on {args.target} (timing only, no numbers):")
    print(f"  NKI tiled kernel : {run.device_ns / 1e6:8.3f} ms  {k_eff:6.1%} of TensorE peak  "
          f"{run.num_instructions} instructions (traced + scheduled in {trace_s:.1f} s)")
    b_eff = flops / (blk.device_ns * 1e-9) / peak
    print(f"  NKI blocked      : {blk.device_ns / 1e6:8.3f} ms  {b_eff:6.1%} of TensorE peak  "
          f"{blk.num_instructions} instructions")
    print(f"  compiler matmul  : {comp_ns / 1e6:8.3f} ms  {c_eff:6.1%} of TensorE peak  "
          f"{comp_instr} instructions (compiled in {comp_s:.1f} s)")
    print(f"  kernel / compiler device time: tiled {run.device_ns / comp_ns:.2f}x, blocked "
          f"{blk.device_ns / comp_ns:.2f}x; the tiled kernel reloads both operand tiles for every (m, n, k) "
          f"step: DMA {run.schedule.busy_ns.get('dma', 0) / 1e6:.2f} ms busy (over 16 queues) vs "
          f"{blk.schedule.busy_ns.get('dma', 0) / 1e6:.2f} ms blocked, TensorE "
          f"{run.schedule.busy_ns.get('tensor', 0) / 1e3:.1f} us in both")

    rng = np.random.default_rng(0)
    K, M, N = 1024, 512, 2048
    lhsT, rhs = rng.standard_normal((K, M), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    t0 = time.perf_counter()
    r = run_kernel(matmul_tiled, (lhsT, rhs), target=args.target)
    total_s = time.perf_counter() - t0
    ok = np.allclose(r.outputs[0], lhsT.T @ rhs, rtol=1e-4, atol=1e-3)
    ni = r.num_instructions
    print(f"simulator speed, fp32 matmul {K}x{M}x{N} kernel ({ni} instructions, numbers "
          f"{'match' if ok else 'DO NOT match'} numpy; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
          f"cores):")
    print(f"  trace + schedule: {r.trace_wall_ns / ni / 1e3:7.1f} us wall per instruction")
    print(f"  interpreter     : {r.sim_wall_ns / ni / 1e3:7.1f} us wall per instruction "
          f"({total_s:.2f} s in all for {r.device_ns / 1e3:.0f} us simulated)")

    B, H, d, S = 1, 4, 128, args.seq
    fa = run_kernel(flash_fwd[B, H], (Spec((B, H, d, S), "bfloat16"), Spec((B, H, d, S), "bfloat16"),
                                      Spec((B, H, S, d), "bfloat16")), execute=False, target=args.target)
    q = torch.zeros(B, H, S, d, dtype=torch.bfloat16)
    att_ns, att_instr = compiled_ns(Attention(), q, q, q, target=args.target)
    print(f"attention b={B} h={H} d={d} s={S} bf16 on {args.target} (timing only):")
    print(f"  NKI flash-attention kernel : {fa.device_ns / 1e3:9.1f} us  {fa.num_instructions} instructions")
    print(f"  compiler SDPA              : {att_ns / 1e3:9.1f} us  {att_instr} instructions")
    print(f"  kernel / compiler device time: {fa.device_ns / att_ns:.2f}x")


if __name__ == "__main__":
    main()
