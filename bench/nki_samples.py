"""The published-tutorial NKI samples at the tutorials' own sizes: simulated device time, achieved
TensorE share and instruction count of each kernel (timed without numbers), whether each sample's kernels equal
numpy at its small size (the sample's own check), plus the interpreter's wall time per instruction on a
numbers run, with the machine's load average. ``--write`` puts the table into docs/nki.md between its
``nki-samples`` markers.

Usage: ``.venv/bin/python bench/nki_samples.py [--target trn1] [--write | --smoke]`` (``--smoke``: small sizes,
what the suite runs).
"""
import argparse
import contextlib
import io
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_workloads" / "nki"))
import attention_tutorial  # noqa: E402
import layernorm  # noqa: E402
import matmul_optimized  # noqa: E402
import sd_attention  # noqa: E402
from attention_tutorial import attn_fused, attn_pipelined  # noqa: E402
from layernorm import layernorm_bn, layernorm_nl  # noqa: E402
from matmul_optimized import matmul_blocked, matmul_blocked_legacy  # noqa: E402
from sd_attention import fused_self_attention  # noqa: E402

from neuron_stack.device.profiles import get_profile  # noqa: E402
from neuron_stack.nki import run_kernel  # noqa: E402
from neuron_stack.nki.kernel import Spec  # noqa: E402

DOC = ROOT / "docs" / "nki.md"
BEGIN, END = "<!-- nki-samples:begin -->", "<!-- nki-samples:end -->"


def cases(smoke: bool = False):
    """(sample file, kernel, shape text, inputs, kwargs, matmul FLOPs); ``smoke``: small sizes (the suite's run)."""
    # the tutorial's own size and meta-parameters (the smoke size is the smallest these blocks tile)
    n = 2048 if smoke else 4096
    mm = dict(TILES_IN_BLOCK_M=16, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=8)
    bf = "bfloat16"
    yield ("matmul_optimized.py", matmul_blocked_legacy, f"bf16 {n}^3, blocks 16/2/8",
           (Spec((n, n), bf), Spec((n, n), bf)), mm, 2 * n ** 3)
    yield ("matmul_optimized.py", matmul_blocked, f"bf16 {n}^3, blocks 16/2/8",
           (Spec((n, n), bf), Spec((n, n), bf)), mm, 2 * n ** 3)
    R, D = (512, 512) if smoke else (4096, 4096)
    ln = (Spec((R, D), "float32"), 1e-5, Spec((D,), "float32"), Spec((D,), "float32"))
    yield ("layernorm.py", layernorm_nl, f"fp32 {R}x{D}", ln, {}, 0)
    yield ("layernorm.py", layernorm_bn, f"fp32 {R}x{D}", ln, {}, 0)
    S, d = 1024 if smoke else 4096, 64
    yield ("sd_attention.py", fused_self_attention, f"bf16 seq {S}, d {d}", tuple(Spec((S, d), bf) for _ in range(3)),
           {}, 4 * S * S * d)
    S = 1024 if smoke else 4096
    for kernel in (attn_fused, attn_pipelined):
        yield ("attention_tutorial.py", kernel, f"bf16 seq {S}, d 128", tuple(Spec((128, S), bf) for _ in range(3)),
               {}, 4 * S * S * 128)


def numbers_checks() -> dict[str, str]:
    """Each sample file's own check at its small size (``main(["--small"])``: every kernel in it against its numpy
    reference): ``pass`` or ``FAIL``, by file."""
    out = {}
    for mod in (matmul_optimized, layernorm, sd_attention, attention_tutorial):
        with contextlib.redirect_stdout(io.StringIO()):
            code = mod.main(["--small"])
        out[Path(mod.__file__).name] = "pass (small size)" if code == 0 else "FAIL"
    return out


def _sgemm_cpu_ns(run) -> int:
    """CPU time of the run's MATMULs as bare single-thread torch matmuls of the same shapes (the floor the
    interpreter's own overhead sits on)."""
    import torch
    shapes = []
    for ins in run.trace.instrs:
        if ins.opcode == "MATMUL":
            (k, m), n = [a[1] for a in ins.operands["src"][0]["ap"][:2]], ins.operands["src"][1]["ap"][-1][1]
            shapes.append((k, m, n))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mats = {s: (torch.rand(s[0], s[1]), torch.rand(s[0], s[2])) for s in set(shapes)}
        c0 = time.thread_time_ns()
        for s in shapes:
            a, b = mats[s]
            a.T @ b
        return time.thread_time_ns() - c0
    finally:
        torch.set_num_threads(threads)


def interpreter_speed(target: str, smoke: bool, repeats: int = 3) -> str:
    """The interpreter's time per executed instruction on the blocked matmul with numbers, fp32 1024 x 512 x
    2048 (smoke: one block, 256^2 x 1024): the best of ``repeats`` runs, its wall time split into CPU time,
    waiting for a core (the run queue: other processes) and blocked (I/O, sleep, locks)."""
    rng = np.random.default_rng(0)
    K, M, N = (256, 256, 1024) if smoke else (1024, 512, 2048)
    lhsT, rhs = rng.standard_normal((K, M), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    load = os.getloadavg()[0]
    runs = [run_kernel(matmul_blocked, (lhsT, rhs), target=target) for _ in range(repeats)]
    r = min(runs, key=lambda r: r.sim_wall_ns)
    ok = all(np.allclose(x.outputs[0], lhsT.T @ rhs, rtol=1e-4, atol=1e-3) for x in runs)
    ni = r.num_instructions
    us = lambda ns: f"{ns / ni / 1e3:,.0f} µs"      # noqa: E731
    split = (f" = {us(r.sim_cpu_ns)} CPU + {us(r.sim_runq_ns)} waiting for a core + "
             f"{us(max(0, r.sim_wall_ns - r.sim_cpu_ns - r.sim_runq_ns))} blocked"
             if r.sim_runq_ns is not None else f" ({us(r.sim_cpu_ns)} CPU)")
    sgemm = _sgemm_cpu_ns(r)
    split += f" (of the CPU, {us(sgemm)} is the MATMULs' fp32 sgemm itself, timed alone)"
    return (f"Interpreter: {us(r.sim_wall_ns)} wall{split} per instruction executed, best of {repeats}; tracing and "
            f"scheduling {us(r.trace_wall_ns)} wall per instruction (`matmul_blocked`, fp32 {K}x{M}x{N}, {ni} "
            f"instructions, numbers {'match' if ok else 'DO NOT match'} numpy; load average {load:.1f} on "
            f"{os.cpu_count()} cores: waiting for a core is other processes' load).")


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="trn1", choices=("trn1", "inf2", "trn2"))
    p.add_argument("--write", action="store_true", help="write the table into docs/nki.md")
    p.add_argument("--smoke", action="store_true", help="small sizes, to check the bench runs (the suite's run)")
    args = p.parse_args()
    if args.smoke and args.write:
        p.error("--smoke figures are not the tutorials' sizes: do not --write them")
    prof = get_profile(args.target)
    peak = prof.tensor_peak_flops("bfloat16")
    checks = numbers_checks()
    rows = ["| sample | kernel | shape | simulated device time | TensorE share of peak | instructions | numbers |",
            "|---|---|---|---|---|---|---|"]
    for file, kernel, shape, inputs, kwargs, flops in cases(args.smoke):
        t0 = time.perf_counter()
        run = run_kernel(kernel, inputs, kwargs, execute=False, target=args.target)
        wall = time.perf_counter() - t0
        share = f"{flops / (run.device_ns * 1e-9) / peak:.1%}" if flops else "–"
        rows.append(f"| `{file}` | `{kernel.__name__}` | {shape} | {run.device_ns / 1e3:,.1f} µs | {share} | "
                    f"{run.num_instructions:,} | {checks[file]} |")
        print(rows[-1], f"(traced + scheduled in {wall:.1f} s)")

    speed = interpreter_speed(args.target, args.smoke)
    print(speed)
    if args.write:
        table = "\n".join(rows) + "\n\n" + speed
        text = DOC.read_text()
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{table}\n{END}", text,
                      flags=re.DOTALL)
        DOC.write_text(text)
        print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
