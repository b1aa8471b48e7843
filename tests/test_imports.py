"""The project's import graph has no cycles, and neuron_stack's stages import only earlier stages.

The graph is built from the source with ``ast``: every ``import``/``from ... import`` anywhere in a
module (module level and inside functions), relative imports resolved. ``from a.b import c`` is an
edge to the module ``a.b.c`` when that is a module, else to ``a.b``. Importing ``a.b.c`` is an edge
to ``a.b.c`` only, not to the packages above it: their ``__init__`` files hold docstrings and the
lazy facade, so counting them would report the facade's own lazy import as a cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("neuron_stack", "traces", "monitor", "top", "explorer")

#: neuron_stack's stages in processing order; a module may import its own stage and earlier ones.
#: ``ir`` (the graph IR every stage passes on) comes first; then the public API in three tiers: ``api``
#: (``api.py``, ``dynamo.py``, ``parallel.py``, ``profiling.py``), ``llm/`` over it,
#: ``inference/`` over that; the lazy facade (``neuron_stack/__init__.py``, and ``compat/``) last.
STAGES = ("ir", "device", "isa", "frontend", "compiler", "runtime", "nki", "tools", "eager", "api", "llm", "inference",
          "facade")
API = ("api", "dynamo", "parallel", "profiling")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    """``{"neuron_stack.compiler.driver": path, ...}`` over every module of the five packages."""
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its source.

    >>> sorted(imports_of("traces.vocab", ROOT / "traces/vocab.py", project_modules()))
    []
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def add(target: str) -> None:
        while target and target not in modules:   # a name inside a module: the module itself
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in modules else base)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None. Iterative DFS (white/grey/black).

    >>> find_cycle({"a": {"b"}, "b": {"a"}})
    ['a', 'b', 'a']
    >>> find_cycle({"a": {"b"}, "b": set()}) is None
    True
    """
    state: dict[str, int] = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
                path.append(nxt)
    return None


def stage_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "neuron_stack":
        return None
    if len(parts) == 1 or parts[1] == "compat":      # the opt-in runner maps the SDK's names onto every tier
        return STAGES.index("facade")
    return STAGES.index("api" if parts[1] in API else parts[1])


def test_cycle_finder_reports_a_cycle_it_is_given():
    assert find_cycle({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == ["x", "y", "z", "x"]


def test_graph_sees_in_function_and_module_level_imports():
    graph = import_graph()
    assert "neuron_stack.api" in graph["neuron_stack"]          # in a function: the lazy facade
    assert "neuron_stack.compiler.partition" in graph["neuron_stack.compiler.driver"]
    assert "traces.vocab" in graph["traces.schema"]


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_neuron_stack_stages_import_only_earlier_stages():
    bad = []
    for module, targets in import_graph().items():
        own = stage_of(module)
        if own is None:
            continue
        for t in sorted(targets):
            other = stage_of(t)
            if other is not None and other > own:
                bad.append(f"{module} ({STAGES[own]}) imports {t} ({STAGES[other]})")
    assert not bad, "a stage imports a later one:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", ["monitor", "top", "explorer", "traces"])
def test_readers_and_hub_never_import_neuron_stack(package):
    bad = [(m, t) for m, ts in import_graph().items() if m.split(".")[0] == package
           for t in ts if t.split(".")[0] == "neuron_stack"]
    assert not bad, bad
