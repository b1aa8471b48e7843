"""The compiler's records in a profile (issue 26): SbufAllocation, Flow, SemaphoreUpdate and TensorInfo,
recorded by the lowering and scheduler into the NEFF and finalised under the real table names."""
from __future__ import annotations

import json
import zipfile

import pytest
import torch

import neuron_stack
import traces
from neuron_stack.isa.neff import Neff


@pytest.fixture(scope="module")
def encoder(recorded_samples):
    return recorded_samples.get("bert_encoder")["bert_encoder"]


def test_sample_encoder_profile_holds_every_record_table(encoder):
    with traces.open(encoder) as p:
        n = {t: p.sql(f"SELECT count(*) FROM {t}").column(0)[0].as_py()
             for t in ("SbufAllocation", "Flow", "SemaphoreUpdate", "TensorInfo")}
        assert all(v > 0 for v in n.values()), n
        bad = p.sql("""SELECT count(*) FROM SbufAllocation
                       WHERE start_ts > end_ts OR start_address > end_address OR partition < 0
                          OR partition + partition_count > 128 OR memory NOT IN ('SBUF', 'PSUM')""")
        assert bad.column(0)[0].as_py() == 0
        # every allocation lies inside its execution, and names an op of the graph
        outside = p.sql("""SELECT count(*) FROM SbufAllocation a JOIN executions e USING (exec_id)
                           WHERE a.start_ts < e.start_ns OR a.end_ts > e.end_ns OR a.op_id IS NULL""")
        assert outside.column(0)[0].as_py() == 0
        kinds = set(p.sql("SELECT DISTINCT dependency_type FROM Flow").column(0).to_pylist())
        assert {"FLOW_DEPENDENCE", "ANTI_DEPENDENCE"} <= kinds <= {"FLOW_DEPENDENCE", "ANTI_DEPENDENCE",
                                                                   "OUTPUT_DEPENDENCE"}
        # an edge's two ends are instruction rows of one execution, gap_time apart
        unmatched = p.sql("""
            WITH e AS (SELECT f.*, x.exec_id FROM Flow f JOIN executions x USING (graph_id))
            SELECT count(*) FROM e WHERE NOT EXISTS (
                SELECT 1 FROM instructions a JOIN instructions b USING (exec_id)
                WHERE a.exec_id = e.exec_id AND a.queue = e.in_queue AND a.pc = e.in_pc
                  AND b.queue = e.out_queue AND b.pc = e.out_pc AND b.start_ns - a.start_ns - a.dur_ns = e.gap_time)
              AND e.exec_id IN (SELECT exec_id FROM instructions)""")
        assert unmatched.column(0)[0].as_py() == 0
        # a semaphore's value counts its increments
        sem = p.sql("""SELECT count(*) FROM (SELECT exec_id, id, max(value) AS v, count(*) AS n
                       FROM SemaphoreUpdate GROUP BY ALL) WHERE v <> n""")
        assert sem.column(0)[0].as_py() == 0
        loads = p.sql("""SELECT count(*) FROM TensorInfo WHERE type = 'IN' AND load_to_sbuf_dma_count > 0
                         AND load_to_sbuf_total_size_bytes >= size""")
        assert loads.column(0)[0].as_py() > 0


def test_a_neff_without_records_still_loads_and_runs(tmp_path):
    """NEFFs written before the records existed (no ``schedule/<p>.<table>.arrow`` members) load."""
    torch.manual_seed(0)
    m, x = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval(), torch.randn(4, 16)
    path = neuron_stack.trace(m, x).save(tmp_path / "m.neff")
    assert Neff.load(path).schedules[0].records["Flow"].num_rows > 0
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist() if n.count(".") < 2 or not n.startswith("schedule/")}
    header = json.loads(members["neff.json"])
    header["checksums"] = {k: v for k, v in header["checksums"].items() if k in members}
    members["neff.json"] = json.dumps(header).encode()
    old = tmp_path / "old.neff"
    with zipfile.ZipFile(old, "w", compression=zipfile.ZIP_STORED) as z:
        for k, v in members.items():
            z.writestr(k, v)
    assert Neff.load(old).schedules[0].records == {}
    torch.testing.assert_close(neuron_stack.load(old)(x), m(x), rtol=1e-4, atol=1e-5)


def test_instruction_columns_the_compiler_knows_are_filled(encoder):
    """Issue 36: Instruction.operands, psum_*, tensor_elements, bir_id, performance_mode, scalar_activation_fn were
    NULL on every row though the Memory Viewer had operands. They come from instruction_info (once per graph),
    joined by the view: every instruction row stays one row, and the operands agree with SbufAllocation's."""
    with traces.open(encoder) as p:
        one = lambda q: p.sql(q).column(0)[0].as_py()  # noqa: E731
        assert one("SELECT count(*) FROM Instruction") == one("SELECT count(*) FROM instructions")
        device = "FROM Instruction WHERE engine <> 'cpu'"
        assert one(f"SELECT count(*) {device} AND (operands IS NULL OR bir_id IS NULL)") == 0
        assert one(f"SELECT bool_and(operands = compiler_operands AND bir_id = raw_bir_id::VARCHAR) {device}")
        assert one("SELECT count(*) FROM Instruction WHERE engine = 'scalar' AND opcode = 'ACTIVATE' "
                   "AND scalar_activation_fn IS NULL") == 0
        assert one("SELECT count(*) FROM Instruction WHERE engine = 'tensor' AND "
                   "(tensor_instruction_type NOT IN ('REGULAR', 'TRANSPOSE') OR tensor_elements <= 0)") == 0
        assert one("SELECT bool_and(performance_mode = '1x') FROM Instruction WHERE engine = 'vector'")  # trn1
        assert one("SELECT count(*) FROM Instruction WHERE opcode = 'MATMUL' AND psum_write_bytes > 0") > 0
        assert one("SELECT count(*) FROM Instruction WHERE psum_read_sbuf_write_bytes > 0") > 0
        assert one("SELECT count(*) FROM Instruction WHERE psum_read_sbuf_write_bytes > psum_read_bytes") == 0
        # bir_id is the id Flow's edges use: every edge's ends are instructions with those ids
        assert one("""SELECT count(*) FROM Flow f JOIN executions x USING (graph_id)
                      WHERE x.exec_id IN (SELECT exec_id FROM instructions) AND NOT EXISTS (
                          SELECT 1 FROM Instruction i WHERE i.exec_id = x.exec_id AND i.raw_bir_id = f.in_id
                          AND i.timeline_track = f.in_queue AND i.pc = f.in_pc)""") == 0
        # the Memory Viewer's operand (SbufAllocation.operands) is one of its instruction's operands
        missed = one("""SELECT count(*) FROM SbufAllocation a WHERE a.op_source_type = 'instruction' AND NOT EXISTS (
                            SELECT 1 FROM Instruction i WHERE i.exec_id = a.exec_id AND i.pc = a.first_pc
                            AND i.opcode = a.opcode AND contains(i.operands, a.operands))""")
        assert missed == 0
        # what stays NULL says why, in SchemaFields too
        why = {r["field_name"]: r["field_description"] for r in p.sql(
            "SELECT field_name, field_description FROM SchemaFields WHERE table_name = 'Instruction'").to_pylist()}
        assert "NULL here: never filled: no compute instruction triggers a DMA" in why["dma_trigger_start_ts"]
        assert one("SELECT count(*) FROM Instruction WHERE dma_trigger_start_ts IS NOT NULL") == 0


class _Scaled(torch.nn.Module):
    def forward(self, x):
        return torch.exp(x) * 3.0   # one ACTIVATE (Scalar) and one TENSOR_SCALAR (Vector) per tile


class _Channels(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = _Scaled()

    def forward(self, x):
        return self.act(x)


def test_framework_node_channels_are_the_partitions_its_instructions_cover(tmp_path):
    """A [64, N] elementwise layer: every instruction's access pattern covers 64 partitions, so its FrameworkNode's
    total_channels_scalar / _vector are 64 × its Scalar / Vector instructions, counted by hand from the NEFF."""
    import subprocess
    import sys

    torch.manual_seed(0)
    neff = neuron_stack.trace(_Channels().eval(), torch.randn(64, 48)).save(tmp_path / "m.neff")
    [sched] = Neff.load(neff).schedules.values()
    per_exec = {e: sched.table.column("engine").to_pylist().count(e) for e in ("scalar", "vector")}
    assert per_exec == {"scalar": 1, "vector": 1}
    r = subprocess.run([sys.executable, "-m", "explorer.cli", "capture", "-n", str(neff), "-s",
                        str(tmp_path / "p.ntff"), "--num-exec", "2", "--profile-nth-exec", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with traces.open(tmp_path / "p.ntff") as p:
        assert p.sql("SELECT DISTINCT channels FROM instruction_info").column(0).to_pylist() == [64]
        [row] = p.sql("""SELECT node_name, scalar_engine_instruction_count AS ns,
                                vector_engine_instruction_count AS nv, total_channels_scalar AS cs,
                                total_channels_vector AS cv FROM FrameworkNode""").to_pylist()
    # instructions of the 2nd execution only: one of each engine, 64 partitions each
    assert row == {"node_name": "act", "ns": 1, "nv": 1, "cs": 64, "cv": 64}


def test_channels_are_null_where_not_recorded(tmp_path):
    """Rows from before instruction_info.channels (old segments are cast, the column null) give NULL totals, not 0."""
    w = traces.Writer(tmp_path, run={"run_id": "r"})
    w.append("graphs", {"graph_id": [1], "run_id": ["r"], "name": ["g"], "kind": ["trace"]})
    w.append("ops", {"op_id": [1], "graph_id": [1], "aten_op": ["aten::exp"], "module_path": ["act"]})
    w.append("executions", {"exec_id": [1], "graph_id": [1], "run_id": ["r"], "core": [0], "start_ns": [0],
                            "end_ns": [100]})
    w.append("instructions", {"exec_id": [1, 1], "core": [0, 0], "engine": ["scalar", "tensor"],
                              "queue": ["Scalar", "PE"], "pc": [0, 0], "opcode": ["ACTIVATE", "MATMUL"],
                              "op_id": [1, 1], "start_ns": [0, 10], "dur_ns": [10, 10]})
    w.append("instruction_info", {"graph_id": [1], "partition": [0], "queue": ["Scalar"], "pc": [0], "pcore": [0],
                                  "seq": [0]})
    w.close()
    with traces.open(traces.finalize(tmp_path)) as p:
        [row] = p.sql("SELECT total_channels_scalar AS cs, total_channels_vector AS cv FROM FrameworkNode").to_pylist()
    assert row == {"cs": None, "cv": 0}   # a Scalar instruction of unknown channels; no Vector instruction
