"""The interval arithmetic behind lod_busy and the DMA active time, against a plain per-row reference."""
from __future__ import annotations

from collections import defaultdict

import duckdb
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

import traces
from traces import intervals, synthetic

row = st.tuples(st.integers(0, 1), st.sampled_from(["tensor", "dma", None]), st.sampled_from(["q0", "q1", None]),
                st.integers(0, 5000), st.integers(0, 900), st.integers(1, 3))


def _table(rows):
    core, engine, queue, start, dur, exec_id = zip(*rows)
    return pa.table({"exec_id": pa.array(exec_id, pa.int64()), "core": pa.array(core, pa.int32()),
                     "engine": pa.array(engine, pa.string()), "queue": pa.array(queue, pa.string()),
                     "start_ns": pa.array(start, pa.int64()), "dur_ns": pa.array(dur, pa.int64())})


def _reference_lod(rows, base, top):
    """Busy ns and starts per (level, lane, bucket), one nanosecond range per row."""
    busy, count = defaultdict(int), defaultdict(int)
    for core, engine, queue, start, dur, _ in rows:
        for level in range(base, top + 1):
            lane = (level, core, engine, queue)
            count[(*lane, start >> level)] += 1
            t, end = start, start + dur
            while t < end:
                edge = min(end, ((t >> level) + 1) << level)
                busy[(*lane, t >> level)] += edge - t
                t = edge
    return {k: (v, count[k]) for k, v in busy.items() if v}


@settings(max_examples=150, deadline=None)
@given(st.lists(row, min_size=1, max_size=60), st.integers(0, 6), st.integers(0, 3), st.integers(1, 7))
def test_lod_pyramid_matches_a_per_row_reference_across_slices(rows, base, levels, slice_rows):
    """Exact per bucket, whatever the row order, slice size (lanes met in later slices) or nulls."""
    original = intervals.LOD_SLICE_ROWS
    intervals.LOD_SLICE_ROWS = slice_rows
    table = _table(rows)
    try:   # the split computed per call, or once for the whole table by the caller (finalise)
        got = [intervals.lod_pyramid(table, base, base + levels, schedules).to_pylist()
               for schedules in (None, intervals.split_schedules(table))]
    finally:
        intervals.LOD_SLICE_ROWS = original
    for pyramid in got:
        assert {(r["level"], r["core"], r["engine"], r["queue"], r["bucket"]): (r["busy_ns"], r["instructions"])
                for r in pyramid} == _reference_lod(rows, base, base + levels)


@settings(max_examples=150, deadline=None)
@given(st.lists(row, min_size=1, max_size=60))
def test_union_active_matches_a_per_nanosecond_reference(rows):
    covered = defaultdict(set)
    for _, engine, _, start, dur, exec_id in rows:
        if engine == "dma":
            covered[(exec_id, engine)].update(range(start, start + dur))
    table = _table(rows)
    for schedules in (None, intervals.split_schedules(table)):
        got = {(r["exec_id"], r["engine"]): r["active_ns"]
               for r in intervals.union_active(table, ("dma",), schedules).to_pylist()}
        assert got == {k: len(v) for k, v in covered.items()}


def test_damaged_intervals_are_left_out_not_overflowed():
    """A damaged trace's start or duration near int64's limit must not wrap the end around."""
    rows = [(0, "dma", "q0", 100, 50, 1), (0, "dma", "q0", (1 << 63) - 10, 100, 1), (0, "dma", "q0", -5, 10, 1),
            (0, "dma", "q0", 200, (1 << 63) - 1, 1)]
    lod = intervals.lod_pyramid(_table(rows), 6, 8).to_pylist()
    assert ({(r["level"], r["bucket"]): r["busy_ns"] for r in lod}
            == {(6, 1): 28, (6, 2): 22, (7, 0): 28, (7, 1): 22, (8, 0): 50})
    assert (intervals.union_active(_table(rows), ("dma",)).to_pylist()
            == [{"exec_id": 1, "engine": "dma", "active_ns": 50}])


@settings(max_examples=100, deadline=None)
@given(st.lists(row, min_size=1, max_size=12), st.lists(st.integers(0, 20_000), min_size=1, max_size=4),
       st.lists(row, max_size=8), st.integers(0, 6), st.integers(0, 3), st.booleans())
def test_repeated_schedules_give_the_per_row_answers(schedule, shifts, other, base, levels, shared_id):
    """Executions replaying one schedule (each its own chunk, shifted in time) are computed once and placed
    per execution: the pyramid and the unions stay exact, next to rows of no schedule (which may share an
    execution id with one: then that execution is not one chunk and goes row by row)."""
    executions = [[(c, e, q, s + shift, d, 100 + i) for c, e, q, s, d, _ in schedule] for i, shift in enumerate(shifts)]
    other = [(c, e, q, s, d, 100 if shared_id else x) for c, e, q, s, d, x in other]
    table = pa.concat_tables([_table(rows) for rows in (*executions, other) if rows])
    original = intervals.REPEAT_MIN_ROWS
    intervals.REPEAT_MIN_ROWS = 1
    try:
        split = intervals.split_schedules(table)
        lod = intervals.lod_pyramid(table, base, base + levels, split).to_pylist()
        union = intervals.union_active(table, ("dma",), split).to_pylist()
    finally:
        intervals.REPEAT_MIN_ROWS = original
    rows = [r for rows in executions for r in rows] + other
    assert all(len(g.exec_ids) > 1 for g in split.groups)
    assert bool(split.groups) or len(shifts) == 1 or (shared_id and other)   # the executions were found
    assert {(r["level"], r["core"], r["engine"], r["queue"], r["bucket"]): (r["busy_ns"], r["instructions"])
            for r in lod} == _reference_lod(rows, base, base + levels)
    covered = defaultdict(set)
    for _, engine, _, start, dur, exec_id in rows:
        if engine == "dma":
            covered[(exec_id, engine)].update(range(start, start + dur))
    assert sorted((r["exec_id"], r["engine"], r["active_ns"]) for r in union) == sorted(
        (*k, len(v)) for k, v in covered.items())


def test_only_identical_schedules_are_shared():
    """Two executions of the same length and sums but different rows are not one schedule."""
    a = [(0, "dma", "q0", 0, 10, 1), (0, "dma", "q1", 5, 20, 1)]
    b = [(0, "dma", "q0", 0, 20, 2), (0, "dma", "q1", 5, 10, 2)]
    original = intervals.REPEAT_MIN_ROWS
    intervals.REPEAT_MIN_ROWS = 1
    try:
        split = intervals.split_schedules(pa.concat_tables([_table(a), _table(b)]))
    finally:
        intervals.REPEAT_MIN_ROWS = original
    assert split.groups == [] and split.rest.num_rows == 4


def test_finalise_with_repeated_schedules_writes_the_same_profile(tmp_path, monkeypatch):
    """Finalise computes a repeated schedule's pyramid, unions and per-op aggregates once: every table of
    the profile is what computing them row by row gives, next to executions of no schedule and a run whose
    executions are too short to be compared."""
    synthetic.write_run(tmp_path, run_id="a", executions=3, instructions=700, cores=(0, 1), seed=1)
    synthetic.write_run(tmp_path, run_id="b", executions=2, instructions=50, seed=2)
    tables = {}
    for min_rows in (64, 10**9):   # split into schedules, and not at all
        monkeypatch.setattr(intervals, "REPEAT_MIN_ROWS", min_rows)
        with duckdb.connect(str(traces.finalize(tmp_path)), read_only=True) as con:
            names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                               "WHERE table_schema = 'main' AND table_type = 'BASE TABLE'").fetchall()]
            tables[min_rows] = {t: con.execute(f'SELECT * FROM "{t}" ORDER BY ALL').fetchall() for t in names
                                if t != "metadata"}
            tables[min_rows]["metadata"] = con.execute(
                "SELECT * FROM metadata WHERE key <> 'finalized_at' ORDER BY ALL").fetchall()
    monkeypatch.setattr(intervals, "REPEAT_MIN_ROWS", 64)
    split = intervals.split_schedules(_instructions(tmp_path))
    assert len(split.groups) == 2 and split.rest.num_rows == 2 * 50   # run a's schedule on cores 0 and 1; run b
    assert tables[64] == tables[10**9] and tables[64]["lod_busy"] and tables[64]["exec_engine_summary"]


def _instructions(directory) -> pa.Table:
    from traces.segments import list_segments, read_segment
    parts = [t for t in (read_segment(p) for p in list_segments(directory)) if t and t[0] == "instructions"]
    return pa.concat_tables([rows for _, rows in parts])
