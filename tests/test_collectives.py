"""Collective costs by the runtime's algorithm (AWS Neuron collectives pages): the choice by size and topology,
hand-computed cases, and their cc-engine rows and CcOp fields."""
import json

import pyarrow as pa
import pytest

from neuron_stack.device.collective_cost import MESH_MAX_BYTES, RDH_MAX_BYTES, collective_ns, stages
from neuron_stack.device.profiles import get_profile
from neuron_stack.runtime.collectives import Group, plan, synchronise

TRN1, INF2, TRN2 = get_profile("trn1"), get_profile("inf2"), get_profile("trn2")


def _cores(n):
    return [(0, c) for c in range(n)]


def test_ring_is_the_fallback_on_one_chip():
    # 1 Mi fp32 = 4 MiB on cores 0 and 1 (one trn1 chip): past Mesh's range, no chips to pair for RDH or
    # KangaRing. 2(N-1) = 2 steps of 2 MiB at the core's DMA rate (16 x 17 B/ns) + 1.5 us per hop.
    p = plan("all_reduce", 1 << 20, "float32", Group.on_cores([0, 1]), TRN1)
    assert (p.algorithm, p.steps, p.link) == ("Ring", 2, "dma")
    assert p.stages[0].step_bytes == 2097152
    assert p.stages[0].step_ns == round(2097152 / 272 + 1500) == 9210
    assert p.dur_ns == 18420
    assert p.algorithm_bandwidth == pytest.approx(4194304 / 18420)
    assert p.bus_bandwidth == pytest.approx(p.algorithm_bandwidth * 2 * 1 / 2)


def test_rdh_between_two_chips():
    # cores 0 and 2: one rank on each of two chips, a 1-cube. Recursive halving then doubling: 1 step each,
    # 2 MiB each to the neighbour at the core's DMA rate (below the chip's 384 B/ns of NeuronLink).
    p = plan("all_reduce", 1 << 20, "float32", Group.on_cores([0, 2]), TRN1)
    assert (p.algorithm, p.steps, p.link, p.dur_ns) == ("RDH", 2, "neuronlink", 18420)


def test_algorithm_by_size_at_the_documented_boundaries():
    # intra-node page, "sweet range": Mesh < 1 MB, RDH 1-56 MB, KangaRing > 56 MB
    full = _cores(64)
    pick = {b: stages("all_gather", b // 64, full, TRN2)[0].algorithm
            for b in (64 * 1024, MESH_MAX_BYTES - 64, MESH_MAX_BYTES, RDH_MAX_BYTES, RDH_MAX_BYTES + 64)}
    assert list(pick.values()) == ["Mesh", "Mesh", "RDH", "RDH", "KangaRing"]
    # KangaRing only when every rank of each chip is in the group: one rank per chip falls back to Ring
    one_per_chip = [(0, 4 * c) for c in range(16)]
    assert stages("all_gather", (64 << 20) // 16, one_per_chip, TRN2)[0].algorithm == "Ring"
    # RDH needs a hypercube of chips: inf2's 12-chip ring is not one, KangaRing takes RDH's range
    assert stages("all_reduce", 8 << 20, _cores(24), INF2)[0].algorithm == "KangaRing"


def test_small_all_reduce_costs_constant_steps_not_a_ring():
    # a decode all-reduce of a 70B hidden state (8192 bf16 = 16 KiB): 126 ring steps at TP 64; at most 4 Mesh
    # steps (RS + AG, each a routed step and an on-chip step), or 1 single-step Mesh, whatever the group size
    steps = {n: plan("all_reduce", 8192, "bfloat16", Group.on_cores(range(n)), TRN2).steps for n in (8, 16, 32, 64)}
    assert steps == {8: 1, 16: 1, 32: 1, 64: 4}
    p = plan("all_reduce", 8192, "bfloat16", Group.on_cores(range(64)), TRN2)
    assert p.algorithm == "Mesh" and p.dur_ns < 10 * TRN2.intranode_step_latency_ns


def test_single_step_mesh_when_its_extra_bytes_cost_less_than_the_saved_hops():
    small = stages("all_reduce", 8 * 1024, _cores(32), TRN1)[0]
    big = stages("all_reduce", 64 * 1024, _cores(32), TRN1)[0]
    assert (small.algorithm, small.steps, small.step_bytes) == ("SingleStepMesh", 1, 31 * 8 * 1024)
    assert (big.algorithm, big.steps) == ("Mesh", 4)


@pytest.mark.parametrize("profile,n", [(TRN2, 64), (TRN1, 32), (INF2, 24), (TRN1, 2)])
def test_cost_grows_with_bytes(profile, n):
    sizes = [2 ** k for k in range(6, 31)]
    cost = [collective_ns(profile, "all_reduce", b, n) for b in sizes]
    # within each algorithm's size range (a switch may change the slope, never the direction within a range)
    for lo, hi in ((0, MESH_MAX_BYTES), (MESH_MAX_BYTES, RDH_MAX_BYTES + 1), (RDH_MAX_BYTES + 1, 1 << 40)):
        run = [c for b, c in zip(sizes, cost) if lo <= b < hi]
        assert run == sorted(run)
    if profile is TRN2:   # the geometry the page describes: monotone across its boundaries too
        assert cost == sorted(cost)


def test_reduce_scatter_between_instances_uses_efa():
    # one rank per instance: the inter-node stage alone, 2 ranks = a 1-cube: one RDH step of 2 MB over EFA
    # (100 B/ns) + the inter-node page's ~15 us hop
    p = plan("reduce_scatter", 1_000_000, "float32", Group(((0, 0), (1, 0))), TRN1)
    assert (p.algorithm, p.link, p.steps, p.output_size) == ("RDH", "efa", 1, 2_000_000)
    assert p.dur_ns == 2_000_000 / 100 + 15000 == 35000


def test_hierarchical_all_reduce_over_instances():
    # inter-node page: intra-node ReduceScatter + inter-node AllReduce + intra-node AllGather
    g = Group(tuple((n, c) for n in range(2) for c in range(4)))
    p = plan("all_reduce", 4096, "float32", g, TRN1)
    assert [(s.operation, s.link) for s in p.stages] == [
        ("reduce_scatter", "neuronlink"), ("all_reduce", "efa"), ("all_gather", "neuronlink")]
    assert p.algorithm.startswith("Hierarchical(") and p.link == "efa"
    assert p.dur_ns == sum(s.steps * s.step_ns for s in p.stages)


def test_single_rank_is_free_and_bad_operation_is_refused():
    assert plan("all_reduce", 10, "float32", Group.on_cores([3]), TRN1).dur_ns == 0
    assert collective_ns(TRN1, "all_reduce", 1 << 20, 1) == 0
    with pytest.raises(ValueError, match="unknown collective 'all_to_all'"):
        plan("all_to_all", 1, "float32", Group.on_cores([0, 1]), TRN1)


def test_compiler_and_runtime_cost_the_same_collective():
    p = plan("all_reduce", 1 << 16, "bfloat16", Group.on_cores(range(8)), TRN1)
    assert collective_ns(TRN1, "all_reduce", p.input_size, 8) == p.dur_ns


def test_instruction_rows_and_ccop_record():
    p = plan("all_reduce", 1 << 17, "float32", Group.on_cores(range(8)), TRN1)   # 512 KiB over 4 chips: Mesh
    assert (p.algorithm, p.steps) == ("Mesh", 4)
    rows = p.instruction_rows(rel_start_ns=1000, node="all_reduce_1", pc0=10, sem_wait_ns=250)
    table = pa.table(rows)
    assert table.num_rows == p.steps
    assert set(table.column("engine").to_pylist()) == {"cc"}
    starts, durs = table.column("rel_start_ns").to_pylist(), table.column("dur_ns").to_pylist()
    assert starts[0] == 1000 and starts[-1] + durs[-1] == 1000 + p.dur_ns
    assert table.column("pc").to_pylist() == list(range(10, 14))
    assert table.column("sem_wait_ns").to_pylist() == [250, 0, 0, 0]
    # the reduce-scatter half reduces what it receives; the all-gather half only moves data
    chunk = p.stages[0].step_bytes // 4
    assert table.column("flops").to_pylist() == [chunk, chunk, 0, 0]
    rec = json.loads(p.event(ts_ns=5, run_id="r")["detail"])
    assert {k: rec[k] for k in ("operation", "algorithm", "num_elements", "dtype", "input_size", "output_size",
                                "replica_group", "steps")} == {
        "operation": "AllReduce", "algorithm": "Mesh", "num_elements": 1 << 17, "dtype": "float32",
        "input_size": 1 << 19, "output_size": 1 << 19, "replica_group": list(range(8)), "steps": 4}
    assert (rec["algorithm_bandwidth"] > 0
            and rec["bus_bandwidth"] == pytest.approx(rec["algorithm_bandwidth"] * 2 * 7 / 8, rel=1e-3))


def test_synchronise_waits_for_the_straggler():
    assert synchronise([10, 400, 20]) == (400, [390, 0, 380])
