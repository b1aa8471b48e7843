"""Collectives as the Neuron runtime runs them: their algorithm and cost, and the ``cc``-engine instructions
that record them.

The algorithm (Mesh, single-step Mesh, RDH, KangaRing, Ring; Hierarchical across instances) is chosen per
message size and group topology and costed by :mod:`neuron_stack.device.collective_cost`, after the AWS Neuron
collectives pages (``neuron-runtime/explore/{intranode,internode}-collective-comm.rst``). Bandwidth figures
follow the nccl-tests conventions:

=============== ======================= ==================
operation        size (algbw = size/t)   busbw / algbw
=============== ======================= ==================
all_reduce       per-rank tensor          2(N-1)/N
all_gather       gathered (output) size   (N-1)/N
reduce_scatter   per-rank input size      (N-1)/N
=============== ======================= ==================

Rows carry the real profiler's CcOp fields (§3.8): ``operation``, ``algorithm``, ``num_elements``, ``dtype``,
``input_size``, ``output_size``, ``algorithm_bandwidth``, ``bus_bandwidth``, ``replica_group``; one ``cc``
instruction per algorithm step.

>>> from neuron_stack.device.profiles import get_profile
>>> p = plan("all_reduce", 1024 * 1024, "float32", Group.on_cores([0, 2]), get_profile("trn1"))
>>> p.algorithm, p.steps, p.link
('RDH', 2, 'neuronlink')
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from neuron_stack.device.collective_cost import Stage, stages
from neuron_stack.device.profiles import DeviceProfile
from neuron_stack.runtime.rows import ExecutionRow, GraphRow
from traces.ids import new_id

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
               "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}

# operation -> (CcOp operation name, bus bandwidth factor(N))
OPERATIONS = {
    "all_reduce": ("AllReduce", lambda n: 2 * (n - 1) / n),
    "all_gather": ("AllGather", lambda n: (n - 1) / n),
    "reduce_scatter": ("ReduceScatter", lambda n: (n - 1) / n),
}


@dataclass(frozen=True)
class Group:
    """The ranks of a collective, as (node, core) (node = instance index).

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


@dataclass
class Plan:
    """One collective's algorithm stages and its CcOp fields (bandwidths in GB/s)."""

    operation: str
    num_elements: int
    dtype: str
    group: Group
    input_size: int
    output_size: int
    stages: list[Stage]
    extra: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return sum(s.steps for s in self.stages)

    @property
    def dur_ns(self) -> int:
        return sum(s.dur_ns for s in self.stages)

    @property
    def wire_bytes(self) -> int:
        """Bytes one rank sends over all steps."""
        return sum(s.steps * s.step_bytes for s in self.stages)

    @property
    def algorithm(self) -> str:
        """The CcOp algorithm name: the stage's, or ``Hierarchical(intra/inter/intra)`` across instances."""
        names = [s.algorithm for s in self.stages]
        if any(s.link == "efa" for s in self.stages) and len(names) > 1:
            return f"Hierarchical({'/'.join(names)})"
        return names[0] if names else "none"

    @property
    def link(self) -> str:
        """The widest link the collective crosses: efa, neuronlink, dma (one chip) or none (one rank)."""
        links = {s.link for s in self.stages}
        return next((k for k in ("efa", "neuronlink", "dma") if k in links), "none")

    @property
    def size(self) -> int:
        """The nccl-tests "size" the bandwidths are computed from."""
        return self.output_size if self.operation == "all_gather" else self.input_size

    @property
    def algorithm_bandwidth(self) -> float:
        return self.size / self.dur_ns if self.dur_ns else 0.0

    @property
    def bus_bandwidth(self) -> float:
        return self.algorithm_bandwidth * OPERATIONS[self.operation][1](self.group.size)

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
        """The ``cc``-engine rows of one rank, one per algorithm step, as Schedule table columns.

        ``sem_wait_ns`` is the time this rank waited for the others before the first step.
        """
        elt = DTYPE_BYTES.get(self.dtype, 4)
        dur = np.array([s.step_ns for s in self.stages for _ in range(s.steps)], dtype=np.int64)
        nbytes = np.array([s.step_bytes for s in self.stages for _ in range(s.steps)], dtype=np.int64)
        # the reducing steps add what they received to the rank's own data
        reduce = np.array([s.step_bytes // elt * (i < s.reduce_steps) for s in self.stages for i in range(s.steps)],
                          dtype=np.int64)
        n = len(dur)
        starts = rel_start_ns + np.concatenate([[0], np.cumsum(dur)[:-1]]).astype(np.int64) if n else dur
        wait = np.zeros(n, dtype=np.int64)
        if n:
            wait[0] = sem_wait_ns
        return {
            "engine": np.full(n, "cc", dtype=object), "queue": np.full(n, queue, dtype=object),
            "opcode": np.full(n, OPERATIONS[self.operation][0], dtype=object),
            "node": np.full(n, node, dtype=object), "pc": np.arange(pc0, pc0 + n, dtype=np.int32),
            "rel_start_ns": starts, "dur_ns": dur, "flops": reduce,
            "bytes_read": nbytes, "bytes_written": nbytes.copy(), "sem_wait_ns": wait,
            # each step reads what it sends from HBM and writes what it receives there (wire_bytes each)
            "hbm_read_bytes": nbytes.copy(), "hbm_write_bytes": nbytes.copy(),
        }

    def event(self, ts_ns: int, run_id: str = "", core: int = 0, wall_ns: int = 0, **extra) -> dict:
        """An ``events`` row of kind ``collective`` whose ``detail`` is the CcOp record."""
        return {"ts_ns": ts_ns, "wall_ns": wall_ns, "dur_ns": self.dur_ns, "run_id": run_id,
                "kind": "collective", "core": core, "detail": json.dumps({**self.ccop(), **extra})}


def plan(operation: str, num_elements: int, dtype: str, group: Group, profile: DeviceProfile,
         release: str = "latest") -> Plan:
    """The runtime's schedule of ``operation`` over ``group`` for a per-rank input of ``num_elements``, with the
    algorithms of runtime ``release`` (``latest`` or ``2.18``: :mod:`neuron_stack.device.collective_cost`).

    >>> from neuron_stack.device.profiles import get_profile
    >>> p = plan("all_gather", 256, "bfloat16", Group.on_cores([0, 1]), get_profile("trn1"))
    >>> p.input_size, p.output_size, p.link, p.algorithm
    (512, 1024, 'dma', 'Mesh')
    """
    if operation not in OPERATIONS:
        raise ValueError(f"unknown collective {operation!r}: use one of {', '.join(OPERATIONS)}")
    if group.size < 1:
        raise ValueError("a collective needs at least one rank")
    n = group.size
    in_size = int(num_elements) * DTYPE_BYTES.get(dtype, 4)
    out_size = {"all_reduce": in_size, "all_gather": in_size * n, "reduce_scatter": in_size // n}[operation]
    return Plan(operation, int(num_elements), dtype, group, in_size, out_size,
                stages(operation, in_size, group.ranks, profile, release))


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
    on, an ``executions`` row per core (its own ``graphs`` row, kind ``collective``), the algorithm's
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
            warmup=False, flops=0, busy_ns={"cc": dur}, hbm_read_bytes=p.wire_bytes,
            hbm_write_bytes=p.wire_bytes))
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
