"""Finalise: derived tables recomputed independently from the raw rows, idempotence, bad segments."""
import logging
import shutil

import pytest

import traces
from traces import synthetic
from traces.schema import SCHEMA_VERSION
from traces.store import DERIVED_TABLES

EXECS, INSTR, WARMUP, CORES = 4, 1500, 1, (0, 1)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    d = tmp_path_factory.mktemp("session")
    ids = synthetic.write_run(d, executions=EXECS, instructions=INSTR, cores=CORES, warmup=WARMUP)
    return d, ids


@pytest.fixture(scope="module")
def profile(session):
    d, _ = session
    with traces.open(traces.finalize(d)) as p:
        yield p


def one(p, query, params=None):
    value = p.sql(query, params).column(0)[0].as_py()
    return int(value) if hasattr(value, "as_integer_ratio") and not isinstance(value, float) else value


def test_every_table_is_there_with_its_version(profile):
    assert set(traces.TABLES) | set(DERIVED_TABLES) <= set(profile.tables())
    meta = profile.metadata()
    assert meta["schema_version"] == SCHEMA_VERSION
    assert meta["target"] == "trn1" and meta["is_simulation"] == "true"
    assert int(meta["instruction_count"]) == EXECS * INSTR * len(CORES)


def test_summary_matches_the_raw_rows(profile):
    s = profile.summary()
    measured = "FROM executions WHERE NOT warmup"
    device_ns = one(profile, f"SELECT sum(device_ns) {measured}")
    assert s["execution_count"] == (EXECS - WARMUP) * len(CORES)
    assert s["warmup_included"] is False
    assert s["total_time"] == pytest.approx(device_ns / 1e9)
    tensor_ns = one(profile, f"""SELECT sum(dur_ns) FROM instructions WHERE engine = 'tensor'
                                AND exec_id IN (SELECT exec_id {measured})""")
    assert s["tensor_engine_active_time_percent"] == pytest.approx(100 * tensor_ns / device_ns)
    flops = one(profile, f"SELECT sum(flops) {measured}")
    peak = float(profile.metadata()["tensor_engine_peak_bf16_flops"])
    assert s["mfu_estimated_percent"] == pytest.approx(100 * flops / (peak * device_ns / 1e9))
    assert s["hbm_read_bytes"] == one(profile, f"SELECT sum(hbm_read_bytes) {measured}")
    assert s["cpu_fallback_count"] == EXECS * len(CORES) and s["cpu_fallback_op_count"] == 1
    assert s["recompile_count"] == 1 and s["graph_count"] == 2
    assert s["event_count"] == (EXECS - WARMUP) * len(CORES) * INSTR


def test_dma_active_time_is_the_union_of_its_queues(profile):
    """DMA queues overlap: active time is the union, checked here with a plain Python sweep."""
    exec_id = one(profile, "SELECT exec_id FROM executions WHERE NOT warmup ORDER BY exec_id LIMIT 1")
    rows = profile.sql("SELECT start_ns, dur_ns FROM instructions WHERE engine = 'dma' AND exec_id = ? "
                       "ORDER BY start_ns", [exec_id]).to_pylist()
    union, end = 0, None
    for r in rows:
        s, e = r["start_ns"], r["start_ns"] + r["dur_ns"]
        if end is None or s >= end:
            union += e - s
            end = e
        elif e > end:
            union += e - end
            end = e
    got = one(profile, "SELECT active_ns FROM exec_engine_summary WHERE exec_id = ? AND engine = 'dma'", [exec_id])
    busy = one(profile, "SELECT busy_ns FROM exec_engine_summary WHERE exec_id = ? AND engine = 'dma'", [exec_id])
    assert got == union and union < busy


def test_warmup_can_be_included(profile):
    s = profile.summary(include_warmup=True)
    assert s["execution_count"] == EXECS * len(CORES) and s["warmup_included"] is True
    per_core = profile.summary_per_core().to_pylist()
    assert [(r["core"], r["execution_count"]) for r in per_core] == [(c, EXECS - WARMUP) for c in CORES]


def test_op_and_source_summaries_add_up(profile):
    measured = "exec_id IN (SELECT exec_id FROM executions WHERE NOT warmup)"
    per_op = {r["op_id"]: r["d"] for r in profile.sql(
        f"SELECT op_id, sum(dur_ns)::BIGINT AS d FROM instructions WHERE {measured} GROUP BY op_id").to_pylist()}
    ops = {r["op_id"]: r for r in profile.sql("SELECT * FROM op_summary").to_pylist()}
    assert {k: v["device_ns"] for k, v in ops.items() if v["device_ns"]} == per_op
    fallback = next(r for r in ops.values() if r["placement"] == "cpu_fallback")
    assert fallback["cpu_calls"] == EXECS * len(CORES) and fallback["cpu_ns"] > 0 and fallback["device_ns"] == 0
    top = profile.source_hotspots(1).to_pylist()[0]
    assert (top["line"], top["ops"]) == (6, "aten.mm.default")   # the matmul line dominates
    assert top["device_ns"] == max(per_op.values())
    lines = {r["line"]: r for r in profile.source_hotspots(10).to_pylist()}
    assert lines[10]["fallback_count"] == 1 and lines[10]["code"] == "idx = torch.nonzero(p > 0.5)"


def test_lod_pyramid_conserves_busy_time_per_lane(profile):
    raw = {(r["core"], r["engine"], r["queue"]): r["b"] for r in profile.sql(
        "SELECT core, engine, queue, sum(dur_ns)::BIGINT AS b FROM instructions GROUP BY ALL").to_pylist()}
    meta = profile.metadata()
    base, top = int(meta["lod_base_level"]), int(meta["lod_top_level"])
    assert top > base
    for level in (base, top):
        lod = {(r["core"], r["engine"], r["queue"]): r["b"] for r in profile.sql(
            "SELECT core, engine, queue, sum(busy_ns)::BIGINT AS b FROM lod_busy WHERE level = ? GROUP BY ALL",
            [level]).to_pylist()}
        assert lod == raw
    # no bucket holds more busy time than its width (one in-order lane cannot be busier than 100%)
    over = one(profile, "SELECT count(*) FROM lod_busy WHERE engine <> 'dma' AND busy_ns > (1::BIGINT << level)")
    assert over == 0


def test_finalising_twice_gives_the_same_profile(session, tmp_path):
    d, _ = session
    copy = tmp_path / "again"
    shutil.copytree(d, copy, ignore=shutil.ignore_patterns("profile.duckdb"))
    first = traces.finalize(copy)
    with traces.open(first) as p:
        before = {t: p.sql(f"SELECT * FROM {t}") for t in ("summary", "op_summary", "lod_busy", "runs")}
    second = traces.finalize(copy)
    assert second == first
    with traces.open(second) as p:
        for t, rows in before.items():
            assert p.sql(f"SELECT * FROM {t}").equals(rows), t


def test_truncated_segment_is_skipped_with_a_warning(tmp_path, caplog):
    copy = tmp_path / "cut"
    synthetic.write_run(copy, run_id="a", executions=EXECS, instructions=INSTR, cores=CORES)
    synthetic.write_run(copy, run_id="b", executions=2, instructions=INSTR, cores=CORES)
    victim = next(copy.glob("instructions.b.*.arrow"))
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])           # cut off mid-write
    (copy / ".instructions.x.1.000099.arrow.1.tmp").write_bytes(b"half")   # a dead writer's temp file
    with caplog.at_level(logging.WARNING, logger="traces"):
        path = traces.finalize(copy)
    assert victim.name in caplog.text
    with traces.open(path) as p:
        assert one(p, "SELECT count(*) FROM instructions") == EXECS * len(CORES) * INSTR
        assert victim.name in p.metadata()["skipped_segments"]


def test_segment_with_wild_string_offsets_is_skipped_not_a_crash(tmp_path):
    """Regression (SIGBUS in the segment fuzzer): a well-formed IPC file whose string offsets point
    a gigabyte past its data made DuckDB read outside the memory map. Finalised in a child process,
    so a crash fails this test instead of killing the suite."""
    import subprocess
    import sys

    import pyarrow as pa

    from traces.segments import segment_name, write_segment
    synthetic.write_run(tmp_path, run_id="a", executions=1, instructions=100)
    keys = pa.Array.from_buffers(pa.string(), 2, [None, pa.array([0, 1 << 30, 5], pa.int32()).buffers()[1],
                                                  pa.py_buffer(b"hello")])
    bad = pa.table({"key": keys, "value": pa.array(["x", "y"])}, schema=traces.TABLES["metadata"])
    victim = write_segment(tmp_path, segment_name("metadata", "a", 1, 999), "metadata", [bad])
    r = subprocess.run([sys.executable, "-c", "import sys, traces; traces.finalize(sys.argv[1])", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-400:]
    assert f"skipping segment {victim}" in r.stderr and "Offset invariant failure" in r.stderr
    with traces.open(tmp_path / "profile.duckdb") as p:
        assert victim.name in p.metadata()["skipped_segments"]


@pytest.mark.parametrize("key, value", [(b"neuron_stack.table", b"gr\xd4phs"),
                                        (b"neuron_stack.schema_version", b"\xd41.0.0"),
                                        (b"neuron_stack.schema_version", b"one.0.0"),
                                        (b"graph_id", b"not a number"),    # a column of the wrong type
                                        (b"name", b"n\xa8me")])            # a column name that is not UTF-8
def test_segment_with_damaged_schema_is_skipped(tmp_path, caplog, key, value):
    """Found by the segment fuzzer: one flipped byte in a segment's table name raised UnicodeDecodeError."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    synthetic.write_run(tmp_path, run_id="a", executions=1, instructions=100)
    victim = next(tmp_path.glob("graphs.*.arrow"))
    rows = ipc.open_file(pa.py_buffer(victim.read_bytes())).read_all()
    meta = {**rows.schema.metadata, key: value}
    if key == b"graph_id":
        rows = rows.set_column(rows.schema.get_field_index("graph_id"), "graph_id",
                               pa.array([value.decode()] * len(rows)))
    if key == b"name":   # pyarrow only takes str names: write "nXme", then swap the byte in the file
        rows = rows.rename_columns([("n\x01me" if c == "name" else c) for c in rows.column_names])
    with pa.OSFile(str(victim), "wb") as sink, ipc.new_file(sink, rows.schema.with_metadata(meta)) as w:
        w.write_table(rows.replace_schema_metadata(meta))
    if key == b"name":
        victim.write_bytes(victim.read_bytes().replace(b"n\x01me", value))
    with caplog.at_level(logging.WARNING, logger="traces"):
        path = traces.finalize(tmp_path)
    assert f"skipping segment {victim}" in caplog.text
    with traces.open(path) as p:
        assert victim.name in p.metadata()["skipped_segments"]


def test_executions_without_instruction_rows_still_summarise(tmp_path):
    with traces.Writer(tmp_path, run={"run_id": "lite"}, metadata=synthetic.TRN1_METADATA) as w:
        w.append("executions", {"exec_id": [1, 2], "run_id": "lite", "core": 0, "start_ns": [0, 2000],
                                "end_ns": [1500, 3500], "device_ns": [1000, 1000], "warmup": [False, False],
                                "tensor_busy_ns": [400, 600], "dma_busy_ns": [100, 100], "flops": [10, 10]})
    with traces.open(traces.finalize(tmp_path)) as p:
        s = p.summary()
        assert s["tensor_engine_active_time_percent"] == pytest.approx(50.0)
        assert s["dma_active_time_percent"] == pytest.approx(10.0)
        assert s["total_exec_time"] == pytest.approx(3e-6)
        assert p.utilization().num_rows == 0   # no instructions: nothing to bucket


def test_finalize_errors_are_one_line(tmp_path):
    with pytest.raises(traces.TraceError, match="does not exist"):
        traces.finalize(tmp_path / "nope")
    with pytest.raises(traces.TraceError, match="holds no trace segments"):
        traces.finalize(tmp_path)
