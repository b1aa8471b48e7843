"""neuron-monitor-prometheus as a user runs it: a captured neuron-monitor stream on stdin, /metrics
scraped over HTTP from 127.0.0.1, names/labels/values checked against the documents."""
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor.collect import Collector
from monitor.config import load_config
from traces.live import LivePublisher

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BASE = {"instance_name", "instance_id", "instance_type", "availability_zone", "region", "subnet_id"}
HW = {"neuron_device_type": "trainium2", "neuron_device_version": "v4", "neuroncore_version": "v3d",
      "neuron_device_count": 16, "neuron_device_memory_size": 96 * 2**30, "neuroncore_per_device_count": 4,
      "logical_neuroncore_config": 2}


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """Three real documents: a runtime working, working more, then gone."""
    d = tmp_path_factory.mktemp("live")
    collector = Collector(load_config(None), directory=d)
    pub = LivePublisher(tag="exp_app", target="trn2", instance_type="trn2.48xlarge", hardware=HW, directory=d)
    pub.cores = [0]
    pub.set_device_memory(0, "constants", 2048)
    pub.set_host_memory("application_memory", 4096)
    proj = time.time_ns()

    def run(n, status="completed"):
        nonlocal proj
        for i in range(n):
            proj += 3_000_000
            pub.record_execution(0, time.time(), proj, 0.002 + i * 1e-4, 0.001, {"tensor": 800_000}, 10**8, status)

    run(10)
    run(2, "timed_out")
    pub.count_error("numerical")
    pub.count_event("recompile", reason="r", source="s.py:1")
    pub.flush()
    time.sleep(0.05)
    doc1 = collector.collect()
    run(5)
    pub.flush()
    time.sleep(0.05)
    doc2 = collector.collect()
    pub.close()
    doc3 = collector.collect()
    return doc1, doc2, doc3


def serve(lines):
    proc = subprocess.Popen([str(BIN / "neuron-monitor-prometheus"), "--port", "0"], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT)
    first = proc.stderr.readline()
    assert "serving http://127.0.0.1:" in first, first
    url = first.split("serving ", 1)[1].strip()
    proc.stdin.write("".join(line + "\n" for line in lines))
    proc.stdin.close()
    err = []
    while True:  # every input line is applied once this line appears
        line = proc.stderr.readline()
        assert line, "exporter ended early: " + "".join(err)
        if "input ended" in line:
            break
        err.append(line)
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    proc.terminate()
    proc.wait(timeout=10)
    return {s.name: s for f in text_string_to_metric_families(text) for s in [f]}, text, err


def samples(fams, name, sample_name=None, **labels):
    fam = fams[name]
    return [s for s in fam.samples if (sample_name is None or s.name == sample_name)
            and all(s.labels.get(k) == v for k, v in labels.items())]


def test_exporter_serves_the_real_metric_names_and_values(stream):
    doc1, doc2, _ = stream
    fams, text, err = serve([json.dumps(doc1), "{not json", json.dumps(doc2)])
    # the malformed line is reported once, in one line, and skipped
    assert len(err) == 1 and "skipped input line 2: not JSON" in err[0]

    for name in ("neuroncore_utilization_ratio", "neuron_runtime_vcpu_usage_ratio", "neuron_runtime_memory_used_bytes",
                 "neuroncore_memory_usage_constants", "neuroncore_memory_usage_model_code",
                 "neuroncore_memory_usage_model_shared_scratchpad", "neuroncore_memory_usage_runtime_memory",
                 "neuroncore_memory_usage_tensors", "execution_latency_seconds", "system_vcpu_count",
                 "system_vcpu_usage_ratio", "system_memory_total_bytes", "system_memory_used_bytes",
                 "system_swap_total_bytes", "system_swap_used_bytes"):
        assert fams[name].type == "gauge", name
    for name in ("execution_errors", "execution_status", "hardware_ecc_events"):
        assert fams[name].type == "counter", name
    # Info metrics, exposed as the real exporter's are: "# TYPE instance_info gauge", value 1
    assert fams["instance_info"].type == "gauge" and fams["neuron_hardware_info"].type == "gauge"
    # every exporter series carries the base labels; runtime ones the runtime tag too
    for fam in fams.values():
        if fam.name.startswith(("python_", "process_")):
            continue
        for s in fam.samples:
            assert BASE <= set(s.labels), s
    inst = doc2["instance_info"]
    (info,) = samples(fams, "instance_info")
    assert info.value == 1
    assert info.labels == {"instance_name": inst["instance_name"], "instance_id": inst["instance_id"],
                           "instance_type": "trn2.48xlarge", "availability_zone": "", "region": "", "subnet_id": ""}
    (hw,) = samples(fams, "neuron_hardware_info")
    assert hw.labels["neuron_device_count"] == "16" and hw.labels["neuroncore_per_device_count"] == "4"

    # counters: the sum of the period deltas of both documents
    tag = {"runtime_tag": "exp_app"}
    (completed,) = samples(fams, "execution_status", "execution_status_total", status_type="completed", **tag)
    assert completed.value == 15
    (timed_out,) = samples(fams, "execution_status", "execution_status_total", status_type="timed_out", **tag)
    assert timed_out.value == 2
    (num,) = samples(fams, "execution_errors", "execution_errors_total", error_type="numerical", **tag)
    assert num.value == 1
    assert 'execution_status_created{' in text and 'execution_errors_created{' in text  # as the client library does
    assert len(samples(fams, "hardware_ecc_events", "hardware_ecc_events_total")) == 16 * 4

    # gauges: the latest document
    rep = doc2["neuron_runtime_data"][0]["report"]
    (util,) = samples(fams, "neuroncore_utilization_ratio", neuroncore="0", **tag)
    assert util.value == pytest.approx(
        rep["neuroncore_counters"]["neuroncores_in_use"]["0"]["neuroncore_utilization"] / 100)
    (p50,) = samples(fams, "execution_latency_seconds", percentile="p50", **tag)
    assert p50.value == pytest.approx(rep["execution_stats"]["latency_stats"]["total_latency"]["p50"])
    assert {s.labels["percentile"] for s in samples(fams, "execution_latency_seconds")} == {
        "p0", "p1", "p25", "p50", "p75", "p99", "p100"}
    (host,) = samples(fams, "neuron_runtime_memory_used_bytes", memory_location="host", **tag)
    # the process's RSS (monitor/collect.py), as the document says: never the 4096 B it published
    assert host.value == rep["memory_used"]["neuron_runtime_used_bytes"]["host"] > 4096
    (const,) = samples(fams, "neuroncore_memory_usage_constants", neuroncore="0", memory_location="None", **tag)
    assert const.value == 2048
    (vcpus,) = samples(fams, "system_vcpu_count")
    assert vcpus.value == len(doc2["system_data"]["vcpu_usage"]["usage_data"])
    (total,) = samples(fams, "system_memory_total_bytes")
    assert total.value == doc2["system_data"]["memory_info"]["memory_total_bytes"]
    assert {s.labels["usage_type"] for s in samples(fams, "system_vcpu_usage_ratio")} == {"user", "system"}
    # our extra group, under its own names
    (rec,) = samples(fams, "neuron_stack_recompiles", "neuron_stack_recompiles_total", **tag)
    assert rec.value == 1
    (tensor,) = samples(fams, "neuron_stack_engine_utilization_ratio", engine="tensor", neuroncore="0", **tag)
    assert 0 < tensor.value <= 1


def test_runtime_metrics_are_cleared_when_no_runtime_runs(stream):
    fams, _, err = serve([json.dumps(d) for d in stream])
    assert err == []
    for name in ("neuroncore_utilization_ratio", "execution_status", "execution_errors",
                 "neuron_runtime_memory_used_bytes", "execution_latency_seconds", "neuroncore_memory_usage_tensors"):
        assert name not in fams or not fams[name].samples, name
    assert samples(fams, "system_memory_total_bytes") and samples(fams, "instance_info")


def test_bad_flags_and_busy_port_are_one_line():
    out = subprocess.run([str(BIN / "neuron-monitor-prometheus"), "--port", "abc"], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=30)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "--port" in out.stderr
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run([str(BIN / "neuron-monitor-prometheus"), "--port", str(port)], capture_output=True,
                             text=True, stdin=subprocess.DEVNULL, timeout=30)
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("neuron-monitor-prometheus: error: cannot serve on 127.0.0.1:") and "--port" in line


def test_grafana_dashboard_queries_only_exported_metrics():
    import re

    from monitor.prometheus import METRICS

    exported = set()
    for name, (kind, _, _) in METRICS.items():
        exported.add({"counter": f"{name}_total", "info": f"{name}_info"}.get(kind, name))
    dash = json.loads((ROOT / "monitor" / "grafana" / "neuron-monitor-dashboard.json").read_text())
    used = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"by \([^)]*\)|\{[^}]*\}|\[[^\]]*\]", "", target["expr"])
            used |= set(re.findall(r"[a-z][a-z0-9_]*", expr)) - {"sum", "avg", "count", "rate"}
    assert used and used <= exported, used - exported
    # the real SDK dashboard's queries are all there
    exprs = {t["expr"] for p in dash["panels"] for t in p["targets"]}
    assert {"avg by (neuroncore) (neuroncore_utilization_ratio)", "count(neuroncore_utilization_ratio > 0)",
            "avg by (percentile) (execution_latency_seconds)", "sum(system_vcpu_count)", "count(instance_info)",
            "avg(system_memory_used_bytes / system_memory_total_bytes)"} <= exprs
