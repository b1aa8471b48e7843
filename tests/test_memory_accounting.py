"""Issue 15 item 2: device memory is accounted as the runtime does, and every tool's per-core total is
the sum of its parts. The runtime reserves ``runtime_memory`` (64 MiB) once per NeuronCore, however
many models it loads; a model's own breakdown shows it as 0."""
from __future__ import annotations

from monitor.collect import Collector
from monitor.config import load_config
from monitor.prometheus import CORE_MEMORY, Exporter
from top.snapshot import build_snapshot
from traces.live import LivePublisher

MIB = 2**20
RESERVED = 64 * MIB   # what the compiler plans per model (neuron_stack.compiler.driver.RUNTIME_MEMORY_BYTES)


def _process_with_five_models(d) -> LivePublisher:
    pub = LivePublisher(tag="five", target="trn1", instance_type="trn1.32xlarge", command="python five.py",
                        hardware={"neuron_device_type": "trainium", "neuroncore_per_device_count": 2,
                                  "neuron_device_count": 16},
                        directory=d)
    pub.cores = [0]
    used = dict.fromkeys(("constants", "model_code", "tensors", "runtime_memory"), 0)
    for i in range(5):   # what LoadedModel._reserve_memory publishes for five small models on core 0
        plan = {"constants": 40_000 * (i + 1), "model_code": 9_000, "tensors": 2_048, "runtime_memory": RESERVED}
        for k, v in plan.items():
            used[k] = max(used[k], v) if k == "runtime_memory" else used[k] + v
            pub.set_device_memory(0, k, used[k])
        pub.model_loaded(name=f"m{i}", uuid=f"u{i}", model_id=100 + i, core=0, device_bytes=plan,
                         host_bytes={"constants": plan["constants"]})
    pub.flush()
    return pub


def test_runtime_reservation_counted_once_per_core_in_every_tool(tmp_path):
    pub = _process_with_five_models(tmp_path)
    doc = Collector(load_config(None), directory=tmp_path).collect()
    (rt,) = [r for r in doc["neuron_runtime_data"] if r["neuron_runtime_tag"] == "five"]
    mem = rt["report"]["memory_used"]
    core0 = mem["neuron_runtime_used_bytes"]["usage_breakdown"]["neuroncore_memory_usage"]["0"]
    assert core0["runtime_memory"] == RESERVED                        # once, not 5 x 64 MiB
    models = mem["loaded_models"]
    assert len(models) == 5
    model_parts = sum(sg["memory_used_bytes"]["neuron_device"] for m in models for sg in m["subgraphs"].values())
    assert all(sg["memory_used_bytes"]["usage_breakdown"]["neuron_device"]["runtime_memory"] == 0
               for m in models for sg in m["subgraphs"].values())
    # neuron-monitor: the core's total is its models' parts plus the core's own reservation
    assert sum(core0.values()) == model_parts + RESERVED
    assert mem["neuron_runtime_used_bytes"]["neuron_device"] == sum(core0.values())

    # neuron-top: "Device Used Memory Total" equals the ND row of the detail tree
    snap = build_snapshot(doc)
    app = next(a for a in snap.apps if a.tag == "five")
    (nd,) = app.memory_tree
    assert sum(app.device_memory.values()) == nd.device_bytes == sum(core0.values())
    assert sum(c.device_bytes for c in nd.children) == nd.device_bytes

    # Prometheus: the per-core category gauges add up to the runtime's device total
    exp = Exporter()
    exp.update(doc)
    values = exp._values
    per_core = sum(v for k in CORE_MEMORY for key, v in values[f"neuroncore_memory_usage_{k}"].items()
                   if "five" in key)
    total = next(v for key, v in values["neuron_runtime_memory_used_bytes"].items()
                 if "five" in key and key[-1] == "neuron_device")
    assert per_core == total == sum(core0.values())
    pub.close()
