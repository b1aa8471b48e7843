"""End to end, as a user runs it: `neuron-explorer inspect -- python sample_workloads/<w>.py --small`
records one row per instruction; summed per engine they equal each execution's busy times, and
every instruction resolves through its op to a source line of the user's model file."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import traces

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync", "dma", "cc")


WORKLOADS = ("mlp", "cnn")


@pytest.fixture(scope="module")
def inspected(tmp_path_factory):
    """Both workloads' ``neuron-explorer inspect`` runs, started together (two processes, one wait)."""
    cli = Path(sys.executable).parent / "neuron-explorer"
    runs = {}
    for name in WORKLOADS:
        out = tmp_path_factory.mktemp(f"inspect-{name}")
        runs[name] = subprocess.Popen(
            [str(cli), "inspect", "-o", str(out), "--", sys.executable, f"sample_workloads/{name}.py", "--small"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "NEURON_COMPILE_CACHE_URL": str(out / "cache")})
    paths = {}
    try:
        for name, proc in runs.items():
            stdout, stderr = proc.communicate(timeout=300)
            assert proc.returncode == 0, stderr[-2000:]
            paths[name] = re.search(r"profile written to (\S+profile\.duckdb)", stdout + stderr).group(1)
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return paths


@pytest.fixture(scope="module", params=WORKLOADS)
def profile(request, inspected):
    with traces.open(inspected[request.param]) as p:
        yield request.param, p


def test_instructions_sum_to_execution_busy_times(profile):
    _, p = profile
    busy = {row["exec_id"]: row for row in p.sql("SELECT * FROM executions").to_pylist()}
    sums = p.sql("SELECT exec_id, engine, sum(dur_ns)::BIGINT AS ns FROM instructions GROUP BY ALL").to_pylist()
    assert busy and sums
    seen = set()
    for row in sums:
        if row["engine"] in ENGINES:
            assert row["ns"] == busy[row["exec_id"]][f"{row['engine']}_busy_ns"], row
            seen.add((row["exec_id"], row["engine"]))
    # and no engine has busy time without instructions
    for eid, ex in busy.items():
        for e in ENGINES:
            if ex[f"{e}_busy_ns"]:
                assert (eid, e) in seen, (eid, e)


def test_every_instruction_resolves_to_a_line_of_the_model_file(profile):
    name, p = profile
    rows = p.sql("""SELECT count(*) AS n, count(o.op_id) AS with_op, count(s.source_id) AS with_source
                    FROM instructions i LEFT JOIN ops o USING (op_id)
                    LEFT JOIN sources s ON s.source_id = o.source_id""").to_pylist()[0]
    assert rows["n"] > 0 and rows["n"] == rows["with_op"] == rows["with_source"], rows
    files = p.sql("""SELECT DISTINCT s.file, s.line, s.code FROM instructions i JOIN ops o USING (op_id)
                     JOIN sources s ON s.source_id = o.source_id""").to_pylist()
    assert {Path(f["file"]).name for f in files} == {"models.py"}      # the user's model code, not torch
    text = (ROOT / "sample_workloads" / "models.py").read_text().splitlines()
    for f in files:
        assert f["code"].strip() == text[f["line"] - 1].strip()
    if name == "cnn":      # the convolutions are Tensor Engine matmuls on the conv lines
        conv = p.sql("""SELECT DISTINCT i.opcode FROM instructions i JOIN ops o USING (op_id)
                        WHERE o.aten_op LIKE 'aten.convolution%'""").column("opcode").to_pylist()
        assert {"LDWEIGHTS", "MATMUL"} <= set(conv) and "CUSTOM_OP" not in conv
