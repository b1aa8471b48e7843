"""Eager vs compiled on the ``neuron`` device: profiles ``sample_workloads/eager_device.py`` both ways and
prints the Why of ``neuron-explorer diff`` (fusion, device time, host dispatch, transfers), the ratios
compiled / eager, and the machine's load average. ``--write`` puts the result into docs/eager.md between its
``eager-vs-compiled`` markers.

Usage: ``.venv/bin/python bench/eager_compiled.py [--small] [--write]``.
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="the sample's --small size (tiny MLP, 3 steps)")
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
    if args.write:
        text = DOC.read_text()
        i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
        DOC.write_text(text[:i] + "\n" + "\n".join(lines) + "\n" + text[j:])
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
