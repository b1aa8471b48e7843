"""The house rule (docs/ARCHITECTURE.md): every function of the product's packages reads in one screen
(at most ~120 lines) and every module holds one thing (at most ~600 lines)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("neuron_stack", "traces", "monitor", "top", "explorer")
MAX_FUNCTION_LINES = 120
MAX_MODULE_LINES = 600


def _sources():
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``"path:line name (N lines)"`` for each function or method of ``path`` longer than ``limit`` lines.

    >>> long_functions(Path(__file__))
    []
    """
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_over_120_lines():
    bad = [f for p in _sources() for f in long_functions(p)]
    assert not bad, "split along the seams a reader would name:\n" + "\n".join(bad)


def test_no_module_over_600_lines():
    bad = [f"{p.relative_to(ROOT)} ({n} lines)" for p in _sources()
           if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not bad, "a module that long holds two things:\n" + "\n".join(bad)
