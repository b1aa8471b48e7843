"""What the viewers' pages read of a profile (the System Trace, the timeline, replay, the compiler's records),
as methods :class:`traces.query.Profile` inherits: each delegates to its ``traces.q_*`` module, so a page asks the
profile and every figure stays computed once.

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=2, instructions=400)
>>> with traces.open(d) as p:
...     p.timeline_bounds().fit is not None
True
"""
from __future__ import annotations

import pyarrow as pa

from traces import q_chain, q_counters, q_figures, q_records, q_replay, q_system, q_timeline


class PageQueries:
    """The pages' questions; mixed into :class:`traces.query.Profile` (``self`` is the open profile)."""

    # -- the system profile (traces.q_system) --------------------------------------------------
    def system_window(self, t0: int, t1: int, buckets: int, cores=None, names=None, instances=None,
                      per_track: int = q_system.PER_TRACK) -> q_system.SystemWindow:
        """The System Trace's level of detail over ``[t0, t1)``: per track, its events one by one when few,
        else busy and count cells (``traces.q_system.window``). Example: ``p.system_window(a, b, 600).events``."""
        return q_system.window(self, t0, t1, buckets, cores, names, instances, per_track)

    def system_extent(self):
        """First start and last end of the system events (absolute ns), or None. Example: ``p.system_extent()``."""
        return q_system.extent(self)

    def system_event(self, track: int, start_ns: int, name: str) -> dict | None:
        """One system event by track, start and name, with its detail.
        Example: ``p.system_event(0, ts, "nrt_execute")``."""
        return q_system.event_at(self, track, start_ns, name)

    def system_chain(self, track: int, start_ns: int, name: str, limit: int = q_chain.MAX_EVENTS):
        """The Dependency Chain of one system event (by track, start and name): the events it depends on and
        that depend on it, across the framework, runtime and device tracks (``traces.q_chain.chain``), or None.
        Example: ``c = p.system_chain(track, ts, "nrt_execute"); c.events[c.downstream[0]]["name"]``."""
        return q_chain.chain(self, track, start_ns, name, limit)

    def system_facets(self) -> dict:
        """Cores, event names, instances and sources of the system profile. Example: ``p.system_facets()["names"]``."""
        return q_system.facets(self)

    def dropped_events(self) -> dict[str, int]:
        """System events the capture's bounds dropped, by what dropped them: ``framework`` (a torch.profiler
        window's host-event bound), ``system`` (the ``max_events_per_nc`` rings). Example:
        ``p.dropped_events()["framework"]``."""
        meta = self.metadata()
        return {k: int(meta.get(f"{k}_events_dropped") or 0) for k in ("framework", "system")}

    def host_series(self) -> dict:
        """Host CPU %, host memory and HBM in use over time. Example: ``p.host_series()["cpu"]``."""
        return q_system.host_series(self)

    def execution_window(self, exec_id: int):
        """An execution's ``(start_ns, end_ns)``. Example: ``p.execution_window(eid)``."""
        return q_system.execution_window(self, exec_id)

    # -- the timeline (traces.q_timeline) ------------------------------------------------------
    def timeline_bounds(self) -> q_timeline.Bounds:
        """First/last recorded moment, the window a timeline opens on (``.fit``: the executions) and
        instruction statistics (cached: a profile never changes). Example: ``p.timeline_bounds().fit``."""
        if getattr(self, "_bounds", None) is None:
            self._bounds = q_timeline.bounds(self)
        return self._bounds

    def graph_fit(self, graph_ids) -> tuple[int, int] | None:
        """The window a timeline opens on for the executions of ``graph_ids`` (absolute ns; None: none ran).
        Example: ``p.graph_fit([3])``."""
        return q_timeline.graph_fit(self, graph_ids)

    def hfu_track(self, t0: int, t1: int, buckets: int):
        """HFU (%) per bucket over ``[t0, t1)``: the timeline's HFU track (``traces.q_counters.hfu``).
        Example: ``p.hfu_track(t, t + 10**6, 200).max()``."""
        return q_counters.hfu(self, int(t0), int(t1), int(buckets))

    def throttle_track(self, t0: int, t1: int, buckets: int):
        """Share (%) of each bucket's time the Tensor Engine was throttled (``traces.q_counters.throttled``);
        None on a target without the limiter. Example: ``p.throttle_track(t, t + 10**6, 200)``."""
        return q_counters.throttled(self, int(t0), int(t1), int(buckets))

    def memory_track(self, t0: int, t1: int) -> list[tuple[int, int]]:
        """Device memory in use over ``[t0, t1)`` as ``(ts_ns, bytes)`` steps (``traces.q_counters``)."""
        return q_counters.device_memory(self, int(t0), int(t1))

    def search(self, text: str, after: int | None = None, before: int | None = None, limit: int = 50) -> dict:
        """Instructions found by opcode, op, source line or tensor name (``traces.q_counters.search``).
        Example: ``p.search("matmul")["count"]``."""
        return q_counters.search(self, text, after, before, limit)

    def lanes(self) -> pa.Table:
        """Lanes with instructions (core, engine, DMA queue), executing cores (engine NULL) and each core's
        host<->device copies (``dma``, ``traces.vocab.HOST_TRANSFER_QUEUE``). Example: ``p.lanes().to_pylist()``."""
        return q_timeline.lanes(self)

    def lane_cells(self, t0: int, t1: int, buckets: int, core=None, engine=None) -> q_timeline.LaneCells:
        """Busy time, counts and top op per lane (DMA per queue) on an exact grid over ``[t0, t1)``.

        Example: ``cells = p.lane_cells(t, t + 10**6, 800); cells.busy.shape``.
        """
        return q_timeline.lane_cells(self, int(t0), int(t1), int(buckets), core, engine, by_queue=True,
                                     dma_queues_only=True)

    def window_count(self, t0: int, t1: int) -> int:
        """How many instructions overlap ``[t0, t1)``."""
        return q_timeline.window_count(self, t0, t1)

    def window_instructions(self, t0: int, t1: int, limit: int) -> pa.Table:
        """At most ``limit`` instructions overlapping ``[t0, t1)``, in start order."""
        return q_timeline.window_instructions(self, t0, t1, limit)

    def selected_counts(self, t0: int, t1: int, buckets: int, op_ids) -> pa.Table:
        """Per lane and grid cell of ``[t0, t1)``: instructions of ``op_ids`` starting there."""
        return q_timeline.selected_counts(self, t0, t1, buckets, op_ids)

    def spans(self, t0: int, t1: int, cap: int) -> tuple[pa.Table, pa.Table]:
        """(executions, host and compile events) overlapping ``[t0, t1)``, at most ``cap`` each."""
        return q_timeline.spans(self, t0, t1, cap)

    def span_count(self, t0: int, t1: int) -> int:
        """Spans overlapping ``[t0, t1)`` before :meth:`spans`' cap. Example: ``p.span_count(0, 10**9)``."""
        return q_timeline.span_count(self, t0, t1)

    def instruction_at(self, core: int, engine: str, start_ns: int, pc: int | None = None) -> dict | None:
        """One instruction by lane and absolute start time. Example: ``p.instruction_at(0, "tensor", t)``."""
        return q_timeline.instruction_at(self, core, engine, start_ns, pc)

    def range_by_lane(self, t0: int, t1: int) -> pa.Table:
        """Busy ns clipped to ``[t0, t1)`` per core × engine × DMA queue."""
        return q_timeline.range_by_lane(self, t0, t1)

    def range_by_op(self, t0: int, t1: int) -> pa.Table:
        """Busy ns clipped to ``[t0, t1)`` per op."""
        return q_timeline.range_by_op(self, t0, t1)

    # -- replay (traces.q_replay) --------------------------------------------------------------
    def replay_runs(self) -> list[dict]:
        """Recorded processes with their active span (first recorded moment to end)."""
        return q_replay.runs(self)

    def replay_span(self) -> tuple[int, int]:
        """``(first, last)`` recorded moment; :class:`TraceError` when nothing was recorded."""
        return q_replay.span(self)

    def targets(self, include_warmup: bool | None = None) -> list[dict]:
        """Per target: instance type, cores, runtime reservation per core, peak, MFU
        (:func:`traces.q_figures.targets`). Example: ``[t["target"] for t in p.targets()]``."""
        return q_figures.targets(self, include_warmup)

    def core_busy(self, include_warmup: bool = False) -> pa.Table:
        """Per (``target``, ``core``): busy ns, the union of its executions' device intervals
        (:func:`traces.q_figures.core_busy`). Example: ``p.core_busy(include_warmup=True).to_pylist()``."""
        return q_figures.core_busy(self, include_warmup)

    def replay_window(self, t0: int, t1: int) -> q_replay.ReplayWindow:
        """What the profile recorded in ``[t0, t1)`` (busy, finished executions, events, memory).

        Example: ``p.replay_window(lo, lo + 10**9).busy``.
        """
        return q_replay.window(self, t0, t1)

    # -- the compiler's records (traces.q_records) ---------------------------------------------
    def dependencies(self, core: int, queue: str, pc: int, start_ns: int) -> dict:
        """An instruction's predecessors and successors (``Flow``) in its execution; ``{}`` if unknown.

        Example: ``p.dependencies(0, "Tensor", 12, t)["predecessors"][0]["dependency_type"]``.
        """
        return q_records.dependencies(self, core, queue, pc, start_ns)

    def execution_labels(self) -> pa.Table:
        """Each execution's graph, inputs, warm-up flag and device time, for a picker
        (:func:`traces.q_records.execution_labels`). Example: ``p.execution_labels().column("graph")``."""
        return q_records.execution_labels(self)

    def allocation_executions(self) -> pa.Table:
        """Executions with SBUF/PSUM allocation rows. Example: ``p.allocation_executions().column("exec_id")``."""
        return q_records.allocation_executions(self)

    def allocations(self, exec_id: int, memory: str = "SBUF", partition: int | None = None,
                    limit: int = 20_000) -> pa.Table:
        """One execution's SBUF or PSUM allocations. Example: ``p.allocations(x, "PSUM").num_rows``."""
        return q_records.allocations(self, exec_id, memory, partition, limit)

    def tensors(self) -> pa.Table:
        """Every tensor (``TensorInfo``) with its graph and first load. Example: ``p.tensors().num_rows``."""
        return q_records.tensors(self)
