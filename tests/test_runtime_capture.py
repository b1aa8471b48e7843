"""Attach on demand end to end (neuron-top's capture key and `neuron-explorer attach` alike): a running workload
with profiling off receives `traces.attach.request(pid, dir, seconds)`, records for those seconds, stops and
flushes by itself even after it went idle, and the directory finalises into a profile whose executions and
instructions join its graphs and ops, with framework events from the program's thread. A bad capture directory,
a second attach, a process that is not running or not ours are refused in one line; the workload carries on."""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)

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


def wait_for(pred, what: str, timeout: float = 120.0, every: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
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
    (ctl / "idle").write_text("")
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
    from traces import attach
    proc, ctl, live, tmp = workload
    assert not (tmp / "output").exists()            # profiling off: nothing written so far

    # A directory that cannot be created: refused in one line, the workload keeps running.
    rid = attach.request(proc.pid, "/dev/null/cannot_be_a_dir", 1.0, directory=live)
    with pytest.raises(attach.AttachError, match="refused the attach: cannot write /dev/null/cannot_be_a_dir"):
        attach.wait(proc.pid, rid, 1.0, directory=live)

    out = tmp / "capture"
    rid = attach.request(proc.pid, out, 3.0, directory=live)
    wait_for(lambda: (attach.state(proc.pid, live) or {}).get("id") == rid, "the workload to take the request")
    with pytest.raises(attach.AttachError, match="already capturing"):   # one capture at a time
        attach.request(proc.pid, tmp / "second", 1.0, directory=live)
    # the writer publishes at least once a second: the first executions segment means recording is on
    wait_for(lambda: out.exists() and any(out.glob("executions.*.arrow")), "the capture to record executions")
    def window_passed():   # under load the capture may be done (no ``until`` any more) before this looks
        st = attach.state(proc.pid, live) or {}
        return st.get("state") != "recording" or time.time() > st["until"]
    wait_for(lambda: any(out.glob("system_events.*.arrow")) and window_passed(), "the window to pass")
    (ctl / "idle").write_text("")                  # stop executing while the capture is on
    wait_for(lambda: (ctl / "idled").exists(), "the workload to go idle")
    st = attach.wait(proc.pid, rid, 3.0, directory=live)
    assert st["state"] == "done" and st["framework"].endswith("framework events"), st
    # each look finalises the directory: every 0.5 s, not every 0.05 s
    wait_for(lambda: run_status(out) == "ok", "the capture to end by itself", timeout=60, every=0.5)
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
        sources = {r["source"]: r["n"] for r in prof.sql(
            "SELECT source, count(*) AS n FROM system_events GROUP BY 1").to_pylist()}
        assert sources.get("neuron_rt", 0) > 0 and sources.get("framework", 0) > 0, sources
        names = {r["name"] for r in prof.sql("SELECT DISTINCT name FROM system_events WHERE source = 'framework'")
                 .to_pylist()}
        assert "aten::randn" not in names and any(n.startswith("aten::") for n in names), names
        meta = {r["key"]: r["value"] for r in prof.sql("SELECT key, value FROM metadata").to_pylist()}
        assert meta["is_simulation"] == "true" and meta["timing_model"]

    (ctl / "exit").write_text("")
    proc.wait(timeout=60)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_attach_cli_captures_a_window_and_refuses_in_one_line(workload, capsys):
    from explorer.cli import main
    proc, ctl, live, tmp = workload
    os.environ["NEURON_STACK_LIVE_DIR"] = str(live)
    try:
        assert main(["attach", "--pid", str(proc.pid), "--duration", "1", "-o", str(tmp / "att")]) == 0
        out = capsys.readouterr().out
        assert "framework events; profile: " in out, out
        assert main(["attach", "--pid", str(os.getpid()), "--duration", "1"]) == 1          # not using the runtime
        assert main(["attach", "--pid", str(proc.pid), "--duration", "100000"]) == 1        # over the bound
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        assert main(["attach", "--pid", dead.stdout.strip(), "--duration", "1"]) == 1       # not running
    finally:
        del os.environ["NEURON_STACK_LIVE_DIR"]
    err = capsys.readouterr().err.splitlines()
    assert [e.split(": error: ")[1].split(" (")[0].split(":")[0] for e in err] == [
        f"process {os.getpid()} does not use the neuron_stack runtime", "--duration 100000 is out of range",
        f"process {dead.stdout.strip()} is not running"], err
    profile = out.split("profile: ")[1].split()[0]
    import traces
    with traces.open(profile) as prof:
        assert prof.sql("SELECT count(*) AS n FROM instructions").to_pylist()[0]["n"] > 0
