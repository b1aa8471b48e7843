"""Live per-process statistics: the runtime publishes, ``neuron-monitor`` and ``neuron-top`` read.

Each process using the runtime owns one small JSON snapshot ``<pid>-<n>.json`` in :func:`live_dir`.
It holds cumulative counters (executions by status, errors by type, per-core busy time per engine on
the projected clock, device time, flops), memory by category, loaded models, event counters, and
the (wall, projected-clock) pair of the last execution. Next to it, ``<pid>-<n>.ring`` is a
memory-mapped ring of the last executions (so a reader can compute latency percentiles for exactly
its own period) that ``record_execution`` fills without a system call. Nothing locks across processes:
the file is replaced atomically (temp file + ``os.replace``), readers just read whatever is there.

>>> import tempfile, time
>>> d = tempfile.mkdtemp()
>>> pub = LivePublisher(tag="demo", target="trn1", instance_type="trn1.32xlarge", directory=d)
>>> pub.record_execution(core=0, wall_end=time.time(), proj_end_ns=time.time_ns(), total_latency_s=0.002,
...                      device_latency_s=0.0015, busy_ns={"tensor": 1_000_000}, flops=10**9)
>>> pub.flush()
>>> [s["tag"] for s in read_all(d)]
['demo']
>>> pub.close(); read_all(d)
[]
"""
from __future__ import annotations

import atexit
import json
import logging
import mmap
import os
import re
import struct
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np

from traces.pids import alive, process_start_time

__all__ = ["LivePublisher", "read_all", "read_ring", "live_dir", "read_device_info",
           "EXECUTION_STATUSES", "ERROR_TYPES", "DEVICE_MEMORY", "HOST_MEMORY", "EVENT_KINDS"]

SNAPSHOT_VERSION = 1
FLUSH_INTERVAL_S = 0.25          # at most four small writes a second per process
# Any recorded change is on disk within this long (hot-path flush or the backstop thread).
PUBLISH_DELAY_MAX_S = 2 * FLUSH_INTERVAL_S + 0.1
RING_SIZE = 4096                 # executions kept for per-period latency percentiles
MAX_TAG_CHARS = 255              # a process tag's length, as the real runtime's

# The real neuron-monitor's keys (reference §1.4); counters always carry all of them.
EXECUTION_STATUSES = ("completed", "completed_with_err", "completed_with_num_err", "timed_out",
                      "incorrect_input", "failed_to_queue")
ERROR_TYPES = ("generic", "numerical", "transient", "model", "runtime", "hardware")
DEVICE_MEMORY = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors", "kv_cache")
HOST_MEMORY = ("application_memory", "constants", "dma_buffers", "tensors")
#: Device memory that belongs to a NeuronCore, not to any model on it: the runtime reserves it once per
#: core (queues, semaphores, DMA rings), however many models it loads. A model's own breakdown shows it
#: as 0, so that a core's total is the sum of its parts in every tool (counting it per model made one
#: process show 64.5 MB in total and 320.5 MB in its tree, as in the real SDK's issue #744).
CORE_ONLY_MEMORY = ("runtime_memory",)
EVENT_KINDS = ("compile", "recompile", "cpu_fallback", "cache_hit")

_STATUS_CODE = {s: i for i, s in enumerate(EXECUTION_STATUSES)}
_STATUS_NAMES = np.array(EXECUTION_STATUSES, dtype=object)
# The execution ring is a memory-mapped file next to the snapshot: record_execution writes one
# 32-byte slot (slot = seq % RING_SIZE) with no system call; readers map the same bytes.
_RING_ENTRY = struct.Struct("<qdffib3x")  # seq, wall end (s), total and device latency (s), core, status
_RING_DTYPE = np.dtype({"names": ["seq", "wall_end", "total_latency", "device_latency", "core", "status"],
                        "formats": ["<i8", "<f8", "<f4", "<f4", "<i4", "i1"],
                        "offsets": [0, 8, 16, 20, 24, 28], "itemsize": _RING_ENTRY.size})
_RING_SUFFIX = ".ring"
_publishers: "weakref.WeakSet[LivePublisher]" = weakref.WeakSet()
_SNAPSHOT_RE = re.compile(r"^(\d+)-(\d+)\.(json|ring)$")
_TMP_RE = re.compile(r"^\..+\.(\d+)\.\d+\.tmp$")  # _write_atomic's temp names: .<name>.<pid>.<thread>.tmp
_DEVICES = "devices"   # one description per simulated instance type, never "the last workload's"
_INSTANCE_TYPE_RE = re.compile(r"^[a-z0-9]+(\.[a-z0-9]+)?$")
_counter = iter(range(1 << 30))  # per-process publisher number, so two publishers never share a file


def _forget_parent_publishers() -> None:
    # A forked child (a DataLoader worker, say) must not write into its parent's shared ring.
    for pub in list(_publishers):
        pub._ring = None


os.register_at_fork(after_in_child=_forget_parent_publishers)


def live_dir() -> Path:
    """Where snapshots live: ``$NEURON_STACK_LIVE_DIR``, else ``/dev/shm/neuron_stack-<uid>/live``
    (memory: a rename on a busy disk can take milliseconds), else ``/tmp/neuron_stack-<uid>/live``.

    >>> live_dir().name
    'live'
    """
    env = os.environ.get("NEURON_STACK_LIVE_DIR")
    if env:
        return Path(env)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else Path("/tmp")
    return base / f"neuron_stack-{uid}" / "live"


def _write_atomic(path: Path, data: dict) -> None:
    # The temp name carries pid and thread so concurrent writers never share a temp file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    text = json.dumps(data, separators=(",", ":"))   # one C call; json.dump is a Python loop of writes
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class LivePublisher:
    """Publishes one process's live statistics for the monitor; every call is cheap and never blocks.

    ``record_*`` calls update in-memory counters and write the snapshot at most every 0.25 s; a
    daemon thread writes the last changes if the process goes quiet. ``close()`` (also at exit)
    removes the snapshot.

    >>> import tempfile
    >>> pub = LivePublisher(tag="job", target="trn1", directory=tempfile.mkdtemp())
    >>> pub.count_error("numerical"); pub.cores = [0]; pub.flush()
    >>> read_all(pub.directory)[0]["errors"]["numerical"]
    1
    >>> pub.close()
    """

    def __init__(self, tag: str | None = None, target: str = "", instance_type: str = "",
                 command: str | None = None, *, hardware: dict | None = None,
                 directory: str | os.PathLike | None = None, peak_flops: float = 0.0,
                 projected_clock=None):
        self.pid = os.getpid()
        # the runtime's projected clock (ns), read as each snapshot is written: a reader then knows the
        # clock exactly at the write instead of guessing from the wall time since the last execution
        self._projected_clock = projected_clock
        self.tag = str(tag) if tag else os.environ.get("NEURON_PROCESS_TAG") or str(self.pid)
        if len(self.tag) > MAX_TAG_CHARS:   # the real runtime's limit; said once, never silently
            logging.getLogger("traces").warning(
                "NEURON_PROCESS_TAG is %d characters: neuron-monitor, neuron-top and profiles use its first %d "
                "(the runtime's limit); give a shorter tag", len(self.tag), MAX_TAG_CHARS)
            self.tag = self.tag[:MAX_TAG_CHARS]
        self.target = target
        self.instance_type = instance_type
        self.peak_flops = float(peak_flops)   # the target's Tensor Engine BF16 peak, for its MFU
        self.command = command if command is not None else " ".join(sys.argv)
        self.hardware = dict(hardware or {})
        self.directory = Path(directory) if directory is not None else live_dir()
        self.path = self.directory / f"{self.pid}-{next(_counter)}.json"
        self.start_time = time.time()
        self.process_start_time = process_start_time(self.pid)
        self._cores: list[int] = []
        # guards the counters; held for microseconds. Re-entrant: a garbage collection while it is held can run a
        # finalizer that counts on the same thread (a freed eager device tensor's set_device_memory)
        self._lock = threading.RLock()
        self._io_lock = threading.Lock()   # one writer at a time, and no write after close()
        self._seq = 0
        self._executions = dict.fromkeys(EXECUTION_STATUSES, 0)
        self._errors = dict.fromkeys(ERROR_TYPES, 0)
        self._core_stats: dict[int, dict] = {}
        self.ring_path = self.path.with_suffix(_RING_SUFFIX)
        self._ring = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.ring_path, "w+b") as f:
                # Allocate the pages now: a sparse ring on a full tmpfs would SIGBUS at its first write.
                os.posix_fallocate(f.fileno(), 0, RING_SIZE * _RING_ENTRY.size)
                self._ring = mmap.mmap(f.fileno(), RING_SIZE * _RING_ENTRY.size)
        except OSError as exc:  # live statistics are optional: a read-only or full directory must not stop the workload
            logging.getLogger("traces").warning(
                "neuron-monitor will not see this process: cannot write live statistics into %s (%s); "
                "set NEURON_STACK_LIVE_DIR to a writable directory", self.directory, exc.strerror or exc)
        self._pack_into = _RING_ENTRY.pack_into
        _publishers.add(self)
        self._device_memory: dict[int, dict[str, int]] = {}
        self._host_memory = dict.fromkeys(HOST_MEMORY, 0)
        self._models: dict[int, dict] = {}
        self._events = {k: {"count": 0, "last_reason": "", "last_source": "", "last_op": ""} for k in EVENT_KINDS}
        self._serving: dict | None = None     # an LLM serving engine's figures (neuron_stack.inference)
        # The projected clock starts at the wall clock; then (wall, projected) at each execution's end.
        self._last_wall = self.start_time
        self._last_proj_ns = int(self.start_time * 1e9)
        self._in_flight: int | None = None       # see execution_started
        self._published_in_flight = False
        self._last_flush = 0.0
        #: Called by the background thread every FLUSH_INTERVAL_S (the runtime's attach poll, traces.attach).
        self.poll_hook = None
        self._dirty = True
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.hardware:
            self._publish_device_info()
        atexit.register(self.close)
        try:
            self.flush()
        except OSError:  # already reported above, or a full disk: the background thread retries
            pass

    @property
    def cores(self) -> list[int]:
        """The NeuronCores this process holds (assign a list; published with the next flush)."""
        return list(self._cores)

    @cores.setter
    def cores(self, value) -> None:
        with self._lock:
            self._cores = sorted(int(c) for c in value)
            self._dirty = True
        self._maybe_flush()

    # -- recording (hot path) ------------------------------------------------------------------
    def record_execution(self, core: int, wall_end: float, proj_end_ns: int, total_latency_s: float,
                         device_latency_s: float, busy_ns: dict | None = None, flops: float = 0,
                         status: str = "completed", start_ns: int | None = None) -> None:
        """Count one NEFF execution on ``core`` (busy time per engine in ns on the projected clock).

        Its device interval is ``[start_ns, start_ns + device latency)`` (``start_ns`` defaults to
        ``proj_end_ns`` minus the total latency); the core's ``active_ns`` grows by the part of it past
        the core's earlier intervals, so executions that overlap on one core (a collective beside the
        next compute execution, recorded in start order) count once, as the profile's
        :func:`traces.q_figures.core_busy` counts them.

        >>> import tempfile, time
        >>> pub = LivePublisher(tag="x", directory=tempfile.mkdtemp())
        >>> pub.record_execution(0, time.time(), time.time_ns(), 0.01, 0.008, {"tensor": 5_000_000}, 1e9)
        >>> pub.close()
        """
        if status not in self._executions:
            raise ValueError(f"unknown execution status {status!r}: use one of {', '.join(EXECUTION_STATUSES)}")
        with self._lock:
            self._seq += 1
            self._executions[status] += 1
            st = self._core_stats.get(core)
            if st is None:
                st = self._core_stats[core] = {"busy_ns": {}, "device_ns": 0, "active_ns": 0, "until": 0,
                                               "flops": 0, "executions": 0}
            busy = st["busy_ns"]
            for engine, ns in (busy_ns or {}).items():
                busy[engine] = busy.get(engine, 0) + int(ns)
            dev = round(device_latency_s * 1e9)   # the ns the runtime had (int() could cut one off)
            start = int(start_ns) if start_ns is not None else int(proj_end_ns) - int(round(total_latency_s * 1e9))
            st["active_ns"] += max(0, start + dev - max(start, st["until"]))
            st["until"] = max(st["until"], start + dev)
            st["device_ns"] += dev
            st["flops"] += int(flops)
            st["executions"] += 1
            if self._ring is not None:
                self._pack_into(self._ring, (self._seq % RING_SIZE) * 32, self._seq, wall_end,
                                total_latency_s, device_latency_s, core, _STATUS_CODE[status])
            self._last_wall = wall_end
            self._last_proj_ns = int(proj_end_ns)
            self._in_flight = None
            self._dirty = True
        self._maybe_flush()

    def execution_started(self, proj_ns: int) -> None:
        """An execution starts being simulated at projected time ``proj_ns``: until its :meth:`record_execution`
        snapshots hold the projected clock there (the clock read meanwhile runs ahead by the simulation's wall
        time, which the execution's end takes back: DESIGN §3.4), published within a flush interval."""
        self._in_flight = int(proj_ns)

    def count_error(self, kind: str) -> None:
        """Count one error of ``kind`` (an ``error_summary`` key: generic, numerical, transient, ...)."""
        if kind not in self._errors:
            raise ValueError(f"unknown error type {kind!r}: use one of {', '.join(ERROR_TYPES)}")
        with self._lock:
            self._errors[kind] += 1
            self._dirty = True
        self._maybe_flush()

    def set_device_memory(self, core: int, category: str, nbytes: int) -> None:
        """Set the device memory ``core`` uses for ``category`` (constants, model_code, tensors, ...)."""
        if category not in DEVICE_MEMORY:
            raise ValueError(f"unknown device memory category {category!r}: use one of {', '.join(DEVICE_MEMORY)}")
        with self._lock:
            used = self._device_memory.get(core)
            if used is None:
                used = self._device_memory[core] = dict.fromkeys(DEVICE_MEMORY, 0)
            used[category] = int(nbytes)
            self._dirty = True
        self._maybe_flush()

    def set_serving(self, figures: dict) -> None:
        """Publish an LLM serving engine's figures (tokens_per_s, num_requests_running/waiting,
        kv_cache_usage_perc, kv_cache_bytes, ...): docs/monitor.md "serving"."""
        with self._lock:
            self._serving = dict(figures)
            self._dirty = True
        self._maybe_flush()

    def set_host_memory(self, category: str, nbytes: int) -> None:
        """Set the host memory the runtime uses for ``category`` (application_memory, dma_buffers, ...)."""
        if category not in HOST_MEMORY:
            raise ValueError(f"unknown host memory category {category!r}: use one of {', '.join(HOST_MEMORY)}")
        with self._lock:
            self._host_memory[category] = int(nbytes)
            self._dirty = True
        self._maybe_flush()

    def model_loaded(self, name: str, uuid: str, model_id: int, core: int,
                     device_bytes: dict | None = None, host_bytes: dict | None = None,
                     device_index: int | None = None) -> None:
        """Record a model (NEFF) loaded on ``core``, with its memory per category."""
        dev = dict.fromkeys(("constants", "model_code", "runtime_memory", "tensors"), 0)
        dev.update({k: 0 if k in CORE_ONLY_MEMORY else int(v) for k, v in (device_bytes or {}).items()})
        host = dict.fromkeys(HOST_MEMORY, 0)
        host.update({k: int(v) for k, v in (host_bytes or {}).items()})
        per_dev = int(self.hardware.get("neuroncore_per_device_count") or 1)
        with self._lock:
            self._models[int(model_id)] = {
                "name": name, "uuid": uuid, "model_id": int(model_id), "is_running": False,
                "core": int(core), "device_index": int(core) // per_dev if device_index is None else device_index,
                "device_bytes": dev, "host_bytes": host}
            self._dirty = True
        self._maybe_flush()

    def model_unloaded(self, model_id: int) -> None:
        """Forget a model that was unloaded."""
        with self._lock:
            self._models.pop(int(model_id), None)
            self._dirty = True
        self._maybe_flush()

    def model_running(self, model_id: int, running: bool) -> None:
        """Mark a loaded model as running (an execution in flight) or idle."""
        with self._lock:
            if int(model_id) in self._models:
                self._models[int(model_id)]["is_running"] = bool(running)
                self._dirty = True
        self._maybe_flush()

    def count_event(self, kind: str, reason: str = "", source: str = "", op: str = "") -> None:
        """Count a compile, recompile, cpu_fallback or cache_hit, keeping the last reason/source/op."""
        if kind not in self._events:
            raise ValueError(f"unknown event kind {kind!r}: use one of {', '.join(EVENT_KINDS)}")
        with self._lock:
            ev = self._events[kind]
            ev["count"] += 1
            if reason:
                ev["last_reason"] = str(reason)
            if source:
                ev["last_source"] = str(source)
            if op:
                ev["last_op"] = str(op)
            self._dirty = True
        self._maybe_flush()

    # -- publishing ------------------------------------------------------------------------------
    def _maybe_flush(self) -> None:
        # The hot path never writes: a daemon thread publishes the changes every FLUSH_INTERVAL_S.
        if self._thread is None and not self._closed:
            with self._io_lock:
                if self._thread is None and not self._closed:
                    self._thread = threading.Thread(target=self._flusher, name="neuron-live", daemon=True)
                    self._thread.start()

    def _flusher(self) -> None:
        while not self._stop.wait(FLUSH_INTERVAL_S):
            sys.setprofile(None)   # a profiler tracing Python (torch.profiler with_stack) leaves this thread alone
            changed = self._dirty or (self._in_flight is not None) != self._published_in_flight
            if changed and time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
                try:
                    self.flush()
                except Exception:  # a full disk must never take the workload down
                    pass
            hook = self.poll_hook
            if hook is not None and os.getpid() == self.pid:
                try:
                    hook()
                except Exception as exc:  # an attach must never take the workload down
                    logging.getLogger("traces").warning("attach: %s", exc)

    def snapshot(self) -> dict:
        """The snapshot as written to disk (a plain dict; see docs/monitor.md for the fields)."""
        with self._lock:
            now = time.time()
            snap = {
                "version": SNAPSHOT_VERSION, "pid": self.pid, "tag": self.tag, "command": self.command,
                "target": self.target, "instance_type": self.instance_type, "hardware": dict(self.hardware),
                "peak_flops": self.peak_flops,
                "start_time": self.start_time, "process_start_time": self.process_start_time,
                # "wall" is when this was written; (proj_wall, proj_ns) the last execution's end on
                # both clocks. The reader extrapolates idle time itself (monitor/collect.py).
                "wall": now, "proj_wall": self._last_wall, "proj_ns": self._last_proj_ns, "seq": self._seq,
                "proj_now_ns": (self._in_flight if self._in_flight is not None else int(self._projected_clock()))
                if self._projected_clock is not None else None, "proj_stands": self._in_flight is not None,
                "cores": list(self._cores),
                "executions": dict(self._executions), "errors": dict(self._errors),
                "core_stats": {str(c): {"busy_ns": dict(s["busy_ns"]), "device_ns": s["device_ns"],
                                        "active_ns": s["active_ns"], "flops": s["flops"],
                                        "executions": s["executions"]}
                               for c, s in self._core_stats.items()},
                "device_memory": {str(c): dict(m) for c, m in self._device_memory.items()},
                "host_memory": dict(self._host_memory),
                "models": [dict(m, device_bytes=dict(m["device_bytes"]), host_bytes=dict(m["host_bytes"]))
                           for m in self._models.values()],
                "events": {k: dict(v) for k, v in self._events.items()},
                "serving": dict(self._serving) if self._serving else None,
                "ring_file": self.ring_path.name, "ring_size": RING_SIZE,
            }
            self._dirty = False
            self._published_in_flight = snap["proj_stands"]
        return snap

    def flush(self) -> None:
        """Write the snapshot now (atomically). A forked child never writes its parent's file."""
        if os.getpid() != self.pid:
            return
        with self._io_lock:
            if self._closed:
                return
            self._last_flush = time.monotonic()
            snap = self.snapshot()
            try:
                _write_atomic(self.path, snap)
            except FileNotFoundError:  # someone removed the directory: recreate it once
                self.directory.mkdir(parents=True, exist_ok=True)
                _write_atomic(self.path, snap)

    def close(self) -> None:
        """Stop publishing and remove the snapshot (also run at interpreter exit)."""
        with self._io_lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        atexit.unregister(self.close)   # never raises, registered or not
        with self._lock:
            ring, self._ring = self._ring, None
        if os.getpid() == self.pid:
            for path in (self.path, self.ring_path):
                try:
                    os.unlink(path)
                except OSError:
                    pass
            if ring is not None:
                ring.close()

    def _publish_device_info(self) -> None:
        # The simulated "driver" description of this process's instance type: survives the process so the
        # monitor can describe that instance (neuron_hardware_info) when nothing runs. One file per instance
        # type: a workload of another target never changes what a tool reports (traces.identity).
        if not _INSTANCE_TYPE_RE.match(self.instance_type or ""):
            return
        info = {"target": self.target, "instance_type": self.instance_type, "hardware": self.hardware}
        try:
            (self.directory / _DEVICES).mkdir(exist_ok=True)
            _write_atomic(self.directory / _DEVICES / f"{self.instance_type}.json", info)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_all(directory: str | os.PathLike | None = None, ring: bool = True) -> list[dict]:
    """Snapshots of every live publishing process, oldest first; files of dead pids are removed.

    A file being replaced while it is read, or a half-written file from a killed process, is
    skipped (it will be complete at the next read). ``ring=False`` leaves each snapshot's execution
    ring unread: a reader that needs only its newest executions takes them with :func:`read_ring`.

    >>> import tempfile
    >>> read_all(tempfile.mkdtemp())
    []
    """
    d = Path(directory) if directory is not None else live_dir()
    try:
        names = os.listdir(d)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        m = _SNAPSHOT_RE.match(name)
        if not m:
            tmp = _TMP_RE.match(name)
            if tmp and not alive(int(tmp.group(1)), None):  # a writer killed mid-write
                _unlink_quietly(d / name)
            continue
        path = d / name
        pid = int(m.group(1))
        if m.group(3) == "ring":  # read with its snapshot; only orphans are handled here
            if not (d / f"{pid}-{m.group(2)}.json").exists() and not alive(pid, None):
                _unlink_quietly(path)
            continue
        try:
            with open(path) as f:
                snap = json.load(f)
        except (OSError, ValueError):
            snap = None
        if not isinstance(snap, dict) or snap.get("version") != SNAPSHOT_VERSION:
            if not alive(pid, None):
                _unlink_quietly(path)
            continue
        if not alive(pid, snap.get("process_start_time")):
            _unlink_quietly(path)
            _unlink_quietly(path.with_suffix(_RING_SUFFIX))
            continue
        snap["file"] = str(path)
        if ring:
            try:
                snap["ring"] = read_ring(snap)
            except (OSError, ValueError, KeyError, TypeError):
                continue
        out.append(snap)
    out.sort(key=lambda s: (s.get("start_time", 0), s.get("pid", 0), s.get("file", "")))
    return out


def read_ring(snap: dict, after: int = 0) -> dict[str, np.ndarray]:
    """The executions of snapshot ``snap`` (from :func:`read_all`) with a sequence number above ``after``, up to
    the snapshot's own count, oldest first, as numpy columns. Raises OSError or ValueError for a missing or
    foreign ring.

    Only their slots are read (``seq % ring_size``, at most two runs): a monitor refresh wants the
    last period's few hundred executions, not the whole ring, sixteen processes a second. Entries
    newer than the snapshot are left for the next read, so the ring and the snapshot's counters
    always describe the same executions.

    >>> import tempfile
    >>> pub = LivePublisher(tag="demo", directory=tempfile.mkdtemp())
    >>> for i in range(3): pub.record_execution(core=0, wall_end=1.0 + i, proj_end_ns=i, total_latency_s=0.001,
    ...                                         device_latency_s=0.001, busy_ns={}, flops=0)
    >>> pub.flush(); (snap,) = read_all(pub.directory, ring=False)
    >>> read_ring(snap, after=1)["seq"].tolist()
    [2, 3]
    >>> pub.close()
    """
    seq, size = int(snap["seq"]), int(snap["ring_size"])
    lo = max(0, seq - size, int(after))
    count, first = max(0, seq - lo), (lo + 1) % max(size, 1)
    fd = os.open(Path(snap["file"]).with_name(snap["ring_file"]), os.O_RDONLY)
    try:
        if os.fstat(fd).st_size != size * _RING_DTYPE.itemsize:
            raise ValueError("ring size mismatch")
        head = min(count, size - first)
        data = os.pread(fd, head * _RING_DTYPE.itemsize, first * _RING_DTYPE.itemsize)
        if count > head:   # the run wraps to the ring's start
            data += os.pread(fd, (count - head) * _RING_DTYPE.itemsize, 0)
    finally:
        os.close(fd)
    raw = np.frombuffer(data, dtype=_RING_DTYPE)
    # Slots hold consecutive sequence numbers, so the runs are in order; a slot another execution took
    # since the snapshot (or never written) drops out.
    entries = raw[(raw["seq"] > lo) & (raw["seq"] <= seq)]
    cols = {name: np.ascontiguousarray(entries[name]) for name in _RING_DTYPE.names}
    cols["status"] = _STATUS_NAMES[np.clip(cols["status"], 0, len(EXECUTION_STATUSES) - 1)]
    return cols


def read_device_info(instance_type: str, directory: str | os.PathLike | None = None) -> dict | None:
    """How a workload described simulated instance type ``instance_type`` (``{"target", "instance_type",
    "hardware"}``), or None if none has yet. Which instance to describe is :func:`traces.identity.machine`'s call.

    >>> import tempfile
    >>> read_device_info("trn1.32xlarge", tempfile.mkdtemp()) is None
    True
    """
    if not _INSTANCE_TYPE_RE.match(instance_type or ""):
        return None
    d = Path(directory) if directory is not None else live_dir()
    try:
        with open(d / _DEVICES / f"{instance_type}.json", "rb") as f:
            info = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("instance_type") == instance_type else None


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
