"""Profiling on: a sample workload's run lands in the trace store (graphs, ops with placement and
source, executions on both clocks with warm-up, events, memory, one row per instruction)."""
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    import traces
    tmp = tmp_path_factory.mktemp("rec")
    env = dict(os.environ, NEURON_RT_INSPECT_ENABLE="1",
               NEURON_RT_INSPECT_DEVICE_PROFILE="session", NEURON_RT_INSPECT_OUTPUT_DIR=str(tmp / "out"),
               NEURON_COMPILE_CACHE_URL=str(tmp / "cache"), NEURON_PROCESS_TAG="fallback_test")
    r = subprocess.run([sys.executable, str(ROOT / "sample_workloads" / "fallback.py"), "--small"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    path = traces.finalize(tmp / "out")
    con = duckdb.connect(str(path), read_only=True)
    yield con
    con.close()


def q(con, sql):
    return con.sql(sql).fetchall()


def test_graph_and_ops(profile):
    [(name, hit, nops)] = q(profile, "SELECT name, cache_hit, num_ops FROM graphs")
    assert name == "Ranker" and hit is False and nops > 5
    rows = q(profile, "SELECT o.aten_op, o.placement, o.fallback_reason, s.file, s.line, s.code FROM ops o "
                      "JOIN sources s USING (source_id) WHERE o.placement = 'cpu_fallback' ORDER BY s.line")
    by_op = {r[0]: r for r in rows}
    assert "ops_to_partition" in by_op["aten.sort.default"][2]
    assert by_op["aten.sort.default"][3].endswith("models.py") and "sort" in by_op["aten.sort.default"][5]
    assert "data-dependent" in by_op["aten.index.Tensor"][2]
    [(n,)] = q(profile, "SELECT count(*) FROM source_files WHERE file LIKE '%models.py' AND text LIKE '%class Ranker%'")
    assert n == 1


def test_executions_both_clocks_and_warmup(profile):
    rows = q(profile, "SELECT warmup, start_ns, end_ns, wall_start_ns, wall_end_ns, device_ns, cpu_fallback_ns "
                      "FROM executions ORDER BY start_ns")
    assert len(rows) == 1 and rows[0][0] is True
    w, s, e, ws, we, d, cpu = rows[0]
    assert e - s == d > 0 and we >= ws and 0 < cpu <= d


def test_events(profile):
    kinds = dict(q(profile, "SELECT kind, count(*) FROM events GROUP BY kind"))
    assert kinds["compile"] == 1 and kinds["load"] == 1 and kinds["cpu_fallback"] >= 2
    assert kinds["host_transfer"] >= 2


def test_instructions_stamped_per_execution(profile):
    # compiler helper instructions (an identity matrix for transposes) belong to no op: null op_id
    [(n, bad_op, bad_range)] = q(profile, """
        SELECT count(*), count(*) FILTER (WHERE op_id IS NULL AND engine IN ('tensor', 'cpu', 'vector', 'scalar')),
               count(*) FILTER (WHERE i.start_ns < x.start_ns OR i.start_ns + i.dur_ns > x.end_ns + 1)
        FROM instructions i JOIN executions x USING (exec_id)""")
    assert n > 5 and bad_op == 0 and bad_range == 0
    engines = {r[0] for r in q(profile, "SELECT DISTINCT engine FROM instructions")}
    assert "cpu" in engines and "tensor" in engines
    [(joined,)] = q(profile, "SELECT count(*) FROM instructions i JOIN ops o USING (op_id) WHERE i.engine = 'cpu' "
                             "AND o.placement = 'cpu_fallback'")
    assert joined >= 2


def test_memory_and_metadata(profile):
    cats = dict(q(profile, "SELECT category, max(bytes) FROM memory GROUP BY category"))
    assert cats["constants"] > 0 and cats["runtime_memory"] > 0 and "model_code" in cats
    meta = dict(q(profile, "SELECT key, value FROM metadata"))
    assert (meta["is_simulation"] == "true" and meta["target"] == "trn1"
            and meta["timing_model"] in ("roofline", "instruction"))


def test_seam_transfers_are_runtime_tensor_reads_and_writes(profile):
    # a CPU island's seams are recorded as eager copies are (runtime/recorder.py: record_transfer)
    events = q(profile, "SELECT ts_ns, dur_ns, detail::JSON->>'direction', CAST(detail::JSON->>'bytes' AS BIGINT) "
                        "FROM events WHERE kind = 'host_transfer' ORDER BY ALL")
    api = {"to_device": "nrt_tensor_write", "to_host": "nrt_tensor_read"}
    system = q(profile, "SELECT start_ts, duration_ns, name, CAST(extra_attributes_json::JSON->>'size' AS BIGINT) "
                        "FROM SystemProfileEvents WHERE name IN ('nrt_tensor_write', 'nrt_tensor_read') ORDER BY ALL")
    assert len(events) >= 2 and sorted((t, d, api[k], b) for t, d, k, b in events) == system
