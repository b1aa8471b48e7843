"""The per-process runtime session: core lease, device memory per core, the live-statistics
publisher (read by ``neuron-monitor``) and the trace recorder (profiling on, or a timed capture
asked for by ``neuron-top``). One session per target per process: ``Session.get("trn1")``.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import uuid as uuidlib
import weakref

from neuron_stack.device import clock
from neuron_stack.device.profiles import get_profile
from neuron_stack.runtime import attach
from neuron_stack.runtime.cores import acquire
from neuron_stack.runtime.recorder import Recorder, record_load
from traces.live import LivePublisher

#: Device memory categories, as the real runtime reports them (neuron-monitor's memory_used).
MEMORY_CATEGORIES = ("constants", "model_code", "tensors", "runtime_memory", "model_shared_scratchpad", "kv_cache")


#: Seconds a SIGTERM waits for the recorders to flush before the process dies of the signal.
SIGTERM_FLUSH_S = 5.0


class Session:
    """Process-wide runtime state: core lease, device memory per core, live publisher, recorder."""

    _instances: dict[str, "Session"] = {}    # one per target (a process may load trn1 and inf2 NEFFs)
    #: Called with the session on every load and execution: ``neuron_stack.profiling`` starts its
    #: torch.profiler captures through them (``begin_recording``), so the runtime never imports the API.
    capture_hooks: list = []
    _lock = threading.Lock()

    @classmethod
    def get(cls, target: str) -> "Session":
        with cls._lock:
            s = cls._instances.get(target)
            if s is None or s.closed:
                s = cls._instances[target] = Session(target)
            return s

    def __init__(self, target: str):
        self.target = target
        self.profile = get_profile(target)
        self.run_id = uuidlib.uuid4().hex
        self.closed = False
        self.lease = acquire(self.profile)
        # the process's one identity (traces.identity): NEURON_STACK_INSTANCE_TYPE, else the target's instance
        self.instance = self.lease.instance
        self.cores = list(self.lease.cores)
        self._next_core = 0
        self.device_memory: dict[int, dict[str, int]] = {c: dict.fromkeys(MEMORY_CATEGORIES, 0) for c in self.cores}
        self.host_constants = 0
        p = self.profile
        self.live = LivePublisher(
            tag=os.environ.get("NEURON_PROCESS_TAG") or None, target=target,
            instance_type=self.instance.instance_type, command=" ".join([os.path.basename(sys.executable)] + sys.argv),
            hardware=self.instance.hardware_info(), peak_flops=p.tensor_peak_flops("bfloat16"),
            projected_clock=clock.settled_ns)
        # attach on demand (traces.attach): the live thread looks for a request every 0.25 s, off the program
        self.live.poll_hook = lambda: attach.poll(Session._instances.values())
        self.live.cores = list(self.cores)
        self.models: weakref.WeakSet = weakref.WeakSet()   # LoadedModels loaded here, described to a capture
        # Guards `recorder`: a capture's timer may close it while an execution is being recorded.
        self.record_lock = threading.Lock()
        self._capture_timer: threading.Timer | None = None
        self.recorder = Recorder.from_env(self)
        atexit.register(self.close)
        _flush_on_sigterm()

    def core_index(self, core: int) -> int | None:
        """This process's own index of machine core ``core`` (what ``neuron:i``, ``capture_enabled_for_nc`` and
        ``NEURON_RT_INSPECT_EVENT_FILTER_NC`` count in, as the real runtime's NeuronCore indices are relative to
        the cores the process sees), or None if the process does not hold it. Example: with core 0 held by
        another process, ``Session.get("trn1").core_index(1) == 0``."""
        return self.cores.index(core) if core in self.cores else None

    def next_core(self) -> int:
        """Round-robin placement of loaded models over this process's cores, as the real runtime does."""
        core = self.cores[self._next_core % len(self.cores)]
        self._next_core += 1
        return core

    def poll_capture(self) -> None:
        """On every load and execution: join a torch.profiler window (``capture_hooks``); while an attach is
        open (:mod:`neuron_stack.runtime.attach`), start or stop its framework events on this thread. When
        nobody is attached this reads one module flag."""
        for hook in Session.capture_hooks:
            hook(self)
        if attach.busy:
            with clock.excluded():   # the profile's bookkeeping is not the program's time
                attach.on_program_thread()

    def begin_recording(self, rec: "Recorder") -> bool:
        """Make ``rec`` this session's recorder until :meth:`stop_capture` (models already loaded are
        described first); False when a recording is already running."""
        with clock.excluded(), self.record_lock:
            if self.recorder is not None or self.closed:
                return False
            for m in list(self.models):
                record_load(rec, m, history=False)
            self.recorder = rec
        return True

    def start_capture(self, output_dir: str, seconds: float) -> bool:
        """Record everything into ``output_dir`` for ``seconds``, then stop and flush by itself
        (a timer, so an idle workload finishes its capture too). Models already loaded are
        described first (sources, graphs, ops, fallbacks, memory), so the capture stands alone.
        Returns False when this process is already recording. Example:
        ``Session.get("trn1").start_capture("/tmp/cap", 5)``, then ``traces.finalize("/tmp/cap")``.
        """
        with clock.excluded(), self.record_lock:   # describing the loaded models is not the program's time
            if self.recorder is not None or self.closed:
                return False
            try:
                rec = Recorder(self, output_dir)
                for m in list(self.models):
                    record_load(rec, m, history=False)
            except Exception as exc:  # a bad capture directory must not break the workload
                print(f"neuron_stack: warning: capture into {output_dir} failed ({exc}); the workload "
                      "continues without recording", file=sys.stderr)
                return False
            self.recorder = rec
            self._capture_timer = threading.Timer(float(seconds), clock.background(self.stop_capture), args=(rec,))
            self._capture_timer.daemon = True
            self._capture_timer.start()
        return True

    def stop_capture(self, rec: "Recorder") -> None:
        """End the recording ``rec`` (if still running): flush and close its segments. Called by the program
        (torch.profiler's window), that time is the simulator's, off the projected clock; by the capture's
        timer, the program runs on meanwhile."""
        timer = threading.current_thread() is self._capture_timer
        with contextlib.nullcontext() if timer else clock.excluded(), self.record_lock:
            if self.recorder is not rec:
                return
            self.recorder = None
            rec.close()

    def close(self, wait: float = -1) -> None:
        """Flush and close the recorder, stop publishing, release the cores. ``wait``: seconds to wait
        for an execution being recorded (-1: as long as it takes); past it nothing is flushed."""
        if not self.record_lock.acquire(timeout=wait):
            return
        try:
            if self.closed:
                return
            self.closed = True
            if self._capture_timer is not None:
                self._capture_timer.cancel()
            if self.recorder is not None:
                self.recorder.close()
                self.recorder = None
        finally:
            self.record_lock.release()
        self.lease.release()   # before the publisher, whose lock a SIGTERM may have interrupted
        self.live.close()


def _on_sigterm(signum, frame) -> None:
    """SIGTERM (torchrun tearing a job down after a rank died, ``kill``): flush what was recorded, as
    ``atexit`` would on a normal exit, then die of the signal as before (:func:`_end`)."""
    _end(signum)
    while True:          # the watcher thread took it first: it ends the process in a moment
        time.sleep(1)


_ending = threading.Lock()


def _end(signum: int) -> None:
    """Flush, bounded, then die of ``signum``; from the main thread's handler or the watcher, once.

    The flush runs on a thread, bounded: the interrupted frame may hold any of the runtime's locks (an
    execution being recorded, the live publisher's counters), and waiting for one from the handler
    would wait forever. Whatever is not done in a few seconds is left, and the process dies anyway."""
    if not _ending.acquire(blocking=False):
        return
    flush = threading.Thread(target=_close_sessions, name="neuron_stack-sigterm", daemon=True)
    flush.start()
    flush.join(timeout=SIGTERM_FLUSH_S)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, signal.SIG_DFL)
    else:   # signal.signal is main-thread only; libc's signal() resets the disposition from any thread
        libc = ctypes.CDLL(None)
        libc.signal.argtypes, libc.signal.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
        libc.signal(signum, None)   # NULL is SIG_DFL
    os.kill(os.getpid(), signum)
    time.sleep(1)
    os._exit(128 + signum)   # not reached: the signal's default action ends the process


def _close_sessions() -> None:
    for s in list(Session._instances.values()):
        s.close(wait=1.0)


def _flush_on_sigterm() -> None:
    """Install :func:`_on_sigterm` once, from the main thread, and only over the default action: a
    handler of the user's (or the framework's) is never replaced.

    A Python handler runs only when the main thread runs Python: blocked in C++ (a gloo collective
    waiting for a rank that died, a TCPStore rendezvous) it would ignore torchrun's SIGTERM until the
    wait timed out, and torchrun SIGKILLs it after 30 s. So a watcher thread also reads Python's
    signal wakeup fd and ends the process itself (unless the fd is someone else's, an asyncio loop's:
    then the handler alone, as the loop's thread does not block in C++)."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    r, w = os.pipe()
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    if previous != -1:   # an event loop's: leave it in place
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
        return
    threading.Thread(target=_watch, args=(r,), name="neuron_stack-sigterm-watch", daemon=True).start()
    os.register_at_fork(after_in_child=_forget_wakeup)


def _watch(fd: int) -> None:
    """The watcher: each byte is a signal Python caught; SIGTERM ends the process from here, unless
    the program has put a handler of its own in place since (that one decides)."""
    while data := os.read(fd, 64):
        if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            _end(signal.SIGTERM)
            return


def _forget_wakeup() -> None:
    # A forked child (a DataLoader worker) has no watcher, and its signals must not reach the parent's.
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
