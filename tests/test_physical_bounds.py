"""Issue 31: no figure exceeds what is physically possible, on every recorded sample workload.

A core cannot be busy more than 100 % of the time that passed, an engine cannot be active longer than
the device time it is a share of, and no time is negative. Each sample is recorded once per session
(conftest: ``recorded_samples``); ``tensor_parallel`` is the case that broke it (an all-reduce
execution overlaps the next compute execution on the same core: busy summed was 102 %).
"""
from __future__ import annotations

import pytest
from recorded_samples import WORKLOADS

import traces
from monitor.replay import Replay
from traces.vocab import MONITOR_ENGINES

EPS = 1e-9


@pytest.fixture(scope="module")
def recorded(recorded_samples):
    return recorded_samples.get(*WORKLOADS)


@pytest.mark.parametrize("name", list(WORKLOADS))
@pytest.mark.parametrize("include_warmup", [False, True])
def test_headline_figures_are_physically_possible(recorded, name, include_warmup):
    with traces.open(recorded[name]) as p:
        f = p.figures(include_warmup=include_warmup)
        layers = p.layer_engine_time().to_pylist()
    assert f.device_ns >= 0 and f.step_ns >= f.device_ns and f.span_ns >= 0
    assert 0.0 <= f.device_busy_percent <= 100.0 + EPS, f"{name}: device busy {f.device_busy_percent} %"
    for engine, pct in f.engine_percent.items():
        assert 0.0 <= pct <= 100.0 + EPS, f"{name}: {engine} active {pct} % of device time"
    assert 0.0 <= f.collective_ns <= f.device_ns
    for layer in layers:   # a layer's engine time is part of the profile's device time
        for key, value in layer.items():
            if key.endswith("_ns"):
                assert 0 <= (value or 0) <= f.device_ns, f"{name}: {layer['module_path']} {key}"


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_monitor_replay_percentages_are_physically_possible(recorded, name):
    with Replay(recorded[name], window_s=0.25) as replay:
        for doc in replay:
            hw = doc["neuron_hardware_info"]   # the devices a live monitor reports, not 0
            assert hw["neuron_device_count"] > 0 and hw["neuroncore_per_device_count"] > 0, hw
            for rt in doc["neuron_runtime_data"]:
                report = rt["report"]
                for core, c in report["neuroncore_counters"]["neuroncores_in_use"].items():
                    assert 0.0 <= c["neuroncore_utilization"] <= 100.0, f"{name}: core {core}"
                    for e in MONITOR_ENGINES:
                        assert 0.0 <= report["neuron_stack"]["engines"][core][e] <= 100.0, f"{name}: {core} {e}"
