"""The compiler's one extension point: a graph recorder a tool installs, so the compiler never
imports a tool (``neuron_parallel_compile`` installs its collector through the public facade).

While a recorder is *active*, :func:`neuron_stack.compiler.driver.compile_program` hands it every
graph before any pass touches it, skips the costly lowering (roofline timing only) and the
persistent cache stays out of the way (:func:`neuron_stack.compiler.cache.compile_cached`).

>>> class Count:
...     seen = 0
...     def active(self): return True
...     def record(self, program, flags, partitioner_config, graph_hash): Count.seen += 1
>>> previous = set_graph_recorder(Count())
>>> recording()
True
>>> _ = set_graph_recorder(previous)
"""
from __future__ import annotations

from typing import Any, Protocol

from neuron_stack.ir import Program


class GraphRecorder(Protocol):
    def active(self) -> bool:
        """True while graphs are to be recorded instead of compiled (checked at every compile)."""

    def record(self, program: Program, flags: dict, partitioner_config: Any, graph_hash: str) -> Any:
        """Keep ``program`` (untouched by any pass), its flags and partitioner config."""


_recorder: GraphRecorder | None = None


def set_graph_recorder(recorder: GraphRecorder | None) -> GraphRecorder | None:
    """Install ``recorder`` (None removes it); returns the one it replaces."""
    global _recorder
    previous, _recorder = _recorder, recorder
    return previous


def active_recorder() -> GraphRecorder | None:
    """The installed recorder if it is active now, else None."""
    r = _recorder
    return r if r is not None and r.active() else None


def recording() -> bool:
    """True while an installed recorder is active (compiles are quick placeholders, never cached)."""
    return active_recorder() is not None
