"""The real Neuron Explorer's remaining device tables (issue 39): a query written for each one runs on a recorded
profile, under the real name and columns, and its figures agree with the rows they come from."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import traces
from traces import profile_hierarchy, profile_schema, profile_tables

ROOT = Path(__file__).resolve().parents[1]
NEW = [t.name for t in (*profile_tables.TABLES, *profile_hierarchy.TABLES)]


@pytest.fixture(scope="module")
def trn2(tmp_path_factory):
    """The small MLP sample recorded on trn2 (LNC=2, the Tensor Engine throttle) as a user records it."""
    out = tmp_path_factory.mktemp("trn2")
    # its own simulated instance, so cores other processes hold never refuse it
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NEURON_STACK_RUNTIME_DIR": str(out) + ".cores",
           "NEURON_STACK_LIVE_DIR": str(out) + ".live"}
    r = subprocess.run([sys.executable, "-m", "explorer.cli", "inspect", "-o", str(out), "--", sys.executable,
                        str(ROOT / "sample_workloads" / "mlp.py"), "--small", "--target", "trn2"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    [path] = out.glob("*/profile.duckdb")
    with traces.open(path) as p:
        yield _Con(p)


class _Con:
    """The profile's own connection (DuckDB refuses a second one configured otherwise), and the Profile."""

    def __init__(self, profile):
        self.profile = profile

    def execute(self, sql):
        return self.profile._cursor().execute(sql)


def _one(con, sql):
    return con.execute(sql).fetchall()[0][0]


def test_a_query_written_for_each_real_table_runs(trn2):
    for name, table in profile_schema.TABLES.items():
        cols = ", ".join(f.name for f in table.fields)
        schemas = (profile_schema.SCHEMA,) if name in ("Metadata", "Summary") else (profile_schema.SCHEMA, "main")
        for schema in schemas:
            trn2.execute(f'SELECT {cols} FROM {schema}."{name}"').fetchall()
    # as a user types it: unquoted, in main
    for name in NEW:
        trn2.execute(f"SELECT * FROM {name} LIMIT 1").fetchall()
    assert {r[0] for r in trn2.execute("SELECT DISTINCT table_name FROM SchemaFields").fetchall()} >= set(NEW)


def test_opcode_summary_and_active_time_add_up_to_the_instructions(trn2):
    rows = trn2.execute("SELECT engine, opcode, instruction_count, instruction_time_ns, active_time_ns, "
                        "active_time_percent FROM OpcodeSummary").fetchall()
    bad = [r for r in rows if r[3] > 0 and not (0 < r[4] <= r[3] and 0 < r[5] <= 100)]
    assert rows and not bad, (bad, trn2.execute("SELECT exec_id, warmup, device_ns, start_ns, end_ns, "
                                                "cpu_fallback_ns FROM main.executions").fetchall())
    assert sum(r[2] for r in rows) == _one(trn2, "SELECT sum(instruction_count) FROM opcode_summary")
    # the in-order compute engines never overlap themselves: their merged active time is their busy time
    per_engine = dict(trn2.execute("SELECT engine, sum(duration_ns) FROM ActiveTime GROUP BY 1").fetchall())
    busy = dict(trn2.execute("SELECT engine, sum(duration_ns) FROM Instruction WHERE engine IN "
                             "('tensor', 'vector', 'scalar', 'gpsimd', 'sync') GROUP BY 1").fetchall())
    assert per_engine == busy and per_engine["tensor"] > 0
    assert _one(trn2, "SELECT count(*) FROM ActiveTime WHERE start_ts >= end_ts") == 0


def test_dma_tables_are_the_dma_rows(trn2):
    n_dma = _one(trn2, "SELECT count(*) FROM Instruction WHERE engine = 'dma'")
    assert n_dma > 0
    assert _one(trn2, "SELECT count(*) FROM DmaPacket") == n_dma == _one(trn2, "SELECT count(*) FROM "
                                                                           "DmaPacketAggregated")
    # each packet names its aggregated DMA, and the aggregated DMA's bytes are its packets'
    assert _one(trn2, "SELECT count(*) FROM DmaPacket p JOIN DmaPacketAggregated a ON a.id = "
                      "p.packet_aggregation_id AND a.transfer_bytes = p.transfer_bytes") == n_dma
    assert _one(trn2, "SELECT count(*) FROM DmaPacketAggregated WHERE source IS NULL OR variable IS NULL "
                      "OR op NOT IN ('read', 'write', 'copy')") == 0
    queues = {r[0] for r in trn2.execute("SELECT DISTINCT queue_name FROM DmaPacket").fetchall()}
    assert queues == {r[0] for r in trn2.execute("SELECT DISTINCT name FROM DmaQueuesInfo").fetchall()}
    # pending DMAs: never negative, and every execution ends with none pending
    assert _one(trn2, "SELECT min(value) FROM PendingDma") >= 0
    assert _one(trn2, "SELECT max(value) FROM PendingDma") >= 1
    assert _one(trn2, "SELECT count(*) FROM (SELECT exec_id, nc_idx, pcore_idx, arg_max(value, timestamp) AS last "
                      "FROM PendingDma GROUP BY ALL) WHERE last <> 0") == 0


def test_memory_usage_samples_are_fractions_of_the_device_memory(trn2):
    for table, cols in (("SbufUsage", ["avg_util_percent"] + [f"partition_{p}_util_percent" for p in (0, 32, 64, 96)]),
                        ("PsumUsage", ["avg_util_percent"] + [f"bank_{b}_util_percent" for b in range(8)])):
        lo, hi = trn2.execute(f"SELECT min(least({', '.join(cols)})), max(greatest({', '.join(cols)})) "
                              f"FROM {table}").fetchall()[0]
        assert lo >= -1e-9 and 0 < hi <= 100, (table, lo, hi)
        # each execution's last sample is after its last allocation ended: nothing left allocated
        assert _one(trn2, f"SELECT max(last) FROM (SELECT arg_max(avg_util_percent, timestamp) AS last FROM {table} "
                          f"GROUP BY exec_id, nc_idx)") == pytest.approx(0, abs=1e-9)


def test_throttle_rows_follow_the_tensor_engine_ramp(trn2):
    ramp = float(_one(trn2, "SELECT value FROM metadata WHERE key = 'tensor_engine_throttle_ramp_ns'"))
    assert ramp > 0
    rows = trn2.execute("SELECT timestamp, duration, k, n, pcore_idx FROM Throttle").fetchall()
    assert rows and all(0 < d <= ramp and (k, n) == (1, 2) for _, d, k, n, _ in rows)
    starts = {r[0] for r in trn2.execute("SELECT start_ts FROM Instruction WHERE engine = 'tensor'").fetchall()}
    assert {r[0] for r in rows} <= starts          # a throttle starts with a Tensor instruction
    [(pct, util)] = trn2.execute("SELECT throttle_active_time_percent, max_achievable_util_with_throttling_percent "
                                 "FROM ThrottleSummary WHERE throttle_type = 'all'").fetchall()
    assert 0 < pct <= 100 and 50 <= util <= 75


def test_hierarchy_and_stack_frames_name_the_model(trn2):
    nodes = {r[0]: r[1] for r in trn2.execute("SELECT node_name, parent_name FROM FrameworkNode").fetchall()}
    modules = {r[0] for r in trn2.execute("SELECT DISTINCT module_path FROM ops WHERE module_path <> ''").fetchall()}
    assert modules and modules <= set(nodes)
    assert _one(trn2, "SELECT count(*) FROM FrameworkNode WHERE hfu < mfu OR hfu > 100 OR start_ts > end_ts") == 0
    hlo = dict(trn2.execute("SELECT id, hbm_read_bytes FROM HloInstruction").fetchall())
    assert set(hlo) == {r[0] for r in trn2.execute("SELECT DISTINCT raw_hlo_id FROM Instruction "
                                                    "WHERE engine <> 'cpu'").fetchall()}
    assert sum(hlo.values()) == _one(trn2, "SELECT sum(hbm_read_bytes) FROM Instruction WHERE raw_hlo_id IS NOT NULL")
    # every Instruction.stack_frame_ids entry is a StackFrame whose location names a file and a line
    frames = trn2.execute("""SELECT DISTINCT trim(Instruction.stack_frame_ids, '[]'), n.name, l.line_number
        FROM Instruction JOIN StackFrame f ON f.id = trim(Instruction.stack_frame_ids, '[]')
        JOIN StackFrameFileLocation l ON l.id = f.file_location_id::VARCHAR
        JOIN StackFrameFileName n ON n.id = l.file_name_id::VARCHAR""").fetchall()
    assert frames and all(name.endswith("mlp.py") or name.endswith(".py") for _, name, _ in frames)
    assert _one(trn2, "SELECT count(DISTINCT stack_frame_ids) FROM Instruction WHERE stack_frame_ids IS NOT NULL") \
        == len({f[0] for f in frames})


def test_operator_table_is_the_op_summary_and_the_framework_nodes(trn2):
    rows = trn2.profile.operator_table().to_pylist()
    every = trn2.profile.operator_table(include_warmup=True).to_pylist()
    ops = dict(trn2.execute("SELECT op_id, device_ns FROM op_summary WHERE device_ns > 0").fetchall())
    assert {r["op_id"]: r["device_ns"] for r in rows if r["level"] == "op"} == ops   # the Summary's top ops
    for layer in {r["layer"] for r in rows}:
        lr = [r for r in rows if r["layer"] == layer]
        assert lr[0]["level"] == "layer"                                                 # a tree, layer first
        assert lr[0]["device_ns"] == sum(r["device_ns"] for r in lr if r["level"] == "op")
        for op_id in {r["op_id"] for r in lr if r["op_id"]}:
            assert sum(r["device_ns"] for r in lr if r["op_id"] == op_id and r["level"] == "opcode") == ops[op_id]
    # over every execution a leaf layer's MFU and HFU are its FrameworkNode's: one formula
    nodes = {r[0]: r[1:] for r in trn2.execute("SELECT node_name, mfu, hfu FROM FrameworkNode "
                                               "WHERE children_names = '[]'").fetchall()}
    layers = {r["layer"]: (r["mfu_percent"], r["hfu_percent"]) for r in every if r["level"] == "layer"}
    assert nodes and all(layers[k] == pytest.approx(v) for k, v in nodes.items())
    assert any(r["mfu_percent"] > 0 for r in rows) and all(r["first_start_ns"] < r["first_end_ns"] for r in rows)


def test_the_throttling_track_is_the_throttle_view(trn2):
    """The timeline's throttling track (trn2 has the limiter) adds up to the Throttle view's events: one number."""
    from explorer.figures import counter_figure

    p = trn2.profile
    lo, hi = p.sql("SELECT min(start_ns) AS a, max(start_ns + dur_ns) AS b FROM instructions").to_pylist()[0].values()
    lo, hi = lo - 10_000, hi + 10_000
    track = p.throttle_track(lo, hi, 100)
    cores = _one(trn2, "SELECT count(DISTINCT core) FROM executions") * int(p.metadata()["num_physical_cores"])
    events = _one(trn2, "SELECT sum(duration) FROM Throttle")
    assert events > 0 and 0 < max(track) <= 100
    assert sum(track) / 100 * cores * (hi - lo) / 100 == pytest.approx(events, rel=1e-9)
    fig = counter_figure({"start": 0, "end": hi - lo, "hfu_x": [0.0], "hfu": [0.0], "throttle": list(track),
                          "memory": []})
    assert fig["layout"]["yaxis3"]["title"]["text"] == "throttled %"


def test_user_sql_reads_the_real_metadata_and_summary(trn2):
    """In user SQL (the console, ``neuron-explorer sql``) the real names come first: ``Metadata`` is one wide row and
    ``Summary`` has every real field (ours beside them); our key/value metadata is ``main.metadata``."""
    p = trn2.profile
    meta = p.user_sql("SELECT * FROM Metadata", select_only=True).table.to_pylist()
    assert len(meta) == 1 and meta[0]["profile_schema_version"] == "7.4.0" and meta[0]["num_physical_cores"] == 2
    assert meta[0]["instance_type"] == "trn2.48xlarge" and meta[0]["vnc_enabled"] is True
    real = ", ".join(f.name for f in profile_schema.SUMMARY.fields)
    [row] = p.user_sql(f"SELECT {real}, execution_count FROM Summary", select_only=True).table.to_pylist()
    assert row["total_time"] == p.summary()["total_time"] and row["input_queue_bytes"] is None   # not typed here
    kv = p.user_sql("SELECT value FROM main.metadata WHERE key = 'target'", select_only=True).table.to_pylist()
    assert kv == [{"value": "trn2"}]
    assert p.sql("SELECT count(*) AS n FROM metadata").to_pylist()[0]["n"] > 1   # the API's own queries: ours


def test_stack_frames_are_the_users_call_stacks(recorded_samples):
    """An op's StackFrame chain, parent by parent, is its user call stack: BertEncoder.forward → Block.forward →
    SelfAttention.forward → attention(), as torch.export recorded it (torch's own frames left out)."""
    path = recorded_samples.get("bert_encoder")["bert_encoder"]
    with traces.open(path) as p:
        frames = {r["id"]: r for r in p.sql("""SELECT f.id, f.parent_frame_id AS parent, l.line_number AS line,
            fn.name AS function, n.name AS file FROM StackFrame f
            JOIN StackFrameFileLocation l ON l.id = f.file_location_id::VARCHAR
            JOIN StackFrameFileName n ON n.id = l.file_name_id::VARCHAR
            JOIN StackFrameFunctionName fn ON fn.id = l.function_name_id::VARCHAR""").to_pylist()}
        leaves = p.sql("""SELECT DISTINCT trim(i.stack_frame_ids, '[]') AS id, s.line FROM Instruction i
            JOIN main.ops o ON o.op_id = i.raw_hlo_id JOIN main.sources s ON s.source_id = o.source_id""").to_pylist()
    assert all(f["parent"] == "0" or f["parent"] in frames for f in frames.values())   # every parent is a frame

    def chain(fid):
        out = []
        while fid != "0":
            out.append(frames[fid])
            fid = frames[fid]["parent"]
        return out[::-1]

    assert leaves and all(chain(leaf["id"])[-1]["line"] == leaf["line"] for leaf in leaves)   # innermost = op's line
    models = (ROOT / "sample_workloads" / "models.py").read_text().splitlines()
    softmax = 1 + next(i for i, t in enumerate(models) if "return scores.softmax(dim=-1) @ v" in t)
    [stack] = {tuple((f["function"], models[f["line"] - 1].strip()) for f in chain(leaf["id"]))
               for leaf in leaves if leaf["line"] == softmax and len(chain(leaf["id"])) > 1}
    assert [fn for fn, _ in stack] == ["forward", "forward", "forward", "attention"]
    assert [code for _, code in stack] == ["x = layer(x, pad_mask)", "x = self.ln1(x + self.attn(x, pad_mask))",
                                           "y = attention(q, k, v, mask)", "return scores.softmax(dim=-1) @ v"]


# -- every real table and column, as a user's query through `neuron-explorer sql` ------------------------------
#: The reference's tables and columns (tests/data: names only, from the SDK's profile-schema-reference.rst).
REFERENCE = {name: cols.split() for name, _, cols in (
    line.partition(": ") for line in (ROOT / "tests" / "data" / "neuron_explorer_schema_7.4.0.txt").read_text()
    .splitlines() if line and not line.startswith("#"))}
#: The reference's own words for these: "not persisted to a parquet table" (the real API computes them), so no
#: query written for the real tool reads them.
TRANSIENT = {"MemoryBandwidthPoint", "MemoryBandwidthSeries", "MemoryBandwidthResponse"}


def _every_table_query() -> str:
    """One statement that names every real table (``SELECT *``) and every real column: a missing table is a
    Catalog Error, a missing column a Binder Error. Its one row: each table's row count."""
    parts = [f'(SELECT count(*) FROM (SELECT * FROM {t} LIMIT 1)) + 0 * (SELECT count(*) FROM (SELECT '
             + ", ".join(f'"{c}"' for c in cols) + f" FROM {t} LIMIT 1)) AS \"{t}\", "
             f'(SELECT count(*) FROM {t}) AS "{t}.rows"' for t, cols in REFERENCE.items() if t not in TRANSIENT]
    return "SELECT " + ",\n".join(parts)


def _sql_cli(profile, query) -> dict:
    """``neuron-explorer sql PROFILE - --format json`` as a user runs it (the statement on stdin)."""
    r = subprocess.run([sys.executable, "-m", "explorer.cli", "sql", str(profile), "-", "--format", "json"],
                       input=query, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    import json
    [row] = json.loads(r.stdout)
    return row


def test_the_reference_list_is_the_real_schema():
    assert len(REFERENCE) == 52 and sum(map(len, REFERENCE.values())) == 656
    assert set(REFERENCE) - TRANSIENT <= set(profile_schema.TABLES) | {"Flow", "SbufAllocation", "SemaphoreUpdate",
                                                                       "TensorInfo"}


@pytest.fixture(scope="module")
def nki_profile(tmp_path_factory):
    """The tiled matmul NKI kernel profiled as the NKI guide does (``nki.profile``)."""
    import numpy as np
    from nki_helpers import sample

    from neuron_stack import nki

    prof = nki.profile(working_directory=tmp_path_factory.mktemp("nki"))(sample("matmul").matmul_tiled)
    prof(np.ones((256, 128), np.float32), np.ones((256, 512), np.float32))
    return prof.profile_path


def test_a_query_naming_every_real_column_runs_on_recorded_profiles(trn2, recorded_samples, nki_profile):
    query = _every_table_query()
    mlp = _sql_cli(trn2.profile.path, query)
    assert all(mlp[t] == (mlp[f"{t}.rows"] > 0) for t in REFERENCE if t not in TRANSIENT)
    # the tables a small trn2 MLP fills (the rest: collectives, NKI kernels, barriers, errors, warnings, stages
    # the compiler has not)
    filled = {t for t in REFERENCE if mlp.get(f"{t}.rows")}
    assert filled >= {"Instruction", "Summary", "Metadata", "ExecutionInfo", "NeffHeader", "DeviceProfileList",
                      "SystemProfileMetadata", "DmaUsage", "DmaUsageSummary", "HbmUsageSummaryByType",
                      "FrameworkInstruction", "SbufAllocation", "SemaphoreUpdate", "TensorInfo", "Flow",
                      "Throttle", "PendingDma"}, sorted(set(REFERENCE) - filled)
    assert mlp["ExecutionInfo.rows"] == _one(trn2, "SELECT count(*) FROM executions")
    tp = _sql_cli(recorded_samples.get("tensor_parallel")["tensor_parallel"], query)
    assert tp["CcOp.rows"] > 0 and tp["CcInstruction.rows"] > 0 and tp["CcStream.rows"] >= 1
    kernel = _sql_cli(nki_profile, query)
    assert kernel["KernelInstructions.rows"] > 0 and kernel["KernelIterationVariables.rows"] > 0


def test_schema_fields_describe_every_real_column(trn2):
    have = set(trn2.execute("SELECT table_name, field_name FROM SchemaFields").fetchall())
    missing = [(t, c) for t, cols in REFERENCE.items() if t not in TRANSIENT for c in cols if (t, c) not in have]
    assert missing == []


def test_show_profile_schema_lists_every_real_column():
    import yaml

    r = subprocess.run([sys.executable, "-m", "explorer.cli", "--show-profile-schema"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    schemas = yaml.safe_load(r.stdout)["components"]["schemas"]
    missing = [(t, c) for t, cols in REFERENCE.items() if t not in TRANSIENT
               for c in cols if c not in schemas.get(t, {}).get("properties", {})]
    assert missing == []


def test_the_summarys_derived_fields_are_their_rows(trn2):
    s = trn2.profile.user_sql("SELECT * FROM Summary").table.to_pylist()[0]
    measured = ("exec_id IN (SELECT exec_id FROM executions WHERE NOT warmup)")
    assert s["matmul_instruction_count"] == _one(trn2, f"SELECT count(*) FROM instructions WHERE opcode = 'MATMUL' "
                                                       f"AND {measured}") > 0
    assert s["activate_instruction_count"] == _one(trn2, f"SELECT count(*) FROM instructions WHERE opcode = "
                                                         f"'ACTIVATE' AND {measured}")
    assert s["dma_queue_count"] == _one(trn2, "SELECT count(DISTINCT queue) FROM instructions WHERE engine = 'dma'")
    assert s["weight_size_bytes"] == _one(trn2, "SELECT sum(size) FROM TensorInfo WHERE type = 'WEIGHT'") > 0
    assert s["weight_size_bytes"] < s["inputs_and_weights_size_bytes"] < s["inputs_outputs_weights_size_bytes"]
    assert s["mfu_hlo_estimated_percent"] == s["mfu_estimated_percent"]
    assert s["mfu_estimated_percent"] <= s["mfu_max_achievable_estimated_percent"] <= 100
    assert s["mfu_inst_estimated_percent"] == pytest.approx(
        s["mfu_estimated_percent"] * (s["hardware_flops"] - s["transpose_flops"]) / s["model_flops"])
    assert s["hardware_dynamic_dma_packet_count"] == 0 and s["dma_transfer_time"] == s["dma_packet_time"] > 0


def test_the_summarys_active_times_and_memory_bytes(trn2):
    s = trn2.profile.user_sql("SELECT * FROM Summary").table.to_pylist()[0]
    engines = [s[f"{e}_engine_active_time"] for e in ("tensor", "vector", "scalar", "gpsimd", "sync")]
    # the union of every engine's intervals: at least the busiest engine's, at most their sum and the device time
    assert max(engines + [s["dma_active_time"]]) <= s["total_active_time"] <= min(
        sum(engines) + s["dma_active_time"] + s["cc_op_active_time"], s["total_time"]) + 1e-12
    assert s["static_dma_active_time"] == pytest.approx(s["dma_active_time"])   # no DMA_INDIRECT in an MLP
    assert s["software_dynamic_dma_active_time"] == 0 == s["software_dynamic_dma_packet_percent"]
    assert s["adjusted_hardware_flops"] == 4 * s["hardware_flops"]              # fp32 inputs: the real 4.0x
    assert s["adjusted_transpose_flops"] == 4 * s["transpose_flops"] > 0
    assert s["psum_read_sbuf_write_count"] > 0 and s["psum_write_bytes"] > 0
    assert s["sbuf_write_bytes"] >= s["hbm_read_bytes"] and s["sbuf_read_bytes"] >= s["hbm_write_bytes"]
    assert s["trace_count"] == _one(trn2, "SELECT count(*) FROM instructions") + _one(
        trn2, "SELECT count(*) FROM SemaphoreUpdate")
