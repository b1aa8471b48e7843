"""Attach on demand: ask a running process that uses this runtime to record the next few seconds into a profile,
without a restart (as dynolog asks Kineto in a running PyTorch job to trace a window).

The channel is two small files per process in :func:`traces.live.live_dir` (per user, so a process that is
not ours is never reachable):

- ``<pid>.capture.json``, the request ``{"id", "output_dir", "seconds"}``, written by the requester
  (``neuron-explorer attach``, ``neuron-top``'s capture key, a ``neuron-monitor`` trigger). The process's
  live-statistics thread claims it with one ``rename`` every 0.25 s, off the program's threads: being
  attachable costs the program nothing (bench/attach.py measures it).
- ``<pid>.attach.json``, the process's answer: ``recording`` (with ``until``), then ``done`` or ``refused``
  (with a one-line ``reason``), under the request's ``id``.

Bounded: one capture at a time per process (a second request is refused while one is pending or recording),
at most :data:`MAX_SECONDS`.

>>> import tempfile, os
>>> try:
...     request(os.getpid(), "/tmp/out", 5, directory=tempfile.mkdtemp())
... except AttachError as e:
...     print(str(e).split(" (")[0].replace(str(os.getpid()), "PID"))
process PID does not use the neuron_stack runtime
"""
from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from traces.errors import TraceError
from traces.live import _write_atomic, live_dir, read_all
from traces.pids import alive

__all__ = ["AttachError", "request", "claim", "set_state", "state", "wait", "MAX_SECONDS"]

#: The longest window one attach records (a profile of a busy process grows by megabytes a second).
MAX_SECONDS = 600.0
#: A request not claimed within this long is stale (the process is stopped, or is not polling).
CLAIM_TIMEOUT_S = 5.0
_REQUEST = ".capture.json"
_STATE = ".attach.json"


class AttachError(TraceError):
    """An attach that cannot be made or did not complete; the message names the problem and the fix."""


def _dir(directory) -> Path:
    return Path(directory) if directory is not None else live_dir()


def request(pid: int, output_dir: str | os.PathLike, seconds: float, directory=None, by: str = "") -> str:
    """Ask process ``pid`` to record ``seconds`` into ``output_dir``; return the request id. Refused (one
    line, :class:`AttachError`) for a bad duration, a process that is not running, one that does not use
    this runtime (or is another user's: the live directory is per user) and one that is already capturing.
    ``by`` names the requester (a monitor trigger), echoed in the process's answer.
    Example: ``rid = request(4242, "output/attach", 10)``, then ``wait(4242, rid)``."""
    seconds = float(seconds)
    if not 0 < seconds <= MAX_SECONDS:
        raise AttachError(f"--duration {seconds:g} is out of range: give 0 < seconds <= {MAX_SECONDS:g}")
    d = _dir(directory)
    pid = int(pid)
    if pid <= 0 or not alive(pid, None):
        raise AttachError(f"process {pid} is not running: pick a pid from neuron-top or neuron-ls -a")
    if not any(s.get("pid") == pid for s in read_all(d)):
        raise AttachError(f"process {pid} does not use the neuron_stack runtime (no live statistics in {d}); "
                          "attach works on a process once it has loaded a model")
    busy = _busy(pid, d)
    if busy:
        raise AttachError(f"process {pid} is already capturing ({busy}): one capture at a time per process; "
                          "wait for it to end")
    rid = uuid.uuid4().hex[:12]
    _write_atomic(d / f"{pid}{_REQUEST}", {"id": rid, "output_dir": str(Path(output_dir).absolute()),
                                           "seconds": seconds, "by": str(by)[:200], "requested": time.time()})
    return rid


def _busy(pid: int, d: Path) -> str:
    """Why ``pid`` cannot take a new request now ("" when it can)."""
    try:
        age = time.time() - (d / f"{pid}{_REQUEST}").stat().st_mtime
        if age < CLAIM_TIMEOUT_S:
            return "a request is waiting to be picked up"
    except OSError:
        pass
    st = state(pid, d)
    if st and st.get("state") == "recording" and st.get("until", 0) + CLAIM_TIMEOUT_S > time.time():
        return f"recording into {st.get('output_dir')} until {time.strftime('%H:%M:%S', time.localtime(st['until']))}"
    return ""


def claim(pid: int, directory=None) -> dict | None:
    """The process's side: the pending request for ``pid``, consumed exactly once (an atomic rename), or None.
    Seconds are clamped to :data:`MAX_SECONDS` whoever wrote the file."""
    path = _dir(directory) / f"{pid}{_REQUEST}"
    claimed = path.with_name(f".{path.name}.claimed")
    try:
        os.replace(path, claimed)
    except OSError:   # no request (the usual case: one failed rename, no read)
        return None
    try:
        with open(claimed, "rb") as f:
            req = json.loads(f.read(4096))   # bounded: the file is anyone-of-ours-writable
        seconds = min(max(float(req["seconds"]), 0.0), MAX_SECONDS)
        return {"id": str(req.get("id", ""))[:64], "output_dir": str(req["output_dir"]), "seconds": seconds,
                "by": str(req.get("by", ""))[:200]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        try:
            os.unlink(claimed)
        except OSError:
            pass


def set_state(pid: int, rid: str, state_name: str, directory=None, **fields) -> None:
    """The process's side: publish its answer to request ``rid`` (recording, done or refused)."""
    _write_atomic(_dir(directory) / f"{pid}{_STATE}", {"id": rid, "state": state_name, "wall": time.time(), **fields})


def state(pid: int, directory=None) -> dict | None:
    """The last answer of process ``pid`` (``{"id", "state", "output_dir", ...}``), or None.

    >>> import tempfile
    >>> d = tempfile.mkdtemp(); set_state(7, "r1", "done", d, output_dir="/x"); state(7, d)["state"]
    'done'
    """
    try:
        with open(_dir(directory) / f"{int(pid)}{_STATE}", "rb") as f:
            st = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    return st if isinstance(st, dict) else None


def wait(pid: int, rid: str, seconds: float, directory=None, poll_s: float = 0.1) -> dict:
    """Wait for process ``pid`` to finish request ``rid`` (``seconds`` is the requested window) and return its
    final answer; raises :class:`AttachError` if it was refused, never picked up, or the process exited."""
    d = _dir(directory)
    start = time.monotonic()
    deadline = None
    while True:
        st = state(pid, d)
        if st and st.get("id") == rid:
            if st["state"] == "refused":
                raise AttachError(f"process {pid} refused the attach: {st.get('reason', 'no reason given')}")
            if st["state"] == "done":
                return st
            deadline = deadline or time.monotonic() + seconds + 30.0   # + flushing the window
        elif time.monotonic() - start > CLAIM_TIMEOUT_S:
            try:
                os.unlink(d / f"{pid}{_REQUEST}")
            except OSError:
                pass
            raise AttachError(f"process {pid} did not pick up the attach request within {CLAIM_TIMEOUT_S:g}s "
                              "(stopped, or its runtime closed): check it runs, then attach again")
        if not alive(pid, None):
            raise AttachError(f"process {pid} exited during the attach; what it recorded is in the output directory")
        if deadline is not None and time.monotonic() > deadline:
            raise AttachError(f"process {pid} did not finish its capture in time; what it recorded is in the "
                              "output directory")
        time.sleep(poll_s)
