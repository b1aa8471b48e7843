"""Ring collective costs on hand-computed cases, and their cc-engine rows and CcOp fields."""
import json

import pyarrow as pa
import pytest

from neuron_stack.device.profiles import get_profile
from neuron_stack.runtime.collectives import Group, plan, synchronise

TRN1 = get_profile("trn1")


def test_all_reduce_two_chips_over_neuronlink():
    # 1 Mi fp32 = 4 MiB per rank, cores 0 and 2 sit on chips 0 and 1: one NeuronLink hop type.
    p = plan("all_reduce", 1 << 20, "float32", Group.on_cores([0, 2]), TRN1)
    # 2(N-1) = 2 steps of 4 MiB / 2 = 2 MiB at 384 B/ns + 2000 ns latency
    assert (p.steps, p.step_bytes, p.link) == (2, 2097152, "neuronlink")
    assert p.step_ns == round(2097152 / 384 + 2000) == 7461
    assert p.dur_ns == 14922
    assert p.algorithm_bandwidth == pytest.approx(4194304 / 14922)
    assert p.bus_bandwidth == pytest.approx(p.algorithm_bandwidth * 2 * 1 / 2)


def test_all_gather_eight_cores_is_limited_by_the_on_chip_hop():
    # cores 0-7 = 4 chips x 2 cores: hops alternate DMA (272 B/ns) and NeuronLink (384 B/ns).
    p = plan("all_gather", 1024, "bfloat16", Group.on_cores(range(8)), TRN1)
    assert (p.input_size, p.output_size, p.steps, p.step_bytes) == (2048, 16384, 7, 2048)
    assert p.link == "dma"
    assert p.step_ns == round(2048 / 272 + 2000) == 2008
    assert p.dur_ns == 7 * 2008
    assert p.bus_bandwidth == pytest.approx(16384 / p.dur_ns * 7 / 8)


def test_reduce_scatter_between_instances_uses_efa():
    g = Group(((0, 0), (1, 0)))
    p = plan("reduce_scatter", 1_000_000, "float32", g, TRN1)
    assert (p.link, p.steps, p.step_bytes, p.output_size) == ("efa", 1, 2_000_000, 2_000_000)
    assert p.step_ns == 2_000_000 / 100 + 15000 == 35000


def test_single_rank_is_free_and_bus_bandwidth_approaches_the_link():
    assert plan("all_reduce", 10, "float32", Group.on_cores([3]), TRN1).dur_ns == 0
    big = plan("all_reduce", 1 << 28, "float32", Group.on_cores([0, 2]), TRN1)
    assert 0.99 * 384 < big.bus_bandwidth < 384
    with pytest.raises(ValueError, match="unknown collective 'all_to_all'"):
        plan("all_to_all", 1, "float32", Group.on_cores([0, 1]), TRN1)


def test_instruction_rows_and_ccop_record():
    p = plan("all_reduce", 4096, "float32", Group.on_cores(range(4)), TRN1)
    rows = p.instruction_rows(rel_start_ns=1000, node="all_reduce_1", pc0=10, sem_wait_ns=250)
    table = pa.table(rows)
    assert table.num_rows == p.steps == 6
    assert set(table.column("engine").to_pylist()) == {"cc"}
    starts = table.column("rel_start_ns").to_pylist()
    assert starts[0] == 1000 and starts[-1] + p.step_ns == 1000 + p.dur_ns
    assert table.column("pc").to_pylist() == list(range(10, 16))
    assert table.column("sem_wait_ns").to_pylist() == [250, 0, 0, 0, 0, 0]
    # reduce-scatter half reduces one chunk per step; the all-gather half only moves data
    assert table.column("flops").to_pylist() == [1024] * 3 + [0] * 3
    rec = json.loads(p.event(ts_ns=5, run_id="r")["detail"])
    assert {k: rec[k] for k in ("operation", "algorithm", "num_elements", "dtype", "input_size", "output_size",
                                "replica_group")} == {
        "operation": "AllReduce", "algorithm": "ring", "num_elements": 4096, "dtype": "float32",
        "input_size": 16384, "output_size": 16384, "replica_group": [0, 1, 2, 3]}
    assert (rec["algorithm_bandwidth"] > 0
            and rec["bus_bandwidth"] == pytest.approx(rec["algorithm_bandwidth"] * 1.5, rel=1e-3))


def test_synchronise_waits_for_the_straggler():
    assert synchronise([10, 400, 20]) == (400, [390, 0, 380])
