"""The interval arithmetic behind lod_busy and the DMA active time, against a plain per-row reference."""
from __future__ import annotations

from collections import defaultdict

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from traces import intervals

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
    try:   # the codes computed per call, or once for the whole table by the caller (finalise)
        got = [intervals.lod_pyramid(table, base, base + levels, lanes).to_pylist()
               for lanes in (None, intervals.lane_codes(table))]
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
    for lanes in (None, intervals.lane_codes(table)):
        got = {(r["exec_id"], r["engine"]): r["active_ns"]
               for r in intervals.union_active(table, ("dma",), lanes).to_pylist()}
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
