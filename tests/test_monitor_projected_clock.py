"""neuron-monitor's utilization of a process that serves back to back, driven by a fake clock.

While an execution is simulated the projected clock read by the publisher ran ahead by the simulation's
wall time (the execution's end takes it back): a period that began at such a reading had its projected
span collapse to nothing, and reported the core 100 % busy at about 1e12 FLOP/s (the walkthrough's step 9,
after the compiles). The publisher now says where the clock stands while an execution is in flight.
"""
import pytest

import monitor.collect
import traces.live
from monitor.collect import Collector
from monitor.config import load_config
from top.snapshot import build_snapshot
from traces.live import LivePublisher

HOST_S, SIM_S, DEVICE_S, FLOPS = 0.05, 1.0, 0.01, 10**10   # per execution: host code, simulation, device


class FakeTime:
    """The wall clock of the publisher and the collector (``time.time``/``monotonic``), moved by hand."""

    def __init__(self, t: float):
        self.t = t

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def time_ns(self) -> int:
        return int(self.t * 1e9)


@pytest.fixture
def fake(monkeypatch):
    import time
    clock = FakeTime(time.time())
    monkeypatch.setattr(traces.live, "time", clock)
    monkeypatch.setattr(monitor.collect, "time", clock)
    return clock


def test_back_to_back_serving_is_measured_not_100_percent(tmp_path, fake):
    offset = [0]    # the runtime's projected clock: wall plus an offset each execution's end moves
    pub = LivePublisher(tag="serve", target="trn1", directory=tmp_path,
                        projected_clock=lambda: fake.time_ns() + offset[0])
    pub._stop.set()   # no background flusher: this test flushes at every 0.25 s tick itself
    pub.cores = [0]
    start = fake.t
    flushes = iter(start + 0.25 * i for i in range(1, 10**6))
    next_flush = [next(flushes)]
    periods = iter(start + 3.0 + 5.0 * i for i in range(13))   # neuron-monitor's default 5 s period
    next_period = [next(periods)]
    collector, docs = [None], []

    def run_for(seconds: float) -> None:
        """The wall clock advances: the flusher writes every 0.25 s, neuron-monitor reports every 5 s."""
        end = fake.t + seconds
        while min(next_flush[0], next_period[0]) <= end:
            if next_flush[0] <= next_period[0]:
                fake.t = next_flush[0]
                pub.flush()
                next_flush[0] = next(flushes)
            else:
                fake.t = next_period[0]
                if collector[0] is None:   # started while the process serves, as the walkthrough runs it
                    collector[0] = Collector(load_config(None), directory=tmp_path)
                else:
                    docs.append(collector[0].collect())
                next_period[0] = next(periods, float("inf"))
        fake.t = end

    def execute() -> None:   # as neuron_stack.runtime.model runs one: host code, then the simulation
        run_for(HOST_S)
        proj0 = fake.time_ns() + offset[0]
        pub.execution_started(proj0)
        run_for(SIM_S)
        offset[0] += int((DEVICE_S - SIM_S) * 1e9)   # the simulation's wall time becomes device time
        pub.record_execution(0, fake.t, proj0 + int(DEVICE_S * 1e9), DEVICE_S, DEVICE_S,
                             {"tensor": int(DEVICE_S * 1e9)}, FLOPS, start_ns=proj0)

    while next_period[0] != float("inf"):
        execute()
    pub.close()
    truth = 100 * DEVICE_S / (HOST_S + DEVICE_S)   # of the projected time, the core is busy this share
    seen = []
    for doc in docs:   # periods ending at every phase of an execution
        (entry,) = doc["neuron_runtime_data"]
        core = entry["report"]["neuroncore_counters"]["neuroncores_in_use"]["0"]
        # neuron-top shows the figure of the same document: one number, one function
        app = next(a for a in build_snapshot(doc).apps if a.tag == "serve")
        assert app.average_utilization() == core["neuroncore_utilization"]
        seen.append(core["neuroncore_utilization"])
        assert core["neuroncore_utilization"] <= truth * 1.5, seen
        assert core["flops"] <= FLOPS / (HOST_S + DEVICE_S) * 1.5, core
    # over the periods, every execution's projected time is counted once: the mean is the truth
    assert len(seen) == 12 and sum(seen) / len(seen) == pytest.approx(truth, rel=0.1), seen
