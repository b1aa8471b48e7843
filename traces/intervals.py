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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

LOD_SCHEMA = pa.schema([("level", pa.int16()), ("core", pa.int32()), ("engine", pa.string()),
                        ("queue", pa.string()), ("bucket", pa.int64()), ("busy_ns", pa.int64()),
                        ("instructions", pa.int64())])
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
    """:func:`_codes` of the lane columns (``core``, ``engine``, ``queue``) over the whole table, for
    :func:`lod_pyramid` and :func:`union_active` to share: hashing the strings is most of their cost.

    >>> codes = lane_codes(pa.table({"core": [0, 0], "engine": ["dma", "pe"], "queue": ["q", "pe"]}))
    >>> codes["engine"][0].tolist(), codes["engine"][1]
    ([0, 1], ['dma', 'pe'])
    """
    return {c: _codes(rows[c]) for c in ("core", "engine", "queue")}


#: Rows per slice the pyramid is built from: small enough that every numpy temporary stays in
#: the CPU cache (whole-table arrays of 10 M rows run about twice as slow), big enough to amortise.
LOD_SLICE_ROWS = 1 << 17


def lod_pyramid(rows: pa.Table, base: int, top: int, lanes: dict | None = None) -> pa.Table:
    """Busy ns per (core, engine, queue) lane in buckets of 2**level ns, levels ``base``..``top``.

    An instruction is split exactly at bucket edges (an instruction touches one base bucket or
    two, except the rare longer one, which is expanded over the buckets it spans); each higher
    level merges bucket pairs of the one below, so every level conserves each lane's busy time.
    ``instructions`` counts the instructions that start in the bucket. ``lanes``: the rows'
    :func:`lane_codes`, if the caller has them. Example: ``lod_pyramid(instructions, base=12, top=20)``.
    """
    valid = valid_intervals(rows)
    if valid is not rows or lanes is None:   # codes must be of exactly these rows
        lanes = lane_codes(valid)
    rows = valid
    if rows.num_rows == 0:
        return LOD_SCHEMA.empty_table()
    (core_all, cores), (engine_all, engines), (queue_all, queues) = (lanes[c] for c in ("core", "engine", "queue"))
    first = int(pc.min(rows["start_ns"]).as_py()) >> base
    last = (int(pc.max(pc.add(rows["start_ns"], pc.max_element_wise(rows["dur_ns"], 1))).as_py()) - 1) >> base
    width = last - first + 1
    lane_row: dict[tuple, int] = {}   # (core, engine, queue) -> row of busy / count, in order of appearance
    busy = np.zeros((8, width))
    count = np.zeros((8, width), dtype=np.int64)
    # Rows arrive in time order (segments are), so a slice covers a narrow span of buckets: each
    # slice is binned into a small local grid that is added into the lanes' rows in place.
    # Slices by row count, whatever the chunks: a run of many short executions writes one small chunk
    # each, and a loop per chunk was most of the pyramid's time there.
    for offset in range(0, rows.num_rows, LOD_SLICE_ROWS):
        start = rows["start_ns"].slice(offset, LOD_SLICE_ROWS).to_numpy()
        end = start + np.maximum(rows["dur_ns"].slice(offset, LOD_SLICE_ROWS).to_numpy(), 0)
        rows_here = slice(offset, offset + len(start))
        composite = (core_all[rows_here] * len(engines) + engine_all[rows_here]) * len(queues) + queue_all[rows_here]
        used = np.flatnonzero(np.bincount(composite))
        rows_of = np.array([lane_row.setdefault((cores[(c // len(queues)) // len(engines)],
                                                 engines[(c // len(queues)) % len(engines)],
                                                 queues[c % len(queues)]), len(lane_row)) for c in used])
        if len(lane_row) > len(busy):
            grow = max(len(lane_row), 2 * len(busy)) - len(busy)
            busy, count = np.pad(busy, ((0, grow), (0, 0))), np.pad(count, ((0, grow), (0, 0)))
        remap = np.zeros(int(composite.max()) + 1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        lane = remap[composite]

        b0 = start >> base
        b1 = (np.maximum(end, start + 1) - 1) >> base
        lo = int(b0.min())
        local = int(b1.max()) - lo + 1
        size = len(used) * local
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
        window = slice(lo - first, lo - first + local)
        busy[rows_of, window] += part_busy.reshape(len(used), local)
        count[rows_of, window] += part_count.reshape(len(used), local)

    keys = list(lane_row)   # a stable lane order, whatever the rows' order (None: a null column value)
    order = sorted(range(len(keys)), key=lambda i: tuple((v is None, "" if v is None else v) for v in keys[i]))
    busy = np.rint(busy[order]).astype(np.int64)   # exact: float64 sums of ints < 2**53
    count = count[order]
    n_lanes = len(order)
    # the lanes' values as Arrow arrays, repeated per row by a take (not a conversion of Python objects)
    lane_values = {name: pa.array([keys[i][k] for i in order], LOD_SCHEMA.field(name).type)
                   for k, name in enumerate(("core", "engine", "queue"))}
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
            **{name: values.take(take) for name, values in lane_values.items()},
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


def union_active(rows: pa.Table, engines: tuple[str, ...], lanes: dict | None = None) -> pa.Table:
    """Per (exec_id, engine) of ``engines``: the length of the union of the instruction intervals.

    For engines whose queues run concurrently (DMA queues, collectives) the time the engine was
    active is less than the sum of durations. ``lanes``: the rows' :func:`lane_codes`, if the caller has
    them (then ``rows`` must be :func:`valid_intervals` already). Example:
    ``union_active(instructions, ("dma", "cc"))``.
    """
    if lanes is not None and valid_intervals(rows) is rows:
        codes, values = lanes["engine"]
        wanted = np.isin(np.arange(len(values)), [i for i, v in enumerate(values) if v in engines])
        sel = np.flatnonzero(wanted[codes]) if len(values) else np.zeros(0, np.int64)
        exec_id = rows["exec_id"].fill_null(-1).to_numpy()[sel]
        start = rows["start_ns"].to_numpy()[sel]
        exec_codes, exec_values = _codes(pa.array(exec_id))
        group = exec_codes * max(len(values), 1) + codes[sel]
        firsts, totals = _union_totals(group, start, start + np.maximum(rows["dur_ns"].to_numpy()[sel], 0))
        return pa.table({"exec_id": pa.array([exec_values[c] for c in (firsts // max(len(values), 1)).tolist()],
                                             pa.int64()),
                         "engine": pa.array([values[c] for c in (firsts % max(len(values), 1)).tolist()], pa.string()),
                         "active_ns": pa.array(totals, pa.int64())}, schema=UNION_SCHEMA)
    rows = rows.select(["exec_id", "engine", "start_ns", "dur_ns"])
    rows = rows.filter(pc.is_in(rows["engine"], value_set=pa.array(list(engines), pa.string())))
    rows = rows.set_column(0, "exec_id", rows["exec_id"].fill_null(-1))
    return union_by(rows, ("exec_id", "engine")).cast(UNION_SCHEMA)


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
