"""Collective algorithms as the Neuron runtime picks them: which one runs, its steps, its bytes, its time.

Source: the AWS Neuron docs "Intra-node Collective Communications with AWS Neuron" and "Inter-node
Collective Communications with AWS Neuron" (aws-neuron-sdk ``neuron-runtime/explore/intranode-collective-comm.rst``
and ``internode-collective-comm.rst``; "the intra-node page" and "the inter-node page" below). A collective's time
is ``steps x hop latency + bytes on the wire / rate``; the pages give the steps of each algorithm, its traffic per
rank, its link utilisation and the message sizes where the runtime uses it:

============== ================================ ==================================== ============= =================
algorithm       steps (AllReduce = RS + AG)      bytes per rank (C = B / N)           link factor   used (buffer B)
============== ================================ ==================================== ============= =================
Mesh            1 per RS/AG (+1 on-chip step     (N-1) C per RS/AG                    mean hops     B < 1 MiB
                when a chip holds >1 rank)                                            (routed)
SingleStepMesh  1 (AllReduce only)               (N-1) B                              mean hops     B < 1 MiB, if
                                                                                                    cheaper than Mesh
RDH             log2(chips) (+1 on-chip step)    (N-1) C per RS/AG                    1             1-56 MiB, chips a
                per RS/AG                                                                           power of two
KangaRing       N/2 - 1 per RS/AG                2 C per step (primary + secondary)   1             > 56 MiB (or RDH
                                                                                                    n/a), whole chips
Ring            N - 1 per RS/AG                  C per step                           1             fallback only
============== ================================ ==================================== ============= =================

Rates: a routed or hypercube step shares the chip's NeuronLink bandwidth among the group's ranks on that chip
(never more than one core's DMA rate); a ring step runs at its slowest hop (the doc runs several cycles on
disjoint wires for full wire bandwidth: a chip-to-chip hop gets the chip's links, an on-chip hop one core's DMA
rate). Mesh traffic is routed through the chips in between: the link factor is the mean NeuronLink hop count
between the group's chips on the instance's topology (the doc's "link over-subscription"). RDH's partners are
direct neighbours (a 4x4 torus is a 4D hypercube), so its factor is 1 (the doc's occasional on-chip contention is
not modelled). Hop latency: the intra-node page's 1-2 us per Ring/KangaRing hop (we take 1.5 us, the middle, for
every intra-node step) and the inter-node page's ~15 us per EFA hop (device profile fields).

The intra-node page describes trn2 (16 chips x 4 ranks, 2D torus, LNC=2). trn1 (4x4 torus, 2 cores per chip) and
inf2 (12 chips in a ring, 2 cores per chip) are assumed to run the same algorithms over their own geometry: ranks
per chip and chip count from the group, routing hops from the topology; RDH needs a power-of-two chip count on a
hypercube (a torus, or a ring of at most 4 chips), so inf2's 12-chip TP24 group falls to KangaRing in RDH's range.

Groups over several instances run the inter-node page's Hierarchical algorithm (AllReduce = intra-node RS +
inter-node AllReduce + intra-node AG; AllGather = inter AG + intra AG; ReduceScatter = intra RS + inter RS), each
stage picking its algorithm by the same size ranges (the inter-node page gives none: Mesh small, RDH small to
medium, Ring large); Y ranks per instance share its EFA bandwidth.

Which algorithms exist depends on the runtime release (``release``; :data:`RELEASES`). ``latest`` is the pages'
set above. ``2.18`` is Neuron 2.18 (runtime 2.20.22, collectives 2.20.22, April 2024), which ran the published
transformers-neuronx rows on trn1 and inf2 (reference §2.12): its release notes (aws-neuron-sdk
``release-notes/runtime/aws-neuronx-runtime-lib`` and ``aws-neuronx-collectives``) name one intra-node algorithm
besides the Ring, the "AllReduce with All-to-all communication pattern enabled for 16 ranks on TRN1/TRN1N
within the instance (intranode); choice of 16 ranks is limited to NeuronCores 0-15 or 16-31" (runtime 2.15.11,
July 2023; costed here as Mesh, an all-to-all per RS/AG phase), and hierarchical AllReduce and ReduceScatter
across instances (collectives 2.12.22). Mesh as a general intra-node algorithm, RDH ("Introduce RDH algorithm
for inter-node collective communication", runtime 2.26 of Neuron 2.24) and KangaRing came later. So under
``2.18`` every other collective, of any size, runs the Ring: 2(N - 1) hops for an AllReduce over N ranks.

>>> from neuron_stack.device.profiles import get_profile
>>> trn2 = get_profile("trn2")
>>> [(s.algorithm, s.steps) for s in stages("all_reduce", 16 * 1024, [(0, c) for c in range(64)], trn2)]
[('Mesh', 4)]
>>> [(s.algorithm, s.steps) for s in stages("all_reduce", 256 << 20, [(0, c) for c in range(64)], trn2)]
[('KangaRing', 62)]
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from neuron_stack.device.profiles import DeviceProfile

#: the intra-node page's "sweet range (empirically)": Mesh below 1 MB, RDH 1-56 MB, KangaRing above
MESH_MAX_BYTES = 1 << 20
RDH_MAX_BYTES = 56 << 20
OPERATIONS = ("all_reduce", "all_gather", "reduce_scatter")
#: runtime releases whose algorithm sets are modelled (module docstring): the pages' (latest) and Neuron 2.18's
RELEASES = ("latest", "2.18")
#: Neuron 2.18's all-to-all AllReduce: 16 ranks of one trn1 instance, NeuronCores 0-15 or 16-31 (runtime 2.15.11)
_A2A_CORES = (tuple(range(16)), tuple(range(16, 32)))


@dataclass(frozen=True)
class Topology:
    """Where a group's ranks sit: per instance, how many chips and ranks per chip, and how far apart the chips are.

    >>> from neuron_stack.device.profiles import get_profile
    >>> t = Topology.of([(0, c) for c in range(64)], get_profile("trn2"))
    >>> t.ranks, t.chips, t.ranks_per_chip, t.whole_chips, round(t.mean_hops, 2)
    (64, 16, 4, True, 2.13)
    """

    ranks: int
    nodes: int
    chips: int  # per instance
    ranks_per_chip: int
    whole_chips: bool  # every core of each chip it touches is in the group (KangaRing's condition)
    mean_hops: float  # mean NeuronLink hops between two of its chips (1.0 within one chip)
    hypercube: bool  # its chips can pair as a hypercube of direct neighbours (RDH's condition)
    cores: tuple = ()  # the group's cores on its first instance, sorted

    @classmethod
    def of(cls, ranks, p: DeviceProfile) -> Topology:
        ranks = list(ranks)
        nodes = sorted({n for n, _ in ranks})
        local = [c for n, c in ranks if n == nodes[0]]  # groups are symmetric across instances (inter-node page)
        per_chip: dict[int, int] = {}
        for c in local:
            per_chip[c // p.cores_per_chip] = per_chip.get(c // p.cores_per_chip, 0) + 1
        chips = sorted(per_chip)
        pairs = [(a, b) for i, a in enumerate(chips) for b in chips[i + 1:]]
        hops = sum(_chip_hops(a, b, p) for a, b in pairs) / len(pairs) if pairs else 1.0
        k = len(chips)
        cube = k & (k - 1) == 0 and (p.neuronlink_topology == "torus" or k <= 4)
        return cls(len(ranks), len(nodes), k, max(per_chip.values()),
                   all(v == p.cores_per_chip for v in per_chip.values()), hops, cube, tuple(sorted(local)))


def _chip_hops(a: int, b: int, p: DeviceProfile) -> int:
    """NeuronLink hops between chips ``a`` and ``b`` of one instance (2D torus or ring, wrap-around)."""
    if p.neuronlink_topology == "torus":
        side = round(math.sqrt(p.chips_per_instance))
        (ra, ca), (rb, cb) = divmod(a, side), divmod(b, side)
        dr, dc = abs(ra - rb), abs(ca - cb)
        return min(dr, side - dr) + min(dc, side - dc)
    d = abs(a - b)
    return min(d, p.chips_per_instance - d)


@dataclass(frozen=True)
class Stage:
    """One algorithm run: ``steps`` steps of ``step_bytes`` per rank, ``step_ns`` each; the first
    ``reduce_steps`` reduce what they receive. ``operation`` is the stage's own (a Hierarchical AllReduce
    has a ReduceScatter stage)."""

    algorithm: str
    operation: str
    link: str  # dma | neuronlink | efa: the widest link the stage crosses
    steps: int
    step_bytes: int
    step_ns: int
    reduce_steps: int

    @property
    def dur_ns(self) -> int:
        return self.steps * self.step_ns


def _phases(op: str) -> int:
    return 2 if op == "all_reduce" else 1


def _stage(algo, op, link, steps, nbytes_ns, nbytes, latency_ns) -> Stage:
    """A stage from its step count, its bandwidth time and its bytes per rank."""
    total = steps * latency_ns + nbytes_ns
    reduce = {"all_reduce": steps if algo == "SingleStepMesh" else steps // 2, "reduce_scatter": steps}.get(op, 0)
    return Stage(algo, op, link, steps, -(-int(nbytes) // steps), int(round(total / steps)), reduce)


def _intra(algo: str, op: str, B: int, t: Topology, p: DeviceProfile) -> Stage:
    """``algo`` over the group's ranks of one instance, buffer ``B`` (AllReduce/RS input, AG output)."""
    n, r, k = t.ranks // t.nodes, t.ranks_per_chip, t.chips
    C, lat, dma = B / n, p.intranode_step_latency_ns, p.dma_bytes_per_ns
    link = "neuronlink" if k > 1 else "dma"
    share = min(dma, p.neuronlink_gbps_per_chip / r)  # a rank's part of its chip's links
    on_chip = r > 1 and k > 1  # an extra exchange among a chip's ranks
    if algo == "SingleStepMesh":  # every rank sends its whole buffer to every peer, routed; one step
        t_bw = max((n - r) * B * t.mean_hops / share, (r - 1) * B / dma)
        return _stage(algo, op, link, 1, t_bw, (n - 1) * B, lat)
    if algo in ("Mesh", "RDH"):
        # per RS/AG phase: a chip's ranks exchange on chip ((r - 1) k chunks each), and each rank sends
        # (k - 1) chunks to other chips, routed (Mesh: mean hops) or to a neighbour per step (RDH)
        factor = t.mean_hops if algo == "Mesh" else 1.0
        t_bw = _phases(op) * ((r - 1) * k * C / dma + (k - 1) * C * factor / share)
        chip_steps = 1 if algo == "Mesh" or k == 1 else int(math.log2(k))
        steps = _phases(op) * (chip_steps + on_chip)
        return _stage(algo, op, link, steps, t_bw, _phases(op) * (n - 1) * C, lat)
    # a ring step runs at its slowest hop: one core's DMA rate on chip, the chip's NeuronLink between chips
    if algo == "KangaRing":  # primaries (one per pair of a chip's ranks) in a cycle, 2 chunks per step
        hop = min([dma] * (r > 2) + [p.neuronlink_gbps_per_chip] * (k > 1))
        steps = _phases(op) * (n // 2 - 1)
        return _stage(algo, op, link, steps, steps * 2 * C / hop, steps * 2 * C, lat)
    hop = min([dma] * (r > 1) + [p.neuronlink_gbps_per_chip] * (k > 1))
    steps = _phases(op) * (n - 1)  # Ring
    return _stage("Ring", op, link, steps, steps * C / hop, steps * C, lat)


def _inter(algo: str, op: str, B: int, t: Topology, p: DeviceProfile) -> Stage:
    """``algo`` over ``t.nodes`` instances (one rank each per parallel group), buffer ``B``, over EFA."""
    x, y = t.nodes, t.ranks // t.nodes
    C, lat, rate = B / x, p.internode_step_latency_ns, p.efa_gbps_per_instance / y  # y groups share the EFA
    per = B if algo == "SingleStepMesh" else C
    steps = {"Mesh": _phases(op), "SingleStepMesh": 1, "RDH": _phases(op) * int(math.log2(x))}.get(
        algo, _phases(op) * (x - 1))
    nbytes = (1 if algo == "SingleStepMesh" else _phases(op)) * (x - 1) * per
    return _stage(algo, op, "efa", steps, nbytes / rate, nbytes, lat)


def _release_2_18(op: str, B: int, t: Topology, p: DeviceProfile, inter: bool) -> Stage:
    """Neuron 2.18's choice (module docstring): the all-to-all AllReduce on 16 ranks of a trn1 half, else Ring.

    >>> from neuron_stack.device.profiles import get_profile
    >>> trn1 = get_profile("trn1")
    >>> [_release_2_18("all_reduce", 8192, Topology.of([(0, c) for c in cores], trn1), trn1, False).algorithm
    ...  for cores in (range(16), range(32), range(8))]
    ['Mesh', 'Ring', 'Ring']
    """
    if inter:
        return _inter("Ring", op, B, t, p)
    a2a = op == "all_reduce" and p.name == "trn1" and t.nodes == 1 and t.cores in _A2A_CORES
    return _intra("Mesh" if a2a else "Ring", op, B, t, p)


def choose(op: str, B: int, t: Topology, p: DeviceProfile, inter: bool = False, release: str = "latest") -> Stage:
    """The algorithm the runtime ``release`` runs for buffer ``B`` on this group (latest: by the pages' size
    ranges; ``2.18``: :func:`_release_2_18`).

    >>> from neuron_stack.device.profiles import get_profile
    >>> t = Topology.of([(0, c) for c in range(64)], get_profile("trn2"))
    >>> [choose("all_gather", b, t, get_profile("trn2")).algorithm for b in (4096, 8 << 20, 64 << 20)]
    ['Mesh', 'RDH', 'KangaRing']
    """
    if release not in RELEASES:
        raise ValueError(f"unknown runtime release {release!r}: use one of {', '.join(RELEASES)}")
    if release == "2.18":
        return _release_2_18(op, B, t, p, inter)
    run = _inter if inter else _intra
    n = t.nodes if inter else t.ranks // t.nodes
    if B < MESH_MAX_BYTES:
        mesh = run("Mesh", op, B, t, p)
        if op == "all_reduce":  # the pages: single-step Mesh wins while its extra transfer is under a hop
            one = run("SingleStepMesh", op, B, t, p)
            return one if one.dur_ns < mesh.dur_ns else mesh
        return mesh
    cube = n & (n - 1) == 0 if inter else t.hypercube and t.chips > 1
    if B <= RDH_MAX_BYTES and cube:
        return run("RDH", op, B, t, p)
    kanga = not inter and t.whole_chips and t.ranks_per_chip % 2 == 0 and t.chips > 1
    return run("KangaRing" if kanga else "Ring", op, B, t, p)


def stages(operation: str, input_bytes: int, ranks, p: DeviceProfile, release: str = "latest") -> list[Stage]:
    """The stages of ``operation`` on a per-rank input of ``input_bytes`` over ``ranks`` ((node, core) pairs),
    with the algorithms of runtime ``release`` (:data:`RELEASES`).

    >>> from neuron_stack.device.profiles import get_profile
    >>> [(s.algorithm, s.operation, s.link) for s in stages("all_reduce", 1 << 20, [(0, 0), (1, 0)],
    ...                                                      get_profile("trn1"))]
    [('RDH', 'all_reduce', 'efa')]
    """
    if operation not in OPERATIONS:
        raise ValueError(f"unknown collective {operation!r}: use one of {', '.join(OPERATIONS)}")
    t = Topology.of(ranks, p)
    if t.ranks <= 1:
        return []
    B = input_bytes * (t.ranks if operation == "all_gather" else 1)  # the whole buffer
    x, y = t.nodes, t.ranks // t.nodes
    if x == 1:
        return [choose(operation, B, t, p, release=release)]
    plan = {"all_reduce": [("reduce_scatter", B, False), ("all_reduce", B // y, True), ("all_gather", B, False)],
            "all_gather": [("all_gather", B // y, True), ("all_gather", B, False)],
            "reduce_scatter": [("reduce_scatter", B, False), ("reduce_scatter", B // y, True)]}[operation]
    return [choose(op, b, t, p, inter, release) for op, b, inter in plan if inter or y > 1]


def collective_ns(p: DeviceProfile, operation: str, input_bytes: int, world: int) -> int:
    """A collective over the first ``world`` cores of one instance (the compiler's in-graph collectives).

    >>> from neuron_stack.device.profiles import get_profile
    >>> collective_ns(get_profile("trn1"), "all_reduce", 1 << 20, 1)
    0
    """
    return sum(s.dur_ns for s in stages(operation, input_bytes, [(0, c) for c in range(world)], p))
