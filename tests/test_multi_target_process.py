"""Issue 15 item 3: a process that uses two targets (a trn1 and an inf2 session, two live files) is one
runtime entry: one pid in neuron-monitor, one neuron-top tab, one Prometheus label set, its cores listed.
Issue 31: inside it, each target keeps its own instance, cores, runtime reservation and peak."""
from __future__ import annotations

import os
import time

import pytest

import traces
from monitor.collect import Collector
from monitor.config import load_config
from monitor.prometheus import Exporter
from top.snapshot import build_snapshot
from traces.live import LivePublisher
from traces.synthetic import TRN1_METADATA, write_run
from traces.writer import Writer

PEAKS = {"trn1": 91.75e12, "inf2": 45.0e12}   # unequal on purpose: each target's MFU uses its own


def _session(d, target, itype, core, executions):
    pub = LivePublisher(target=target, instance_type=itype, command="python two_targets.py",
                        hardware={"neuron_device_type": target, "neuroncore_per_device_count": 2,
                                  "neuron_device_count": 16}, directory=d, peak_flops=PEAKS[target])
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
    # per target: its own instance, core, one 64 MiB runtime reservation and its own peak
    targets = report["neuron_stack"]["targets"]
    assert {t: (b["instance_type"], b["cores"], b["runtime_memory_bytes"], b["peak_flops"])
            for t, b in targets.items()} == {"trn1": ("trn1.32xlarge", [0], {"0": 64 * 2**20}, PEAKS["trn1"]),
                                             "inf2": ("inf2.48xlarge", [1], {"1": 64 * 2**20}, PEAKS["inf2"])}
    for b in targets.values():
        assert b["mfu_percent"] == 100 * b["model_flops"] / (b["peak_flops"] * b["device_ns"] / 1e9) > 0

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


def test_each_target_has_its_own_instance_and_peak(tmp_path):
    """Issue 31: a process with trn1 and trn2 sessions (peaks differ) names both instances, and each
    target's MFU, and the profile's, use each target's own peak (not one peak for both)."""
    targets = {"trn1": ("trn1.32xlarge", 91.75e12), "trn2": ("trn2.48xlarge", 78.64e12)}
    for i, (target, (itype, peak)) in enumerate(targets.items()):
        own = {"instance_type": itype, "tensor_engine_peak_bf16_flops": str(peak)}
        start = 1_750_000_000_000_000_000 + i * 10**9
        meta = {**TRN1_METADATA, **own, "target": target, **{f"target.{target}.{k}": v for k, v in own.items()}}
        w = Writer(tmp_path, run={"run_id": target, "pid": 7, "tag": "7", "target": target, "start_ns": start,
                                  "command": "python two.py"}, metadata=meta)
        write_run(tmp_path, writer=w, run_id=target, executions=3, instructions=100, seed=i, start_ns=start)
        w.close()
    with traces.open(traces.finalize(tmp_path)) as p:
        figures, per_target = p.figures(), p.targets()
    assert [(t["target"], t["instance_type"], t["peak_flops"]) for t in per_target] == \
        [(t, itype, peak) for t, (itype, peak) in targets.items()]
    for t in per_target:
        assert t["mfu_percent"] == pytest.approx(100 * t["model_flops"] / (t["peak_flops"] * t["device_ns"] / 1e9))
    # the profile's MFU: every model FLOP over what each target's peak could do in its device time
    available = sum(t["peak_flops"] * t["device_ns"] / 1e9 for t in per_target)
    assert figures.mfu_percent == pytest.approx(100 * sum(t["model_flops"] for t in per_target) / available)
    assert figures.cores == 2   # core 0 of each instance
