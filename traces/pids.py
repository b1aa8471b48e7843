"""Is a pid still the process that wrote a file? Pids get reused, so a reader compares the process's start time
with the one the writer recorded; the monitor asks this for every process every refresh, so it is kept cheap.

>>> import os
>>> alive(os.getpid(), process_start_time(os.getpid()))
True
"""
from __future__ import annotations

import os


def process_start_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch, psutil's), None if it is gone or hidden."""
    try:
        import psutil
        return psutil.Process(pid).create_time()
    except Exception:  # gone, or psutil cannot see it: the caller treats None as "unknown"
        return None


def start_ticks(pid: int) -> bytes | None:
    """The start time of ``pid`` in clock ticks since boot (/proc/<pid>/stat's 22nd field), None without /proc:
    one small read, where psutil's start time costs three (a monitor refresh checks every process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
        return stat[stat.rindex(b")") + 2:].split()[19]   # fields after the command name, which may hold spaces
    except (OSError, ValueError, IndexError):
        return None


_verified: dict[int, tuple[bytes, float]] = {}   # pid -> (its start ticks, the snapshot start time they matched)


def alive(pid: int, started: float | None) -> bool:
    """True while ``pid`` runs and is the same process that wrote the snapshot (pids get reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if started is None:
        return True
    ticks = start_ticks(pid)
    if ticks is not None and _verified.get(pid) == (ticks, started):
        return True   # the process whose start time matched before (another one would have other ticks)
    now_started = process_start_time(pid)
    same = now_started is None or abs(now_started - started) < 1.0
    if same and ticks is not None:
        if len(_verified) > 4096:
            _verified.clear()
        _verified[pid] = (ticks, started)
    return same
