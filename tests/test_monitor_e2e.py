"""End to end: a real neuron_stack workload (the sample MLP, compiled and executed in a loop by the
runtime) seen by a real ``neuron-monitor`` subprocess, and then by the Prometheus exporter."""
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_monitor import Stream, runtimes

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)

LOOP = r'''
import sys, time
sys.path.insert(0, "sample_workloads")
import torch, neuron_stack
from models import MLP

torch.manual_seed(0)
model = MLP(32, 64, 10).eval()
x = torch.randn(4, 32)
nm = neuron_stack.trace(model, x, target=sys.argv[1])
print("compiled", flush=True)
with torch.no_grad():
    ref = model(x)
while True:   # a serving loop, until stopped
    y = nm(x)
    assert torch.allclose(y, ref, rtol=1e-4, atol=1e-5)
'''


def test_monitor_sees_a_real_runtime_workload(tmp_path):
    env = dict(os.environ, NEURON_STACK_LIVE_DIR=str(tmp_path / "live"), NEURON_STACK_RUNTIME_DIR=str(tmp_path / "rt"),
               NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"), NEURON_PROCESS_TAG="serve_mlp")
    env.pop("NEURON_RT_INSPECT_ENABLE", None)  # profiling off: the live statistics still flow
    script = tmp_path / "serve.py"
    script.write_text(LOOP)
    cfg = tmp_path / "monitor.json"
    cfg.write_text(json.dumps({"period": "500ms", "neuron_runtimes": [{"tag_filter": "^serve_", "metrics": [
        {"type": t} for t in ("neuroncore_counters", "execution_stats", "memory_used", "neuron_stack")]}],
        "system_metrics": [{"type": "memory_info"}]}))
    mon = Stream(["-c", str(cfg)], env)
    work = subprocess.Popen([sys.executable, str(script), "trn2"], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert work.stdout.readline().strip() == "compiled"

        def busy(doc):
            rts = runtimes(doc, work.pid)
            return rts and rts[0]["report"]["execution_stats"]["execution_summary"]["completed"] > 0

        docs = mon.until(busy, timeout=60)
        docs += [mon.next()]
        ours = [runtimes(d, work.pid)[0] for d in docs if runtimes(d, work.pid)]
        rt = ours[-1]
        assert rt["neuron_runtime_tag"] == "serve_mlp"
        rep = rt["report"]
        assert rep["execution_stats"]["execution_summary"]["completed"] > 0
        tl = rep["execution_stats"]["latency_stats"]["total_latency"]
        assert tl is not None and 0 < tl["p0"] <= tl["p50"] <= tl["p100"]
        (core,) = rep["neuroncore_counters"]["neuroncores_in_use"]
        nc = rep["neuroncore_counters"]["neuroncores_in_use"][core]
        assert 0 < nc["neuroncore_utilization"] <= 100 and nc["flops"] > 0
        assert set(nc["v3d"]) == {f"nc_v3.{2 * int(core)}", f"nc_v3.{2 * int(core) + 1}"}  # trn2: LNC=2
        used = rep["memory_used"]["neuron_runtime_used_bytes"]
        assert used["neuron_device"] > 0
        (model,) = rep["memory_used"]["loaded_models"]
        assert model["subgraphs"]["sg_00"]["neuroncore_index"] == int(core)
        ns = [r["report"]["neuron_stack"] for r in ours]
        assert sum(x["compiles"] + x["cache_hits"] for x in ns) == 1
        assert ns[-1]["target"] == "trn2" and ns[-1]["cores"] == [int(core)]
        assert max(sum(e.values()) for x in ns for e in x["engines"].values()) > 0
        hw = docs[-1]["neuron_hardware_info"]
        assert ((hw["neuron_device_type"], hw["neuroncore_version"], hw["logical_neuroncore_config"])
                == ("trainium2", "v3d", 2))
        assert docs[-1]["instance_info"]["instance_type"] == "trn2.48xlarge"

        # The same stream through the exporter.
        exp = subprocess.Popen([str(BIN / "neuron-monitor-prometheus"), "-p", "0"], stdin=subprocess.PIPE,
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        url = exp.stderr.readline().split("serving ", 1)[1].strip()
        exp.stdin.write("".join(json.dumps(d) + "\n" for d in docs))
        exp.stdin.close()
        assert "input ended" in exp.stderr.readline()
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        exp.terminate()
        exp.wait(timeout=10)
        total = sum(r["report"]["execution_stats"]["execution_summary"]["completed"] for r in ours)
        scraped = {(s.name, s.labels.get("status_type")): s for f in text_string_to_metric_families(text)
                   for s in f.samples if s.labels.get("runtime_tag") == "serve_mlp"}
        assert scraped[("execution_status_total", "completed")].value == total
        assert scraped[("neuroncore_utilization_ratio", None)].value == pytest.approx(
            nc["neuroncore_utilization"] / 100)

        work.terminate()
        work.wait(timeout=30)
        mon.until(lambda d: runtimes(d, work.pid) == [], timeout=20)
    finally:
        if work.poll() is None:
            work.kill()
        work.wait()
        code, _, err = mon.stop()
    assert code == 0 and "Traceback" not in err
