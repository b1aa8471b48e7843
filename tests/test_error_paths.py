"""Issue 37's error paths, each driven as the user runs it: one line with the fix, a non-zero exit, no traceback.

The monitor config that selects nothing is in test_monitor.py's ``BAD_CONFIGS`` (the same subprocess check).
Ctrl-C is SIGINT to the process group, as a terminal sends it: to ``neuron-explorer inspect`` and its workload.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("NEURON_STACK_DEBUG", None)

pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)


def one_error_line(r: subprocess.CompletedProcess, prog: str, needle: str) -> str:
    assert r.returncode != 0, r.stdout[-500:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:") and needle in lines[0], r.stderr[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def neff(tmp_path_factory) -> Path:
    """A real NEFF, as the walkthrough's step 2 saves one (``neuron-cc compile`` here: no Python needed)."""
    d = tmp_path_factory.mktemp("neff")
    r = subprocess.run([str(BIN / "neuron-cc"), "compile", f"{ROOT}/sample_workloads/models.py:Ranker",
                        "--input-shapes", "2x32", "-o", str(d / "ranker.neff")],
                       capture_output=True, text=True, env=ENV, cwd=d, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return d / "ranker.neff"


def view(path: Path) -> subprocess.CompletedProcess:
    # were the file accepted, this would serve until the timeout: the refusal must come first
    return subprocess.run([str(BIN / "neuron-explorer"), "view", str(path), "--port", "65000"],
                          capture_output=True, text=True, env=ENV, timeout=120, stdin=subprocess.DEVNULL)


def test_view_of_a_neff_points_to_capture(neff):
    line = one_error_line(view(neff), "neuron-explorer", "is a NEFF (a compiled model), not a profile")
    assert f"neuron-explorer capture -n {neff}" in line


@pytest.mark.parametrize("content,needle", [
    (b"", "is an empty file (0 bytes), not a profile"),
    (b"step,loss\n1,0.5\n", "is not a profile (not a DuckDB database)"),
])
@pytest.mark.parametrize("name", ["profile.duckdb", "notes.txt"])
def test_view_of_a_file_that_is_no_profile_is_refused_up_front(tmp_path, name, content, needle):
    path = tmp_path / name
    path.write_bytes(content)
    line = one_error_line(view(path), "neuron-explorer", needle)
    assert "pass the profile.duckdb that `neuron-explorer inspect` wrote" in line


def test_summary_of_a_neff_says_the_same(neff):
    r = subprocess.run([str(BIN / "neuron-explorer"), "summary", str(neff)], capture_output=True, text=True,
                       env=ENV, timeout=120)
    one_error_line(r, "neuron-explorer", f"neuron-explorer capture -n {neff}")


def test_analyze_wrong_shape_keeps_torch_log_out(tmp_path):
    r = subprocess.run([str(BIN / "neuron-cc"), "analyze", f"{ROOT}/sample_workloads/models.py:Ranker",
                        "--input-shapes", "2x31"], capture_output=True, text=True, env=ENV, cwd=tmp_path,
                       timeout=300)
    line = one_error_line(r, "neuron-cc", "could not capture Ranker")
    assert "[2, 31] X [32, 16]" in line and r.stdout == ""


# A workload as a user writes one: a traced model in a loop. On the first Ctrl-C it "saves a checkpoint"
# (slow, so a second Ctrl-C can arrive while it still runs), then stops.
WORKLOAD = """
import sys, time, torch, neuron_stack
nm = neuron_stack.trace(torch.nn.Linear(16, 8).eval(), torch.randn(2, 16))
print("running", flush=True)
try:
    while True:
        nm(torch.randn(2, 16))
        time.sleep(0.01)
except KeyboardInterrupt:
    if len(sys.argv) > 1:
        print("saving a checkpoint", flush=True)
        time.sleep(60)
    raise
"""


def _as_in_a_terminal():
    # A test run in the background inherits SIGINT ignored (as a shell's `&` sets it); a terminal's
    # foreground command has the default action, so Python turns Ctrl-C into KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_until(predicate, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not predicate() and time.monotonic() < end:
        time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is left in process group ``pgid``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, pgrp = stat.read_text().rpartition(")")[2].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == pgid and state not in "ZX":
            return True
    return False


def interrupt(tmp_path: Path, times: int, slow_exit: bool) -> tuple[subprocess.CompletedProcess, Path]:
    script = tmp_path / "train.py"
    script.write_text(WORKLOAD)
    out = tmp_path / "output"
    cmd = [str(BIN / "neuron-explorer"), "inspect", "-o", str(out), "--", sys.executable, str(script)]
    proc = subprocess.Popen(cmd + (["slow"] if slow_exit else []), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path, start_new_session=True,
                            preexec_fn=_as_in_a_terminal)
    try:
        assert proc.stdout.readline() == "running\n", proc.stderr.read()[-2000:]
        time.sleep(1.5)   # a few executions, and a segment flush (every 0.5 s)
        os.killpg(proc.pid, signal.SIGINT)
        if times == 2:
            assert proc.stdout.readline() == "saving a checkpoint\n"
            time.sleep(0.5)   # a person's second press; two signals before a handler runs are one for Python
            os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=180)
        _wait_until(lambda: not _group_alive(proc.pid), 30)   # the workload too (of the same Ctrl-C)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), out


def test_one_ctrl_c_says_what_was_kept_and_where(tmp_path):
    r, out = interrupt(tmp_path, 1, slow_exit=False)
    assert r.returncode == 130 and "Traceback" not in r.stderr, r.stderr[-3000:]
    # The press lands in the loop's call (line 7: the user's frame, not ours inside it) or its sleep (line 8).
    (line,) = r.stderr.strip().splitlines()
    assert re.fullmatch(r"neuron_stack: interrupted \(Ctrl-C\) at train\.py:[78] "
                        r"\(NEURON_STACK_DEBUG=1 shows the traceback\)", line), r.stderr
    (session,) = out.iterdir()
    first = r.stdout.splitlines()[0]   # "running" was read above
    assert first == ("neuron-explorer: interrupted (Ctrl-C): the profile keeps what the workload recorded before "
                     f"it, written to {session / 'profile.duckdb'}"), r.stdout
    import traces
    with traces.open(session) as p:   # what it says it kept is there
        assert p.sql("SELECT count(*) AS n FROM executions")["n"][0].as_py() >= 1


def test_two_ctrl_cs_say_the_session_is_unfinished_and_how_to_finalise_it(tmp_path):
    r, out = interrupt(tmp_path, 2, slow_exit=True)
    assert r.returncode == 130 and "Traceback" not in r.stderr, r.stderr[-3000:]
    (session,) = out.iterdir()
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("neuron-explorer")]
    assert lines == [f"neuron-explorer: interrupted again: {session} is left unfinished (the segments recorded "
                     f"so far, not finalised); `neuron-explorer summary {session}` (or view) finalises it"], \
        r.stderr + r.stdout
    s = subprocess.run([str(BIN / "neuron-explorer"), "summary", str(session)], capture_output=True, text=True,
                       env=ENV, timeout=120)
    assert s.returncode == 0 and "execution_count" in s.stdout, s.stderr[-2000:]
