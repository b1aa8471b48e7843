"""The runtime's trace rows as typed records: one frozen dataclass per hand-built row, its field
names the columns of the table (``traces/schema.py``), so a misspelt column is a ``TypeError``
where the row is built and ``traces.Writer`` refuses a column its table does not know.

>>> row = EventRow(ts_ns=5, wall_ns=4, run_id="r", kind="load", core=0, graph_id=7)
>>> row.columns()["kind"], row.columns()["detail"]
(['load'], ['{}'])
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from traces.vocab import DEVICE_ENGINES, busy_column


class _Row:
    TABLE: ClassVar[str]

    def columns(self) -> dict[str, list]:
        """``{column: [value]}``, the one-row form :meth:`traces.Writer.append` takes."""
        return {f.name: [getattr(self, f.name)] for f in fields(self)}


@dataclass(frozen=True)
class GraphRow(_Row):
    """One compiled graph (a NEFF loaded by this process, or a collective's pseudo-graph)."""

    TABLE: ClassVar[str] = "graphs"
    graph_id: int
    run_id: str
    name: str
    kind: str                                 # trace | forward | backward | inference | collective
    neff_hash: str
    input_signature: str
    target: str
    flags: str                                # JSON
    compile_wall_ns: int = 0
    compile_ns: int = 0
    cache_hit: bool = False
    recompile_of: int | None = None
    recompile_reason: str | None = None
    source_id: int | None = None
    num_ops: int = 0
    num_device_ops: int = 0
    num_instructions: int = 0


@dataclass(frozen=True)
class ExecutionRow(_Row):
    """One execution of a graph on one core; ``busy_ns`` becomes the ``<engine>_busy_ns`` columns."""

    TABLE: ClassVar[str] = "executions"
    exec_id: int
    run_id: str
    graph_id: int
    core: int
    iteration: int
    wall_start_ns: int
    wall_end_ns: int
    start_ns: int
    end_ns: int
    device_ns: int
    warmup: bool
    flops: int
    busy_ns: dict[str, int] = field(default_factory=dict)
    cpu_fallback_ns: int = 0
    hbm_read_bytes: int = 0
    hbm_write_bytes: int = 0
    status: str = "completed"
    spill_save_bytes: int = 0
    spill_reload_bytes: int = 0
    transpose_flops: int = 0

    def columns(self) -> dict[str, list]:
        # device time and host time never mix: host CPU time is cpu_fallback_ns, not a busy column
        unknown = {e for e, ns in self.busy_ns.items() if ns and e not in DEVICE_ENGINES}
        if unknown:
            raise ValueError(f"busy time for engines {sorted(unknown)}: an execution row has "
                             f"{', '.join(DEVICE_ENGINES)} (host CPU time is cpu_fallback_ns)")
        cols = super().columns()
        del cols["busy_ns"]                  # one column per engine instead, below
        cols.update({busy_column(e): [int(self.busy_ns.get(e, 0))] for e in DEVICE_ENGINES})
        return cols


@dataclass(frozen=True)
class EventRow(_Row):
    """One event (``traces.schema.EVENT_KINDS``); ``detail`` is stored as a JSON object."""

    TABLE: ClassVar[str] = "events"
    ts_ns: int
    wall_ns: int
    run_id: str
    kind: str
    dur_ns: int = 0
    core: int | None = None
    graph_id: int | None = None
    op_id: int | None = None
    source_id: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def columns(self) -> dict[str, list]:
        cols = super().columns()
        cols["detail"] = [json.dumps(self.detail, default=str)]
        return cols


ROW_TYPES = (GraphRow, ExecutionRow, EventRow)
