"""neuron-monitor as a user runs it: real workload processes publishing live statistics, a real
``neuron-monitor`` subprocess, every stdout line parsed and validated against monitor/schema.json."""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCHEMA = json.loads((ROOT / "monitor" / "schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
ALL_RUNTIME = ["neuroncore_counters", "execution_stats", "memory_used", "neuron_runtime_vcpu_usage", "neuron_stack"]
pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)

# A workload: publishes N executions with known latencies, memory, a model and events, then idles
# until killed (or exits when IDLE_EXIT is set). Prints "done" once everything is recorded.
WORKLOAD = r'''
import os, sys, time
from traces.live import LivePublisher
n, sleep_s = int(sys.argv[1]), float(sys.argv[2])
hw = {"neuron_device_type": "trainium", "neuron_device_version": "v2", "neuroncore_version": "v2",
      "neuron_device_count": 16, "neuron_device_memory_size": 32 * 2**30,
      "neuroncore_per_device_count": 2, "logical_neuroncore_config": 1}
pub = LivePublisher(target="trn1", instance_type="trn1.32xlarge", hardware=hw, command="python workload.py")
pub.cores = [1]
pub.set_device_memory(1, "constants", 4096); pub.set_device_memory(1, "model_code", 512)
pub.set_host_memory("application_memory", 1 << 20); pub.set_host_memory("dma_buffers", 8192)
pub.model_loaded(name="mlp", uuid="0123abcd", model_id=10001, core=1,
                 device_bytes={"constants": 4096, "model_code": 512}, host_bytes={"application_memory": 100})
print("ready", flush=True)
proj = time.time_ns()
for i in range(n):
    time.sleep(sleep_s)
    total = 0.001 * (i % 10 + 1)
    proj += int(total * 1e9) + 1_000_000
    pub.record_execution(core=1, wall_end=time.time(), proj_end_ns=proj, total_latency_s=total,
                         device_latency_s=total / 2, busy_ns={"tensor": int(total * 0.4e9), "dma": int(total * 0.1e9)},
                         flops=10**9, status="timed_out" if i % 25 == 24 else "completed")
    if i % 50 == 0:
        pub.count_event("recompile", reason=f"x dim 0: {i} -> {i + 1}", source="workload.py:17")
pub.count_event("cpu_fallback", op="aten.nonzero.default", reason="data-dependent shape", source="workload.py:20")
pub.count_error("numerical")
pub.flush()
print("done", flush=True)
if os.environ.get("IDLE_EXIT"):
    sys.exit(0)
time.sleep(600)
'''


class Stream:
    """A running neuron-monitor and its stdout lines, parsed."""

    def __init__(self, args, env):
        self.proc = subprocess.Popen([str(BIN / "neuron-monitor"), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout=15.0) -> dict:
        line = self.lines.get(timeout=timeout)
        assert line is not None, f"neuron-monitor ended: {self.proc.stderr.read()}"
        doc = json.loads(line)
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATOR.iter_errors(doc)]
        assert not errors, errors[:5]
        return doc

    def until(self, pred, timeout=20.0) -> list[dict]:
        """Documents read until ``pred(doc)`` holds (inclusive)."""
        docs, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            docs.append(self.next(timeout=max(0.1, deadline - time.monotonic())))
            if pred(docs[-1]):
                return docs
        raise AssertionError(f"condition not met in {timeout}s; last document: {json.dumps(docs[-1])[:2000]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=10)
        return self.proc.returncode, out, err


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ, NEURON_STACK_LIVE_DIR=str(tmp_path / "live"), PYTHONPATH=str(ROOT))
    e.pop("NEURON_PROCESS_TAG", None)
    return e


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def start_workload(tmp_path, env, procs, n=150, sleep_s=0.002, tag=None, idle_exit=False):
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    e = dict(env)
    if tag:
        e["NEURON_PROCESS_TAG"] = tag
    if idle_exit:
        e["IDLE_EXIT"] = "1"
    p = subprocess.Popen([sys.executable, str(script), str(n), str(sleep_s)], stdout=subprocess.PIPE, text=True,
                         env=e, cwd=ROOT)
    procs.append(p)
    assert p.stdout.readline().strip() == "ready"
    return p


def write_config(tmp_path, period="250ms", tag_filter=".*", runtime=ALL_RUNTIME,
                 system=("vcpu_usage", "memory_info", "neuron_hw_counters")):
    cfg = {"period": period,
           "neuron_runtimes": [{"tag_filter": tag_filter, "metrics": [{"type": t} for t in runtime]}],
           "system_metrics": [{"type": t} for t in system]}
    path = tmp_path / "monitor.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def runtimes(doc, pid=None):
    return [r for r in doc["neuron_runtime_data"] if pid is None or r["pid"] == pid]


def test_stream_follows_a_workload_field_by_field(tmp_path, env, procs):
    mon = Stream(["-c", write_config(tmp_path)], env)
    try:
        first = mon.next()
        assert runtimes(first) == []  # nothing running yet, and that is not an error
        assert first["neuron_hardware_info"]["error"]  # no device described yet: says so
        n = 150
        w = start_workload(tmp_path, env, procs, n=n)
        # The process started after the monitor: it appears, and its per-period deltas add up.
        seen = mon.until(lambda d: runtimes(d, w.pid) != [])
        docs = seen[-1:]
        def executions(doc):
            return sum(sum(r["report"]["execution_stats"]["execution_summary"].values()) for r in runtimes(doc, w.pid))

        count = executions(docs[0])

        def all_counted(d):  # the per-period deltas add up to exactly what the workload ran
            nonlocal count
            count += executions(d)
            return count == n

        docs += mon.until(all_counted)
        assert w.stdout.readline().strip() == "done"
        # After the work: idle periods report zero executions and null latencies.
        docs += mon.until(lambda d: runtimes(d, w.pid) and runtimes(d, w.pid)[0]["report"]["execution_stats"]
                          ["latency_stats"]["total_latency"] is None
                          and runtimes(d, w.pid)[0]["report"]["neuron_stack"]["cpu_fallbacks"]["count"] == 0
                          and any(runtimes(x, w.pid)[0]["report"]["neuron_stack"]["cpu_fallbacks"]["count"]
                                  for x in docs if runtimes(x, w.pid)))
        ours = [runtimes(d, w.pid)[0] for d in docs if runtimes(d, w.pid)]
        stats = [r["report"]["execution_stats"] for r in ours]
        assert sum(s["execution_summary"]["completed"] for s in stats) == n - n // 25
        assert sum(s["execution_summary"]["timed_out"] for s in stats) == n // 25
        assert sum(s["error_summary"]["numerical"] for s in stats) == 1
        assert all(s["execution_summary"]["failed_to_queue"] == 0 for s in stats)
        active = [s for s in stats if s["latency_stats"]["total_latency"] is not None]
        assert active
        for s in active:
            tl, dl = s["latency_stats"]["total_latency"], s["latency_stats"]["device_latency"]
            values = [tl[p] for p in ("p0", "p1", "p25", "p50", "p75", "p99", "p100")]
            assert values == sorted(values) and 0.001 - 1e-6 <= values[0] and values[-1] <= 0.010 + 1e-6
            assert dl["p100"] == pytest.approx(tl["p100"] / 2, rel=1e-4)
        idle = stats[-1]
        assert idle["latency_stats"] == {"total_latency": None, "device_latency": None}
        assert sum(idle["execution_summary"].values()) == 0

        rt = ours[-1]
        assert rt["neuron_runtime_tag"] == str(w.pid) and rt["address"] == "" and rt["error"] == ""
        counters = [r["report"]["neuroncore_counters"]["neuroncores_in_use"] for r in ours]
        assert all(set(c) <= {"1"} for c in counters) and set(counters[-1]) == {"1"}
        assert max(c.get("1", {}).get("neuroncore_utilization", 0) for c in counters) > 0
        assert max(c.get("1", {}).get("flops", 0) for c in counters) > 0
        assert counters[-1]["1"]["neuroncore_utilization"] == 0  # idle
        mem = rt["report"]["memory_used"]
        used = mem["neuron_runtime_used_bytes"]
        assert used["neuron_device"] == 4096 + 512
        # host: the workload's RSS (its published application_memory is replaced by the measured figure)
        import psutil
        host = used["usage_breakdown"]["host"]
        assert host["dma_buffers"] == 8192 and used["host"] == sum(host.values())
        assert used["host"] == pytest.approx(psutil.Process(w.pid).memory_info().rss, rel=0.05)
        assert used["usage_breakdown"]["neuroncore_memory_usage"]["1"]["constants"] == 4096
        (model,) = mem["loaded_models"]
        assert ((model["name"], model["uuid"], model["model_id"], model["is_running"])
                == ("mlp", "0123abcd", 10001, False))
        sg = model["subgraphs"]["sg_00"]
        assert (sg["neuroncore_index"], sg["neuron_device_index"]) == (1, 0)
        assert sg["memory_used_bytes"]["neuron_device"] == 4608
        ns = [r["report"]["neuron_stack"] for r in ours]
        assert sum(x["recompiles"]["count"] for x in ns) == 3
        assert ns[-1]["recompiles"]["last_reason"] == "x dim 0: 100 -> 101"
        assert ns[-1]["cpu_fallbacks"]["last_op"] == "aten.nonzero.default"
        assert ns[-1]["cores"] == [1] and ns[-1]["target"] == "trn1" and ns[-1]["command"] == "python workload.py"
        peak = {e: max(x["engines"].get("1", {}).get(e, 0) for x in ns) for e in ("tensor", "dma")}
        assert peak["tensor"] > peak["dma"] > 0
        assert ns[-1]["engines"]["1"]["tensor"] == 0
        last = docs[-1]
        hw = last["neuron_hardware_info"]
        assert (hw["neuron_device_type"], hw["neuron_device_count"], hw["neuroncore_per_device_count"],
                hw["error"]) == ("trainium", 16, 2, "")
        assert last["instance_info"]["instance_type"] == "trn1.32xlarge"
        assert last["instance_info"]["instance_id"].startswith("i-")
        assert len(last["system_data"]["neuron_hw_counters"]["neuron_devices"]) == 16
        vcpu = last["system_data"]["vcpu_usage"]
        assert set(vcpu["usage_data"]) == {str(i) for i in range(os.cpu_count())}
        assert last["system_data"]["memory_info"]["memory_total_bytes"] > 0

        # Killed without a chance to clean up: it disappears without an error.
        w.kill()
        w.wait()
        gone = mon.until(lambda d: runtimes(d, w.pid) == [])
        assert all(r["error"] == "" for d in gone for r in d["neuron_runtime_data"])
    finally:
        code, _, err = mon.stop()
    assert code == 0 and "Traceback" not in err


def test_tag_filter_selects_processes(tmp_path, env, procs):
    train = start_workload(tmp_path, env, procs, n=20, tag="train_x")
    infer = start_workload(tmp_path, env, procs, n=20, tag="infer_y")
    mon = Stream(["-c", write_config(tmp_path, tag_filter="^train")], env)
    try:
        docs = [mon.next() for _ in range(3)]
        for d in docs:
            assert [(r["pid"], r["neuron_runtime_tag"]) for r in d["neuron_runtime_data"]] == [(train.pid, "train_x")]
        assert infer.poll() is None  # it runs, it is just filtered out
    finally:
        mon.stop()


def test_groups_follow_the_config(tmp_path, env, procs):
    start_workload(tmp_path, env, procs, n=5)
    cfg = write_config(tmp_path, runtime=["execution_stats"], system=["memory_info"])
    mon = Stream(["-c", cfg], env)
    try:
        doc = mon.until(lambda d: d["neuron_runtime_data"] != [])[-1]
        assert list(doc["neuron_runtime_data"][0]["report"]) == ["execution_stats"]
        assert list(doc["system_data"]) == ["memory_info"]
    finally:
        mon.stop()


def test_sigterm_ends_with_a_complete_last_line(tmp_path, env):
    # Default config: 5 s period, so the only line is the one written on SIGTERM.
    proc = subprocess.Popen([str(BIN / "neuron-monitor"), "--verbose", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert "config (default)" in proc.stderr.readline()  # it is running
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert out.endswith("\n") and len(out.splitlines()) == 1
    doc = json.loads(out)
    assert not list(VALIDATOR.iter_errors(doc))
    assert set(doc["system_data"]) == {"vcpu_usage", "memory_info", "neuron_hw_counters"}
    assert "Traceback" not in err


def test_sigint_too(tmp_path, env):
    proc = subprocess.Popen([str(BIN / "neuron-monitor"), "--verbose", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and len(out.splitlines()) == 1 and json.loads(out)
    assert "Traceback" not in err


def test_closed_pipe_ends_quietly(tmp_path, env):
    cfg = write_config(tmp_path, period="100ms")
    out = subprocess.run(["bash", "-o", "pipefail", "-c", f"'{BIN / 'neuron-monitor'}' -c '{cfg}' | head -1"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert json.loads(out.stdout)["neuron_runtime_data"] == []


def test_once_prints_one_document(tmp_path, env, procs):
    start_workload(tmp_path, env, procs, n=10)
    out = subprocess.run([str(BIN / "neuron-monitor"), "--once", "-c", write_config(tmp_path, period="200ms")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=30)
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()
    doc = json.loads(line)
    assert not list(VALIDATOR.iter_errors(doc))
    assert len(doc["neuron_runtime_data"]) == 1


BAD_CONFIGS = [
    ("missing", None, "not found"),
    ("notjson", "{period: 1s}", "not valid JSON"),
    ("unknown_type", {"system_metrics": [{"type": "gpu_usage"}]},
     "system_metrics[0].type: unknown metric type 'gpu_usage'"),
    ("bad_period", {"period": "fast"}, "period: 'fast' is not a duration"),
    ("bad_group_period", {"neuron_runtimes": [{"metrics": [{"type": "memory_used", "period": "1x"}]}]},
     "neuron_runtimes[0].metrics[0].period"),
    ("bad_regex", {"neuron_runtimes": [{"tag_filter": "(", "metrics": []}]},
     "neuron_runtimes[0].tag_filter: bad regex"),
    ("unknown_key", {"periode": "1s"}, "unknown key 'periode'"),
    ("runtime_group_as_system", {"system_metrics": [{"type": "execution_stats"}]}, "unknown metric type"),
    # issue 37: a config that selects nothing would print empty documents forever
    ("selects_nothing", {"period": "1s"}, "selects no metric group, so every document would be empty"),
    ("empty_metrics", {"neuron_runtimes": [{"tag_filter": ".*", "metrics": []}], "system_metrics": []},
     "list groups in neuron_runtimes[].metrics or system_metrics"),
]


@pytest.mark.parametrize("name,content,expect", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_one_line_before_any_output(tmp_path, env, name, content, expect):
    path = tmp_path / f"{name}.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    out = subprocess.run([str(BIN / "neuron-monitor"), "-c", str(path)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=30)
    assert out.returncode != 0 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuron-monitor: error: "), out.stderr
    assert expect in lines[0]


def test_bad_flag_is_one_line(env):
    out = subprocess.run([str(BIN / "neuron-monitor"), "--verbose", "9"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=30)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "--verbose" in out.stderr


@pytest.mark.skipif(not __import__("shutil").which("jq"), reason="jq not installed")
def test_jq_pipeline_from_the_readme(tmp_path, env, procs):
    w = start_workload(tmp_path, env, procs, n=100000, sleep_s=0.002)
    cfg = write_config(tmp_path, period="300ms")
    cmd = (f"'{BIN / 'neuron-monitor'}' -c '{cfg}' | jq -c --unbuffered "
           "'.neuron_runtime_data[0].report.neuroncore_counters'"
           " | grep -m1 neuroncore_utilization; exit ${PIPESTATUS[0]}")  # neuron-monitor's own status
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    counters = json.loads(out.stdout)
    assert set(counters) == {"period", "neuroncores_in_use", "error"} and w.poll() is None
