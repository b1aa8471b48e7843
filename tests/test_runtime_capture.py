"""neuron-top's capture key end to end on the runtime side: a running workload with profiling off
receives `traces.live.request_capture(pid, dir, seconds)`, records for those seconds, stops and
flushes by itself even after it went idle, and the directory finalises into a profile whose
executions and instructions join its graphs and ops. A bad capture directory never stops the
workload."""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[1]

WORKLOAD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    import torch, neuron_stack
    from models import MLP, Ranker

    ctl = Path(sys.argv[1])
    torch.manual_seed(0)
    mlp = neuron_stack.trace(MLP(16, 32, 4).eval(), torch.randn(3, 16))                 # the fast path
    ranker = neuron_stack.trace(Ranker(16, 8).eval(), torch.randn(2, 16),                 # CPU islands
                                partitioner_config=neuron_stack.PartitionerConfig(ops_to_partition={"aten::sort"}))
    x, y = torch.randn(3, 16), torch.randn(2, 16)
    (ctl / "ready").write_text("")
    deadline = time.time() + 240
    while time.time() < deadline and not (ctl / "idle").exists():
        mlp(x), ranker(y)
        time.sleep(0.005)
    (ctl / "idled").write_text("")
    while time.time() < deadline and not (ctl / "exit").exists():
        time.sleep(0.05)      # idle: no executions, so nothing polls; the capture must end by itself
""")


def wait_for(pred, what: str, timeout: float = 120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def workload(tmp_path):
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    live = tmp_path / "live"
    env = dict(os.environ, NEURON_STACK_LIVE_DIR=str(live), NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT), NEURON_PROCESS_TAG="capture_test")
    env.pop("NEURON_RT_INSPECT_ENABLE", None)
    proc = subprocess.Popen([sys.executable, str(script), str(ctl), str(ROOT / "sample_workloads")], env=env,
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (ctl / "ready").exists() or proc.poll() is not None, "the workload to compile")
    assert proc.poll() is None, proc.stderr.read()
    yield proc, ctl, live, tmp_path
    (ctl / "exit").write_text("")
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


def run_status(out: Path):
    import traces
    try:
        path = traces.finalize(out)
    except Exception:
        return None
    con = duckdb.connect(str(path), read_only=True)
    try:
        rows = con.sql("SELECT status FROM runs").fetchall()
    finally:
        con.close()
    return rows[0][0] if rows else None     # "incomplete" until the writer records the run's end


def test_capture_request_records_then_stops_by_itself(workload):
    import traces
    from traces.live import request_capture
    proc, ctl, live, tmp = workload
    assert not (tmp / "output").exists()            # profiling off: nothing written so far

    # A directory that cannot be created: the workload warns and keeps running.
    request = request_capture(proc.pid, "/dev/null/cannot_be_a_dir", 1.0, directory=live)
    wait_for(lambda: not request.exists(), "the workload to consume the bad request")

    out = tmp / "capture"
    request = request_capture(proc.pid, out, 3.0, directory=live)
    wait_for(lambda: not request.exists(), "the workload to consume the capture request")
    # the writer publishes at least once a second: the first executions segment means recording is on
    wait_for(lambda: out.exists() and any(out.glob("executions.*.arrow")), "the capture to record executions")
    (ctl / "idle").write_text("")                  # stop executing while the capture is on
    wait_for(lambda: (ctl / "idled").exists(), "the workload to go idle")
    wait_for(lambda: run_status(out) == "ok", "the capture to end by itself", timeout=60)
    assert proc.poll() is None                      # ended by its timer, not by the process exiting

    with traces.open(traces.finalize(out)) as prof:
        graphs = {r["name"]: r for r in prof.sql("SELECT name, graph_id, num_ops FROM graphs").to_pylist()}
        assert set(graphs) == {"MLP", "Ranker"} and all(g["num_ops"] > 0 for g in graphs.values())
        [row] = prof.sql("""SELECT count(*) AS n, count(*) FILTER (WHERE g.graph_id IS NULL) AS orphans
                             FROM executions x LEFT JOIN graphs g USING (graph_id)""").to_pylist()
        assert row["n"] >= 2 and row["orphans"] == 0
        per_engine = {r["engine"]: r["n"] for r in prof.sql("""
            SELECT i.engine AS engine, count(*) AS n FROM instructions i JOIN ops o USING (op_id)
            JOIN executions x USING (exec_id) GROUP BY ALL""").to_pylist()}
        assert per_engine.get("tensor", 0) > 0 and per_engine.get("cpu", 0) > 0
        # a capture describes the graphs it saw but not compiles that happened before it
        kinds = {r["kind"] for r in prof.sql("SELECT DISTINCT kind FROM events").to_pylist()}
        assert "compile" not in kinds and "cpu_fallback" in kinds
        meta = {r["key"]: r["value"] for r in prof.sql("SELECT key, value FROM metadata").to_pylist()}
        assert meta["is_simulation"] == "true" and meta["timing_model"]

    (ctl / "exit").write_text("")
    proc.wait(timeout=60)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "capture into /dev/null/cannot_be_a_dir failed" in err and "Traceback" not in err
