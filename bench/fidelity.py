"""Cost-model fidelity against the published NeuronCore figures (a benchmark, not a test).

Per device profile it prints:
  1. achieved Tensor Engine TFLOPS / peak for bf16 matmuls 128^3 ... 4096^3 (stationary operand
     given transposed, as NKI matmul kernels take it); large ones should reach >= 0.85 of peak and
     128^3 fall well below, as on the hardware;
  2. DMA efficiency against the payload per partition (overhead-bound under 256 B, near peak from
     4 KiB), from a real lowered HBM->SBUF->HBM copy and from the formula;
  3. a Llama-style decoder layer (RMSNorm, rotary-free attention with causal mask, SwiGLU MLP),
     built through ``neuron_stack.frontend.export``: device time and busy time per engine.

Usage: ``.venv/bin/python bench/fidelity.py [--targets trn1,inf2,trn2] [--max-n 4096] [--quick]``
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from neuron_stack.compiler.fuse import fuse  # noqa: E402
from neuron_stack.compiler.legalize import legalize  # noqa: E402
from neuron_stack.compiler.partition import partition  # noqa: E402
from neuron_stack.compiler.schedule import build_schedule  # noqa: E402
from neuron_stack.device.cost import dma_efficiency  # noqa: E402
from neuron_stack.device.profiles import get_profile  # noqa: E402
from neuron_stack.frontend.export import capture  # noqa: E402


class LhsTMatmul(torch.nn.Module):
    def forward(self, a_t, b):
        return a_t.t() @ b


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class DecoderLayer(torch.nn.Module):
    """One Llama-style layer (hidden 1024, 16 heads, SwiGLU 2816) on a 256-token sequence."""

    def __init__(self, d=1024, heads=16, ff=2816):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = torch.nn.Linear(d, ff, bias=False), torch.nn.Linear(d, ff, bias=False)
        self.down = torch.nn.Linear(ff, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        y = self.n1(x)
        q, k, v = (p(y).view(b, s, self.h, self.dh).transpose(1, 2) for p in (self.q, self.k, self.v))
        att = (q @ k.transpose(-1, -2)) / self.dh ** 0.5
        mask = torch.triu(torch.full((s, s), float("-inf")), 1)
        a = torch.softmax(att + mask, dim=-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        y = self.n2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))


def compile_program(model, args):
    return fuse(partition(legalize(capture(model, args))))


def matmul_rows(targets, sizes):
    print("\n== Tensor Engine: bf16 matmul n^3, achieved / peak ==")
    print(f"{'n':>6} " + " ".join(f"{t:>16}" for t in targets))
    for n in sizes:
        a_t = torch.empty(n, n, dtype=torch.bfloat16)
        b = torch.empty(n, n, dtype=torch.bfloat16)
        prog = compile_program(LhsTMatmul(), (a_t, b))
        cells = []
        for t in targets:
            p = get_profile(t)
            s = build_schedule(prog, 0, p, {"target": t})
            frac = 2 * n ** 3 / (s.device_ns * 1e-9) / (p.lnc * p.tensor_peak_flops("bfloat16"))  # logical core
            cells.append(f"{frac:6.3f} ({2 * n ** 3 / s.device_ns / 1e3:5.1f} TF)")
        print(f"{n:>6} " + " ".join(f"{c:>16}" for c in cells))


def dma_rows(targets, per_partition, transfers=64):
    """HBM->SBUF loads of [128 partitions x N bytes] into 16 rotating SBUF slots, lowered and
    scheduled over the core's queues (the DMA guide's "16 transfers x 8 buffers" shape)."""
    from published import scheduled_dma_efficiency
    print(f"\n== DMA: efficiency vs payload per partition ({transfers} loads of 128 partitions, 16 in flight,"
          " 16 queues) ==")
    print("   scheduled = bytes / (device time x core peak); formula = cost.dma_efficiency (fixed cost overlapped)")
    print(f"{'bytes':>7} " + " ".join(f"{t + ' sched':>12} {t + ' formula':>13}" for t in targets))
    for nbytes in per_partition:
        cells = []
        for t in targets:
            eff = scheduled_dma_efficiency(t, nbytes, transfers)
            cells.append(f"{eff:12.3f} {dma_efficiency(get_profile(t), nbytes):13.3f}")
        print(f"{nbytes:>7} " + " ".join(cells))


def decoder_rows(targets, seq):
    print(f"\n== Llama-style decoder layer (hidden 1024, 16 heads, SwiGLU 2816, seq {seq}), --auto-cast matmult ==")
    torch.manual_seed(0)
    model = DecoderLayer().eval()
    prog = compile_program(model, (torch.randn(1, seq, 1024),))
    engines = ("tensor", "vector", "scalar", "gpsimd", "dma")
    print(f"{'target':>7} {'device us':>10} {'instr':>7} {'sched s':>8} " + " ".join(f"{e:>14}" for e in engines)
          + f" {'MFU':>6}")
    for t in targets:
        p = get_profile(t)
        t0 = time.perf_counter()
        s = build_schedule(prog, 0, p, {"target": t, "auto_cast": "matmult"})
        el = time.perf_counter() - t0
        cells = []
        for e in engines:
            busy = s.active_ns.get(e, 0)
            cells.append(f"{busy / 1e3:8.1f}us {100 * busy / max(s.device_ns, 1):3.0f}%")
        mfu = s.tensor_flops / (s.device_ns * 1e-9) / (p.lnc * p.tensor_peak_flops("bfloat16"))
        print(f"{t:>7} {s.device_ns / 1e3:10.1f} {s.table.num_rows:7d} {el:8.2f} " + " ".join(f"{c:>14}" for c in cells)
              + f" {100 * mfu:5.1f}%")
    print("   (per engine: active time = union of its busy intervals, and its share of the device time)")


def published_report(targets, quick: bool, json_path: str | None, docs: str | None = None) -> int:
    """``--published``: the NKI guide's curves, then the §2.12 Llama rows (``--quick``: the Llama-3-8B
    rows with 128 input tokens on ``targets``), each with its ratio and roofline, and the summary."""
    import json
    import os

    import published
    load = os.getloadavg()[0]
    print("Calibration report (issue 18): projected / published. Device constants and their sources:")
    for name in targets:
        p = get_profile(name)
        print(f"   {name}: " + "; ".join(f"{k}: {v}" for k, v in sorted(p.sources.items())))
    disagree = published.print_nki(targets)
    rows = [r for r in published.ROWS if r[1] in targets and (not quick or r[0] == "Llama-3-8B" and r[4] == 128)]
    out, s = published.llama_report(rows, log=lambda m: print(m, file=sys.stderr))
    published.print_llama(out, s)
    print(f"   NKI guide statements that disagree with the schedule: {disagree}")
    load = max(load, os.getloadavg()[0])   # the run's load, at either end (the figures themselves are simulated)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"rows": out, "summary": s, "nki_disagreements": disagree, "load_average": load}, f, indent=1)
    if docs:
        published.write_docs(docs, published.markdown(out, s, load))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="trn1,inf2,trn2")
    ap.add_argument("--max-n", type=int, default=4096)
    ap.add_argument("--quick", action="store_true", help="small sizes only (seconds)")
    ap.add_argument("--published", action="store_true",
                    help="the calibration report: every public figure in the references vs the projection")
    ap.add_argument("--json", metavar="FILE", help="with --published: also write the rows and summary as JSON")
    ap.add_argument("--docs", metavar="PAGE", help="with --published: write the table into PAGE's generated block")
    ap.add_argument("--from-json", metavar="FILE",
                    help="with --docs: write the table of a saved --json run (load average as it was) instead")
    a = ap.parse_args(argv)
    targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    for t in targets:
        try:
            get_profile(t)
        except ValueError as e:
            ap.exit(2, f"fidelity: error: {e}\n")
    if a.from_json and a.docs:
        import json

        import published
        run = json.loads(Path(a.from_json).read_text())
        rows = run["rows"]
        published.write_docs(a.docs, published.markdown(rows, published.summary(rows), run["load_average"]))
        return 0
    if a.published:
        return published_report(targets, a.quick, a.json, a.docs)
    sizes = [n for n in (128, 256, 512, 1024, 2048, 4096) if n <= (512 if a.quick else a.max_n)]
    matmul_rows(targets, sizes)
    dma_rows(targets, [64, 128, 256, 512, 1024, 2048, 4096, 8192] if not a.quick else [64, 4096])
    decoder_rows(targets, 64 if a.quick else 256)
    return 0


if __name__ == "__main__":
    sys.exit(main())
