"""DESIGN.md §2: the layer rules, checked by importing each package in a fresh interpreter."""
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)

ROOT = Path(__file__).resolve().parents[1]
UI = {"textual", "dash", "plotly"}
FORBIDDEN = {
    "traces": {"neuron_stack", "monitor", "top", "explorer", "torch"} | UI,
    "monitor": {"neuron_stack", "torch", "top", "explorer"} | UI,
    "top": {"neuron_stack", "torch", "explorer"},
    "explorer": {"neuron_stack", "torch", "monitor", "top"},
    "neuron_stack": UI | {"monitor", "top", "explorer"},
}


def _modules(package: str) -> list[str]:
    names = [package]
    for info in pkgutil.walk_packages([str(ROOT / package)], prefix=package + "."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_layers(package):
    code = (
        "import importlib, json, sys\n"
        f"for m in {_modules(package)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted({k.split('.')[0] for k in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert not loaded & FORBIDDEN[package], f"{package} pulls in {sorted(loaded & FORBIDDEN[package])}"
