"""Host memory, live (issue 36): neuron-monitor's ``memory_used`` host figures and neuron-top's ``Host Used
Memory`` are the workload process's real resident memory (psutil RSS), not the 0.0B they showed."""
import os
import subprocess
import sys
import textwrap

import psutil
import pytest

from monitor.collect import Collector
from monitor.config import load_config
from top.render import memory_summary
from top.snapshot import build_snapshot, human_bytes

pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)

# a real workload on the neuron device, holding ~64 MiB of host tensors, then idle until stdin closes
WORKLOAD = textwrap.dedent("""
    import sys, torch
    x = torch.ones(4, device="neuron"); (x + 1).cpu()
    keep = torch.ones(16 << 20)
    print("ready", flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def workload(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_")}
    env.update(NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"), NEURON_STACK_LIVE_DIR=str(tmp_path / "live"),
               NEURON_STACK_RUNTIME_DIR=str(tmp_path / "cores"))
    w = subprocess.Popen([sys.executable, "-c", WORKLOAD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert w.stdout.readline().strip() == "ready"
        yield w, tmp_path / "live"
    finally:
        w.stdin.close()
        w.wait(timeout=60)


def test_host_used_memory_is_the_process_rss_in_monitor_and_top(workload):
    w, live = workload
    doc = Collector(load_config(None), directory=live).collect()
    rss = psutil.Process(w.pid).memory_info().rss   # the workload is idle: its RSS holds still
    [entry] = [e for e in doc["neuron_runtime_data"] if e["pid"] == w.pid]
    used = entry["report"]["memory_used"]["neuron_runtime_used_bytes"]
    host = used["usage_breakdown"]["host"]
    assert used["host"] == sum(host.values()) == pytest.approx(rss, rel=0.02)
    assert host["application_memory"] > 64 << 20   # the tensors it holds, at least
    # neuron-top's Memory Usage Summary, from the same document: Total is the RSS, App. Memory its part
    snap = build_snapshot(doc)
    [app] = [a for a in snap.apps if a.pid == w.pid]
    assert sum(app.host_memory.values()) == used["host"]
    text = memory_summary(app, 100).plain
    total = text.splitlines()[1][:35]   # the Host column's Total row (Device Used Memory is beside it)
    assert total.startswith("Total") and total.rstrip().endswith(human_bytes(used["host"]))
    assert "App. Memory" in text and human_bytes(host["application_memory"]) in text


def test_a_capture_records_the_process_host_memory_for_the_replay(tmp_path):
    """A profile keeps the process's RSS (HostSampler, HOST_MEMORY mode), so neuron-top --replay's Host Used
    Memory is the process's too, not 0.0B."""
    import traces
    from monitor.replay import Replay

    script = "import torch\nkeep = torch.ones(16 << 20)\nx = torch.ones(8, device='neuron')\n" \
             "for _ in range(3): (x * 2).cpu()\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_")}
    env.update(NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"), NEURON_STACK_LIVE_DIR=str(tmp_path / "live"),
               NEURON_STACK_RUNTIME_DIR=str(tmp_path / "cores"), NEURON_RT_INSPECT_ENABLE="1",
               NEURON_RT_INSPECT_OUTPUT_DIR=str(tmp_path / "out"))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    path = traces.finalize(tmp_path / "out")
    with traces.open(path) as p:
        rows = p.sql("SELECT category, arg_max(bytes, ts_ns) AS bytes FROM memory WHERE location = 'host' "
                     "GROUP BY ALL").to_pylist()
    last = {r["category"]: r["bytes"] for r in rows}
    assert last["application_memory"] > 64 << 20
    with Replay(path, window_s=3600) as replay:
        *_, doc = iter(replay)
    used = doc["neuron_runtime_data"][0]["report"]["memory_used"]["neuron_runtime_used_bytes"]
    assert used["host"] == sum(last.values()) and used["usage_breakdown"]["host"]["application_memory"] == \
        last["application_memory"]
