"""The launch grid and loops of ``nki.language``: ``program_id``, ``spmd_dim``, the range iterators and the
scheduling hints, which trace as plain Python (a kernel's loops unroll; its instances run serially).

>>> list(affine_range(3)), spmd_dim(2, nc(2))
([0, 1, 2], 4)
"""
from __future__ import annotations

import ast
import linecache
import math
import os
import re

from .core import NKIError, current
from .core import where as _where
from .tensor import _frame, _local

_FOR = re.compile(r"\bfor\s+(\w+)\s+in\b")


def program_id(axis: int = 0) -> int:
    """This instance's index along ``axis`` of the launch grid (``kernel[gx, gy](...)``)."""
    t = current()
    if not 0 <= axis < len(t.grid):
        raise NKIError(f"{_where()}: program_id({axis}) but the kernel was launched with grid {t.grid}")
    return t.program_id[axis]


def num_programs(axes: int = 0) -> int:
    return current().grid[axes]


def program_ndim() -> int:
    return len(current().grid)


class nc(int):
    """``nl.nc(n)``: ``n`` physical NeuronCores in a launch grid dimension (``nl.spmd_dim(4, nl.nc(2))``)."""


def spmd_dim(*sizes) -> int:
    """``nl.spmd_dim(4, nl.nc(2))``: a launch grid dimension of 4 x 2 instances spread over two physical cores
    (instance n on core n % 2). Instances run serially on one simulated core here, as every SPMD grid does.

    >>> spmd_dim(4, nc(2))
    8
    """
    return math.prod(int(n) for n in sizes)


def affine_range(*args, **kwargs):
    """A loop without loop-carried dependencies (accumulating into one PSUM tile is allowed).
    Traced as an unrolled Python loop; independence shows in the schedule, not in the trace (a loop
    that unrolls past ``core.MAX_INSTRUCTIONS`` instructions is refused at that line). Inside a kernel each
    iteration's index is on the trace's loop stack while its body runs, so every instruction the body issues
    records its loop variables (the profile's ``KernelIterationVariables``)."""
    t = getattr(_local, "trace", None)
    if t is None:
        return range(*args)
    f = _frame()
    path = os.path.abspath(f.f_code.co_filename) if f is not None else "<kernel>"
    line = f.f_lineno if f is not None else 0
    m = _FOR.search(linecache.getline(path, line)) if f is not None else None
    return _iterate(t, range(*args), m.group(1) if m else "_", path, line)


def _iterate(t, r: range, name: str, path: str, line: int):
    for v in r:
        t.loops.append((name, v, path, line))
        try:
            yield v
        finally:   # also when the loop breaks (the generator is closed)
            t.loops.pop()


sequential_range = static_range = affine_range


class NKIObject:
    """``nl.NKIObject``: a plain Python object a kernel may carry its tiles and settings in."""


class no_reorder:
    """``with nl.no_reorder():`` keep the instructions in program order. The simulator's scheduler already
    issues each engine's instructions in program order, so the block changes nothing here."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def assignment_at(frame):
    """The ``x = nl.loop_reduce(...)`` statement the frame is executing, which may span lines (flash attention's
    backward writes ``b[i] = nl.loop_reduce(`` and its arguments below), or None."""
    lines = linecache.getlines(frame.f_code.co_filename, frame.f_globals)
    at = frame.f_lineno
    for first in range(at, max(at - 3, 0), -1):
        for last in range(at, min(at + 20, len(lines)) + 1):
            text = "".join([lines[first - 1].lstrip(), *lines[first:last]])
            try:
                body = ast.parse(text).body
            except SyntaxError:
                continue
            if len(body) == 1 and isinstance(body[0], ast.Assign) and "loop_reduce" in ast.unparse(body[0].value):
                return body[0]
    return None
