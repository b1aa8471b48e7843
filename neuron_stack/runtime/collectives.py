"""Collectives as ring algorithms: their cost, and the ``cc``-engine instructions that record them.

A ring over N ranks moves the data in equal chunks, one hop per step (reference §5.1 for the
link rates, the nccl-tests conventions for the bandwidth figures):

=============== ========= ============ ======================= ==================
operation        steps     chunk         size (algbw = size/t)   busbw / algbw
=============== ========= ============ ======================= ==================
all_reduce       2(N-1)    size / N      per-rank tensor          2(N-1)/N
all_gather       N-1       size / N      gathered (output) size   (N-1)/N
reduce_scatter   N-1       size / N      per-rank input size      (N-1)/N
=============== ========= ============ ======================= ==================

Each step costs ``chunk / B + latency`` where ``B`` is the slowest hop of the ring: a hop
between two cores of one chip runs at the core's DMA rate, a hop between chips of one instance
at the chip's NeuronLink rate, a hop between instances at the instance's EFA rate (all device
profile fields, GB/s == bytes/ns). Rows carry the real profiler's CcOp fields (§3.8):
``operation``, ``algorithm``, ``num_elements``, ``dtype``, ``input_size``, ``output_size``,
``algorithm_bandwidth``, ``bus_bandwidth``, ``replica_group``.

>>> from neuron_stack.device.profiles import get_profile
>>> p = plan("all_reduce", 1024 * 1024, "float32", Group.on_cores([0, 2]), get_profile("trn1"))
>>> p.steps, p.step_bytes, p.link
(2, 2097152, 'neuronlink')
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from neuron_stack.device.profiles import DeviceProfile
from neuron_stack.runtime.rows import ExecutionRow, GraphRow
from traces.ids import new_id

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
               "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}

# operation -> (CcOp operation name, steps(N), bus bandwidth factor(N))
OPERATIONS = {
    "all_reduce": ("AllReduce", lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n),
    "all_gather": ("AllGather", lambda n: n - 1, lambda n: (n - 1) / n),
    "reduce_scatter": ("ReduceScatter", lambda n: n - 1, lambda n: (n - 1) / n),
}

LINK_ORDER = ("dma", "neuronlink", "efa")  # slowest-hop search goes by kind, then by rate


@dataclass(frozen=True)
class Group:
    """The ranks of a collective, as (node, core) in ring order (node = instance index).

    >>> Group.on_cores([0, 1, 2, 3]).size
    4
    """

    ranks: tuple[tuple[int, int], ...]

    @classmethod
    def on_cores(cls, cores, node: int = 0) -> "Group":
        return cls(tuple((node, int(c)) for c in cores))

    @property
    def size(self) -> int:
        return len(self.ranks)

    def hops(self, cores_per_chip: int) -> list[str]:
        """The link kind of each ring hop rank i -> rank i+1 (wrapping)."""
        out = []
        for i, (node, core) in enumerate(self.ranks):
            nnode, ncore = self.ranks[(i + 1) % self.size]
            if nnode != node:
                out.append("efa")
            elif ncore // cores_per_chip != core // cores_per_chip:
                out.append("neuronlink")
            else:
                out.append("dma")
        return out


def link_rate(kind: str, profile: DeviceProfile) -> tuple[float, float]:
    """(bytes per ns, fixed latency ns) of one ring hop of ``kind`` on ``profile``."""
    if kind == "efa":
        return profile.efa_gbps_per_instance, profile.efa_step_latency_ns
    if kind == "neuronlink":
        return profile.neuronlink_gbps_per_chip, profile.neuronlink_step_latency_ns
    return profile.dma_bytes_per_ns, profile.dma_fixed_ns


@dataclass
class Plan:
    """One collective's ring schedule and its CcOp fields (bandwidths in GB/s)."""

    operation: str
    num_elements: int
    dtype: str
    group: Group
    input_size: int
    output_size: int
    steps: int
    step_bytes: int
    step_ns: int
    link: str
    algorithm: str = "ring"
    extra: dict = field(default_factory=dict)

    @property
    def dur_ns(self) -> int:
        return self.steps * self.step_ns

    @property
    def size(self) -> int:
        """The nccl-tests "size" the bandwidths are computed from."""
        return self.output_size if self.operation == "all_gather" else self.input_size

    @property
    def algorithm_bandwidth(self) -> float:
        return self.size / self.dur_ns if self.dur_ns else 0.0

    @property
    def bus_bandwidth(self) -> float:
        return self.algorithm_bandwidth * OPERATIONS[self.operation][2](self.group.size)

    def ccop(self) -> dict:
        """The real profiler's CcOp record for this collective (JSON-able)."""
        return {"operation": OPERATIONS[self.operation][0], "algorithm": self.algorithm,
                "num_elements": self.num_elements, "dtype": self.dtype, "input_size": self.input_size,
                "output_size": self.output_size, "algorithm_bandwidth": round(self.algorithm_bandwidth, 3),
                "bus_bandwidth": round(self.bus_bandwidth, 3),
                "replica_group": [c for _, c in self.group.ranks] if len({n for n, _ in self.group.ranks}) == 1
                else [list(r) for r in self.group.ranks],
                "link": self.link, "steps": self.steps, "dur_ns": self.dur_ns, **self.extra}

    def instruction_rows(self, rel_start_ns: int = 0, node: str = "", pc0: int = 0,
                         queue: str = "cc0", sem_wait_ns: int = 0) -> dict[str, np.ndarray]:
        """The ``cc``-engine rows of one rank, one per ring step, as Schedule table columns.

        ``sem_wait_ns`` is the time this rank waited for the others before the first step.
        """
        n = self.steps
        starts = rel_start_ns + np.arange(n, dtype=np.int64) * self.step_ns
        reduce = np.zeros(n, dtype=np.int64)
        if self.operation in ("all_reduce", "reduce_scatter"):  # reduction steps add one chunk
            k = self.group.size - 1
            reduce[:k] = self.step_bytes // DTYPE_BYTES.get(self.dtype, 4)
        wait = np.zeros(n, dtype=np.int64)
        if n:
            wait[0] = sem_wait_ns
        return {
            "engine": np.full(n, "cc", dtype=object), "queue": np.full(n, queue, dtype=object),
            "opcode": np.full(n, OPERATIONS[self.operation][0], dtype=object),
            "node": np.full(n, node, dtype=object), "pc": np.arange(pc0, pc0 + n, dtype=np.int32),
            "rel_start_ns": starts, "dur_ns": np.full(n, self.step_ns, dtype=np.int64), "flops": reduce,
            "bytes_read": np.full(n, self.step_bytes, dtype=np.int64),
            "bytes_written": np.full(n, self.step_bytes, dtype=np.int64), "sem_wait_ns": wait,
        }

    def event(self, ts_ns: int, run_id: str = "", core: int = 0, wall_ns: int = 0, **extra) -> dict:
        """An ``events`` row of kind ``collective`` whose ``detail`` is the CcOp record."""
        return {"ts_ns": ts_ns, "wall_ns": wall_ns, "dur_ns": self.dur_ns, "run_id": run_id,
                "kind": "collective", "core": core, "detail": json.dumps({**self.ccop(), **extra})}


def plan(operation: str, num_elements: int, dtype: str, group: Group, profile: DeviceProfile) -> Plan:
    """The ring schedule of ``operation`` over ``group`` for a per-rank input of ``num_elements``.

    >>> from neuron_stack.device.profiles import get_profile
    >>> p = plan("all_gather", 256, "bfloat16", Group.on_cores([0, 1]), get_profile("trn1"))
    >>> p.input_size, p.output_size, p.link
    (512, 1024, 'dma')
    """
    if operation not in OPERATIONS:
        raise ValueError(f"unknown collective {operation!r}: use one of {', '.join(OPERATIONS)}")
    if group.size < 1:
        raise ValueError("a collective needs at least one rank")
    n = group.size
    elt = DTYPE_BYTES.get(dtype, 4)
    in_size = int(num_elements) * elt
    out_size = {"all_reduce": in_size, "all_gather": in_size * n, "reduce_scatter": in_size // n}[operation]
    size = out_size if operation == "all_gather" else in_size
    steps = OPERATIONS[operation][1](n)
    if steps == 0:
        return Plan(operation, int(num_elements), dtype, group, in_size, out_size, 0, 0, 0, "none")
    hops = group.hops(profile.cores_per_chip)
    rates = [link_rate(h, profile) for h in hops]
    bw = min(r for r, _ in rates)
    latency = max(lat for _, lat in rates)
    link = min(set(hops), key=lambda h: (link_rate(h, profile)[0], -LINK_ORDER.index(h)))
    chunk = -(-size // n)  # ceil: the last chunk carries the remainder
    step_ns = int(round(chunk / bw + latency))
    return Plan(operation, int(num_elements), dtype, group, in_size, out_size, steps, chunk, step_ns, link)


def synchronise(arrivals_ns: list[int]) -> tuple[int, list[int]]:
    """A collective starts when its last rank arrives: (start, wait of each rank).

    >>> synchronise([100, 250, 120])
    (250, [150, 0, 130])
    """
    start = max(arrivals_ns)
    return start, [start - a for a in arrivals_ns]


# -- recording ---------------------------------------------------------------------------------

@dataclass
class _CollectiveGraph:
    graph_id: int
    recorded: bool = False


_cc_graphs: dict[tuple, _CollectiveGraph] = {}


def record_collective(session, p: Plan, cores: list[int], arrivals_ns: list[int], start_ns: int,
                      tag: str = "") -> None:
    """Record one collective on every participating core: live busy time, and with profiling
    on, an ``executions`` row per core (its own ``graphs`` row, kind ``collective``), the ring's
    ``cc`` instructions (first one carrying the wait for the slowest rank) and a ``collective``
    event with the CcOp fields. ``arrivals_ns`` are when each core was ready.
    """
    dur = p.dur_ns
    for c, arrival in zip(cores, arrivals_ns):   # from its arrival, as its executions row
        session.live.record_execution(core=c, wall_end=time.time(), proj_end_ns=start_ns + dur,
                                      total_latency_s=(start_ns + dur - arrival) / 1e9,
                                      device_latency_s=(start_ns + dur - arrival) / 1e9,
                                      busy_ns={"cc": dur}, flops=0, start_ns=arrival)
    rec = session.recorder
    if rec is None:
        return
    op = p.ccop()["operation"]
    key = (id(rec), op, tuple(cores), p.input_size, p.dtype)
    g = _cc_graphs.setdefault(key, _CollectiveGraph(new_id()))
    name = f"{op}[{','.join(map(str, cores))}]{'/' + tag if tag else ''}"
    if not g.recorded:
        g.recorded = True
        rec.add(GraphRow(graph_id=g.graph_id, run_id=session.run_id, name=name, kind="collective", neff_hash="",
                         input_signature=f"{p.num_elements} x {p.dtype}", target=session.target, flags="{}",
                         num_ops=1, num_device_ops=1, num_instructions=p.steps))
    wall = time.time_ns()
    for c, arrival in zip(cores, arrivals_ns):
        exec_id = new_id()
        wait = start_ns - arrival
        rec.add(ExecutionRow(
            exec_id=exec_id, run_id=session.run_id, graph_id=g.graph_id, core=c, iteration=0,
            wall_start_ns=wall, wall_end_ns=wall, start_ns=arrival, end_ns=start_ns + dur, device_ns=dur + wait,
            warmup=False, flops=0, busy_ns={"cc": dur}, hbm_read_bytes=p.steps * p.step_bytes,
            hbm_write_bytes=p.steps * p.step_bytes))
        rows = p.instruction_rows(rel_start_ns=start_ns, node=name, sem_wait_ns=wait)
        n = len(rows["pc"])
        if n:
            t = pa.table({k: v for k, v in rows.items() if k != "node"})
            t = (t.rename_columns(["start_ns" if k == "rel_start_ns" else k for k in t.column_names])
                 .append_column("exec_id", pa.array(np.full(n, exec_id, dtype=np.int64)))
                 .append_column("core", pa.array(np.full(n, c, dtype=np.int32))))
            rec.append("instructions", t)
        detail = {k: v for k, v in p.ccop().items() if k != "dur_ns"}
        rec.event("collective", ts_ns=start_ns, dur_ns=dur, core=c, graph_id=g.graph_id, **detail, wait_ns=wait)
