"""The query API: utilization against a brute-force sweep, helpers, read-only opening, bad profiles."""
import logging
import random
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import duckdb
import pytest

import traces
from traces import synthetic

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    d = tmp_path_factory.mktemp("q")
    synthetic.write_run(d, executions=3, instructions=2500, cores=(0, 1), warmup=1)
    traces.finalize(d)
    return d


@pytest.fixture(scope="module")
def profile(session):
    with traces.open(session / "profile.duckdb") as p:
        yield p


def brute_force(rows, t0, t1, buckets):
    """Busy ns per (core, engine, bucket), splitting every instruction at every bucket edge."""
    w = (t1 - t0) / buckets
    out = defaultdict(float)
    for r in rows:
        s, e = max(r["start_ns"], t0) - t0, min(r["start_ns"] + r["dur_ns"], t1) - t0
        k = int(s // w)
        while e > s and k < buckets and k * w < e:
            out[(r["core"], r["engine"], k)] += min(e, (k + 1) * w) - max(s, k * w)
            k += 1
    return out


def test_zoomed_in_utilization_is_exact(profile):
    rows = profile.sql("SELECT core, engine, start_ns, dur_ns FROM instructions").to_pylist()
    lo, hi = profile.trace_range()
    rnd = random.Random(1)
    for _ in range(4):
        t0 = rnd.randrange(lo - 1000, hi - 200_000)
        t1 = t0 + rnd.randrange(20_000, 200_000)
        buckets = rnd.choice([64, 333, 1000])  # buckets under 16 pyramid-base widths: the raw path
        got = profile.utilization(t0, t1, buckets=buckets)
        expected = brute_force(rows, t0, t1, buckets)
        assert got.num_rows == buckets * len({(r["core"], r["engine"]) for r in rows})
        for r in got.to_pylist():
            assert r["busy_ns"] == pytest.approx(expected.get((r["core"], r["engine"], r["bucket"]), 0.0), abs=1e-6)
            assert r["utilization"] == pytest.approx(r["busy_ns"] / ((t1 - t0) / buckets))
        assert got.column("start_ns")[0].as_py() == t0 and got.column("end_ns")[-1].as_py() == t1


def test_zoomed_out_utilization_reads_the_pyramid_and_conserves_time(profile):
    lo, hi = profile.trace_range()
    n = max(2, int((hi - lo) / (32 * 2 ** int(profile.metadata()["lod_base_level"]))))
    got = profile.utilization(buckets=n)   # a bucket >= 16 base buckets wide: the LOD path
    width = (hi - lo) / n
    assert width / 16 >= 2 ** int(profile.metadata()["lod_base_level"])
    totals = defaultdict(float)
    for r in got.to_pylist():
        totals[(r["core"], r["engine"])] += r["busy_ns"]
    raw = {(r["core"], r["engine"]): r["b"] for r in profile.sql(
        "SELECT core, engine, sum(dur_ns)::BIGINT AS b FROM instructions GROUP BY ALL").to_pylist()}
    assert totals.keys() == raw.keys()
    for k, v in raw.items():
        assert totals[k] == pytest.approx(v, rel=1e-9)
    # per bucket, the pyramid answer is within one pyramid bucket of the exact one at each edge
    exact = brute_force(profile.sql("SELECT core, engine, start_ns, dur_ns FROM instructions").to_pylist(),
                        lo, hi, n)
    for r in got.to_pylist():
        assert abs(r["busy_ns"] - exact.get((r["core"], r["engine"], r["bucket"]), 0)) <= 2 * width / 16


def test_utilization_filters_and_queues(profile):
    t = profile.utilization(buckets=5, core=1, engine=["tensor", "dma"])
    assert {(r["core"], r["engine"]) for r in t.to_pylist()} == {(1, "tensor"), (1, "dma")}
    q = profile.utilization(buckets=5, engine="dma", by_queue=True)
    queues = {r["queue"] for r in q.to_pylist()}
    assert queues == set(synthetic.DMA_QUEUES)
    assert max(r["utilization"] for r in q.to_pylist()) <= 1.0 + 1e-9   # one queue is one in-order stream


@pytest.mark.parametrize("kwargs, message", [
    ({"buckets": 0}, "buckets must be a positive integer"),
    ({"t0": 10, "t1": 10}, "empty time range"),
    ({"t0": 0, "t1": 2**63 - 1}, "beyond"),   # found by the profile fuzzer: the bucket edges wrapped
])
def test_utilization_bad_arguments(profile, kwargs, message):
    with pytest.raises(traces.TraceError, match=message):
        profile.utilization(**kwargs)


def test_helpers_answer_the_common_questions(profile):
    assert profile.top_ops(2).column("aten_op").to_pylist() == ["aten.mm.default", "aten._softmax.default"]
    fb = profile.fallbacks().to_pylist()
    assert [(r["aten_op"], r["line"], r["cpu_calls"]) for r in fb] == [("aten.nonzero.default", 10, 6)]
    rc = profile.recompiles().to_pylist()
    assert [(r["previous_signature"], r["input_signature"], r["recompile_reason"]) for r in rc] == [
        ('{"x": [8, 128]}', '{"x": [8, 136]}', "tensor 'x' dim 1: 128 -> 136")]
    assert profile.source_text(synthetic.MODEL_FILE) == synthetic.MODEL_TEXT
    assert profile.source_text("/elsewhere.py") is None
    lo, _ = profile.trace_range()
    window = profile.instructions(lo, lo + 5000, core=0, engine="tensor")
    assert window.num_rows > 0 and set(window.column("engine").to_pylist()) == {"tensor"}
    assert all(r["start_ns"] < lo + 5000 and r["start_ns"] + r["dur_ns"] > lo for r in window.to_pylist())


def test_sql_takes_parameters_and_wraps_errors(profile):
    got = profile.sql("SELECT count(*) AS n FROM instructions WHERE core = ? AND engine = ?", [1, "vector"])
    assert got.column("n")[0].as_py() > 0
    named = profile.sql("SELECT $k AS k", {"k": "it's safe"})
    assert named.column("k")[0].as_py() == "it's safe"
    with pytest.raises(traces.TraceError, match=r"^SQL error: Catalog Error: Table with name nope does not exist"):
        profile.sql("SELECT * FROM nope")
    with pytest.raises(traces.TraceError, match="SQL error") as err:   # read-only
        profile.sql("DELETE FROM instructions")
    assert "\n" not in str(err.value)


def test_profile_is_shared_by_concurrent_readers(session):
    """Two read-only processes and this one hold the profile at once (no DuckDB lock conflict)."""
    code = textwrap.dedent("""
        import sys, time, traces
        with traces.open(sys.argv[1]) as p:
            time.sleep(0.5)
            print(p.sql("SELECT count(*) AS n FROM instructions").column("n")[0].as_py())
    """)
    with traces.open(session / "profile.duckdb") as mine:
        procs = [subprocess.run([sys.executable, "-c", code, str(session / "profile.duckdb")], cwd=ROOT,
                                capture_output=True, text=True, timeout=120) for _ in range(2)]
        n = mine.sql("SELECT count(*) AS n FROM instructions").column("n")[0].as_py()
    assert [p.stdout.strip() for p in procs] == [str(n), str(n)], [p.stderr for p in procs]


def test_opening_a_segment_directory_finalises_it(tmp_path, caplog):
    synthetic.write_run(tmp_path, executions=2, instructions=200)
    with caplog.at_level(logging.INFO, logger="traces"):
        with traces.open(tmp_path) as p:
            assert p.path == tmp_path / "profile.duckdb"
    assert "finalising the segments" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="traces"):
        traces.open(tmp_path).close()        # up to date now: no second finalise
    assert "finalising" not in caplog.text


def _newer_schema_copy(src: Path, dst: Path, version: str) -> Path:
    shutil.copy(src, dst)
    con = duckdb.connect(str(dst))
    con.execute("UPDATE metadata SET value = ? WHERE key = 'schema_version'", [version])
    con.close()
    return dst


@pytest.mark.parametrize("make, message", [
    (lambda d, s: d / "missing.duckdb", "does not exist"),
    (lambda d, s: (d / "junk.duckdb").write_bytes(b"not a database" * 100) and d / "junk.duckdb",
     "is not a profile \\(not a DuckDB database\\)"),
    (lambda d, s: (duckdb.connect(str(d / "other.duckdb")).execute("CREATE TABLE t (x INT)").close(),
                   d / "other.duckdb")[1], "not a neuron_stack profile \\(it has no metadata table\\)"),
    (lambda d, s: _newer_schema_copy(s / "profile.duckdb", d / "new.duckdb", "2.0.0"),
     "was written by schema 2.0.0; this neuron-stack reads 1.x: upgrade neuron-stack"),
    (lambda d, s: _newer_schema_copy(s / "profile.duckdb", d / "old.duckdb", "0.9.0"), "older than the 1.x"),
    (lambda d, s: d, "is not a profile"),
])
def test_bad_profiles_are_one_line_errors(tmp_path, session, make, message):
    path = make(tmp_path, session)
    with pytest.raises(traces.TraceError, match=message) as err:
        traces.open(path)
    assert "\n" not in str(err.value)


def test_a_newer_minor_version_opens(tmp_path, session):
    path = _newer_schema_copy(session / "profile.duckdb", tmp_path / "minor.duckdb", "1.7.0")
    with traces.open(path) as p:
        assert p.summary()["execution_count"] == 4
