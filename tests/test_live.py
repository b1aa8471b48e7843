"""traces.live: the per-process snapshot the monitor and neuron-top read."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from traces import live
from traces.live import RING_SIZE, LivePublisher, read_all, read_device_info

pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def d(tmp_path):
    return tmp_path / "live"


def _record(pub, n, core=0, status="completed", start=0):
    for i in range(start, start + n):
        pub.record_execution(core=core, wall_end=1000.0 + i, proj_end_ns=10**12 + i * 10**6,
                             total_latency_s=0.001 * (i + 1), device_latency_s=0.0005 * (i + 1),
                             busy_ns={"tensor": 300, "dma": 100}, flops=1000, status=status)


def test_counters_memory_models_events_round_trip(d):
    pub = LivePublisher(tag="app", target="trn1", instance_type="trn1.32xlarge", command="python x.py",
                        hardware={"neuron_device_type": "trainium", "neuroncore_per_device_count": 2},
                        directory=d)
    pub.cores = [1, 0]
    _record(pub, 3, core=0)
    _record(pub, 2, core=1, status="timed_out", start=3)
    pub.count_error("numerical")
    pub.set_device_memory(0, "constants", 1024)
    pub.set_host_memory("dma_buffers", 4096)
    pub.model_loaded(name="mlp", uuid="abc", model_id=10001, core=1, device_bytes={"model_code": 77},
                     host_bytes={"application_memory": 5})
    pub.model_running(10001, True)
    pub.count_event("recompile", reason="x dim 0: 4 -> 8", source="m.py:3")
    pub.count_event("cpu_fallback", op="aten.nonzero.default", source="m.py:9")
    pub.flush()
    (s,) = read_all(d)
    assert (s["tag"], s["pid"], s["target"], s["instance_type"], s["command"]) == (
        "app", os.getpid(), "trn1", "trn1.32xlarge", "python x.py")
    assert s["cores"] == [0, 1]
    assert s["seq"] == 5
    assert s["executions"]["completed"] == 3 and s["executions"]["timed_out"] == 2
    assert set(s["executions"]) == set(live.EXECUTION_STATUSES)
    assert s["errors"] == dict.fromkeys(live.ERROR_TYPES, 0) | {"numerical": 1}
    # the three executions all start at 10**12 - 10**6 (end minus total latency): busy is their union
    assert s["core_stats"]["0"] == {"busy_ns": {"tensor": 900, "dma": 300}, "device_ns": 3_000_000,
                                    "active_ns": 1_500_000, "flops": 3000, "executions": 3}
    assert s["device_memory"]["0"]["constants"] == 1024 and s["device_memory"]["0"]["tensors"] == 0
    assert s["host_memory"]["dma_buffers"] == 4096
    (m,) = s["models"]
    assert (m["name"], m["model_id"], m["is_running"], m["core"], m["device_index"]) == ("mlp", 10001, True, 1, 0)
    assert m["device_bytes"]["model_code"] == 77 and m["host_bytes"]["application_memory"] == 5
    assert s["events"]["recompile"] == {"count": 1, "last_reason": "x dim 0: 4 -> 8",
                                        "last_source": "m.py:3", "last_op": ""}
    assert s["events"]["cpu_fallback"]["last_op"] == "aten.nonzero.default"
    assert s["ring"]["seq"].tolist() == [1, 2, 3, 4, 5]
    assert s["ring"]["core"].tolist() == [0, 0, 0, 1, 1]
    assert s["ring"]["status"].tolist() == ["completed"] * 3 + ["timed_out"] * 2
    assert s["ring"]["total_latency"][4] == pytest.approx(0.005, rel=1e-6)
    assert s["hardware"]["neuron_device_type"] == "trainium"
    assert read_device_info("trn1.32xlarge", d)["hardware"]["neuron_device_type"] == "trainium"
    assert read_device_info("inf2.48xlarge", d) is None and read_device_info("../x", d) is None
    pub.close()
    assert read_all(d) == [] and not pub.path.exists() and not pub.ring_path.exists()


def test_tag_defaults_to_env_then_pid(d, monkeypatch):
    monkeypatch.delenv("NEURON_PROCESS_TAG", raising=False)
    a = LivePublisher(directory=d)
    monkeypatch.setenv("NEURON_PROCESS_TAG", "my_app_1")
    b = LivePublisher(directory=d)
    assert a.tag == str(os.getpid()) and b.tag == "my_app_1"
    assert a.path != b.path  # two publishers in one process never share a file
    a.close(), b.close()


def test_ring_keeps_the_newest_executions_in_order(d):
    pub = LivePublisher(tag="r", directory=d)
    n = RING_SIZE + 123
    _record(pub, n)
    pub.flush()
    ring = read_all(d)[0]["ring"]
    assert ring["seq"].tolist() == list(range(n - RING_SIZE + 1, n + 1))
    assert ring["wall_end"][-1] == 1000.0 + n - 1
    assert all(len(col) == RING_SIZE for col in ring.values())
    pub.close()


def test_flush_is_rate_limited_and_a_quiet_spell_still_gets_written(d):
    pub = LivePublisher(tag="f", directory=d)
    writes = 0
    orig = live._write_atomic

    def counting(path, data):
        nonlocal writes
        writes += 1
        orig(path, data)

    live._write_atomic = counting
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.6:
            _record(pub, 1)
        # at most one write per 0.25 s (+1 for a backstop write racing the hot path)
        assert 1 <= writes <= 5
        last = pub._seq
        deadline = time.monotonic() + 5
        while read_all(d)[0]["seq"] != last and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read_all(d)[0]["seq"] == last  # the background flusher published the tail
    finally:
        live._write_atomic = orig
        pub.close()


def test_unknown_names_are_refused(d):
    pub = LivePublisher(tag="u", directory=d)
    with pytest.raises(ValueError, match="unknown execution status 'ok'"):
        pub.record_execution(0, 1.0, 1, 0.1, 0.1, status="ok")
    with pytest.raises(ValueError, match="error type"):
        pub.count_error("oops")
    with pytest.raises(ValueError, match="device memory category"):
        pub.set_device_memory(0, "weights", 1)
    with pytest.raises(ValueError, match="event kind"):
        pub.count_event("launch")
    pub.close()


def test_dead_process_files_are_dropped_and_removed(d):
    code = ("import time, sys; from traces.live import LivePublisher\n"
            f"p = LivePublisher(tag='short', directory={str(d)!r}); p.flush(); print(p.path, flush=True)\n"
            "import os; os._exit(0)\n")  # skip atexit: like a kill, the file stays behind
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    left = Path(out.stdout.strip())
    assert left.exists() and left.with_suffix(".ring").exists()
    assert read_all(d) == []
    assert not left.exists() and not left.with_suffix(".ring").exists()


def test_half_written_and_foreign_files_are_skipped(d):
    pub = LivePublisher(tag="ok", directory=d)
    (d / f"{os.getpid()}-999.json").write_text('{"version": 1, "pid": ')  # torn write of a live pid
    (d / "notes.txt").write_text("hello")
    (d / ".99999999-0.json.99999999.1.tmp").write_text("{")  # left by a writer killed mid-write
    assert [s["tag"] for s in read_all(d)] == ["ok"]
    assert not (d / ".99999999-0.json.99999999.1.tmp").exists() and (d / "notes.txt").exists()
    pub.close()


def test_concurrent_read_while_the_file_is_replaced(d):
    pub = LivePublisher(tag="busy", directory=d)
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            _record(pub, 50, start=i)
            i += 50
            pub.flush()

    t = threading.Thread(target=writer)
    t.start()
    try:
        seen = []
        deadline = time.monotonic() + 0.8
        while time.monotonic() < deadline:
            snaps = read_all(d)
            assert len(snaps) == 1  # never torn, never missing
            seen.append(snaps[0]["seq"])
        assert seen == sorted(seen) and seen[-1] > 0
    finally:
        stop.set()
        t.join()
        pub.close()


def test_capture_request_is_consumed_once(d):
    from traces import attach
    pub = LivePublisher(tag="cap", directory=d)
    assert attach.claim(pub.pid, d) is None
    rid = attach.request(os.getpid(), "/tmp/cap_out", 3, directory=d)
    assert attach.claim(pub.pid, d) == {"id": rid, "output_dir": "/tmp/cap_out", "seconds": 3.0, "by": ""}
    assert attach.claim(pub.pid, d) is None
    pub.close()


def test_atexit_removes_the_file(d):
    code = ("from traces.live import LivePublisher\n"
            f"p = LivePublisher(tag='bye', directory={str(d)!r}); print(p.path)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert not Path(out.stdout.strip()).exists()
    assert read_all(d) == []


def test_live_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_STACK_LIVE_DIR", str(tmp_path))
    assert live.live_dir() == tmp_path
    monkeypatch.delenv("NEURON_STACK_LIVE_DIR")
    default = live.live_dir()
    assert (default.parent.name == f"neuron_stack-{os.getuid()}"
            and default.parent.parent in (Path("/dev/shm"), Path("/tmp")))


def test_ring_only_shows_executions_the_snapshot_counted(d):
    pub = LivePublisher(tag="r2", directory=d)
    _record(pub, 3)
    pub.flush()
    pub._last_flush = time.monotonic() + 3600  # hold further writes of the snapshot back
    _record(pub, 2, start=3)                   # in the shared ring already, not yet in the snapshot
    (s,) = read_all(d)
    assert s["seq"] == 3 and s["ring"]["seq"].tolist() == [1, 2, 3]
    pub.close()


def test_forked_child_leaves_the_parents_files_alone(d):
    pub = LivePublisher(tag="parent", directory=d)
    _record(pub, 2)
    pub.flush()
    pid = os.fork()
    if pid == 0:  # child: recording and closing must not touch the parent's ring or snapshot
        try:
            _record(pub, 5, start=100)
            pub.flush()
            pub.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    (s,) = read_all(d)
    assert s["pid"] == os.getpid() and s["seq"] == 2 and s["ring"]["seq"].tolist() == [1, 2]
    assert s["ring"]["wall_end"].tolist() == [1000.0, 1001.0]
    pub.close()


def test_a_finalizer_run_by_a_collection_inside_the_lock_does_not_deadlock(d):
    """A garbage collection while the publisher's lock is held (the flusher's snapshot) can run a finalizer
    that counts on the same thread: a freed eager device tensor's set_device_memory. With a plain lock that
    thread waited on itself and the workload hung (bench/window.py, issue 41)."""
    import gc
    import weakref

    pub = LivePublisher(tag="x", directory=d)

    class Tensor:
        pass

    def freed_and_counted():
        t = Tensor()
        t.cycle = t                                  # freed only by a collection, as torch tensors often are
        weakref.finalize(t, pub.set_device_memory, 0, "tensors", 0)
        del t
        with pub._lock:                              # where the flusher's snapshot() allocates
            gc.collect()

    worker = threading.Thread(target=freed_and_counted, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the finalizer waited on the lock its own thread holds"
    assert pub.snapshot()["device_memory"]["0"]["tensors"] == 0
    pub.close()


def test_a_long_tag_is_cut_with_a_warning(d, caplog):
    pub = LivePublisher(tag="t" * 300, directory=d)
    try:
        assert pub.tag == "t" * 255
        assert any("300 characters" in r.getMessage() and "first 255" in r.getMessage() for r in caplog.records)
    finally:
        pub.close()


def test_read_ring_reads_the_newer_executions_only_across_the_wrap(d):
    pub = LivePublisher(tag="tail", directory=d)
    n = RING_SIZE + 10
    _record(pub, n)
    pub.flush()
    (s,) = read_all(d, ring=False)
    assert "ring" not in s
    tail = live.read_ring(s, after=n - 20)   # slots RING_SIZE - 9 .. end, then 0 .. 10
    assert tail["seq"].tolist() == list(range(n - 19, n + 1))
    assert tail["wall_end"].tolist() == [1000.0 + i - 1 for i in range(n - 19, n + 1)]
    whole, full = live.read_ring(s), read_all(d)[0]["ring"]
    assert all(whole[k].tolist() == full[k].tolist() for k in full)
    assert whole["seq"].tolist() == list(range(n - RING_SIZE + 1, n + 1))
    assert live.read_ring(s, after=n)["seq"].tolist() == []
    pub.close()


def test_a_reused_pid_is_caught_after_its_start_time_was_verified(monkeypatch):
    import psutil

    from traces import pids
    pid, started = os.getpid(), psutil.Process().create_time()
    assert pids.alive(pid, started) and pids.alive(pid, started)   # the second from the verified start ticks
    assert pids._verified[pid] == (pids.start_ticks(pid), started)
    # the pid now belongs to a process started later: other start ticks, so the start time is read again
    monkeypatch.setattr(pids, "start_ticks", lambda pid: b"1")
    monkeypatch.setattr(pids, "process_start_time", lambda pid: started + 60)
    assert not pids.alive(pid, started)
