"""The trace writer: conversions, atomic segments, background flush, many writers, kill -9."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import traces
from traces import synthetic
from traces.segments import list_segments, read_segment
from traces.writer import to_table

ROOT = Path(__file__).resolve().parents[1]


def _rows(d: Path, table: str) -> int:
    return sum(read_segment(p)[1].num_rows for p in list_segments(d) if p.name.startswith(table + "."))


def test_to_table_casts_broadcasts_and_fills_nulls():
    t = to_table("instructions", {"start_ns": np.arange(3, dtype=np.int64), "core": 1, "engine": "tensor",
                                  "pc": [1, 2, 3]})
    assert t.schema == traces.TABLES["instructions"]
    assert t.column("core").to_pylist() == [1, 1, 1]            # scalar repeated, int -> int32
    assert t.column("dur_ns").null_count == 3                   # missing column -> nulls
    assert t.column("pc").type == pa.int32()
    # a pyarrow table (a schedule, its relative start swapped for the absolute one) plus keyword overrides
    sched = synthetic.schedule([1, 2, 3, 4], 50)
    w = to_table("instructions", sched.drop_columns(["rel_start_ns"]),
                 {"exec_id": 7, "start_ns": sched["rel_start_ns"].to_numpy() + 100})
    assert w.num_rows == 50 and set(w.column("exec_id").to_pylist()) == {7}
    assert w.column("start_ns").to_pylist()[:3] == [v + 100 for v in sched["rel_start_ns"].to_pylist()[:3]]


@pytest.mark.parametrize("table, rows, message", [
    ("instrs", {"pc": [1]}, "unknown trace table 'instrs'"),
    ("ops", {"op_id": [1, 2], "name": ["a"]}, "different lengths"),
    ("ops", {"opid": [1]}, "table 'ops' has no column 'opid'"),
    ("ops", {"op_id": [1], "aten": ["aten.mm"]}, "table 'ops' has no column 'aten'"),   # misspelt beside good ones
    ("instructions", pa.table({"pc": [1], "rel_start_ns": [5]}), "no column 'rel_start_ns'"),
    ("ops", {"op_id": ["x"]}, "cannot append column ops.op_id"),
    ("memory", [1, 2], "cannot append list"),
])
def test_bad_appends_are_one_line_errors(table, rows, message):
    with pytest.raises(traces.TraceError, match=message) as err:
        to_table(table, rows)
    assert "\n" not in str(err.value)


def test_segments_are_published_atomically_and_readable(tmp_path):
    w = traces.Writer(tmp_path, run={"run_id": "atomic"}, metadata={"target": "trn1"})
    w.append("memory", {"ts_ns": [1, 2], "category": "tensors", "bytes": [10, 20]})
    w.flush()
    names = [p.name for p in tmp_path.iterdir()]
    assert not [n for n in names if n.endswith(".tmp")]
    assert any(n.startswith("memory.atomic.") and n.endswith(".arrow") for n in names)
    # each segment is a complete Arrow IPC file with the table name in its schema metadata
    seg = next(p for p in list_segments(tmp_path) if p.name.startswith("memory."))
    reader = ipc.open_file(pa.memory_map(str(seg)))
    assert reader.schema.metadata[b"neuron_stack.table"] == b"memory"
    assert reader.read_all().column("bytes").to_pylist() == [10, 20]
    w.close()
    with pytest.raises(traces.TraceError, match="closed"):
        w.append("memory", {"ts_ns": [3]})


def test_background_thread_flushes_without_being_asked(tmp_path):
    w = traces.Writer(tmp_path, run={"run_id": "bg"}, flush_interval=0.05)
    w.append("events", {"ts_ns": [5], "kind": "load", "detail": "{}"})
    deadline = time.monotonic() + 20  # generous: the machine may be busy; no timing is asserted
    while _rows(tmp_path, "events") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _rows(tmp_path, "events") == 1
    w.close()


def test_close_records_the_run_end_and_is_idempotent(tmp_path):
    w = traces.Writer(tmp_path, run={"run_id": "r1", "tag": "t", "start_ns": 1000, "wall_start_ns": 5000})
    w.close(status="error", end_ns=4000)
    w.close()
    with traces.open(tmp_path) as p:
        run = p.runs().to_pylist()
    assert len(run) == 1 and run[0]["status"] == "error" and run[0]["end_ns"] == 4000 and run[0]["tag"] == "t"


def test_many_processes_write_into_one_directory(tmp_path):
    code = textwrap.dedent("""
        import sys
        from traces import synthetic
        i = int(sys.argv[2])
        synthetic.write_run(sys.argv[1], run_id=f"proc{i}", seed=i, cores=(i,), executions=3, instructions=700)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(i)], cwd=ROOT) for i in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    with traces.open(traces.finalize(tmp_path)) as p:
        assert sorted(r["run_id"] for r in p.runs().to_pylist()) == ["proc0", "proc1", "proc2"]
        assert {r["status"] for r in p.runs().to_pylist()} == {"ok"}
        counts = p.sql("SELECT core, count(*) AS n FROM instructions GROUP BY core ORDER BY core").to_pylist()
        assert counts == [{"core": i, "n": 3 * 700} for i in range(3)]
        # the same source line recorded by three processes is one row (stable ids)
        assert p.sql("SELECT count(*) AS n FROM sources").to_pylist()[0]["n"] == 5


def test_sigkilled_writer_keeps_what_it_published(tmp_path):
    code = textwrap.dedent("""
        import sys, time
        import traces
        from traces import synthetic
        w = traces.Writer(sys.argv[1], run={"run_id": "victim", "start_ns": 0}, flush_interval=0.05)
        sched = synthetic.schedule([1, 2, 3, 4], 500)
        i = 0
        while True:
            w.append("instructions", sched.drop_columns(["rel_start_ns"]), exec_id=i, core=0,
                     start_ns=sched["rel_start_ns"].to_numpy() + i * 10**6)
            w.append("executions", {"exec_id": [i], "run_id": "victim", "core": 0, "start_ns": i * 10**6,
                                    "end_ns": i * 10**6 + 900_000, "device_ns": 900_000, "warmup": False})
            i += 1
            time.sleep(0.005)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while len([p for p in list_segments(tmp_path) if p.name.startswith("instructions.")]) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "writer did not publish"
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    published = _rows(tmp_path, "instructions")
    assert published > 0 and published % 500 == 0  # whole appends only, never a torn segment
    with traces.open(traces.finalize(tmp_path)) as p:
        run = p.runs().to_pylist()[0]
        assert run["status"] == "incomplete" and run["end_ns"] is not None
        assert p.sql("SELECT count(*) AS n FROM instructions").to_pylist()[0]["n"] == published


def test_forked_child_does_not_republish_parent_rows(tmp_path):
    w = traces.Writer(tmp_path, run={"run_id": "parent"}, flush_interval=60)
    w.append("memory", {"ts_ns": [1], "bytes": [1]})
    pid = os.fork()
    if pid == 0:  # the child runs the writer's exit handler, as a DataLoader worker exiting would
        from traces.writer import _close_all
        _close_all()
        os._exit(0)
    os.waitpid(pid, 0)
    w.close()
    assert _rows(tmp_path, "memory") == 1


def test_full_disk_keeps_rows_buffered_until_space_returns(tmp_path):
    """A write that fails (file-size limit, as a full disk) is one line; the rows are retried later."""
    code = textwrap.dedent("""
        import resource, signal, sys
        import numpy as np
        import traces
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        w = traces.Writer(sys.argv[1], run={"run_id": "full"}, flush_interval=3600)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
        w.append("instructions", {"start_ns": np.arange(100_000), "dur_ns": 5, "engine": "vector"})
        try:
            w.flush()
        except traces.TraceError as exc:
            print("ERROR", exc)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        w.close()
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ERROR cannot write trace segment into") and "free disk space" in proc.stdout
    assert len(proc.stdout.strip().splitlines()) == 1
    assert _rows(tmp_path, "instructions") == 100_000
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
