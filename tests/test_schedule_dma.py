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


def test_big_nki_load_spreads_over_the_dma_queues(tmp_path):
    """A 2 MiB ``nl.load`` is one transfer spread over the core's 16 DMA engines, 8 partitions each (SDK
    nki/about/nki-dma-overview.rst): the profile's rows name 16 queues and the load runs near 16 engines' rate,
    not one queue's (it ran 125 us on qSyncIO0 at 17 GB/s)."""
    import numpy as np

    import neuron_stack.nki as nki
    import neuron_stack.nki.language as nl
    import traces

    def load_store(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, t)
        return out

    line = load_store.__code__.co_firstlineno + 2

    prof = nki.profile(working_directory=tmp_path)(load_store)
    x = np.arange(128 * 4096, dtype=np.float32).reshape(128, 4096)
    np.testing.assert_array_equal(prof(x), x)
    with traces.open(prof.profile_path) as pr:
        rows = pr.sql("""SELECT queue, count(*) AS n, sum(bytes_read) AS bytes, min(start_ns) AS t0,
                                max(start_ns + dur_ns) AS t1
                         FROM instructions WHERE opcode = 'DMA_DIRECT2D' AND nki_source_location = ?
                         GROUP BY queue""", [f"test_schedule_dma.py:{line}"]).to_pylist()
    assert len(rows) == 16 and sum(r["bytes"] for r in rows) == x.nbytes
    p = get_profile("trn1")
    span = max(r["t1"] for r in rows) - min(r["t0"] for r in rows)
    assert span < 1.2 * x.nbytes / p.dma_bytes_per_ns          # the core's 16 engines, not one


@pytest.mark.parametrize("quantized", [False, True])
def test_tp_shard_weight_is_k_tiled_and_numbers_match_eager(quantized):
    """A weight whose K-tiles have short rows (96 columns: a tensor-parallel shard) is laid out at compile time
    so each partition's K-tiles are contiguous: one DMA moves several K-tiles, every partition's bytes one run
    (not one [128, 96] tile per DMA with 192 B per partition), and the interpreter's numbers equal eager PyTorch."""
    import json

    import numpy as np
    import torch

    from neuron_stack.compiler.fuse import fuse
    from neuron_stack.compiler.legalize import legalize
    from neuron_stack.compiler.partition import partition
    from neuron_stack.compiler.schedule import build_schedules
    from neuron_stack.frontend.export import capture
    from neuron_stack.isa.interp import run_program

    class Shard(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            if quantized:
                self.register_buffer("w", torch.randint(-100, 100, (96, 512), dtype=torch.int8, generator=g))
            else:
                self.w = torch.nn.Parameter(torch.randn(96, 512, generator=g) / 20)

        def forward(self, x):
            return torch.nn.functional.linear(x, self.w.to(x.dtype) if quantized else self.w)

    model, x = Shard().eval(), torch.randn(1, 512, generator=torch.Generator().manual_seed(1))
    prog = fuse(partition(legalize(capture(model, (x,)))))
    sched = build_schedules(prog, {"auto_cast": "none"})
    got = np.asarray(run_program(prog, {prog.input_names[0]: x.numpy()}, sched)[0], dtype=np.float32)
    ref = model(x).detach().numpy()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
    loads = [json.loads(o) for o in sched[0].table.column("operands").to_pylist()]
    loads = [o for o in loads if o.get("src") and o["src"][0]["m"] == "hbm" and o["src"][0]["b"].endswith("w")]
    assert loads and all(o["src"][0]["ap"] == [[4 * 96, o["src"][0]["ap"][0][1]], [1, 4 * 96]] for o in loads)
    assert sum(o["src"][0]["ap"][0][1] for o in loads) == 128       # 128 partitions, each all 4 K-tiles at once
