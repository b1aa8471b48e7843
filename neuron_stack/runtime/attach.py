"""The process's side of attach on demand (:mod:`traces.attach`): a process started without profiling records
the next few seconds when ``neuron-explorer attach``, ``neuron-top`` or a ``neuron-monitor`` trigger asks.

Like Kineto's on-demand tracing (a daemon polls for a config, the profiler then runs in the job for a window),
split by who may do what:

- The live-statistics thread (:class:`traces.live.LivePublisher`, already running every 0.25 s) calls
  :func:`poll`: one failed ``rename`` when nobody asks, nothing on the program's threads. On a request it
  starts a timed capture in every runtime session of the process (device rows and the system profile, as
  :meth:`Session.start_capture`), and answers ``recording`` then ``done`` (or ``refused``, with the reason).
- torch.profiler records only on the thread that enables it, so framework events (ATen ops and
  ``record_function`` regions) start at the program's next load or execution (:func:`on_program_thread`,
  reached through one module flag, :data:`busy`) and stop at its first one past the window; they are written
  as the ``framework`` system events of the same profile.

A window whose program thread never comes back (the process went idle) ends without framework events after
:data:`GRACE_S`, and says so in its answer.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from traces import attach as channel

#: How long past its window a capture waits for the program's thread to stop framework events.
GRACE_S = 2.0
#: True while a window needs the program's thread (start or stop framework events); the hot path reads only this.
busy = False
_lock = threading.Lock()
_window: "_Window | None" = None


class _Window:
    def __init__(self, req: dict, recs: list):
        self.rid, self.out, self.seconds, self.by = req["id"], req["output_dir"], req["seconds"], req.get("by", "")
        self.until = time.time() + self.seconds
        self.recs = recs                    # (session, recorder) per runtime session of the process
        self.profiler = None                # torch.profiler on the program's thread
        self.thread = None
        self.framework = "the program ran nothing during the window"
        self.framework_done = False


def poll(sessions) -> None:
    """From the live-statistics thread: take a pending request, or finish the open window. ``sessions``: the
    process's runtime sessions."""
    global _window, _abandoned, busy
    with _lock:
        w = _window
        if w is None:
            req = channel.claim(os.getpid())
            if req is not None:
                _start(req, [s for s in list(sessions) if not s.closed])
            return
        if any(s.recorder is rec for s, rec in w.recs):
            return   # the sessions' timers end the device recording at `until`
        if not w.framework_done:
            if time.time() < w.until + GRACE_S:
                return
            w.framework = "the program did not run again after the window; no framework events"
            if w.profiler is not None:   # only its own thread can stop it: at its next load or execution
                _abandoned = (w.profiler, w.thread)
        _window = None
        busy = _abandoned is not None
        channel.set_state(os.getpid(), w.rid, "done", output_dir=w.out, seconds=w.seconds, framework=w.framework,
                          by=w.by)


def _start(req: dict, sessions: list) -> None:
    global _window, busy
    pid = os.getpid()
    try:
        Path(req["output_dir"]).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        channel.set_state(pid, req["id"], "refused", by=req.get("by", ""), output_dir=req["output_dir"],
                          reason=f"cannot write {req['output_dir']} ({exc.strerror or exc}): give a writable -o "
                          "directory")
        return
    recs = [(s, s.recorder) for s in sessions if s.start_capture(req["output_dir"], req["seconds"])]
    if not recs:
        channel.set_state(pid, req["id"], "refused", by=req.get("by", ""), output_dir=req["output_dir"],
                          reason="it is already recording (NEURON_RT_INSPECT_ENABLE=1, a torch.profiler window or "
                          "another capture): open that profile instead")
        return
    _window = _Window(req, recs)
    busy = True
    channel.set_state(pid, req["id"], "recording", output_dir=req["output_dir"], until=_window.until,
                      seconds=req["seconds"], by=_window.by)


_abandoned = None   # (profiler, thread) of a window that ended while its program thread was away


def on_program_thread() -> None:
    """From a load or execution on the program's thread while :data:`busy`: start framework events for the open
    window, stop them once it is over and write them into its profile, or drop an abandoned window's."""
    global _abandoned, busy
    me = threading.current_thread()
    with _lock:
        w, old = _window, _abandoned
        if old is not None and old[1] is me:
            _abandoned = None
        busy = w is not None or _abandoned is not None
    if old is not None and old[1] is me:
        _stop(old[0])
    if w is None or w.framework_done:
        return
    if w.profiler is None:
        _begin(w)
    elif w.thread is me and time.time() >= w.until:
        _finish(w)


def _begin(w: _Window) -> None:
    import torch

    if time.time() >= w.until:
        w.framework_done = True
    elif torch._C._autograd._profiler_enabled():   # the user's own torch.profiler: leave it alone
        w.framework, w.framework_done = "torch.profiler is already running in this process; none recorded", True
    else:
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU])
        prof.__enter__()
        w.profiler, w.thread = prof, threading.current_thread()


def _stop(prof) -> None:
    try:
        prof.__exit__(None, None, None)
    except Exception:   # never take the program down for its profile
        pass


def _finish(w: _Window) -> None:
    from neuron_stack.runtime import host_frames

    try:
        w.profiler.__exit__(None, None, None)
        acts, dropped = host_frames.user_events(w.profiler.profiler.kineto_results.trace_activities())
        run = {k: v for k, v in w.recs[0][1].writer.run.items() if k not in ("status", "wall_end_ns", "end_ns")}
        n = host_frames.write_framework_events(acts, Path(w.out), run, dropped)
        w.framework = f"{n} framework events"
    except Exception as exc:   # never take the program down for its profile
        print(f"neuron_stack: warning: attach could not record framework events ({exc})", file=sys.stderr)
        w.framework = f"framework events failed ({exc})"
    finally:
        w.framework_done = True
