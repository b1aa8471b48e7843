"""Issue 15 item 3: a process that uses two targets (a trn1 and an inf2 session, two live files) is one
runtime entry: one pid in neuron-monitor, one neuron-top tab, one Prometheus label set, its cores listed."""
from __future__ import annotations

import os
import time

from monitor.collect import Collector
from monitor.config import load_config
from monitor.prometheus import Exporter
from top.snapshot import build_snapshot
from traces.live import LivePublisher


def _session(d, target, itype, core, executions):
    pub = LivePublisher(target=target, instance_type=itype, command="python two_targets.py",
                        hardware={"neuron_device_type": target, "neuroncore_per_device_count": 2,
                                  "neuron_device_count": 16}, directory=d)
    pub.cores = [core]
    for i in range(executions):
        pub.record_execution(core, time.time(), time.time_ns(), 0.002, 0.001, {"tensor": 400_000}, 1e6)
    pub.set_device_memory(core, "runtime_memory", 64 * 2**20)
    pub.model_loaded(name=f"{target}_model", uuid=target, model_id=10 + core, core=core,
                     device_bytes={"constants": 1000 * (core + 1)})
    pub.count_event("compile", op=f"{target}_model")
    pub.flush()
    return pub


def test_two_targets_in_one_process_are_one_runtime(tmp_path):
    collector = Collector(load_config(None), directory=tmp_path)
    pubs = [_session(tmp_path, "trn1", "trn1.32xlarge", 0, 3), _session(tmp_path, "inf2", "inf2.48xlarge", 1, 2)]
    time.sleep(0.05)
    doc = collector.collect()
    runtimes = doc["neuron_runtime_data"]
    assert [r["pid"] for r in runtimes] == [os.getpid()]
    report = runtimes[0]["report"]
    assert report["execution_stats"]["execution_summary"]["completed"] == 5
    assert report["neuron_stack"]["cores"] == [0, 1] and report["neuron_stack"]["compiles"] == 2
    assert report["neuron_stack"]["target"] == "trn1,inf2"
    assert sorted(report["neuroncore_counters"]["neuroncores_in_use"]) == ["0", "1"]
    mem = report["memory_used"]
    assert {m["name"] for m in mem["loaded_models"]} == {"trn1_model", "inf2_model"}
    per_core = mem["neuron_runtime_used_bytes"]["usage_breakdown"]["neuroncore_memory_usage"]
    assert mem["neuron_runtime_used_bytes"]["neuron_device"] == sum(sum(c.values()) for c in per_core.values())

    # neuron-top: one tab besides "all", its vCPU counted once (the same as the process's own)
    snap = build_snapshot(doc)
    assert [a.pid for a in snap.apps[1:]] == [os.getpid()]
    assert snap.apps[1].runtime_vcpu == snap.apps[0].runtime_vcpu

    # Prometheus: one label set per metric and core, so no value is lost
    exp = Exporter()
    exp.update(doc)
    names = [f.name for f in exp.collect()]
    assert names
    tags = {key[6] for key in exp._values["neuroncore_utilization_ratio"]}
    assert len(tags) == 1 and len(exp._values["neuroncore_utilization_ratio"]) == 2
    for p in pubs:
        p.close()


def test_merging_a_period_where_one_target_finished_nothing():
    """One session's latency_stats are null in a period where the other's are not (seen in a replay)."""
    from monitor.merge import merge_runtimes

    def entry(latency):
        stats = {"total_latency": latency, "device_latency": latency}
        return {"pid": 7, "neuron_runtime_tag": "7", "report": {"execution_stats": {
            "period": 1.0, "execution_summary": {"completed": 1 if latency else 0}, "latency_stats": stats}}}
    both = [entry({"p50": 0.002, "p99": 0.003}), entry(None)]
    for runtimes in (both, both[::-1]):
        (merged,) = merge_runtimes(runtimes)
        stats = merged["report"]["execution_stats"]
        assert stats["latency_stats"]["total_latency"] == {"p50": 0.002, "p99": 0.003}
        assert stats["execution_summary"]["completed"] == 1
