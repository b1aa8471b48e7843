"""DMA timing in the schedule: the fixed ~1.3 us is trigger-to-start latency (the queue moves other
transfers meanwhile), so many 4 KiB-per-partition loads run near peak while small ones stay
overhead-bound, and a lone transfer still takes fixed + bytes / rate (DMA guide, reference §5.4)."""
import pytest

from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.tiles import Lowered, Pool
from neuron_stack.compiler.schedule import schedule_lowered
from neuron_stack.device.profiles import get_profile
from neuron_stack.ir import Program


def _loads(p, per_partition: int, transfers: int, slots: int):
    low = Lowerer(Program("dma", [], [], []), 0, p, {})
    F = per_partition // 4
    pool = Pool(low, "t", "sbuf", 128, F, "float32", bufs=slots)
    for k in range(transfers):
        low.dma("load", pool.tile().op(),
                {"m": "hbm", "b": "x", "dt": "float32", "o": k * 128 * F, "ap": [[F, 128], [1, F]]})
    return schedule_lowered(Lowered(low.instrs, low.hbm, [], [], {}, 0), p)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_efficiency_against_payload(target):
    p = get_profile(target)

    def eff(nbytes):
        s = _loads(p, nbytes, 64, 16)
        return 64 * 128 * nbytes / (s.device_ns * p.lnc * p.dma_bytes_per_ns)   # a logical core's peak

    assert eff(64) < 0.2                 # overhead-bound under 256 B per partition
    assert eff(256) < 0.5
    assert eff(4096) > 0.9               # near peak from 4 KiB
    assert eff(64) < eff(256) < eff(1024) < eff(4096) < eff(8192) <= 1.0


def test_lone_transfer_pays_the_fixed_latency_by_hand():
    p = get_profile("trn1")
    s = _loads(p, 256, 1, 1)             # 128 x 256 B = 32 KiB, 128 descriptors, one queue
    expect = p.dma_fixed_ns + (128 * 256 + 128 * p.dma_desc_overhead_bytes) / p.dma_bytes_per_ns_per_engine
    assert s.device_ns == pytest.approx(expect, abs=2)
    row = s.table.to_pylist()[0]
    assert row["rel_start_ns"] == pytest.approx(p.dma_fixed_ns, abs=1)      # the latency before data moves
    assert row["queue"] == "qSyncIO0"
