"""Explorer speed on a generated ten-million-instruction profile.

Prints: time to the first timeline figure (profile opened cold), server time per zoom/pan request
(data query + figure build, the work of one timeline callback) at several zoom levels, and what each
request sends to the browser (cells or instruction bars, and JSON bytes). Target: ≤ 0.3 s per
zoom/pan request. Baseline in the same run: one full scan of the instructions table
(``SELECT engine, sum(dur_ns) … GROUP BY engine``), the cheapest query that touches every row.

    .venv/bin/python bench/explorer.py                      # 10 M instructions
    .venv/bin/python bench/explorer.py --instructions 1e6   # quicker
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import traces  # noqa: E402
from traces.synthetic import write_run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instructions", type=float, default=10e6, help="total instructions (default 1e7)")
    ap.add_argument("--requests", type=int, default=40, help="zoom/pan requests to time (default 40)")
    ap.add_argument("--dir", help="keep the generated profile here (default: a temporary directory)")
    args = ap.parse_args()

    out = Path(args.dir or tempfile.mkdtemp(prefix="explorer-bench-"))
    per_exec, cores = 10_000, (0, 1)
    executions = max(1, int(args.instructions) // (per_exec * len(cores)))
    t = time.perf_counter()
    if not (out / "profile.duckdb").exists():
        write_run(out, executions=executions, instructions=per_exec, cores=cores)
        traces.finalize(out)
    build_s = time.perf_counter() - t

    from plotly.utils import PlotlyJSONEncoder

    from explorer import data
    from explorer import timeline as tline
    from explorer.figures import timeline_figure

    t = time.perf_counter()
    reg = data.Registry([out / "profile.duckdb"])
    L = reg.get(reg.default_key())
    tl = tline.timeline(L)
    fig = timeline_figure(tl, data.ops(L))
    first_s = time.perf_counter() - t
    n = data.bounds(L)["instructions"]
    span = data.bounds(L)["span"]

    t = time.perf_counter()
    L.rows("SELECT engine, sum(dur_ns) AS busy FROM instructions GROUP BY engine")
    scan_s = time.perf_counter() - t

    rng = random.Random(0)
    rows = []
    for i in range(args.requests):
        frac = [1.0, 0.3, 0.05, 0.01, 1e-3, 1e-4, 1e-5][i % 7]   # zoom levels from whole profile to a few instructions
        width = max(int(span * frac), 1000)
        start = rng.randrange(0, max(span - width, 1))
        t = time.perf_counter()
        tl = tline.timeline(L, start, start + width)
        fig = timeline_figure(tl, data.ops(L))
        payload = len(json.dumps(fig, cls=PlotlyJSONEncoder))
        dt = time.perf_counter() - t
        sent = len(tl["instructions"]) if tl["mode"] == "raw" else sum(len(c) for c in tl["buckets"].values())
        rows.append((frac, tl["mode"], dt, sent, payload))

    print(f"profile: {n:,} instructions, {executions * len(cores)} executions, span {span / 1e6:.1f} ms "
          f"(generate + finalise {build_s:.1f} s)")
    print(f"baseline full scan of instructions: {scan_s * 1e3:.0f} ms")
    print(f"time to first timeline figure (cold open): {first_s * 1e3:.0f} ms "
          f"({first_s / scan_s:.1f}x one full scan)")
    print(f"{'window':>10} {'mode':>5} {'median ms':>10} {'max ms':>8} {'rows sent':>10} {'JSON kB':>8}")
    for frac in sorted({r[0] for r in rows}, reverse=True):
        mine = [r for r in rows if r[0] == frac]
        times = [r[2] * 1e3 for r in mine]
        print(f"{frac:>10.0e} {mine[0][1]:>5} {statistics.median(times):>10.0f} {max(times):>8.0f} "
              f"{max(r[3] for r in mine):>10,} {max(r[4] for r in mine) / 1e3:>8.0f}")
    worst = max(r[2] for r in rows)
    print(f"zoom/pan server time: median {statistics.median(r[2] for r in rows) * 1e3:.0f} ms, "
          f"max {worst * 1e3:.0f} ms (target <= 300 ms: {'met' if worst <= 0.3 else 'NOT met'}); "
          f"max rows sent per request {max(r[3] for r in rows):,}")
    reg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
