"""The System Trace's level of detail at real size: a synthetic eager with_stack profile of a million system
events (traces.synthetic.write_system, through the Writer), finalised into system_tracks and the system_lod
pyramid, read back by traces.q_system.window as the Explorer's System Trace does."""
from __future__ import annotations

import numpy as np
import pytest

import traces
from traces import q_system
from traces.intervals import merge_intervals, track_pyramid
from traces.synthetic import write_system

N = 1_000_000


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    d = tmp_path_factory.mktemp("system_lod")
    written = write_system(d, N)
    with traces.open(traces.finalize(d)) as p:
        p.written = written
        yield p


def _union_ns(p) -> dict[int, int]:
    """Per track, the time its events cover (nesting once), by SQL gaps and islands: not the numpy code."""
    rows = p.sql("""
        WITH e AS (SELECT t.track, s.ts_ns AS s, s.ts_ns + greatest(coalesce(s.dur_ns, 0), 0) AS e
                   FROM system_events s JOIN system_tracks t ON hash(s.run_id, s.source, s.core, s.thread_id) = t.h),
        r AS (SELECT *, max(e) OVER (PARTITION BY track ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING
                                                                              AND 1 PRECEDING) AS reach FROM e),
        g AS (SELECT *, sum(CASE WHEN reach IS NULL OR s > reach THEN 1 ELSE 0 END)
                            OVER (PARTITION BY track ORDER BY s, e) AS island FROM r)
        SELECT track, sum(hi - lo)::BIGINT AS ns FROM (SELECT track, island, min(s) lo, max(e) hi FROM g GROUP BY ALL)
        GROUP BY track""").to_pylist()
    return {r["track"]: r["ns"] for r in rows}


def test_every_level_counts_every_event_and_covers_the_union_once(profile):
    tracks = {r["track"]: r for r in q_system.tracks(profile).to_pylist()}
    assert {r["source"] for r in tracks.values()} == {"framework", "neuron_rt", "neuron_hw"}
    assert sum(r["total_events"] for r in tracks.values()) == profile.written > 0.99 * N
    per_level = profile.sql("SELECT level, track, sum(events)::BIGINT AS n, sum(busy_ns)::BIGINT AS busy "
                            "FROM system_lod GROUP BY ALL").to_pylist()
    meta = profile.metadata()
    levels = range(int(meta["system_lod_base_level"]), int(meta["system_lod_top_level"]) + 1)
    assert {r["level"] for r in per_level} == set(levels) and len(levels) > 3
    union = _union_ns(profile)
    for r in per_level:
        assert r["n"] == tracks[r["track"]]["total_events"], r
        assert r["busy"] == union[r["track"]], r       # nested frames cover their time once, at every level


def test_whole_trace_is_cells_whose_counts_sum_to_every_event(profile):
    lo, hi = profile.system_extent()
    w = profile.system_window(lo, hi, 600)
    assert w.source.startswith("system_lod level")
    assert not any(w.tracks["exact"].to_pylist()) and w.events.num_rows == 0
    assert int(w.count.sum()) == w.summarised == profile.written
    union = _union_ns(profile)
    for i, track in enumerate(w.tracks["track"].to_pylist()):   # busy cells: the union, to a bucket at each edge
        assert abs(w.busy[i].sum() - union[track]) <= 2 * w.width / 16
    assert (w.busy <= w.width * (1 + 1e-9)).all()              # a cell is never more than fully busy


def _exact_sql(p, a: int, b: int) -> list[tuple]:
    return [tuple(r.values()) for r in p.sql(
        "SELECT source, name, ts_ns FROM system_events WHERE ts_ns < $b AND ts_ns + dur_ns >= $a ORDER BY ALL",
        {"a": a, "b": b}).to_pylist()]


def test_deep_zoom_draws_exactly_the_events_in_the_window(profile):
    lo, hi = profile.system_extent()
    a = lo + (hi - lo) // 3
    b = a + 200_000                                           # 200 µs: ten executions
    w = profile.system_window(a, b, 600)
    assert all(w.tracks["exact"].to_pylist()) and w.summarised == 0
    got = sorted(zip(w.events["source"].to_pylist(), w.events["name"].to_pylist(), w.events["start_ns"].to_pylist()))
    assert got == _exact_sql(profile, a, b) and len(got) > 100
    assert int(w.count.sum()) == len(got)


def test_each_track_has_its_own_budget(profile):
    """A window where the framework thread's frames are too many to send keeps the runtime and device
    tracks' events one by one: the frames never starve them."""
    lo, hi = profile.system_extent()
    a = lo + (hi - lo) // 2
    b = a + 2_000_000                                         # 2 ms: 100 executions, ~1,700 frames
    w = profile.system_window(a, b, 600)
    by_source = {r["source"]: r for r in w.tracks.to_pylist()}
    assert not by_source["framework"]["exact"] and by_source["framework"]["events"] > q_system.PER_TRACK
    assert by_source["neuron_rt"]["exact"] and by_source["neuron_hw"]["exact"]
    assert w.summarised == by_source["framework"]["events"]
    want = [r for r in _exact_sql(profile, a, b) if r[0] != "framework"]
    assert sorted(zip(w.events["source"].to_pylist(), w.events["name"].to_pylist(),
                      w.events["start_ns"].to_pylist())) == want
    fw = w.tracks["source"].to_pylist().index("framework")
    assert abs(int(w.count[fw].sum()) - by_source["framework"]["events"]) == 0
    assert abs(by_source["framework"]["events"] - sum(1 for r in _exact_sql(profile, a, b) if r[0] == "framework")) \
        <= 2 * 17                                             # the pyramid's edge buckets: about one execution each


def test_an_event_type_filter_reads_the_events(profile):
    lo, hi = profile.system_extent()
    w = profile.system_window(lo, hi, 600, names=["nc_exec_running"])
    assert w.source == "system_events" and w.tracks["source"].to_pylist() == ["neuron_hw"]
    assert int(w.count.sum()) == profile.sql("SELECT count(*) AS n FROM system_events "
                                             "WHERE name = 'nc_exec_running'")["n"][0].as_py()
    first = profile.system_window(lo, lo + 50_000, 600, names=["nc_exec_running"]).events.to_pylist()[0]
    one = profile.system_event(first["track"], first["start_ns"], "nc_exec_running")
    assert one["source"] == "neuron_hw" and one["exec_id"] == 0 and one["nc_idx"] == 0


def test_pyramid_and_merge_match_brute_force():
    rng = np.random.default_rng(0)
    track = rng.integers(0, 3, 400)
    start = rng.integers(0, 5_000, 400)
    end = start + rng.integers(0, 300, 400)
    covered = np.zeros((3, 5_400), bool)
    for t, s, e in zip(track, start, end):
        covered[t, s:e] = True
    mt, ms, me = merge_intervals(track, start, end)
    assert all(covered[t, s:e].all() for t, s, e in zip(mt, ms, me))
    assert sum(int(e - s) for s, e in zip(ms, me)) == covered.sum()
    lod = track_pyramid(track, start, end, base=6, top=9).to_pylist()
    for r in lod:
        w = 1 << r["level"]
        lo = r["bucket"] * w
        assert r["busy_ns"] == covered[r["track"], lo:lo + w].sum()
        assert r["events"] == ((track == r["track"]) & (start >> r["level"] == r["bucket"])).sum()
