"""neuron-ls as typed: the real header lines, columns and JSON keys, and who holds which cores."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)

NEURON_LS = str(Path(sys.executable).parent / "neuron-ls")
HOLD = ("import sys; from neuron_stack.runtime.cores import acquire; acquire('trn1'); print('held', flush=True); "
        "sys.stdin.read()")


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_RT_", "NEURON_STACK_INSTANCE"))}
    e["NEURON_STACK_RUNTIME_DIR"] = str(tmp_path)
    e["NEURON_STACK_LIVE_DIR"] = str(tmp_path / "live")   # no other workload's instance (neuron-ls follows it)
    return e


def _ls(env, *args):
    return subprocess.run([NEURON_LS, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def holder(env):
    p = subprocess.Popen([sys.executable, "-c", HOLD], env={**env, "NEURON_RT_VISIBLE_CORES": "2-3"},
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    yield p
    p.stdin.close()
    p.wait(timeout=20)


def test_default_table_has_real_header_and_columns(env):
    out = _ls(env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "instance-type: trn1.32xlarge"
    assert lines[1].startswith("instance-id: i-")
    assert lines[2].startswith("+--------+")
    heads = [c.strip() for c in lines[3].strip("|").split("|")]
    heads2 = [c.strip() for c in lines[4].strip("|").split("|")]
    assert [f"{a} {b}".strip() for a, b in zip(heads, heads2)] == [
        "NEURON DEVICE", "NEURON CORES", "NEURON CORE IDS", "NEURON MEMORY", "CONNECTED DEVICES",
        "PCI BDF", "CPU AFFINITY", "NUMA NODE"]
    row0 = [c.strip() for c in lines[6].strip("|").split("|")]
    assert row0[:5] == ["0", "2", "0-1", "32 GB", "12, 3, 4, 1"]
    assert sum(1 for line in lines if line.startswith("| ")) == 2 + 16


def test_wide_and_json_show_the_holder_and_its_cores(env, holder):
    wide = _ls(env, "--wide").stdout
    row = next(line for line in wide.splitlines() if f"| {holder.pid} " in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "1" and cells[2] == "2-3" and cells[-1] == "0.1.0"
    assert "python -c" in cells[-2]
    devices = json.loads(_ls(env, "-j").stdout)
    assert len(devices) == 16
    assert set(devices[0]) >= {"neuron_device", "bdf", "cpu_affinity", "numa_node", "connected_to", "nc_count",
                               "logical_neuroncore_config", "memory_size", "neuroncore_ids", "neuron_processes"}
    assert devices[1]["neuroncore_ids"] == [2, 3] and devices[1]["memory_size"] == 32 * 2**30
    (proc,) = devices[1]["neuron_processes"]
    assert proc["pid"] == holder.pid and proc["neuroncore_ids"] == [2, 3]
    assert proc["neuron_runtime_version"] == "0.1.0" and devices[0]["neuron_processes"] == []


def test_show_all_procs_lists_neuron_ls_itself_as_na(env):
    p = subprocess.Popen([NEURON_LS, "-a"], env=env, stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=60)
    me = [line for line in out.splitlines() if f"| {p.pid} " in line]
    assert all("neuron-ls -a" in line for line in me)
    assert len(me) == 16 and all(line.rstrip().endswith("| NA      |") for line in me)


def test_trn2_header_and_topology(env):
    out = _ls({**env, "NEURON_STACK_INSTANCE_TYPE": "trn2.48xlarge"}, "-t").stdout
    assert "logical-neuroncore-config: 2" in out.splitlines()[2]
    assert "| 0      | 4      | 0-3      | 96 GB  | 12, 3, 4, 1" in out
    assert "*––►[12 ]◄––►[13 ]◄––►[14 ]◄––►[15 ]◄––*" in out and "Wrap-around link" in out


def test_bad_instance_type_is_one_line(env):
    out = _ls({**env, "NEURON_STACK_INSTANCE_TYPE": "p5.48xlarge"})
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        out.stderr.strip()] and out.stderr.startswith("neuron-ls: error: NEURON_STACK_INSTANCE_TYPE='p5.48xlarge'")
