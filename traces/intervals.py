"""Vectorised interval arithmetic over the instruction rows, run by finalise on the Arrow data.

Two derived results need every instruction interval: the level-of-detail pyramid (busy ns per
lane in power-of-two buckets, split exactly at bucket edges) and the active time of engines whose
queues overlap (the union of their intervals). Both are a handful of numpy passes and
``bincount`` s here, with no Python loop per row: measured several times cheaper than the same
work as SQL hash aggregates and window functions (bench/ingest.py).

>>> import pyarrow as pa
>>> t = pa.table({"exec_id": [1, 1, 1], "core": pa.array([0, 0, 0], pa.int32()),
...               "engine": ["dma", "dma", "tensor"], "queue": ["q0", "q1", "tensor"],
...               "start_ns": [0, 50, 0], "dur_ns": [100, 100, 70]})
>>> union_active(t, ("dma",)).to_pylist()
[{'exec_id': 1, 'engine': 'dma', 'active_ns': 150}]
>>> lod = lod_pyramid(t, base=6, top=7)
>>> sorted((r["level"], r["queue"], r["bucket"], r["busy_ns"]) for r in lod.to_pylist())[:3]
[(6, 'q0', 0, 64), (6, 'q0', 1, 36), (6, 'q1', 0, 14)]
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The pyramid's rows; engine and queue dictionary-encoded (a few lanes repeated over many rows: DuckDB
#: reads them as VARCHAR, without a string per row being built first).
LOD_SCHEMA = pa.schema([("level", pa.int16()), ("core", pa.int32()), ("engine", pa.dictionary(pa.int32(), pa.string())),
                        ("queue", pa.dictionary(pa.int32(), pa.string())), ("bucket", pa.int64()),
                        ("busy_ns", pa.int64()), ("instructions", pa.int64())])
UNION_SCHEMA = pa.schema([("exec_id", pa.int64()), ("engine", pa.string()), ("active_ns", pa.int64())])


#: Interval ends are computed in int64: a start or duration beyond this (only a damaged trace has
#: one; ns since 1970 stay below 2**61 until 2043) is left out rather than allowed to overflow.
MAX_NS = 1 << 62


def valid_intervals(rows: pa.Table) -> pa.Table:
    """Rows with an interval that can be placed in time: no null start or duration, start and
    duration in [0, MAX_NS) (a negative duration counts as zero)."""
    start, dur = rows["start_ns"], rows["dur_ns"]
    if start.null_count == 0 and dur.null_count == 0 and len(start):
        lo, hi = (v.as_py() for v in pc.min_max(start).values())
        if 0 <= lo and hi < MAX_NS and pc.max(dur).as_py() < MAX_NS:
            return rows  # the usual case: one min/max pass, no copy
    # (numpy conversion goes by null_count too: an array with nulls would become floats)
    return rows.filter(pc.and_kleene(pc.and_kleene(pc.is_valid(start), pc.is_valid(dur)),
                                     pc.and_kleene(pc.and_kleene(pc.greater_equal(start, 0), pc.less(start, MAX_NS)),
                                                   pc.less(dur, MAX_NS))), null_selection_behavior="drop")


def _codes(column) -> tuple[np.ndarray, list]:
    """Small integer codes and their values for a low-cardinality column (nulls get their own code).

    Each distinct chunk is encoded once: the runtime stamps a graph's static schedule once per execution,
    so a trace's chunks of a string column repeat, and comparing a chunk with one seen before costs a
    fraction of hashing its strings again.

    >>> codes, values = _codes(pa.chunked_array([["pe", "dma"], ["pe", "dma"], ["act", None]]))
    >>> codes.tolist(), values
    ([0, 1, 0, 1, 2, 3], ['pe', 'dma', 'act', None])
    """
    column = column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column])
    if pa.types.is_integer(column.type) and column.null_count == 0 and len(column):
        values = column.to_numpy().astype(np.int64)   # small ints (cores): offset, no hashing
        lo, hi = int(values.min()), int(values.max())
        if hi - lo < 4096:
            return values - lo, list(range(lo, hi + 1))
    index: dict = {}                   # value -> code, over the whole column
    seen: dict[tuple, list] = {}       # (length, bytes) -> [(chunk, its codes)]: chunks already encoded
    parts = []
    for chunk in column.chunks:
        similar = seen.setdefault((len(chunk), chunk.nbytes), [])
        codes = next((c for prev, c in similar if prev.equals(chunk)), None)
        if codes is None:
            local = pc.dictionary_encode(chunk, null_encoding="encode")
            remap = np.array([index.setdefault(v, len(index)) for v in local.dictionary.to_pylist()], np.int64)
            codes = remap[local.indices.to_numpy(zero_copy_only=False)]
            if len(similar) < 4:       # a few distinct schedules of one size; a trace of unique chunks stays linear
                similar.append((chunk, codes))
        parts.append(codes)
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), list(index)


def lane_codes(rows: pa.Table) -> dict[str, tuple[np.ndarray, list]]:
    """:func:`_codes` of the lane columns (``core``, ``engine``, ``queue``) over the whole table, computed once
    per part by :func:`split_schedules` for :func:`lod_pyramid` and :func:`union_active` to share (hashing the
    strings was most of their cost).

    >>> codes = lane_codes(pa.table({"core": [0, 0], "engine": ["dma", "pe"], "queue": ["q", "pe"]}))
    >>> codes["engine"][0].tolist(), codes["engine"][1]
    ([0, 1], ['dma', 'pe'])
    """
    return {c: _codes(rows[c]) for c in ("core", "engine", "queue")}


#: Rows per slice the pyramid is built from: small enough that every numpy temporary stays in
#: the CPU cache (whole-table arrays of 10 M rows run about twice as slow), big enough to amortise.
LOD_SLICE_ROWS = 1 << 17
#: An execution is matched against others replaying its schedule only from this many rows: a short one
#: (an eager op) is cheaper binned row by row than compared.
REPEAT_MIN_ROWS = 4096


class Schedule(NamedTuple):
    """Executions replaying one schedule: ``rows``, one execution's rows (a zero-copy slice) and their
    :func:`lane_codes`; per execution (``rows``' own first) its ``exec_id`` and its shift in ``start_ns``."""
    rows: pa.Table
    lanes: dict
    shifts: np.ndarray
    exec_ids: np.ndarray


class Schedules(NamedTuple):
    """Rows split by :func:`split_schedules`: the repeated ``groups`` and the ``rest`` (with its lane codes)."""
    groups: list[Schedule]
    rest: pa.Table
    rest_lanes: dict


def split_schedules(rows: pa.Table) -> Schedules:
    """``rows`` (valid intervals) split into executions that replay one schedule shifted in time, per
    schedule, and the rest, each with its :func:`lane_codes`.

    The runtime stamps a graph's static schedule once per execution, so its executions' rows differ
    only in ``start_ns`` by one offset (and in ``exec_id``): the pyramid and the interval unions of such
    a schedule are computed once, and each execution is placed by its shift. An execution here is a
    chunk of one ``exec_id`` that no other row has (the writer appends each execution's rows as one),
    of at least ``REPEAT_MIN_ROWS`` rows; chunks are grouped by a cheap fingerprint and then compared in
    full (every column but ``exec_id`` and ``start_ns``), so a group only ever holds identical schedules.
    Reads zero-copy views of the chunks: no copy of the whole table. Example:
    ``split_schedules(valid_intervals(instructions)).groups``.
    """
    column = rows["exec_id"]
    heads, sizes, ids, others = [], [], [], []
    if rows.num_rows >= 2 * REPEAT_MIN_ROWS and not column.null_count:
        at = np.r_[0, np.cumsum([len(c) for c in column.chunks])].tolist()
        for i, chunk in enumerate(column.chunks):
            lo, hi = (v.as_py() for v in pc.min_max(chunk).values()) if len(chunk) >= REPEAT_MIN_ROWS else (0, 1)
            if lo == hi:   # a long chunk of one execution
                heads.append(at[i]), sizes.append(len(chunk)), ids.append(lo)
            else:
                others.append(chunk)
    ids = np.array(ids, np.int64)
    _, inverse, times = np.unique(ids, return_inverse=True, return_counts=True)
    alone = times[inverse] == 1
    if others and len(ids):   # an execution also met outside its chunk is not one chunk
        alone &= ~pc.is_in(pa.array(ids), value_set=pc.unique(pa.chunked_array(others))).to_numpy(False)
    found: dict[tuple, list[list[int]]] = {}   # fingerprint -> groups of indices into heads
    for k in np.flatnonzero(alone).tolist():
        part = rows.slice(heads[k], sizes[k])
        start = part["start_ns"].to_numpy()
        key = (sizes[k], pc.sum(part["dur_ns"]).as_py(), int((start - start[0]).sum()))
        groups = found.setdefault(key, [])
        group = next((g for g in groups if _same_schedule(rows.slice(heads[g[0]], sizes[k]), part)), None)
        if group is None:
            groups.append([k])
        else:
            group.append(k)
    kept = [np.array(g) for groups in found.values() for g in groups if len(g) > 1]
    if not kept:
        return Schedules([], rows, lane_codes(rows))
    heads, sizes = np.array(heads), np.array(sizes)
    out = []
    for g in kept:
        first = rows.slice(heads[g[0]], sizes[g[0]])
        shifts = np.array([rows["start_ns"][h].as_py() for h in heads[g].tolist()]) - first["start_ns"][0].as_py()
        out.append(Schedule(first, lane_codes(first), shifts, ids[g]))
    taken = np.sort(np.concatenate(kept))
    lo, hi = np.r_[0, heads[taken] + sizes[taken]], np.r_[heads[taken], rows.num_rows]   # the rest: in between
    rest = pa.concat_tables([rows.slice(a, b - a) for a, b in zip(lo.tolist(), hi.tolist())])   # zero-copy
    return Schedules(out, rest, lane_codes(rest))


def _same_schedule(a: pa.Table, b: pa.Table) -> bool:
    """Whether two executions' rows are the same but for ``exec_id`` and one shift of ``start_ns`` (every
    other column compared, so what finalise aggregates per execution is the same too)."""
    sa, sb = a["start_ns"].to_numpy(), b["start_ns"].to_numpy()
    return (all(a[c].equals(b[c]) for c in a.column_names if c not in ("exec_id", "start_ns"))
            and np.array_equal(sa - sa[0], sb - sb[0]))


def _span(rows: pa.Table) -> tuple[int, int]:
    """(first start, last end) of valid rows, a zero duration counting as 1 ns (the bucket it starts in)."""
    ends = pc.add(rows["start_ns"], pc.max_element_wise(rows["dur_ns"], 1))
    return int(pc.min(rows["start_ns"]).as_py()), int(pc.max(ends).as_py())


class _Grid:
    """Busy ns and instruction starts per (lane, base bucket) of the pyramid; lanes get a row as met."""

    def __init__(self, first: int, width: int):
        self.first, self.lane_row = first, {}
        self.busy, self.count = np.zeros((8, width)), np.zeros((8, width), dtype=np.int64)

    def rows(self, lanes: dict, part=slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """(grid row of each lane met in rows ``part`` of ``lanes``, each row's index into those)."""
        (core, cores), (engine, engines), (queue, queues) = (lanes[c] for c in ("core", "engine", "queue"))
        composite = (core[part] * len(engines) + engine[part]) * len(queues) + queue[part]
        used = np.flatnonzero(np.bincount(composite))
        rows = np.array([self.lane_row.setdefault((cores[(c // len(queues)) // len(engines)],
                                                   engines[(c // len(queues)) % len(engines)],
                                                   queues[c % len(queues)]), len(self.lane_row))
                         for c in used.tolist()], dtype=np.int64)
        if len(self.lane_row) > len(self.busy):
            grow = max(len(self.lane_row), 2 * len(self.busy)) - len(self.busy)
            self.busy, self.count = (np.pad(a, ((0, grow), (0, 0))) for a in (self.busy, self.count))
        remap = np.zeros(int(composite.max()) + 1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        return rows, remap[composite]

    def add(self, rows: np.ndarray, lo: int, busy: np.ndarray, count: np.ndarray) -> None:
        """Add ``(len(rows), k)`` busy ns and starts to buckets ``lo .. lo + k - 1`` of lanes ``rows``."""
        window = slice(lo - self.first, lo - self.first + busy.shape[1])
        self.busy[rows, window] += busy
        self.count[rows, window] += count


def lod_pyramid(rows: pa.Table, base: int, top: int, schedules: Schedules | None = None) -> pa.Table:
    """Busy ns per (core, engine, queue) lane in buckets of 2**level ns, levels ``base``..``top``.

    An instruction is split exactly at bucket edges (an instruction touches one base bucket or
    two, except the rare longer one, which is expanded over the buckets it spans); each higher
    level merges bucket pairs of the one below, so every level conserves each lane's busy time.
    ``instructions`` counts the instructions that start in the bucket. ``schedules``: the rows'
    :func:`split_schedules`, if the caller has them (a repeated schedule is binned once per execution
    from its busy time at bucket edges, not row by row). Example: ``lod_pyramid(instructions, base=12, top=20)``.
    """
    valid = valid_intervals(rows)
    if valid is not rows or schedules is None:   # the split must be of exactly these rows
        schedules = split_schedules(valid)
    if valid.num_rows == 0:
        return LOD_SCHEMA.empty_table()
    spans = [_span(schedules.rest)] if schedules.rest.num_rows else []
    for g in schedules.groups:
        lo, hi = _span(g.rows)
        spans.append((lo + int(g.shifts.min()), hi + int(g.shifts.max())))
    first = min(lo for lo, _ in spans) >> base
    grid = _Grid(first, ((max(hi for _, hi in spans) - 1) >> base) - first + 1)
    for g in schedules.groups:
        _bin_schedule(grid, g, base)
    _bin_rows(grid, schedules.rest, schedules.rest_lanes, base)
    return _levels(grid, base, top)


def _bin_rows(grid: _Grid, rows: pa.Table, lanes: dict, base: int) -> None:
    """Add every row's busy ns (split at bucket edges) and start to ``grid``, slice by slice."""
    # Rows arrive in time order (segments are), so a slice covers a narrow span of buckets: each
    # slice is binned into a small local grid that is added into the lanes' rows in place.
    # Slices by row count, whatever the chunks: a run of many short executions writes one small chunk
    # each, and a loop per chunk was most of the pyramid's time there.
    for offset in range(0, rows.num_rows, LOD_SLICE_ROWS):
        start = rows["start_ns"].slice(offset, LOD_SLICE_ROWS).to_numpy()
        end = start + np.maximum(rows["dur_ns"].slice(offset, LOD_SLICE_ROWS).to_numpy(), 0)
        rows_of, lane = grid.rows(lanes, slice(offset, offset + len(start)))

        b0 = start >> base
        b1 = (np.maximum(end, start + 1) - 1) >> base
        lo = int(b0.min())
        local = int(b1.max()) - lo + 1
        size = len(rows_of) * local
        idx0 = lane * local + (b0 - lo)
        part_busy = np.bincount(idx0, weights=np.minimum(end, (b0 + 1) << base) - start, minlength=size)
        part_count = np.bincount(idx0, minlength=size)
        cross = b1 > b0
        if cross.any():  # the part in the last bucket of the instructions that cross an edge
            part_busy += np.bincount(lane[cross] * local + (b1[cross] - lo),
                                     weights=end[cross] - (b1[cross] << base), minlength=size)
            spans = np.where(cross, b1 - b0 - 1, 0)
            if spans.any():  # whole buckets in between, for instructions longer than a bucket
                sel = np.flatnonzero(spans)
                reps = spans[sel]
                offsets = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
                mids = np.repeat(lane[sel] * local + (b0[sel] + 1 - lo), reps) + offsets
                part_busy += np.bincount(mids, minlength=size) * float(1 << base)
        grid.add(rows_of, lo, part_busy.reshape(len(rows_of), local), part_count.reshape(len(rows_of), local))


def _bin_schedule(grid: _Grid, schedule: Schedule, base: int) -> None:
    """Add the busy ns and starts of ``schedule``'s rows, once per execution at its shift, to ``grid``.

    A lane's busy time up to ``x`` is ``sum((x - s)+) - sum((x - e)+)`` over its rows ``[s, e)``: a prefix
    sum at a binary-searched index. Its busy ns in a bucket is the difference at the bucket's edges, so an
    execution costs a few operations per bucket edge, not per row. Exact in int64."""
    rows_of, lane = grid.rows(schedule.lanes)
    start = schedule.rows["start_ns"].to_numpy()
    end = start + np.maximum(schedule.rows["dur_ns"].to_numpy(), 0)
    origin = int(start.min())
    s, e = start - origin, end - origin
    width = int(e.max()) + 1                     # positions 0 .. width - 1: one key range per lane
    ks, ke = np.sort(lane * width + s), np.sort(lane * width + e)
    ps, pe = (np.r_[0, np.cumsum(k % width)] for k in (ks, ke))
    bounds = np.r_[0, np.cumsum(np.bincount(lane, minlength=len(rows_of)))][:-1, None]   # a lane's first index
    reach = max(width - 1, int(s.max()) + 1)     # the buckets an execution touches end at origin + reach - 1
    lanes_key = np.arange(len(rows_of), dtype=np.int64)[:, None] * width
    for shift in (schedule.shifts + origin).tolist():
        lo, hi = shift >> base, (shift + reach - 1) >> base
        x = (np.arange(lo, hi + 2, dtype=np.int64) << base) - shift    # bucket edges, relative to the schedule
        xb = np.clip(x, 0, width - 1)[None, :]
        i_s = np.searchsorted(ks, lanes_key + xb, "right")
        i_e = np.searchsorted(ke, lanes_key + xb, "right")
        busy = (xb * (i_s - bounds) - (ps[i_s] - ps[bounds])) - (xb * (i_e - bounds) - (pe[i_e] - pe[bounds]))
        starts = np.searchsorted(ks, lanes_key + np.clip(x, 0, width)[None, :], "left")
        grid.add(rows_of, lo, np.diff(busy, axis=1), np.diff(starts, axis=1))


def _levels(grid: _Grid, base: int, top: int) -> pa.Table:
    """The pyramid's rows from its base-level grid: each level merges bucket pairs of the one below."""
    keys = list(grid.lane_row)   # a stable lane order, whatever the rows' order (None: a null column value)
    order = sorted(range(len(keys)), key=lambda i: tuple((v is None, "" if v is None else v) for v in keys[i]))
    busy = np.rint(grid.busy[order]).astype(np.int64)   # exact: float64 sums of ints < 2**53
    count = grid.count[order]
    first, n_lanes = grid.first, len(order)
    # the lanes' values as Arrow arrays, repeated per row by a take of the core or of the strings' indices
    lane_values = {name: pa.array([keys[i][k] for i in order], pa.int32() if name == "core" else pa.string())
                   for k, name in enumerate(("core", "engine", "queue"))}
    lane_values = {name: v if name == "core" else v.dictionary_encode() for name, v in lane_values.items()}
    parts = []
    for level in range(base, top + 1):
        if level > base:  # merge bucket pairs: align the first bucket to an even index, pad to even width
            if first & 1:
                busy, count = (np.pad(a, ((0, 0), (1, 0))) for a in (busy, count))
                first -= 1
            if busy.shape[1] & 1:
                busy, count = (np.pad(a, ((0, 0), (0, 1))) for a in (busy, count))
            busy = busy.reshape(n_lanes, -1, 2).sum(axis=2)
            count = count.reshape(n_lanes, -1, 2).sum(axis=2)
            first >>= 1
        bk, ln = np.nonzero(busy.T)   # bucket-major: rows come out in (level, bucket) order, no sort later
        take = pa.array(ln)
        parts.append(pa.table({
            "level": pa.array(np.full(len(ln), level, dtype=np.int16)),
            **{name: values.take(take) if name == "core" else
               pa.DictionaryArray.from_arrays(values.indices.take(take), values.dictionary)
               for name, values in lane_values.items()},
            "bucket": pa.array(bk.astype(np.int64) + first),
            "busy_ns": pa.array(busy[ln, bk]),
            "instructions": pa.array(count[ln, bk]),
        }, schema=LOD_SCHEMA))
    return pa.concat_tables(parts)


def bucket_busy(lane: np.ndarray, s: np.ndarray, e: np.ndarray, busy: np.ndarray, lanes: int, span: int,
                buckets: int) -> np.ndarray:
    """Busy ns per (lane, bucket) of ``buckets`` equal buckets over ``[0, span)``.

    Row i is lane ``lane[i]`` (``-1``: not wanted), interval ``[s[i], e[i])`` relative to the
    window start, with ``busy[i]`` ns spread evenly over it (``e - s`` for an instruction, which
    makes the split exact). Each interval is clipped to the window and split at every bucket edge
    (edges may be fractional). Returns a ``(lanes, buckets)`` float array. Example:
    ``bucket_busy(lane, start - t0, end - t0, end - start, 12, t1 - t0, 1000)``.
    """
    out = np.zeros((lanes, buckets))
    s, e, busy = (np.asarray(a, dtype=np.float64) for a in (s, e, busy))
    cs, ce = np.maximum(s, 0.0), np.minimum(e, float(span))
    keep = (lane >= 0) & (ce > cs) & (e > s)
    if not keep.all():
        lane, s, e, busy, cs, ce = lane[keep], s[keep], e[keep], busy[keep], cs[keep], ce[keep]
    if lane.size == 0:
        return out
    w = span / buckets
    density = busy / (e - s)                 # 1.0 for an instruction: its busy time is its interval
    b0 = np.minimum(np.floor(cs / w), buckets - 1).astype(np.int64)
    b1 = np.maximum(np.minimum(np.ceil(ce / w) - 1, buckets - 1).astype(np.int64), b0)
    flat = out.reshape(-1)
    flat += np.bincount(lane * buckets + b0, weights=(np.minimum(ce, (b0 + 1) * w) - cs) * density,
                        minlength=flat.size)
    cross = b1 > b0
    if cross.any():
        flat += np.bincount(lane[cross] * buckets + b1[cross], weights=(ce[cross] - b1[cross] * w) * density[cross],
                            minlength=flat.size)
        spans = np.where(cross, b1 - b0 - 1, 0)
        if spans.any():  # whole buckets in between
            sel = np.flatnonzero(spans)
            reps = spans[sel]
            offsets = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
            mids = np.repeat(lane[sel] * buckets + b0[sel] + 1, reps) + offsets
            flat += np.bincount(mids, weights=np.repeat(w * density[sel], reps), minlength=flat.size)
    return out


def longest_per_cell(cell: np.ndarray, dur: np.ndarray, value: np.ndarray, cells: int) -> np.ndarray:
    """Per cell ``0..cells-1``, the ``value`` of its row with the longest ``dur`` (of those, the last row),
    -1 for a cell without rows: the order ``np.lexsort((dur, cell))`` gives, at a fraction of its cost
    (a stable sort by cell, a radix sort for up to 65536 cells, and a maximum per cell).

    >>> longest_per_cell(np.array([2, 0, 2, 2]), np.array([5, 1, 7, 7]), np.array([10, 11, 12, 13]), 3).tolist()
    [11, -1, 13]
    """
    out = np.full(cells, -1, dtype=np.int64)
    if cell.size == 0:
        return out
    by = np.argsort(cell.astype(np.uint16) if cells <= 1 << 16 else cell, kind="stable")
    c, d = cell[by], dur[by]
    heads = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    top = np.flatnonzero(d == np.repeat(np.maximum.reduceat(d, heads), np.diff(np.r_[heads, c.size])))
    last = top[np.r_[c[top][1:] != c[top][:-1], True]]   # rows in input order within a cell: the last wins
    out[c[last]] = value[by][last]
    return out


def union_active(rows: pa.Table, engines: tuple[str, ...], schedules: Schedules | None = None) -> pa.Table:
    """Per (exec_id, engine) of ``engines``: the length of the union of the instruction intervals.

    For engines whose queues run concurrently (DMA queues, collectives) the time the engine was
    active is less than the sum of durations. ``schedules``: the rows' :func:`split_schedules`, if the
    caller has them (a repeated schedule's unions are computed once). Example:
    ``union_active(instructions, ("dma", "cc"))``.
    """
    valid = valid_intervals(rows)
    if valid is not rows or schedules is None:
        schedules = split_schedules(valid)
    parts = []
    for g in schedules.groups:   # a union does not move with its execution: one per schedule, then per execution
        _, engine, totals = _engine_unions(g.rows, g.lanes, engines)
        parts.append(pa.table({"exec_id": pa.array(np.repeat(g.exec_ids, len(engine)), pa.int64()),
                               "engine": pa.array(engine * len(g.exec_ids), pa.string()),
                               "active_ns": pa.array(np.tile(totals, len(g.exec_ids)), pa.int64())},
                              schema=UNION_SCHEMA))
    exec_id, engine, totals = _engine_unions(schedules.rest, schedules.rest_lanes, engines)
    parts.append(pa.table({"exec_id": pa.array(exec_id, pa.int64()), "engine": pa.array(engine, pa.string()),
                           "active_ns": pa.array(totals, pa.int64())}, schema=UNION_SCHEMA))
    return pa.concat_tables(parts)


def _engine_unions(rows: pa.Table, lanes: dict, engines: tuple[str, ...]) -> tuple[list, list, np.ndarray]:
    """(exec_ids, engines, union lengths) per (exec_id, engine) of ``engines`` among valid ``rows``."""
    codes, values = lanes["engine"]
    wanted = np.isin(np.arange(len(values)), [i for i, v in enumerate(values) if v in engines])
    sel = np.flatnonzero(wanted[codes]) if len(values) else np.zeros(0, np.int64)
    exec_id = rows["exec_id"].fill_null(-1).to_numpy()[sel]
    start = rows["start_ns"].to_numpy()[sel]
    exec_codes, exec_values = _codes(pa.array(exec_id))
    radix = max(len(values), 1)
    firsts, totals = _union_totals(exec_codes * radix + codes[sel], start,
                                   start + np.maximum(rows["dur_ns"].to_numpy()[sel], 0))
    return ([exec_values[c] for c in (firsts // radix).tolist()], [values[c] for c in (firsts % radix).tolist()],
            totals)


def union_by(rows: pa.Table, by: tuple[str, ...]) -> pa.Table:
    """Per distinct value of the ``by`` columns: the length of the union of the rows' intervals
    ``[start_ns, start_ns + dur_ns)`` (columns ``*by, active_ns``).

    Sort by (group, start), then a running maximum of the end: each interval adds only the part
    past everything before it. Example: ``union_by(dma_rows, ("exec_id", "module_path"))``.
    """
    rows = valid_intervals(rows.select([*by, "start_ns", "dur_ns"]))
    if rows.num_rows == 0:
        return pa.table({**{k: rows[k].combine_chunks() for k in by}, "active_ns": pa.array([], pa.int64())})
    start = rows["start_ns"].to_numpy().astype(np.int64, copy=False)
    end = start + np.maximum(rows["dur_ns"].to_numpy(), 0)
    group = np.zeros(rows.num_rows, dtype=np.int64)
    values = []
    for k in by:   # one mixed-radix code over the key columns
        codes, vals = _codes(rows[k])
        group = group * max(len(vals), 1) + codes
        values.append(vals)
    firsts, totals = _union_totals(group, start, end)
    out = {}
    for k, vals in reversed(list(zip(by, values))):   # undo the mixed radix, last key first
        radix = max(len(vals), 1)
        out[k] = pa.array([vals[c] for c in (firsts % radix).tolist()], rows.schema.field(k).type)
        firsts = firsts // radix
    return pa.table({**{k: out[k] for k in by}, "active_ns": pa.array(totals)})


def _group_order(group: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``np.lexsort((start, group))``, faster for rows nearly in start order (a trace's are) and few
    groups: a stable sort by start (runs of sorted rows merge cheaply), then a stable radix sort by group.

    >>> _group_order(np.array([1, 0, 1, 0]), np.array([5, 9, 2, 1])).tolist()
    [3, 1, 2, 0]
    """
    if group.size == 0 or int(group.max()) >= 1 << 16 or int(group.min()) < 0:
        return np.lexsort((start, group))
    order = np.argsort(start, kind="stable")
    return order[np.argsort(group[order].astype(np.uint16), kind="stable")]


def _union_totals(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per distinct ``group`` (ascending): the length of the union of its intervals ``[start, end)``,
    as (groups, lengths)."""
    if group.size == 0:
        return group.astype(np.int64), np.zeros(0, np.int64)
    order = _group_order(group, start)
    start, end, group = start[order], end[order], group[order]
    heads = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    sizes = np.diff(np.r_[heads, len(group)])
    base = np.repeat(start[heads], sizes)               # sorted: a group's first start is its minimum
    span = int((end - base).max()) + 1
    rank = np.repeat(np.arange(len(heads), dtype=np.int64), sizes)
    if len(heads) * span < 2**62:
        # running max of end within each group: lift each group above all earlier ones, accumulate once
        s_key, e_key = rank * span + (start - base), rank * span + (end - base)
        prev = np.r_[np.iinfo(np.int64).min, np.maximum.accumulate(e_key)[:-1]]
        added = np.maximum(0, e_key - np.maximum(s_key, prev))
    else:  # keys would overflow int64: one accumulate per group (a loop per group, not per row)
        added = np.concatenate([
            np.maximum(0, e - np.maximum(s, np.r_[np.iinfo(np.int64).min, np.maximum.accumulate(e)[:-1]]))
            for s, e in zip(np.split(start, heads[1:]), np.split(end, heads[1:]))])
    return group[heads], np.rint(np.bincount(rank, weights=added)).astype(np.int64)


SYSTEM_LOD_SCHEMA = pa.schema([("level", pa.int16()), ("track", pa.int32()), ("bucket", pa.int64()),
                               ("busy_ns", pa.int64()), ("events", pa.int64())])


def merge_intervals(track: np.ndarray, start: np.ndarray, end: np.ndarray):
    """Per track, the union of the intervals ``[start, end)`` as disjoint intervals sorted by
    (track, start): ``(track, start, end)`` arrays. Nested or overlapping spans (a framework
    thread's call stack) cover their time once.

    >>> t, s, e = merge_intervals(np.array([0, 0, 0, 1]), np.array([0, 2, 10, 0]), np.array([8, 5, 12, 3]))
    >>> t.tolist(), s.tolist(), e.tolist()
    ([0, 0, 1], [0, 10, 0], [8, 12, 3])
    """
    track, start, end = (np.asarray(a, dtype=np.int64) for a in (track, start, end))
    if track.size == 0:
        return track, start, end
    t_lo, s_lo = int(track.min()), int(start.min())
    s_span = int(start.max()) - s_lo + 1
    if (int(track.max()) - t_lo + 1) * s_span < 2**62:
        # one int64 key (track, start): a single sort, about twice as fast as lexsort on two keys, and many
        # times faster on input already in runs (merged intervals of sub-tracks: timsort finds the runs)
        order = np.argsort((track - t_lo) * s_span + (start - s_lo), kind="stable")
    else:
        order = np.lexsort((start, track))
    t, s = track[order], start[order]
    e = np.maximum(end[order], s)
    lo = int(s.min())
    span = int(e.max()) - lo + 1
    if (int(t.max()) + 1) * span < 2**62:
        # running max of the end within each track: lift each track above the ones before it
        lift = (t - int(t.min())) * span
        reach = np.maximum.accumulate(lift + (e - lo)) - lift + lo   # furthest end so far (this track)
        head = np.r_[True, (t[1:] != t[:-1]) | (s[1:] > reach[:-1])]
    else:  # keys would overflow int64: one accumulate per track
        cuts = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
        head = np.concatenate([np.r_[True, ss[1:] > np.maximum.accumulate(ee)[:-1]]
                               for ss, ee in zip(np.split(s, cuts[1:]), np.split(e, cuts[1:]))])
    heads = np.flatnonzero(head)
    return t[heads], s[heads], np.maximum.reduceat(e, heads)


def track_pyramid(track: np.ndarray, start: np.ndarray, end: np.ndarray, base: int, top: int) -> pa.Table:
    """The System Trace's level-of-detail pyramid: per track and bucket of ``2**level`` ns (levels
    ``base``..``top``), ``busy_ns``, the time the track's events cover (their union, split exactly
    at bucket edges, so nesting counts once), and ``events``, how many start in the bucket.
    Rows come in (level, bucket) order. Example: ``track_pyramid(track, ts, ts + dur, 12, 20)``.

    >>> p = track_pyramid(np.array([0, 0]), np.array([0, 10]), np.array([100, 20]), base=6, top=7)
    >>> [(r["level"], r["bucket"], r["busy_ns"], r["events"]) for r in p.to_pylist()]
    [(6, 0, 64, 2), (6, 1, 36, 0), (7, 0, 100, 2)]
    """
    track, start, end = (np.asarray(a, dtype=np.int64) for a in (track, start, end))
    if track.size == 0:
        return SYSTEM_LOD_SCHEMA.empty_table()
    mt, ms, me = merge_intervals(track, start, end)
    b0 = ms >> base
    b1 = (np.maximum(me, ms + 1) - 1) >> base
    reps = b1 - b0 + 1                             # each merged interval, cut into the buckets it covers
    piece_t = np.repeat(mt, reps)
    piece_b = np.repeat(b0, reps) + (np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps))
    piece_busy = (np.minimum(np.repeat(me, reps), (piece_b + 1) << base)
                  - np.maximum(np.repeat(ms, reps), piece_b << base))
    bt = np.concatenate([piece_t, track])          # busy pieces, then one zero-busy count per event start
    bb = np.concatenate([piece_b, start >> base])
    busy = np.concatenate([np.maximum(piece_busy, 0), np.zeros(track.size, np.int64)])
    count = np.concatenate([np.zeros(piece_t.size, np.int64), np.ones(track.size, np.int64)])
    parts = []
    for level in range(base, top + 1):
        if level > base:
            bb = bb >> 1
        first, n_tracks = int(bb.min()), int(bt.max()) + 1
        keys, inverse = np.unique((bb - first) * n_tracks + bt, return_inverse=True)   # bucket-major order
        busy, count = (np.bincount(inverse, weights=a, minlength=keys.size).astype(np.int64)
                       for a in (busy, count))
        bb, bt = keys // n_tracks + first, keys % n_tracks
        parts.append(pa.table({"level": pa.array(np.full(keys.size, level, np.int16)),
                               "track": pa.array(bt.astype(np.int32)), "bucket": pa.array(bb),
                               "busy_ns": pa.array(busy), "events": pa.array(count)}, schema=SYSTEM_LOD_SCHEMA))
    return pa.concat_tables(parts)
