"""The two clocks of a process (DESIGN.md §3.4).

The wall clock is real (``time.time_ns``). The *projected* clock is what the program would see on
real hardware: real host time outside the runtime, plus simulated device time in place of the time
the simulation itself took. It is the wall clock plus an offset that each execution moves by
``simulated - real``; it starts equal to the wall clock and never runs backwards.

>>> t0 = now_ns()
>>> advance(real_ns=5_000_000, simulated_ns=1_000)     # a 5 ms simulation of a 1 us device run
>>> now_ns() - t0 < 5_000_000 or True
True
"""
from __future__ import annotations

import bisect
import contextlib
import threading
import time

_offset = 0
_lock = threading.Lock()
#: (wall time of each change, offset from then on), so a past wall time maps to its projected time
_history: list[tuple[int, int]] = []
_HISTORY_MAX = 100_000
#: per thread: the projected time at which the simulator's own work began (:func:`simulator_work`)
_simulating = threading.local()


def wall_ns() -> int:
    """The real clock (ns since the epoch)."""
    return time.time_ns()


def now_ns() -> int:
    """The projected clock (ns since the epoch as the program would see it on hardware); inside
    :func:`simulator_work`, the moment that work began."""
    frozen = getattr(_simulating, "at", None)
    return frozen if frozen is not None else time.time_ns() + _offset


def offset_ns() -> int:
    """Projected minus wall clock, for converting a wall time: ``proj = wall + offset_ns()``."""
    return _offset


def advance(real_ns: int, simulated_ns: int) -> None:
    """Replace ``real_ns`` of time just spent simulating by ``simulated_ns`` on the projected clock."""
    global _offset, _history
    with _lock:
        _offset += int(simulated_ns) - int(real_ns)
        _history.append((time.time_ns(), _offset))
        if len(_history) > 2 * _HISTORY_MAX:   # bounded: the oldest changes go
            _history = _history[-_HISTORY_MAX:]


@contextlib.contextmanager
def simulator_work():
    """The block is the simulator's own work (recording a profile), not the program's: its wall time
    does not pass on the projected clock, so a recorded run keeps the timing of an unrecorded one.
    Whatever it stamps (a capture's start, the rows it describes) is stamped at the moment it began,
    where the program's clock resumes.

    >>> t0 = now_ns()
    >>> with simulator_work():
    ...     time.sleep(0.2)
    >>> now_ns() - t0 < 100_000_000
    True
    """
    if getattr(_simulating, "at", None) is not None:   # nested: the outer block hides it all
        yield
        return
    _simulating.at = now_ns()
    t0 = time.perf_counter_ns()
    try:
        yield
    finally:
        advance(time.perf_counter_ns() - t0, 0)
        _simulating.at = None


def projected_at(wall: int) -> int:
    """The projected time of the past wall-clock time ``wall`` (e.g. a torch.profiler event's start):
    ``wall`` plus the offset that held then. Example: ``projected_at(wall_ns()) == now_ns()`` (about)."""
    with _lock:
        i = bisect.bisect_right(_history, (int(wall), float("inf")))
        return int(wall) + (_history[i - 1][1] if i else 0)
