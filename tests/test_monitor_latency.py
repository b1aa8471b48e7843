"""neuron-monitor's latency percentiles: numpy's, over exactly the executions of each period (the collector
reads only the new part of each process's execution ring)."""
import numpy as np

from monitor.collect import PERCENTILES, Collector, _percentiles
from monitor.config import load_config
from traces.live import RING_SIZE, LivePublisher


def _record(pub, latencies, start):
    for i, s in enumerate(latencies):
        pub.record_execution(core=0, wall_end=1000.0 + start + i, proj_end_ns=10**12 + (start + i) * 10**6,
                             total_latency_s=float(s), device_latency_s=float(s) / 2, busy_ns={"tensor": 1},
                             flops=1)


def _expected(latencies):
    values = np.asarray(latencies, dtype=np.float32).astype(np.float64)
    return {k: float(round(v, 9)) for (k, _), v in zip(PERCENTILES, np.percentile(values, [p for _, p in PERCENTILES]))}


def test_each_period_has_the_percentiles_of_its_own_executions(tmp_path):
    rng = np.random.default_rng(7)
    pub = LivePublisher(tag="lat", directory=tmp_path)
    pub._stop.set()   # flushed by hand
    collector = Collector(load_config(None), directory=tmp_path)
    first, second = rng.gamma(2.0, 0.002, 300), rng.gamma(3.0, 0.001, RING_SIZE - 7)   # the second wraps
    seen = []
    for start, latencies in ((0, first), (300, second)):
        _record(pub, latencies, start)
        pub.flush()
        (runtime,) = collector.collect()["neuron_runtime_data"]
        stats = runtime["report"]["execution_stats"]
        assert stats["execution_summary"]["completed"] == len(latencies)
        seen.append(stats["latency_stats"]["total_latency"])
        assert seen[-1] == _expected(latencies)
    pub.flush()
    (runtime,) = collector.collect()["neuron_runtime_data"]
    assert runtime["report"]["execution_stats"]["latency_stats"]["total_latency"] is None   # nothing new
    pub.close()


def test_percentiles_are_numpys_to_the_last_bit():
    rng = np.random.default_rng(0)
    for n in [*range(1, 40), 101, 4096]:
        values = rng.random((2, n)) * rng.choice([1e-3, 1.0])
        assert (_percentiles(values) == np.percentile(values, [p for _, p in PERCENTILES], axis=1).T).all()


def test_an_older_publishers_clock_runs_on_past_the_median_gap_of_its_last_executions():
    from traces.live import PUBLISH_DELAY_MAX_S
    ends = np.array([10.0, 10.5, 11.5, 11.75, 13.0])   # gaps 0.5, 1, 0.25, 1.25: median 0.75
    snap = {"proj_now_ns": None, "wall": 13.0, "proj_ns": 5, "proj_wall": 13.0, "ring": {"wall_end": ends}}
    idle = 20.0 - PUBLISH_DELAY_MAX_S - 13.0 - float(np.median(np.diff(ends)))
    assert Collector._proj_now(snap, now=20.0) == int(5 + idle * 1e9)
    two = dict(snap, ring={"wall_end": ends[:2]})   # too few executions for a gap: none is taken off
    assert Collector._proj_now(two, now=20.0) == int(5 + (20.0 - PUBLISH_DELAY_MAX_S - 13.0) * 1e9)
