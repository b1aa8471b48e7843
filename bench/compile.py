"""Compile-time benchmark: BERT-base-sized encoders (hidden 768, seq 128, random init) of 1, 12 and 24 layers.

For each size, in one run: plain ``torch.export`` + ``run_decompositions`` ("capture"), a cold
``neuron_stack.trace`` (empty cache), a warm one (cache hit, same process), and in a new process a cache
hit (the whole ``trace``, against that process's own bare export: the goal, issue 41, is at most 0.3 s
over it) and ``neuron_stack.load`` of the saved NEFF.
Prints the per-stage table, the ratios cold/capture, warm/capture, load/cold, warm - capture (wall
clock, and again in CPU seconds of the process, which a busy shared machine disturbs less), and a
digest of the instruction schedule (``--expect-digest`` checks it: speed work must not change what
the compiler emits). The machine's load average is printed with the figures: ratios are measured
within one run because absolute times on a shared machine mean little.

``--write`` puts the table (every size of the run), the new process's warm hit over its bare export and the
digests into docs/compiler.md between its ``written by bench/compile.py`` markers (on a quiet machine).

Usage: ``.venv/bin/python bench/compile.py [--layers 1 12 24] [--expect-digest 12:<sha256>] [--write]``.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_workloads"))
from _docs import conditions, write_block  # noqa: E402
from models import BertEncoder  # noqa: E402

import neuron_stack  # noqa: E402
from neuron_stack.frontend.export import export  # noqa: E402

STAGES = ("capture", "graph_hash", "passes", "cache", "runtime_load")

#: Run in a fresh interpreter: a cache hit of the model against its bare export (before and after the hit: the
#: faster one is the baseline), then neuron_stack.load of the saved NEFF.
CHILD = """
import json, sys, time, torch
sys.path.insert(0, {workloads!r})
from models import BertEncoder
import neuron_stack
t0 = time.perf_counter(); import neuron_stack.api; import_s = time.perf_counter() - t0   # noqa: E702
from neuron_stack.frontend.export import export
torch.manual_seed(0)
m = BertEncoder(vocab=30522, hidden={hidden}, layers={layers}, heads=12, seq={seq}).eval()
ids = torch.randint(0, 30522, (1, {seq}))
export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))          # torch's one-time export warm-up, as in the parent


def timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


_, exp1_s, exp1_cpu = timed(lambda: export(m, (ids,)))
hit, total_s, total_cpu = timed(lambda: neuron_stack.trace(m, ids))
_, exp2_s, exp2_cpu = timed(lambda: export(m, (ids,)))
st, cpu = hit.model.compile_info["stages_s"], hit.model.compile_info["stages_cpu_s"]
cache_hit = hit.cache_hit
hit.model.unload()
del hit
nm, load_s, load_cpu = timed(lambda: neuron_stack.load({saved!r}))
print(json.dumps({{"import_s": import_s, "load_s": load_s, "load_cpu": load_cpu, "hit": cache_hit,
                  "hit_s": st["graph_hash"] + st["cache"] + st["runtime_load"],
                  "hit_cpu": cpu["graph_hash"] + cpu["cache"] + cpu["runtime_load"], "stages": st,
                  "trace_s": total_s, "trace_cpu": total_cpu, "export_s": min(exp1_s, exp2_s),
                  "export_cpu": min(exp1_cpu, exp2_cpu)}}))
"""


def schedule_digest(nm) -> str:
    """sha256 over every instruction column and the scalars of every partition's schedule."""
    h = hashlib.sha256()
    for _, s in sorted(nm.neff.schedules.items()):
        h.update(str(s.table.schema).encode())
        for c in s.table.column_names:
            h.update(json.dumps(s.table.column(c).to_pylist(), default=str).encode())
        h.update(json.dumps(s.scalars(), sort_keys=True).encode())
    return h.hexdigest()


def bench(layers: int, hidden: int, seq: int) -> dict:
    torch.manual_seed(0)
    model = BertEncoder(vocab=30522, hidden=hidden, layers=layers, heads=12, seq=seq).eval()
    ids = torch.randint(0, 30522, (1, seq))
    t0, c0 = time.perf_counter(), time.process_time()
    export(model, (ids,))                        # torch.export + run_decompositions, nothing of ours
    capture_s, capture_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    cold = neuron_stack.trace(model, ids)
    cold_s, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    warm = neuron_stack.trace(model, ids)
    warm_s, warm_cpu = time.perf_counter() - t0, time.process_time() - c0
    assert warm.cache_hit and not cold.cache_hit
    saved = Path(tempfile.mkdtemp(prefix="bench-neff-")) / "model.neff"
    cold.save(saved)
    code = CHILD.format(workloads=str(ROOT / "sample_workloads"), hidden=hidden, layers=layers, seq=seq,
                        saved=str(saved))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"bench: the new-process load failed: {r.stderr.strip().splitlines()[-1:]}")
    child = json.loads(r.stdout.strip().splitlines()[-1])
    assert child["hit"], "the new process missed the cache"
    st = cold.neff.program.stats
    return {"layers": layers, "ops": st["num_ops"], "instructions": st["num_instructions"],
            "capture_s": capture_s, "cold_s": cold_s, "warm_s": warm_s, "child": child,
            "capture_cpu": capture_cpu, "cold_cpu": cold_cpu, "warm_cpu": warm_cpu,
            "cold_stages": cold.model.compile_info["stages_s"], "warm_stages": warm.model.compile_info["stages_s"],
            "pass_s": st["pass_s"], "digest": schedule_digest(cold)}


def markdown(rows: list[dict], command: str, loads: tuple[float, float]) -> str:
    """The run as docs/compiler.md shows it: one column per size, targets in brackets, then the digests."""
    def row(name: str, cell) -> str:
        return f"| {name} | " + " | ".join(cell(r, r["child"]) for r in rows) + " |"
    return "\n".join([
        conditions(command, loads) + ". Targets in brackets.", "",
        "| BERT-base-sized encoder | " + " | ".join(f"{r['layers']} layer{'s' * (r['layers'] > 1)}" for r in rows)
        + " |", "|---|" + "---|" * len(rows),
        row("instructions", lambda r, c: f"{r['instructions']:,}"),
        row("capture (`torch.export` + decompositions), s", lambda r, c: f"{r['capture_s']:.2f}"),
        row("cold `trace`, s", lambda r, c: f"{r['cold_s']:.2f}"),
        row("cold / capture (≤ 2)", lambda r, c: f"{r['cold_s'] / r['capture_s']:.2f}"),
        row("warm `trace` (cache hit, same process) − capture, s (≤ 0.3)",
            lambda r, c: f"{r['warm_s'] - r['capture_s']:+.2f}"),
        row("`neuron_stack.load` in a new process / cold (≤ 0.1)", lambda r, c: f"{c['load_s'] / r['cold_s']:.3f}"),
        row("cache hit in a new process (hash + lookup + runtime load) / cold (≤ 0.1)",
            lambda r, c: f"{c['hit_s'] / r['cold_s']:.3f}"),
        row("warm hit in a new process − its bare export, s wall (CPU) (≤ 0.3)",
            lambda r, c: f"{c['trace_s'] - c['export_s']:+.2f} ({c['trace_cpu'] - c['export_cpu']:+.2f})"),
        row("lower + schedule, µs per instruction (linear scaling)",
            lambda r, c: f"{r['pass_s'].get('lower+schedule', 0) / max(r['instructions'], 1) * 1e6:.1f}"),
        "", "Schedule digests (`--expect-digest LAYERS:SHA256` checks them):", "", "```",
        *(f"{r['layers']}: {r['digest']}" for r in rows), "```"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[1, 12, 24])
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--expect-digest", action="append", default=[], metavar="LAYERS:SHA256",
                   help="fail unless the schedule of that size has this digest (before/after a speed change)")
    p.add_argument("--write", action="store_true", help="write the table into docs/compiler.md")
    args = p.parse_args()
    os.environ["NEURON_COMPILE_CACHE_URL"] = tempfile.mkdtemp(prefix="bench-cache-")
    export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))          # pay the one-time export warm-up
    load_before = os.getloadavg()
    rows = [bench(n, args.hidden, args.seq) for n in args.layers]
    load_after = os.getloadavg()

    print(f"load average (1/5/15 min) before {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
          f"after {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f} on {os.cpu_count()} CPUs")
    print("\nper-stage seconds (cold | warm):")
    print(f"{'layers':>6} " + " ".join(f"{s:>21}" for s in STAGES))
    for r in rows:
        cells = [f"{r['cold_stages'].get(s, 0):9.3f} | {r['warm_stages'].get(s, 0):9.3f}" for s in STAGES]
        print(f"{r['layers']:>6} " + " ".join(f"{c:>21}" for c in cells))
    print("\ncompiler passes of the cold compile, seconds:")
    names = list(rows[0]["pass_s"])
    print(f"{'layers':>6} " + " ".join(f"{n:>15}" for n in names))
    for r in rows:
        print(f"{r['layers']:>6} " + " ".join(f"{r['pass_s'].get(n, 0):15.3f}" for n in names))
    print("\nsummary (capture = torch.export + run_decompositions; load = neuron_stack.load in a new process; "
          "hit = graph hash + cache lookup + runtime load of a new process's trace, after its capture):")
    print(f"{'layers':>6} {'ops':>5} {'instr':>7} {'capture':>8} {'cold':>8} {'warm':>8} {'load':>7} {'hit':>7} "
          f"{'cold/cap':>8} {'warm/cap':>8} {'warm-cap':>8} {'load/cold':>9} {'hit/cold':>8} {'us/instr':>8}")
    for r in rows:
        c = r["child"]
        print(f"{r['layers']:>6} {r['ops']:>5} {r['instructions']:>7} {r['capture_s']:8.2f} {r['cold_s']:8.2f} "
              f"{r['warm_s']:8.2f} {c['load_s']:7.2f} {c['hit_s']:7.2f} {r['cold_s'] / r['capture_s']:8.2f} "
              f"{r['warm_s'] / r['capture_s']:8.2f} {r['warm_s'] - r['capture_s']:+8.2f} "
              f"{c['load_s'] / r['cold_s']:9.3f} {c['hit_s'] / r['cold_s']:8.3f} "
              f"{r['pass_s'].get('lower+schedule', 0) / max(r['instructions'], 1) * 1e6:8.1f}")
    print("\nthe same in CPU seconds of the process (less sensitive to a shared machine's load; "
          "hit as above):")
    print(f"{'layers':>6} {'capture':>8} {'cold':>8} {'warm':>8} {'load':>7} {'hit':>7} "
          f"{'cold/cap':>8} {'warm/cap':>8} {'load/cold':>9} {'hit/cold':>8}")
    for r in rows:
        c = r["child"]
        print(f"{r['layers']:>6} {r['capture_cpu']:8.2f} {r['cold_cpu']:8.2f} {r['warm_cpu']:8.2f} "
              f"{c['load_cpu']:7.2f} {c['hit_cpu']:7.2f} {r['cold_cpu'] / r['capture_cpu']:8.2f} "
              f"{r['warm_cpu'] / r['capture_cpu']:8.2f} {c['load_cpu'] / r['cold_cpu']:9.3f} "
              f"{c['hit_cpu'] / r['cold_cpu']:8.3f}")
    print("(load excludes importing neuron_stack.api in the new process: "
          + ", ".join(f"{r['child']['import_s']:.2f} s" for r in rows) + ")")
    print("\nwarm hit in a new process, over its bare export (the whole neuron_stack.trace minus torch.export + "
          "run_decompositions of the same model in that process; goal <= 0.3 s):")
    for r in rows:
        c = r["child"]
        print(f"  {r['layers']} layers: {c['trace_s'] - c['export_s']:+.2f} s wall "
              f"(trace {c['trace_s']:.2f} s, export {c['export_s']:.2f} s), "
              f"{c['trace_cpu'] - c['export_cpu']:+.2f} s CPU (trace {c['trace_cpu']:.2f} s, "
              f"export {c['export_cpu']:.2f} s)")
    print("\nschedule digests: " + ", ".join(f"{r['layers']}: {r['digest']}" for r in rows))
    bad = []
    for spec in args.expect_digest:
        n, _, want = spec.partition(":")
        got = {str(r["layers"]): r["digest"] for r in rows}.get(n)
        if got != want:
            bad.append(f"{n} layers: schedule digest {got} != expected {want}")
    if bad:
        sys.exit("bench: " + "; ".join(bad) + " (the compiler's output changed)")
    if args.write:
        size = "" if (args.hidden, args.seq) == (768, 128) else f" --hidden {args.hidden} --seq {args.seq}"
        command = f"bench/compile.py --layers {' '.join(map(str, args.layers))}{size} --write"
        write_block(ROOT / "docs" / "compiler.md", "bench/compile.py",
                    markdown(rows, command, (load_before[0], load_after[0])))


if __name__ == "__main__":
    main()
