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

import threading
import time

_offset = 0
_lock = threading.Lock()


def wall_ns() -> int:
    """The real clock (ns since the epoch)."""
    return time.time_ns()


def now_ns() -> int:
    """The projected clock (ns since the epoch as the program would see it on hardware)."""
    return time.time_ns() + _offset


def offset_ns() -> int:
    """Projected minus wall clock, for converting a wall time: ``proj = wall + offset_ns()``."""
    return _offset


def advance(real_ns: int, simulated_ns: int) -> None:
    """Replace ``real_ns`` of time just spent simulating by ``simulated_ns`` on the projected clock."""
    global _offset
    with _lock:
        _offset += int(simulated_ns) - int(real_ns)
