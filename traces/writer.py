"""The write path: buffer rows per table, publish them as segment files twice a second.

The runtime is the main user: it appends one ~100k-row instruction table per execution, so
``append`` only converts columns (zero-copy where the types already match) and queues the
table; the disk write happens on a background thread. A SIGKILLed process loses at most the
rows appended since the last flush (at most ``flush_interval`` = 0.5 s plus one flush, so under
a second); everything published before stays readable and finalises.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> w = Writer(d, run={"run_id": "demo", "tag": "doc"}, metadata={"target": "trn1"})
>>> w.append("events", {"ts_ns": [1, 2], "kind": "compile", "detail": "{}"})
>>> w.close()
>>> sorted(p.split(".")[0] for p in __import__("os").listdir(d))
['events', 'metadata', 'runs', 'runs']
"""
from __future__ import annotations

import atexit
import errno
import itertools
import logging
import os
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa

from traces.errors import TraceError
from traces.schema import SCHEMA_VERSION, TABLES
from traces.segments import segment_name, write_segment

log = logging.getLogger("traces")

_live: "weakref.WeakSet[Writer]" = weakref.WeakSet()
_seq = itertools.count()  # per process: segment names of all writers of this process stay unique


class Writer:
    """Append trace rows into ``out_dir``; many processes may write into one directory at once.

    ``run`` describes this process (``runs`` table; missing fields get defaults: a fresh
    ``run_id``, this pid, host, command line, clocks now). ``metadata`` (str -> str) is merged
    into the ``metadata`` table. ``on_segment(path)`` runs after each segment is published; an error
    there is a write error like the disk's (the rows stay buffered and the next flush retries). Example::

        w = Writer("output/session", run={"run_id": rid, "tag": "bert"}, metadata=profile.metadata())
        w.append("instructions", schedule_table, exec_id=eid, core=0, start_ns=t0 + rel_start)
        w.close(status="ok")
    """

    def __init__(self, out_dir: str | os.PathLike, run: Mapping | None = None,
                 metadata: Mapping[str, object] | None = None, flush_interval: float = 0.5,
                 on_segment: Callable[[Path], None] | None = None):
        self.out_dir = Path(out_dir)
        self.on_segment = on_segment   # called with each published segment (an upload to object storage)
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TraceError(f"cannot create trace directory {self.out_dir}: {exc.strerror}; "
                             "choose a writable NEURON_RT_INSPECT_OUTPUT_DIR") from None
        now = time.time_ns()
        self.run = {"run_id": uuid.uuid4().hex[:16], "pid": os.getpid(), "tag": str(os.getpid()),
                    "command": " ".join(sys.argv), "host": socket.gethostname(), "target": None,
                    "rank": 0, "node": 0, "wall_start_ns": now, "start_ns": now, "status": "running"}
        self.run.update({k: v for k, v in (run or {}).items() if v is not None})
        unknown = sorted(set(self.run) - set(TABLES["runs"].names))
        if unknown:
            raise TraceError(f"table 'runs' has no column {unknown[0]!r}: check the run= keys "
                             "(columns are in traces/schema.py)")
        self.run_id = str(self.run["run_id"])
        self._pid = os.getpid()
        self._pending: dict[str, list[pa.Table]] = {}
        self._lock = threading.Lock()         # guards _pending
        self._flush_lock = threading.Lock()   # one flush at a time (thread vs explicit calls)
        self._closed = False
        self._error: str | None = None
        self.flush_interval = flush_interval
        meta = {"schema_version": SCHEMA_VERSION, **{str(k): str(v) for k, v in (metadata or {}).items()}}
        if self.run.get("target") is None and "target" in meta:
            self.run["target"] = meta["target"]
        self.append("runs", {k: [v] for k, v in self.run.items()})
        self.append("metadata", {"key": list(meta), "value": list(meta.values())})
        self.flush()  # the run is visible at once, even if the process dies within the first second
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._flush_loop, name="traces-writer", daemon=True)
        self._thread.start()
        _live.add(self)

    # -- appending -----------------------------------------------------------------------------
    def append(self, table: str, rows=None, **columns) -> None:
        """Queue ``rows`` for ``table``; the next flush publishes them.

        ``rows`` is a ``pa.Table``, ``pa.RecordBatch`` or ``dict[column -> list | np.ndarray | scalar]``;
        keyword ``columns`` add or override columns (a scalar is repeated on every row). Columns
        are matched by name and cast to the table schema; missing columns become null, a column
        the schema does not know is an error (:class:`TraceError`), never silently dropped. Example:
        ``w.append("ops", {"op_id": ids, "graph_id": gid, "aten_op": names})``.
        """
        if self._closed:
            raise TraceError(f"trace writer for {self.out_dir} is closed: create a new Writer to append")
        part = to_table(table, rows, columns)
        if part.num_rows:
            with self._lock:
                self._pending.setdefault(table, []).append(part)

    # -- publishing ----------------------------------------------------------------------------
    def flush(self) -> None:
        """Publish every buffered row now, one segment per table. Raises TraceError on a write error.

        Rows that failed to write stay buffered and are retried by the next flush.
        """
        with self._flush_lock:
            with self._lock:
                pending, self._pending = self._pending, {}
            items = list(pending.items())
            for i, (table, parts) in enumerate(items):
                name = segment_name(table, self.run_id, self._pid, next(_seq))
                try:
                    path = write_segment(self.out_dir, name, table, parts)
                    if self.on_segment is not None:
                        try:
                            self.on_segment(path)
                        except TraceError as exc:
                            path.unlink(missing_ok=True)   # retried whole by the next flush, never twice
                            raise OSError(str(exc)) from None
                except OSError as exc:
                    with self._lock:  # keep this table's rows and every later table's, in order, for the next attempt
                        unwritten = dict(items[i:])
                        for t, newer in self._pending.items():
                            unwritten[t] = unwritten.get(t, []) + newer
                        self._pending = unwritten
                    fix = ("free disk space or choose another output directory"
                           if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
                           else "choose a writable NEURON_RT_INSPECT_OUTPUT_DIR")
                    self._error = f"cannot write trace segment into {self.out_dir}: {exc.strerror or exc}; {fix}"
                    raise TraceError(self._error) from None
            self._error = None

    def _flush_loop(self) -> None:
        warned = False
        # Ticks on a fixed schedule (not "interval after the last flush ended"), so the window a
        # SIGKILL can lose stays one interval plus one flush, never drifting with slow writes.
        deadline = time.monotonic()
        while True:
            deadline = max(deadline + self.flush_interval, time.monotonic())
            if self._wake.wait(deadline - time.monotonic()):
                break
            sys.setprofile(None)   # a profiler tracing Python (torch.profiler with_stack) leaves this thread alone
            try:
                self.flush()
                warned = False
            except TraceError as exc:
                if not warned:  # once per outage: the runtime keeps running, rows stay buffered
                    log.warning("%s", exc)
                    warned = True

    def close(self, status: str = "ok", end_ns: int | None = None, wall_end_ns: int | None = None) -> None:
        """Flush and record the end of the run (``runs.status``, end on both clocks). Idempotent.

        ``end_ns`` is the projected-clock end; by default the run's projected start plus the
        wall time elapsed. Called automatically at interpreter exit. Example: ``w.close("error")``.
        """
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        wall_end = wall_end_ns if wall_end_ns is not None else time.time_ns()
        if end_ns is None:
            end_ns = int(self.run["start_ns"]) + (wall_end - int(self.run["wall_start_ns"]))
        row = {**self.run, "status": status, "wall_end_ns": wall_end, "end_ns": end_ns}
        part = to_table("runs", {k: [v] for k, v in row.items()}, {})
        with self._lock:
            self._pending.setdefault("runs", []).append(part)
        _live.discard(self)
        self.flush()

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(status="ok" if exc_type is None else "error")


def to_table(table: str, rows, columns: Mapping | None = None) -> pa.Table:
    """Rows for ``table`` as a ``pa.Table`` with exactly its schema (see :meth:`Writer.append`).

    Vectorised: each column is converted once (``pa.array`` on a numpy array is zero-copy when
    the dtype matches); no Python loop runs per row. Example:
    ``to_table("memory", {"ts_ns": [5], "category": "tensors", "bytes": [4096]}).num_rows == 1``.
    """
    schema = TABLES.get(table)
    if schema is None:
        raise TraceError(f"unknown trace table {table!r}: use one of {', '.join(TABLES)}")
    given: dict[str, object] = {}
    if isinstance(rows, pa.RecordBatch):
        rows = pa.Table.from_batches([rows])
    if isinstance(rows, pa.Table):
        given.update(zip(rows.column_names, rows.columns))
    elif isinstance(rows, Mapping):
        given.update(rows)
    elif rows is not None:
        raise TraceError(f"cannot append {type(rows).__name__} to {table!r}: pass a pyarrow Table, "
                         "RecordBatch or a dict of columns")
    given.update(columns or {})
    unknown = [name for name in given if name not in schema.names]
    if unknown:  # a misspelt column would otherwise be dropped and its real column left NULL
        raise TraceError(f"table {table!r} has no column{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown[:5]))}: check the names (columns are in traces/schema.py)")
    known = given
    n = _row_count(table, known, rows)
    arrays = []
    for field in schema:
        value = known.get(field.name)
        try:
            arrays.append(_column(value, field.type, n))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as exc:
            raise TraceError(f"cannot append column {table}.{field.name} as {field.type}: "
                             f"{str(exc).splitlines()[0]}") from None
    return pa.Table.from_arrays(arrays, schema=schema)


def _is_scalar(value) -> bool:
    return value is None or isinstance(value, (str, bytes, bool, int, float, np.generic))


def _row_count(table: str, known: Mapping, rows) -> int:
    if isinstance(rows, pa.Table):
        lengths = {rows.num_rows}
    else:
        lengths = set()
    lengths |= {len(v) for v in known.values() if not _is_scalar(v)}
    if len(lengths) > 1:
        raise TraceError(f"columns appended to {table!r} have different lengths {sorted(lengths)}: "
                         "every column needs one value per row")
    return lengths.pop() if lengths else (1 if known else 0)


def _column(value, typ: pa.DataType, n: int):
    if value is None:
        return pa.nulls(n, typ)
    if _is_scalar(value):
        if isinstance(value, np.generic):
            value = value.item()
        return pa.repeat(pa.scalar(value, typ), n)
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        return value if value.type == typ else value.cast(typ)
    return pa.array(value, type=typ)


@atexit.register
def _close_all() -> None:
    """At exit, publish what every open writer still buffers (status ``ok``: the program ended)."""
    for writer in list(_live):
        try:
            writer.close(status="ok")
        except TraceError as exc:
            log.warning("%s", exc)


def _forget_in_child() -> None:
    """A forked child (e.g. a DataLoader worker) must not publish its parent's buffered rows again."""
    for writer in list(_live):
        writer._closed = True
        writer._pending = {}
        writer._lock = threading.Lock()
        writer._flush_lock = threading.Lock()
    _live.clear()


os.register_at_fork(after_in_child=_forget_in_child)
