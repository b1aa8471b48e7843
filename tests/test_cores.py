"""Core reservation across real processes: exclusivity, release on exit and on SIGKILL, env parsing."""
import json
import os
import signal
import subprocess
import sys

import pytest

from neuron_stack.runtime import cores

pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)

HOLDER = """
import json, sys
from neuron_stack.runtime.cores import acquire, CoreAllocationError
try:
    lease = acquire("trn1")
except CoreAllocationError as e:
    print(json.dumps({"error": str(e)}), flush=True)
    sys.exit(3)
print(json.dumps({"cores": lease.cores}), flush=True)
sys.stdin.read()   # hold until the test closes stdin
"""


@pytest.fixture
def rtdir(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_STACK_RUNTIME_DIR", str(tmp_path))
    for var in ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_STACK_INSTANCE_TYPE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def _spawn(rtdir, **env):
    e = {**os.environ, "NEURON_STACK_RUNTIME_DIR": str(rtdir), **env}
    return subprocess.Popen([sys.executable, "-c", HOLDER], env=e, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _first_line(p):
    line = p.stdout.readline()
    assert line, p.stderr.read()
    return json.loads(line)


def test_racing_processes_never_share_a_core(rtdir):
    # 12 processes x 3 cores on a 32-core trn1.32xlarge: exactly 10 fit, no core twice.
    procs = [_spawn(rtdir, NEURON_RT_NUM_CORES="3") for _ in range(12)]
    try:
        results = [_first_line(p) for p in procs]
        won = [r["cores"] for r in results if "cores" in r]
        lost = [r["error"] for r in results if "error" in r]
        assert len(won) == 10 and len(lost) == 2
        flat = [c for cs in won for c in cs]
        assert len(flat) == len(set(flat)) == 30
        for msg in lost:
            assert "Virtual Neuron Core(s) not available - Requested:3 Available:" in msg
            assert "\n" not in msg
        # neuron-ls's view: each live holder is recorded against exactly its cores
        holders = cores.core_holders(cores.get_instance("trn1"))
        by_pid = {}
        for c, h in holders.items():
            by_pid.setdefault(h["pid"], []).append(c)
        assert sorted(map(sorted, by_pid.values())) == sorted(map(sorted, won))
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=20)


def test_visible_cores_conflict_and_sigkill_frees_cores(rtdir):
    a = _spawn(rtdir, NEURON_RT_VISIBLE_CORES="0-1")
    assert _first_line(a) == {"cores": [0, 1]}
    b = _spawn(rtdir, NEURON_RT_VISIBLE_CORES="1-2")
    err = _first_line(b)["error"]
    b.wait(timeout=20)
    assert b.returncode == 3
    assert err.startswith("Virtual Neuron Core(s) not available - Requested:2 Available:1")
    assert f"pid {a.pid}" in err
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=20)
    # the kernel dropped a's locks; its stale record is ignored
    assert 0 not in cores.core_holders(cores.get_instance("trn1"))
    c = _spawn(rtdir, NEURON_RT_VISIBLE_CORES="0-2")
    assert _first_line(c) == {"cores": [0, 1, 2]}
    c.stdin.close()
    c.wait(timeout=20)
    assert c.returncode == 0
    # normal exit releases too
    assert cores.free_cores(cores.get_instance("trn1")) == list(range(32))


def test_default_is_one_core_and_zero_means_all(rtdir):
    inst_env = {"NEURON_STACK_INSTANCE_TYPE": "trn1.2xlarge"}  # 1 chip x 2 cores
    a = _spawn(rtdir, **inst_env)
    assert _first_line(a) == {"cores": [0]}
    b = _spawn(rtdir, NEURON_RT_NUM_CORES="0", **inst_env)
    assert _first_line(b) == {"cores": [1]}
    c = _spawn(rtdir, **inst_env)
    assert _first_line(c)["error"].startswith("Virtual Neuron Core(s) not available - Requested:1 Available:0")
    for p in (a, b, c):
        p.stdin.close()
        p.wait(timeout=20)


def test_same_process_shares_its_reservation(rtdir):
    first = cores.acquire("trn1")
    second = cores.acquire("trn1")           # a second model load reuses the core
    assert first.cores == second.cores == [0]
    wide = cores.acquire("trn1", 4)           # DataParallel asking for more grows it
    assert wide.cores == [0, 1, 2, 3]
    wide.release()
    inst = cores.get_instance("trn1")
    assert cores.held_cores(inst) == [0]
    first.release()
    assert cores.held_cores(inst) == [0]      # still referenced by `second`
    second.release()
    assert cores.held_cores(inst) == [] and cores.free_cores(inst) == list(range(32))


def test_explicit_core_ids_are_relative_to_visible(rtdir, monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "4-7")
    with cores.acquire("trn1", cores=[1, 3]) as lease:
        assert lease.cores == [5, 7]
    with pytest.raises(cores.CoreAllocationError, match="core 4 is out of range"):
        cores.acquire("trn1", cores=[4])


@pytest.mark.parametrize("value, message", [
    ("a-b", "is malformed: use an index (3), an inclusive range (0-2) or a comma list (0,2,5)"),
    ("3-1", "decreasing range 3-1: write it as 1-3"),
    ("40", "names core 40 but this instance has cores 0-31"),
    ("", None),
])
def test_visible_cores_errors_are_one_line(rtdir, monkeypatch, value, message):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", value)
    if message is None:
        cores.acquire("trn1").release()
        return
    with pytest.raises(cores.CoreAllocationError) as exc:
        cores.acquire("trn1")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_bad_num_cores_and_instance_type(rtdir, monkeypatch):
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "two")
    with pytest.raises(cores.CoreAllocationError, match="NEURON_RT_NUM_CORES='two' is not a core count"):
        cores.acquire("trn1")
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "33")
    with pytest.raises(cores.CoreAllocationError, match=r"Requested:33 Available:32"):
        cores.acquire("trn1")
    monkeypatch.delenv("NEURON_RT_NUM_CORES")
    monkeypatch.setenv("NEURON_STACK_INSTANCE_TYPE", "inf2.48xlarge")
    with pytest.raises(cores.CoreAllocationError, match="has inf2 chips but the model targets trn1"):
        cores.acquire("trn1")
    monkeypatch.setenv("NEURON_STACK_INSTANCE_TYPE", "p4d.24xlarge")
    with pytest.raises(cores.CoreAllocationError, match="not a simulated instance type"):
        cores.acquire("trn1")


def test_instance_shapes():
    trn1 = cores.get_instance("trn1")
    assert (trn1.chips, trn1.num_cores) == (16, 32)
    assert trn1.neighbors(0) == [12, 3, 4, 1] and trn1.neighbors(15) == [11, 14, 3, 12]
    inf2 = cores.get_instance("inf2")
    assert inf2.num_cores == 24 and inf2.neighbors(0) == [1, 11]
    assert cores.get_instance("trn2").num_cores == 64
