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
