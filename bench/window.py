"""How large a torch.profiler window gets (docs/traces.md, "Capturing with torch.profiler").

Runs the training loop of AWS's torch-neuronx profiling samples (a 64->128->10 MLP, AdamW, ``with_stack``,
``record_function`` regions, ``device="neuron"``, eager) in a child process twice, with windows of ``--short``
and ``--long`` active steps, and prints each window's files (``trace.json``, ``profile.duckdb``, the
segments) and host events, then the bytes per step (the difference of the two over the difference of
their steps) and what a window of 1,000 steps comes to, by that slope (host events and ``trace.json``
stop growing at the window's bound, ``host_frames.MAX_EVENTS``). Sizes, not times: the figures do not
depend on the machine's load. Note: torch's Python tracer holds a long ``with_stack`` window's frames in
memory until it ends (some 0.3 GB per step of this eager loop, whose AdamW compiles new ops every step).

Usage: ``.venv/bin/python bench/window.py [--short 4] [--long 24] [--write]`` (``--write``: also write the
table into docs/traces.md's generated block).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from published import write_docs  # noqa: E402

from neuron_stack.runtime.host_frames import MAX_EVENTS  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs" / "traces.md"
DOCS_BEGIN = "<!-- begin: written by bench/window.py --write; do not edit by hand -->"
DOCS_END = "<!-- end: written by bench/window.py --write -->"

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from torch.profiler import profile, ProfilerActivity, schedule, record_function
    from neuron_stack.profiling import NeuronConfig, ProfileMode, NeuronProfiler

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = {}
    for active in map(int, sys.argv[2:]):
        cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME, ProfileMode.CPU_UTIL],
                           profile_output_dir=f"{sys.argv[1]}/{active}")
        neuron = NeuronProfiler(cfg)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=cfg,
                     schedule=schedule(wait=1, warmup=1, active=active), on_trace_ready=neuron.export_trace,
                     with_stack=True) as p:
            for step in range(active + 2):
                x, y = torch.randn(32, 64).to("neuron"), torch.randint(0, 10, (32,)).to("neuron")
                with record_function("forward"):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                with record_function("backward"):
                    loss.backward()
                opt.step(); opt.zero_grad()
                loss.item()
                p.step()
        out[active] = str(neuron.traces[0])
    print(json.dumps(out))
""")


def _window(profile: Path) -> dict:
    import traces
    d = profile.parent
    with traces.open(profile) as p:
        events = p.sql("SELECT count(*) AS n FROM system_events WHERE source = 'framework'").column("n")[0].as_py()
        instructions = p.sql("SELECT count(*) AS n FROM instructions").column("n")[0].as_py()
    return {"trace.json": (d / "trace.json").stat().st_size, "profile.duckdb": profile.stat().st_size,
            "segments": sum(f.stat().st_size for f in d.glob("*.arrow")),
            "window": sum(f.stat().st_size for f in d.iterdir()), "host events": events,
            "instructions": instructions}


def markdown(rows: dict[str, tuple], short: int, long: int) -> str:
    mb = lambda b: f"{b / 1e6:,.2f} MB"   # noqa: E731
    lines = [f"| | {short} steps | {long} steps | per step | 1,000 steps |", "|---|---:|---:|---:|---:|"]
    for key, (a, b, slope, k) in rows.items():
        fmt = mb if key not in ("host events", "instructions") else (lambda n: f"{n:,.0f}")
        lines.append(f"| {key} | {fmt(a)} | {fmt(b)} | {fmt(slope)} | {fmt(k)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/window.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", type=int, default=4)
    ap.add_argument("--long", type=int, default=24)
    ap.add_argument("--write", action="store_true", help=f"write the table into {DOCS.name}")
    args = ap.parse_args(argv)
    if not 0 < args.short < args.long:
        print("bench/window.py: --short must be positive and less than --long", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-window-") as tmp:
        env = dict(os.environ, NEURON_COMPILE_CACHE_URL=f"{tmp}/cache", NEURON_STACK_LIVE_DIR=f"{tmp}/live")
        r = subprocess.run([sys.executable, "-c", SCRIPT, f"{tmp}/out", str(args.short), str(args.long)],
                           env=env, capture_output=True, text=True, timeout=3600)
        if r.returncode:
            print(f"bench/window.py: the training script failed: {r.stderr.strip().splitlines()[-1:]}",
                  file=sys.stderr)
            return 1
        paths = json.loads(r.stdout.strip().splitlines()[-1])
        a, b = _window(Path(paths[str(args.short)])), _window(Path(paths[str(args.long)]))
    rows = {}
    for key in a:
        slope = (b[key] - a[key]) / (args.long - args.short)
        rows[key] = (a[key], b[key], slope, a[key] + slope * (1000 - args.short))
    # a window keeps at most MAX_EVENTS host events: trace.json grows with them, then stops
    ev_a, ev_b, ev_slope, ev_k = rows["host events"]
    kept = min(ev_k, MAX_EVENTS)
    js = rows["trace.json"]
    js_k = js[0] + (js[1] - js[0]) / max(ev_b - ev_a, 1) * (kept - ev_a)
    rows["window"] = (*rows["window"][:3], rows["window"][3] - js[3] + js_k)
    rows["trace.json"], rows["host events"] = (*js[:3], js_k), (ev_a, ev_b, ev_slope, kept)
    table = markdown(rows, args.short, args.long)
    print(table)
    if args.write:
        write_docs(str(DOCS), table, DOCS_BEGIN, DOCS_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
