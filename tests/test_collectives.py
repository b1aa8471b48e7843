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


# -- the runtime release's algorithms: Neuron 2.18 (runtime 2.20), which ran AWS's transformers-neuronx rows --

@pytest.mark.parametrize("profile,n", [(INF2, 24), (TRN1, 32), (TRN1, 8)])
def test_neuron_2_18_runs_the_ring_at_every_size(profile, n):
    # its release notes name the Ring and one all-to-all AllReduce (16 ranks of a trn1 half): no Mesh, RDH or
    # KangaRing, so every size runs 2(N - 1) hops for an AllReduce and N - 1 for an AllGather
    for nbytes in (8 * 1024, 1 << 20, 64 << 20):
        ar = plan("all_reduce", nbytes // 2, "bfloat16", Group.on_cores(range(n)), profile, "2.18")
        ag = plan("all_gather", nbytes // 2, "bfloat16", Group.on_cores(range(n)), profile, "2.18")
        assert (ar.algorithm, ar.steps, ag.algorithm, ag.steps) == ("Ring", 2 * (n - 1), "Ring", n - 1)
        assert ar.dur_ns >= plan("all_reduce", nbytes // 2, "bfloat16", Group.on_cores(range(n)), profile).dur_ns


def test_neuron_2_18_ring_by_hand_on_inf2():
    # a decode all-reduce of an 8B hidden state (4096 bf16 = 8 KiB) over inf2's 24 ranks (12 chips, 2 cores
    # each): 46 steps of C = 8192 / 24 bytes at the slower hop (inf2's 192 B/ns of NeuronLink, below the
    # core's 272 B/ns of DMA), each with the intra-node page's 1.5 us
    p = plan("all_reduce", 4096, "bfloat16", Group.on_cores(range(24)), INF2, "2.18")
    total = 46 * 1500 + 46 * (8192 / 24) / 192
    assert p.steps == 46 and p.stages[0].step_ns == round(total / 46) and p.dur_ns == 46 * round(total / 46)
    # the pages' algorithms: a single-step Mesh, about a hop
    assert plan("all_reduce", 4096, "bfloat16", Group.on_cores(range(24)), INF2).dur_ns < 5 * 1500


def test_neuron_2_18_all_to_all_all_reduce_on_a_trn1_half_only():
    # runtime 2.15.11: "AllReduce with All-to-all communication pattern enabled for 16 ranks on TRN1/TRN1N
    # within the instance (intranode); choice of 16 ranks is limited to NeuronCores 0-15 or 16-31"
    def algo(op, cores, profile=TRN1):
        return plan(op, 4096, "bfloat16", Group.on_cores(cores), profile, "2.18").algorithm
    assert algo("all_reduce", range(16)) == algo("all_reduce", range(16, 32)) == "Mesh"
    assert algo("all_reduce", range(8, 24)) == algo("all_gather", range(16)) == "Ring"
    assert algo("all_reduce", range(16), INF2) == "Ring"


def test_neuron_2_18_across_instances_is_hierarchical_with_rings():
    g = Group(tuple((n, c) for n in range(4) for c in range(4)))
    p = plan("all_reduce", 4096, "float32", g, TRN1, "2.18")
    assert [(s.algorithm, s.operation, s.link) for s in p.stages] == [
        ("Ring", "reduce_scatter", "neuronlink"), ("Ring", "all_reduce", "efa"), ("Ring", "all_gather", "neuronlink")]
    assert p.stages[1].steps == 2 * 3


def test_an_unknown_runtime_release_is_refused():
    with pytest.raises(ValueError, match="unknown runtime release '2.5': use one of latest, 2.18"):
        plan("all_reduce", 16, "float32", Group.on_cores(range(4)), TRN1, "2.5")
