"""Data and tensor parallel sample workloads as a user runs them, and what their profiles show."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import traces
from neuron_stack.device.profiles import get_profile
from neuron_stack.runtime.collectives import Group, plan

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, script, *args):
    out = tmp_path / "profile"
    env = {**os.environ, "NEURON_STACK_RUNTIME_DIR": str(tmp_path / "rt"),
           "NEURON_COMPILE_CACHE_URL": str(tmp_path / "cache"), "NEURON_RT_INSPECT_ENABLE": "1",
                                           "NEURON_RT_INSPECT_DEVICE_PROFILE": "session",
           "NEURON_RT_INSPECT_OUTPUT_DIR": str(out)}
    for var in ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_STACK_INSTANCE_TYPE"):
        env.pop(var, None)
    p = subprocess.run([sys.executable, str(ROOT / "sample_workloads" / script), "--small", *args], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "OK vs eager PyTorch" in p.stdout
    return p.stdout, traces.finalize(out)


def test_data_parallel_runs_cores_side_by_side(tmp_path):
    out, db = _run(tmp_path, "data_parallel.py", "--cores", "4")
    assert "cores: [0, 1, 2, 3]" in out
    with traces.open(db) as prof:
        # the last DataParallel call: one execution per core, all starting at the same projected time
        rows = prof.sql("""SELECT core, start_ns, end_ns FROM executions
                           WHERE start_ns = (SELECT max(start_ns) FROM executions WHERE core = 3)""").to_pylist()
        assert sorted(r["core"] for r in rows) == [0, 1, 2, 3]
        assert len({r["end_ns"] for r in rows}) == 1
        lanes = prof.sql("SELECT DISTINCT core FROM instructions ORDER BY core").column("core").to_pylist()
        assert lanes == [0, 1, 2, 3]


@pytest.mark.parametrize("tp", [2, 8])
def test_tensor_parallel_records_all_reduces_that_overlap(tmp_path, tp):
    out, db = _run(tmp_path, "tensor_parallel.py", "--tp", str(tp))
    with traces.open(db) as prof:
        cc = prof.sql("""SELECT core, count(*) AS n, sum(dur_ns) AS busy FROM instructions
                         WHERE engine = 'cc' GROUP BY core ORDER BY core""").to_pylist()
        assert [r["core"] for r in cc] == list(range(tp))
        # 2 stages x 2 micro-batches, each a small all-reduce: the runtime's Mesh, a constant number of steps
        p = plan("all_reduce", 16 * 64, "float32", Group.on_cores(range(tp)), get_profile("trn1"))
        assert all(r["n"] == 4 * p.steps for r in cc) and p.steps <= 4
        ev = prof.sql("""SELECT json_extract_string(detail, '$.operation') AS op,
                                json_extract_string(detail, '$.algorithm') AS algo,
                                json_extract(detail, '$.bus_bandwidth')::DOUBLE AS busbw,
                                json_extract(detail, '$.algorithm_bandwidth')::DOUBLE AS algbw,
                                json_extract(detail, '$.input_size')::BIGINT AS size
                         FROM events WHERE kind = 'collective'""").to_pylist()
        assert len(ev) == 4 * tp
        assert {(e["op"], e["algo"]) for e in ev} == {("AllReduce", p.algorithm)}
        # the real profiler's CcOp table carries the algorithm the runtime chose
        assert prof.sql('SELECT DISTINCT algorithm FROM neuron_explorer."CcOp"').column(0).to_pylist() == [p.algorithm]
        assert all(e["busbw"] == pytest.approx(e["algbw"] * 2 * (tp - 1) / tp, rel=1e-2) for e in ev)
        assert {e["size"] for e in ev} == {1 * 16 * 64 * 4}   # one micro-batch of the (2, 16, 64) fp32 block
        # overlap: some collective runs while a compute instruction runs on the same core
        overlap = prof.sql("""SELECT count(*) AS n FROM instructions c JOIN instructions k
                              ON c.core = k.core AND c.engine = 'cc' AND k.engine NOT IN ('cc', 'cpu')
                              AND k.start_ns < c.start_ns + c.dur_ns AND c.start_ns < k.start_ns + k.dur_ns""")
        assert overlap.column("n")[0].as_py() > 0


def test_shard_helpers_match_the_full_layer():
    from neuron_stack.parallel import ParallelError, column_parallel, row_parallel
    torch.manual_seed(0)
    lin, x = torch.nn.Linear(8, 6), torch.randn(3, 8)
    cols = torch.cat([s(x) for s in column_parallel(lin, 3)], -1)
    rows = sum(s(xi) for s, xi in zip(row_parallel(lin, 2), x.chunk(2, -1))) + lin.bias
    assert torch.allclose(cols, lin(x), atol=1e-6) and torch.allclose(rows, lin(x), atol=1e-6)
    with pytest.raises(ParallelError, match="6 output features do not split over 4 cores"):
        column_parallel(lin, 4)
