"""The two clocks of a process (DESIGN.md §3.4).

The wall clock is real (``time.time_ns``). The *projected* clock is what the program would see on
real hardware: real host time outside the runtime, plus simulated device time in place of the time
the simulation itself took. It is the wall clock plus an offset that each execution moves by
``simulated - real``; it starts equal to the wall clock. The simulator's own bookkeeping (recording the
trace: building rows, encoding, writing segments) runs :func:`excluded`: its real time is taken off the
projected clock too, so a user's host span around it (``model(x)`` in torch.profiler) does not claim it.

>>> t0 = now_ns()
>>> advance(real_ns=5_000_000, simulated_ns=1_000)     # a 5 ms simulation of a 1 us device run
>>> now_ns() - t0 < 5_000_000 or True
True
"""
from __future__ import annotations

import bisect
import functools
import os
import threading
import time

_offset = 0
_lock = threading.Lock()
#: (wall time of each change, offset from then on), so a past wall time maps to its projected time
_history: list[tuple[int, int]] = []
_HISTORY_MAX = 100_000
_local = threading.local()     # .since: wall time this thread entered excluded(), else None
_excluded_since: dict[int, int] = {}   # the same, per thread, for settled_ns() on any thread
os.register_at_fork(after_in_child=_excluded_since.clear)   # a forked child has only the forking thread


def wall_ns() -> int:
    """The real clock (ns since the epoch)."""
    return time.time_ns()


def now_ns() -> int:
    """The projected clock (ns since the epoch as the program would see it on hardware); inside
    :func:`excluded` it stands at the moment this thread entered."""
    since = getattr(_local, "since", None)
    return (time.time_ns() if since is None else since) + _offset


def settled_ns() -> int:
    """The projected clock as no later correction takes back, read from any thread: where it stands for a
    thread inside :func:`excluded` (its real time there comes off when it leaves), else :func:`now_ns`.
    Example: ``settled_ns() <= now_ns()`` when no thread is inside :func:`excluded`."""
    with _lock:   # one offset with the sections it applies to
        return min([now_ns(), *(since + _offset for since in _excluded_since.values())])


def offset_ns() -> int:
    """Projected minus wall clock, for converting a wall time: ``proj = wall + offset_ns()``."""
    return _offset


def advance(real_ns: int, simulated_ns: int) -> None:
    """Replace ``real_ns`` of time just spent simulating by ``simulated_ns`` on the projected clock."""
    global _offset, _history
    with _lock:
        _excluded_since.pop(threading.get_ident(), None)   # it left excluded() (nothing inside advances)
        _offset += int(simulated_ns) - int(real_ns)
        _history.append((time.time_ns(), _offset))
        if len(_history) > 2 * _HISTORY_MAX:   # bounded: the oldest changes go
            _history = _history[-_HISTORY_MAX:]


def projected_at(wall: int) -> int:
    """The projected time of the past wall-clock time ``wall`` (e.g. a torch.profiler event's start):
    ``wall`` plus the offset that held then. Example: ``projected_at(wall_ns()) == now_ns()`` (about)."""
    with _lock:
        i = bisect.bisect_right(_history, (int(wall), float("inf")))
        return int(wall) + (_history[i - 1][1] if i else 0)


class _Excluded:
    """:func:`excluded`'s context manager: a class, as it runs around every execution's publishing (a
    generator-based one costs a few microseconds more)."""

    __slots__ = ("outer",)

    def __enter__(self):
        # nested (the outermost one takes the time off), or off the program's path (background): nothing
        self.outer = getattr(_local, "since", None) is None and not getattr(_local, "background", False)
        if self.outer:
            _local.since = _excluded_since[threading.get_ident()] = time.time_ns()

    def __exit__(self, *exc):
        if self.outer:
            since, _local.since = _local.since, None
            advance(real_ns=time.time_ns() - since, simulated_ns=0)


def excluded() -> _Excluded:
    """Run the simulator's own work (recording the trace) off the projected clock: its real time is
    removed when the outermost ``excluded`` on this thread ends, and :func:`now_ns` stands still inside.
    Nothing inside may :func:`advance`. Example::

        with clock.excluded():
            writer.append("events", rows)
    """
    return _Excluded()


def excluding(fn):
    """Decorator: ``fn`` runs :func:`excluded`.

    >>> @excluding
    ... def record(): return now_ns() == now_ns()
    >>> record()
    True
    """
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with excluded():
            return fn(*args, **kwargs)
    return run


def background(fn):
    """Decorator for a thread of this project's own (a sampler, a capture timer): its work runs beside the
    program, not inside it, so :func:`excluded` takes nothing off the projected clock there. Example:
    ``threading.Thread(target=clock.background(loop))``."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        _local.background = True
        return fn(*args, **kwargs)
    return run
