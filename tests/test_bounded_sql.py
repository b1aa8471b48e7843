"""Issue 31: user SQL bounded by construction, and damaged vs locked profiles told apart.

The web console runs each query in a worker process whose address space is capped (killed and
restarted on breach); ``neuron-explorer sql`` caps its own process unless ``--unsafe``. Both answer a
query that breaks a bound with one line.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

import traces
import traces.synthetic
from explorer import data
from explorer.profiles import ExplorerError, Loaded
from traces.console import MEMORY_BOUND_BYTES

pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)

CLI = str(Path(sys.executable).parent / "neuron-explorer")
HUGE = "SELECT repeat('x', 1000000000) || 'a' AS s"


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bounded")
    traces.synthetic.write_run(d, executions=3, instructions=300)
    return traces.finalize(d)


@pytest.fixture
def loaded(profile):
    L = Loaded("p", profile)
    yield L
    L.close()


def test_a_huge_value_is_one_line_and_the_console_keeps_answering(loaded):
    with pytest.raises(ExplorerError, match="memory bound") as err:
        data.run_console(loaded, HUGE)
    assert "\n" not in str(err.value)
    assert data.run_console(loaded, "SELECT 42 AS x")["rows"] == [{"x": 42}]


def test_four_heavy_queries_at_once_stay_out_of_the_server(loaded):
    before = psutil.Process().memory_info().rss
    answers = []

    def ask():
        try:
            data.run_console(loaded, HUGE)
            answers.append("answered")
        except ExplorerError as exc:
            answers.append(str(exc))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 4 and all("memory bound" in a or "busy" in a for a in answers), answers
    assert psutil.Process().memory_info().rss - before < 200 << 20   # the server itself stayed flat
    worker = loaded.cached("console_worker", lambda: None)
    assert psutil.Process(worker._proc.pid).memory_info().vms < psutil.Process().memory_info().vms + \
        2 * MEMORY_BOUND_BYTES


def test_a_killed_worker_is_restarted_for_the_next_query(loaded):
    assert data.run_console(loaded, "SELECT 1 AS x")["rows"] == [{"x": 1}]
    worker = loaded.cached("console_worker", lambda: None)
    old = worker._proc.pid
    os.kill(old, 9)
    worker._proc.wait()
    assert data.run_console(loaded, "SELECT 2 AS x")["rows"] == [{"x": 2}]
    assert worker._proc.pid != old


def test_a_used_worker_that_runs_out_of_memory_retries_once_on_a_fresh_one(loaded):
    # earlier answers leave the worker's heap bigger than it started: the bound is the query's, not the worker's
    assert data.run_console(loaded, "SELECT 1 AS x")["rows"] == [{"x": 1}]
    worker = loaded.cached("console_worker", lambda: None)
    old = worker._proc.pid
    with pytest.raises(ExplorerError, match="memory bound") as err:
        data.run_console(loaded, HUGE)
    assert "\n" not in str(err.value) and worker._proc.pid != old
    fresh = worker._proc.pid
    with pytest.raises(ExplorerError, match="memory bound"):     # a fresh worker that fails does not try again
        data.run_console(loaded, HUGE)
    assert worker._proc.pid == fresh


#: Runs a command and writes its peak RSS (KiB) to a file. A child forked from this test's worker would carry the
#: worker's own peak in its ``ru_maxrss`` (Linux keeps the pre-exec high-water mark); one forked from this small
#: process starts from this process's size.
PEAK = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[2:]).returncode; "
        "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(code)")


@pytest.mark.parametrize("sql", [HUGE, "CREATE TEMP TABLE t AS SELECT repeat('x', 1000000) AS s FROM range(3000)"])
def test_cli_sql_is_bounded_unless_unsafe(profile, sql, tmp_path):
    p = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path / "peak"), CLI, "sql", str(profile), sql],
                       capture_output=True, text=True, timeout=300)
    peak = int((tmp_path / "peak").read_text()) * 1024
    assert peak < MEMORY_BOUND_BYTES, f"{peak >> 20} MiB"      # the docs' promise: under 1 GiB
    if p.returncode:
        assert p.stderr.count("\n") == 1 and "memory bound" in p.stderr and "--unsafe" in p.stderr, p.stderr


def test_cli_sql_timeout_is_checked_and_applied(profile):
    p = subprocess.run([CLI, "sql", str(profile), "--timeout", "nan", "SELECT 1"], capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.startswith("neuron-explorer: error: --timeout nan")
    p = subprocess.run([CLI, "sql", str(profile), "--timeout", "1",
                        "SELECT count(*) FROM range(100000000000), range(1000)"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1 and "query stopped after 1 s" in p.stderr and p.stderr.count("\n") == 1


def test_damaged_and_locked_profiles_are_told_apart(profile, tmp_path):
    damaged = tmp_path / "damaged.duckdb"
    raw = bytearray(profile.read_bytes())
    raw[8192 + 100:8192 + 164] = b"\xff" * 64     # inside a checksummed block
    damaged.write_bytes(bytes(raw))
    with pytest.raises(traces.TraceError, match="is damaged") as err:
        traces.open(damaged).figures()
    assert "open for writing" not in str(err.value)

    locked = tmp_path / "locked.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys\n"
                               f"c = duckdb.connect({str(locked)!r}); c.execute('CREATE TABLE x (a INT)')\n"
                               "print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(traces.TraceError, match="open for writing by another process"):
            traces.open(locked)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
