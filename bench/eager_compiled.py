"""Eager vs compiled on the ``neuron`` device: profiles ``sample_workloads/eager_device.py`` both ways and
prints the Why of ``neuron-explorer diff`` (fusion, device time, host dispatch, transfers), the ratios
compiled / eager, and the machine's load average. ``--write`` puts the result into docs/eager.md between its
``eager-vs-compiled`` markers.

Then the eager device's own cost: one training step of a 256→512→256→10 MLP (batch 32, cross-entropy, SGD)
on ``neuron`` tensors against the same step in CPU eager, in this process, steps interleaved, with profiling
off and then on (a capture recording every execution); wall and CPU time (the process's, which a shared
machine disturbs less), and whether the weights stayed bit-exact with CPU eager. Goal (issue 41): ≤ 3× wall
with profiling off.

Usage: ``.venv/bin/python bench/eager_compiled.py [--small] [--steps 200] [--write]``.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "eager.md"
BEGIN, END = "<!-- eager-vs-compiled:begin -->", "<!-- eager-vs-compiled:end -->"


def _cli(*args: str, env: dict) -> str:
    r = subprocess.run([sys.executable, "-m", "explorer.cli", *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=1800)
    if r.returncode:
        sys.exit(f"eager_compiled: `neuron-explorer {' '.join(args[:2])}` failed: {r.stderr.strip()[-500:]}")
    return r.stdout


def _mlp(device: str):
    """The MLP, its data and its SGD step on ``device`` (the same weights and data on every device)."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
    x, y = torch.randn(32, 256).to(device), torch.randint(0, 10, (32,)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model, step


def _time_steps(cpu_step, dev_step, steps: int) -> dict:
    """Median wall and process-CPU seconds per step, CPU eager and device steps interleaved."""
    import statistics
    import time
    t = {"cpu_wall": [], "cpu_cpu": [], "dev_wall": [], "dev_cpu": []}
    for _ in range(steps):
        for name, step in (("cpu", cpu_step), ("dev", dev_step)):
            w0, c0 = time.perf_counter(), time.process_time()
            step()
            t[f"{name}_wall"].append(time.perf_counter() - w0)
            t[f"{name}_cpu"].append(time.process_time() - c0)
    return {k: statistics.median(v) for k, v in t.items()}


def step_cost(steps: int, out: Path) -> list[str]:
    """The device step against CPU eager, profiling off then on: the lines to print."""
    import torch

    from neuron_stack.eager.memory import session
    cpu_model, cpu_step = _mlp("cpu")
    dev_model, dev_step = _mlp("neuron")
    for _ in range(3):               # compiles every op's NEFF, and warms the CPU's allocator
        cpu_step()
        dev_step()
    load = os.getloadavg()[0]
    off = _time_steps(cpu_step, dev_step, steps)
    s = session()
    s.start_capture(str(out), 3600)
    cpu_step()
    dev_step()                       # the capture's first executions describe the models
    on = _time_steps(cpu_step, dev_step, steps)
    s.stop_capture(s.recorder)
    load = max(load, os.getloadavg()[0])
    exact = all(torch.equal(a.detach(), b.detach().cpu()) for a, b in zip(cpu_model.parameters(),
                                                                          dev_model.parameters()))
    lines = [f"eager device step, 256→512→256→10 MLP, batch 32, SGD, against CPU eager in this process "
             f"(median of {steps} steps, load average up to {load:.1f} on {os.cpu_count()} cores):"]
    for name, r in (("profiling off", off), ("profiling on ", on)):
        lines.append(f"  {name}: device {r['dev_wall'] * 1e3:.2f} ms, CPU eager {r['cpu_wall'] * 1e3:.2f} ms: "
                     f"{r['dev_wall'] / r['cpu_wall']:.2f}× wall, {r['dev_cpu'] / r['cpu_cpu']:.2f}× CPU time")
    lines.append(f"  weights after {2 * steps + 4} steps bit-exact with CPU eager: {exact}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="the sample's --small size (tiny MLP, 3 steps)")
    p.add_argument("--steps", type=int, default=200, help="timed MLP steps each way (--small: 3)")
    p.add_argument("--write", action="store_true", help="write the result into docs/eager.md")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="eager_compiled_"))
    # a runtime directory and compile cache of its own: cores held by other processes do not matter
    env = dict(os.environ, NEURON_STACK_RUNTIME_DIR=str(tmp / "rt"), NEURON_COMPILE_CACHE_URL=str(tmp / "cache"))
    profiles = {}
    for mode in ("eager", "compile"):
        _cli("inspect", "-o", str(tmp / mode), "--name", mode, "--", sys.executable,
             str(ROOT / "sample_workloads" / "eager_device.py"), *(["--small"] if args.small else []),
             "--mode", mode, env=env)
        profiles[mode] = next((tmp / mode).glob("*/profile.duckdb"))
    why = json.loads(_cli("diff", "--json", str(profiles["eager"]), str(profiles["compile"]), env=env))["why"]
    a, b = why["a"], why["b"]
    ratios = {k: b[k] / a[k] for k in ("executions", "device_ns", "dispatch_ns", "dispatch_median_ns")
              if a[k]}
    load = os.getloadavg()[0]
    size = "the sample's --small size" if args.small else "the sample's full size"
    lines = [f"`python bench/eager_compiled.py{' --small' if args.small else ''}` ({size}, load average "
             f"{load:.1f} on {os.cpu_count()} cores):", "", "```text",
             *(f"• {line}" for line in why["lines"]),
             "compiled / eager: " + ", ".join(f"{k} {v:.2f}×" for k, v in ratios.items()), "```"]
    print("\n".join(lines))
    os.environ.update(NEURON_STACK_RUNTIME_DIR=env["NEURON_STACK_RUNTIME_DIR"],
                      NEURON_COMPILE_CACHE_URL=env["NEURON_COMPILE_CACHE_URL"])
    # --small checks the path runs (each figure a median, of 3 steps as well as 5); profiled steps are costly
    step_lines = step_cost(3 if args.small else args.steps, tmp / "step_capture")
    print("\n" + "\n".join(step_lines))
    if args.write:
        text = DOC.read_text()
        i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
        block = lines + ["", "```text", *step_lines, "```"]
        DOC.write_text(text[:i] + "\n" + "\n".join(block) + "\n" + text[j:])
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
