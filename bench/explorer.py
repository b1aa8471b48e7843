"""Explorer speed on a generated ten-million-instruction profile and a one-million-event system profile.

Prints, for the device timeline: time to the first timeline figure (profile opened cold), server
time per zoom/pan request (data query + figure build, the work of one timeline callback) at several
zoom levels, and what each request sends to the browser (cells or instruction bars, and JSON bytes).
Target: ≤ 0.3 s per zoom/pan request. The counter tracks under the lanes (HFU, device memory: a second
callback per request) are timed beside it. Baseline in the same run: one full scan of the instructions
table (``SELECT engine, sum(dur_ns) … GROUP BY engine``), the cheapest query that touches every row.

Then the same for the System Trace on a synthetic eager ``with_stack`` profile
(``traces.synthetic.write_system``: a framework thread full of Python frames, the runtime and the
device on core 0): time to its first figure (cold open, whole trace), server time per zoom/pan
request, what each sends, and events drawn one by one vs summarised. Targets: first draw ≤ 2 s,
zoom/pan ≤ 0.3 s. Baseline: one full scan of ``system_events``.

    .venv/bin/python bench/explorer.py                      # 10 M instructions, 1 M system events
    .venv/bin/python bench/explorer.py --instructions 1e6   # quicker
    .venv/bin/python bench/explorer.py --instructions 0     # the System Trace alone
    .venv/bin/python bench/explorer.py --write              # and write the figures into docs/explorer.md

``--write`` replaces the block between ``<!-- bench:explorer:begin -->`` and ``<!-- bench:explorer:end -->`` in
docs/explorer.md with this run's report, headed by its command line and the machine's load: the documented
zoom, first-figure and Operators-page figures are written by this script, never typed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import traces  # noqa: E402
from traces.synthetic import write_run  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "explorer.md"
BEGIN, END = "<!-- bench:explorer:begin -->", "<!-- bench:explorer:end -->"
#: The report's lines, printed as they come and written into the doc by ``--write``.
REPORT: list[str] = []


def say(line: str) -> None:
    print(line, flush=True)
    REPORT.append(line)


def write_doc(argv: list[str], load: tuple[float, float, float]) -> None:
    """Put this run's report into docs/explorer.md between the markers, as a text block with its command."""
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"bench/explorer.py: {DOC} has no {BEGIN} … {END} block to write into")
    cmd = " ".join([".venv/bin/python bench/explorer.py", *[a for a in argv if a != "--write"]])
    block = (f"{BEGIN}\n`{cmd}` (load average {load[0]:.1f} at the start, {os.cpu_count()} cores):\n\n```text\n"
             + "\n".join(REPORT) + f"\n```\n{END}")
    DOC.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S))
    print(f"wrote the figures into {DOC}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instructions", type=float, default=10e6, help="total instructions (default 1e7)")
    ap.add_argument("--requests", type=int, default=40, help="zoom/pan requests to time (default 40)")
    ap.add_argument("--system-events", type=float, default=1e6, help="system events (default 1e6; 0: skip)")
    ap.add_argument("--dir", help="keep the generated profiles under here (default: a temporary directory)")
    ap.add_argument("--write", action="store_true", help="write the figures into docs/explorer.md")
    args = ap.parse_args()
    load = os.getloadavg()
    root = Path(args.dir or tempfile.mkdtemp(prefix="explorer-bench-"))
    if args.instructions > 0:
        timeline(args, root / "timeline" if args.dir else root)
    if args.system_events > 0:
        system(args, root / "system")
    if args.write:
        write_doc(sys.argv[1:], load)
    return 0


def timeline(args, out: Path) -> None:

    out.mkdir(parents=True, exist_ok=True)
    per_exec, cores = 10_000, (0, 1)
    executions = max(1, int(args.instructions) // (per_exec * len(cores)))
    t = time.perf_counter()
    if not (out / "profile.duckdb").exists():
        write_run(out, executions=executions, instructions=per_exec, cores=cores)
        traces.finalize(out)
    build_s = time.perf_counter() - t

    from plotly.utils import PlotlyJSONEncoder

    from explorer import data, tracks
    from explorer import timeline as tline
    from explorer.figures import counter_figure, timeline_figure

    t = time.perf_counter()
    reg = data.Registry([out / "profile.duckdb"])
    L = reg.get(reg.default_key())
    tl = tline.timeline(L)
    fig = timeline_figure(tl, data.ops(L))
    first_s = time.perf_counter() - t
    n = data.bounds(L)["instructions"]
    span = data.bounds(L)["span"]

    t = time.perf_counter()
    L.profile.sql("SELECT engine, sum(dur_ns) AS busy FROM instructions GROUP BY engine")
    scan_s = time.perf_counter() - t
    ops_s, ops_cached_s, ops_rows = operators_page(reg)
    t = time.perf_counter()   # the real HbmUsage view: every execution's HBM throughput buckets, evaluated on read
    hbm_rows = L.profile.sql("SELECT count(*) AS n, max(total_transfer_bytes) AS b FROM HbmUsage").to_pylist()[0]["n"]
    hbm_s = time.perf_counter() - t

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
        t = time.perf_counter()
        counter_figure(tracks.counters(L, tl["start"], tl["end"]))
        rows.append((frac, tl["mode"], dt, sent, payload, time.perf_counter() - t))

    say(f"profile: {n:,} instructions, {executions * len(cores)} executions, span {span / 1e6:.1f} ms "
          f"(generate + finalise {build_s:.1f} s)")
    say(f"baseline full scan of instructions: {scan_s * 1e3:.0f} ms")
    say(f"time to first timeline figure (cold open): {first_s * 1e3:.0f} ms "
          f"({first_s / scan_s:.1f}x one full scan)")
    say(f"{'window':>10} {'mode':>5} {'median ms':>10} {'max ms':>8} {'rows sent':>10} {'JSON kB':>8} "
          f"{'counters ms':>12}")
    for frac in sorted({r[0] for r in rows}, reverse=True):
        mine = [r for r in rows if r[0] == frac]
        times = [r[2] * 1e3 for r in mine]
        say(f"{frac:>10.0e} {mine[0][1]:>5} {statistics.median(times):>10.0f} {max(times):>8.0f} "
              f"{max(r[3] for r in mine):>10,} {max(r[4] for r in mine) / 1e3:>8.0f} "
              f"{max(r[5] for r in mine) * 1e3:>12.0f}")
    worst = max(r[2] for r in rows)
    say(f"zoom/pan server time: median {statistics.median(r[2] for r in rows) * 1e3:.0f} ms, "
          f"max {worst * 1e3:.0f} ms (target <= 300 ms: {'met' if worst <= 0.3 else 'NOT met'}); "
          f"max rows sent per request {max(r[3] for r in rows):,}")
    say(f"counter tracks (HFU, device memory) server time: median "
          f"{statistics.median(r[5] for r in rows) * 1e3:.0f} ms, max {max(r[5] for r in rows) * 1e3:.0f} ms")
    say(f"Operators page (layer → op → opcode, {ops_rows:,} rows), first open: {ops_s * 1e3:.0f} ms "
          f"({ops_s / scan_s:.1f}x one full scan); again (cached per profile): {ops_cached_s * 1e3:.1f} ms")
    say(f"HbmUsage ({hbm_rows:,} buckets, every execution's HBM throughput over time), counted: "
        f"{hbm_s * 1e3:.0f} ms ({hbm_s / scan_s:.1f}x one full scan)")
    reg.close()


def operators_page(reg) -> tuple[float, float, int]:
    """Server time of the Operators page: its first open (``Profile.operator_table`` over every instruction, then
    the table's rows), and a second open (the answer is cached per profile)."""
    from explorer import data, records
    from explorer.pages import operators

    data.set_registry(reg)
    key = reg.default_key()
    times = []
    for _ in range(2):
        t = time.perf_counter()
        operators.layout(profile=key)
        times.append(time.perf_counter() - t)
    return times[0], times[1], len(records.operators(data.resolve(key)))


def system(args, out: Path) -> None:
    from plotly.utils import PlotlyJSONEncoder

    from explorer import data
    from explorer.pages import system as page
    from traces.synthetic import write_system

    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    if not (out / "profile.duckdb").exists():
        write_system(out, int(args.system_events))
        traces.finalize(out)
    build_s = time.perf_counter() - t

    t = time.perf_counter()
    reg = data.Registry([out / "profile.duckdb"])
    data.set_registry(reg)
    key = reg.default_key()
    page.layout(profile=key)                   # the page's filters (a scan for the event types) ...
    fig, status, state, _ = page.render(key)   # ... then its first figure: the whole trace
    first_bytes = len(json.dumps(fig, cls=PlotlyJSONEncoder))
    first_s = time.perf_counter() - t
    L = reg.get(key)
    n = L.profile.sql("SELECT count(*) AS n FROM system_events")["n"][0].as_py()

    t = time.perf_counter()
    L.profile.sql("SELECT source, count(*) AS n, sum(dur_ns) AS busy FROM system_events GROUP BY source")
    scan_s = time.perf_counter() - t

    lo, hi = state["start"], state["end"]
    rng = random.Random(0)
    rows = []
    for i in range(args.requests):
        frac = [1.0, 0.3, 0.1, 0.01, 1e-3, 1e-4][i % 6]   # from the whole trace to a few executions
        width = max(int((hi - lo) * frac), 1000)
        start = lo + rng.randrange(0, max(hi - lo - width, 1))
        t = time.perf_counter()
        view = page.system.view(L, start, start + width)
        fig = page.figure(view, page._series(L))
        payload = len(json.dumps(fig, cls=PlotlyJSONEncoder))
        dt = time.perf_counter() - t
        rows.append((frac, dt, view["drawn"], len(view["cells"]), view["summarised"], payload))

    say(f"system profile: {n:,} events over {(hi - lo) / 1e6:.1f} ms (generate + finalise {build_s:.1f} s)")
    say(f"baseline full scan of system_events: {scan_s * 1e3:.0f} ms")
    say(f"time to first System Trace page and figure (cold open, whole trace): {first_s * 1e3:.0f} ms "
          f"({first_s / scan_s:.1f}x one full scan; target <= 2000 ms: {'met' if first_s <= 2 else 'NOT met'}), "
          f"JSON {first_bytes / 1e3:.0f} kB")
    say(f"{'window':>10} {'median ms':>10} {'max ms':>8} {'events':>8} {'cells':>7} {'summarised':>11} "
          f"{'JSON kB':>8}")
    for frac in sorted({r[0] for r in rows}, reverse=True):
        mine = [r for r in rows if r[0] == frac]
        times = [r[1] * 1e3 for r in mine]
        say(f"{frac:>10.0e} {statistics.median(times):>10.0f} {max(times):>8.0f} {max(r[2] for r in mine):>8,} "
              f"{max(r[3] for r in mine):>7,} {max(r[4] for r in mine):>11,} {max(r[5] for r in mine) / 1e3:>8.0f}")
    worst = max(r[1] for r in rows)
    say(f"System Trace zoom/pan server time: median {statistics.median(r[1] for r in rows) * 1e3:.0f} ms, "
          f"max {worst * 1e3:.0f} ms ({worst / scan_s:.1f}x one full scan; target <= 300 ms: "
          f"{'met' if worst <= 0.3 else 'NOT met'})")
    chain(L, page, scan_s, args.requests)
    reg.close()


def chain(L, page, scan_s: float, requests: int) -> None:
    """Server time of a click's Dependency Chain (``explorer.system.chain``) on a device run, and on a
    ProfilerStep span whose calls fill the chain's bound, spread over the trace."""
    from traces.q_chain import MAX_EVENTS
    picks = L.profile.sql("""
        SELECT t.track, s.ts_ns, s.name FROM system_events AS s
        JOIN system_tracks AS t ON hash(s.run_id, s.source, s.core, s.thread_id) = t.h
        WHERE s.name = 'nc_exec_running' OR s.name LIKE 'ProfilerStep#%'
        QUALIFY row_number() OVER (PARTITION BY s.name LIKE 'ProfilerStep#%' ORDER BY hash(s.ts_ns)) <= ?""",
                          [max(requests // 2, 1)])
    t0 = page.system.origin(L)
    times: dict[str, list[float]] = {}
    for r in picks.to_pylist():
        kind = "ProfilerStep" if r["name"].startswith("ProfilerStep") else r["name"]
        t = time.perf_counter()
        c = page.system.chain(L, r["track"], r["ts_ns"] - t0, r["name"])
        times.setdefault(kind, []).append(time.perf_counter() - t)
        assert c is not None and (c["upstream"] or c["downstream"]), r
    for kind, ts in sorted(times.items()):
        say(f"Dependency Chain of a {kind} (click, server time): median {statistics.median(ts) * 1e3:.0f} ms, "
            f"max {max(ts) * 1e3:.0f} ms over {len(ts)} clicks ({max(ts) / scan_s:.1f}x one full scan; "
            f"target <= 300 ms: {'met' if max(ts) <= 0.3 else 'NOT met'}; at most {MAX_EVENTS} events downstream)")


if __name__ == "__main__":
    sys.exit(main())
