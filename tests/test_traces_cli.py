"""``neuron-explorer summary|sql|export`` as a user types them, including every bad-input case."""
import hashlib
import json
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow.ipc as ipc
import pytest

from traces import synthetic

EXPLORER = str(Path(sys.executable).parent / "neuron-explorer")


def run(*args, preexec_fn=None, stdin=None):
    return subprocess.run([EXPLORER, *map(str, args)], capture_output=True, text=True, timeout=180,
                          preexec_fn=preexec_fn, input=stdin)


def one_line_error(proc, *fragments):
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("neuron-explorer: note: ")]
    assert len(lines) == 1 and lines[0].startswith("neuron-explorer: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli") / "20260101T000000_model"
    synthetic.write_run(d, executions=3, instructions=600, cores=(0, 1), warmup=1)
    return d


def test_summary_finalises_a_session_and_prints_the_metrics(session):
    proc = run("summary", session)
    assert proc.returncode == 0, proc.stderr
    assert "finalising the segments" in proc.stderr        # said so, on one note line
    for name in ("total_time", "tensor_engine_active_time_percent", "mfu_estimated_percent", "hbm_read_bytes",
                 "recompile_count", "warm-up executions excluded"):
        assert name in proc.stdout
    assert (session / "profile.duckdb").exists()


def test_summary_json_has_the_real_profiler_shape(session):
    proc = run("summary", session / "profile.duckdb", "--json")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)["summary"][0]
    assert row["execution_count"] == 4 and row["recompile_count"] == 1 and row["cpu_fallback_op_count"] == 1
    assert 0 < row["tensor_engine_active_time_percent"] <= 100
    warm = json.loads(run("summary", session, "--json", "--include-warmup").stdout)["summary"][0]
    assert warm["execution_count"] == 6
    cores = json.loads(run("summary", session, "--json", "--per-core").stdout)["summary"]
    assert [(r["core"], r["execution_count"]) for r in cores] == [(0, 2), (1, 2)]


def test_sql_table_csv_json_and_arrow(session, tmp_path):
    q = "SELECT engine, count(*) AS n FROM instructions WHERE core = ? GROUP BY engine ORDER BY engine"
    table = run("sql", session, q, "-p", "1")
    assert table.returncode == 0, table.stderr
    assert "tensor" in table.stdout and "6 rows" in table.stdout
    rows = json.loads(run("sql", session, q, "-p", "1", "--format", "json").stdout)
    assert [r["engine"] for r in rows] == ["dma", "gpsimd", "scalar", "sync", "tensor", "vector"]
    assert sum(r["n"] for r in rows) == 3 * 600
    csv_out = run("sql", session, q, "-p", "1", "--format", "csv").stdout.splitlines()
    assert csv_out[0] == '"engine","n"' and len(csv_out) == 7
    arrow = run("sql", session, q, "-p", "1", "--format", "arrow", "-o", tmp_path / "r.arrow")
    assert arrow.returncode == 0, arrow.stderr
    assert ipc.open_file(str(tmp_path / "r.arrow")).read_all().num_rows == 6
    piped = run("sql", session, "-", "--format", "json", stdin="SELECT count(*) AS n FROM runs")
    assert json.loads(piped.stdout) == [{"n": 1}]
    limited = run("sql", session, "SELECT * FROM instructions", "--max-rows", "3")
    assert "first 3 shown" in limited.stdout


def test_export_every_format(session, tmp_path):
    for fmt, out in (("perfetto", tmp_path / "t.json"), ("parquet", tmp_path / "pq"), ("csv", tmp_path / "csv")):
        proc = run("export", session, "--format", fmt, "-o", out)
        assert proc.returncode == 0, proc.stderr
        assert f"exported {fmt} to {out}" in proc.stdout
    assert json.loads((tmp_path / "t.json").read_text())["displayTimeUnit"] == "ns"
    same = run("sql", tmp_path / "pq", "SELECT count(*) AS n FROM instructions", "--format", "json")
    assert json.loads(same.stdout) == [{"n": 3600}]
    assert (tmp_path / "csv" / "summary.csv").exists()


def test_bad_input_is_one_line(session, tmp_path):
    one_line_error(run("summary", tmp_path / "missing.duckdb"), "does not exist")
    (tmp_path / "corrupt.duckdb").write_bytes(b"\x00garbage" * 4096)
    one_line_error(run("summary", tmp_path / "corrupt.duckdb"), "is not a profile (not a DuckDB database)")
    one_line_error(run("sql", session, "SELEC 1"), "SQL error", "syntax error")
    one_line_error(run("sql", session, "SELECT * FROM no_such_table"), "no_such_table does not exist")
    one_line_error(run("sql", session, "DROP TABLE ops"), "SQL error")
    one_line_error(run("sql", session, "  "), "empty SQL statement")
    one_line_error(run("export", session, "--format", "csv", "-o", session), "already exists")
    newer = tmp_path / "newer.duckdb"
    shutil.copy(session / "profile.duckdb", newer)
    con = duckdb.connect(str(newer))
    con.execute("UPDATE metadata SET value = '2.0.0' WHERE key = 'schema_version'")
    con.close()
    one_line_error(run("summary", newer), "written by schema 2.0.0", "upgrade neuron-stack")
    bad_flag = run("export", session, "--format", "xml", "-o", tmp_path / "x")
    assert bad_flag.returncode == 2 and "invalid choice: 'xml'" in bad_flag.stderr


def test_truncated_segment_is_a_warning_not_a_failure(tmp_path):
    d = tmp_path / "s"
    synthetic.write_run(d, run_id="a", executions=2, instructions=300)
    synthetic.write_run(d, run_id="b", executions=2, instructions=300)
    victim = next(d.glob("instructions.b.*.arrow"))
    victim.write_bytes(victim.read_bytes()[:1000])
    proc = run("sql", d, "SELECT count(*) AS n FROM instructions", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [{"n": 600}]
    warning = [ln for ln in proc.stderr.splitlines() if "warning" in ln]
    assert len(warning) == 1 and victim.name in warning[0] and "truncated" in warning[0]


def _small_disk():
    # a 256 KiB file-size limit: every write past it fails like a full disk (EFBIG, SIGXFSZ ignored)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))


def test_full_disk_during_finalise_keeps_the_previous_profile(tmp_path):
    d = tmp_path / "s"
    synthetic.write_run(d, run_id="first", executions=2, instructions=300)
    assert run("summary", d).returncode == 0
    before = hashlib.sha256((d / "profile.duckdb").read_bytes()).hexdigest()
    synthetic.write_run(d, run_id="second", executions=2, instructions=300)   # the profile is now stale
    proc = run("summary", d, preexec_fn=_small_disk)
    one_line_error(proc, "could not finalise", "previous profile is unchanged", "free disk space")
    assert hashlib.sha256((d / "profile.duckdb").read_bytes()).hexdigest() == before
    assert not [p.name for p in d.iterdir() if p.name.endswith((".tmp", ".wal"))]
    ok = run("summary", d, "--json")                                        # space again: it recovers
    assert ok.returncode == 0 and json.loads(ok.stdout)["summary"][0]["run_count"] == 2


@pytest.mark.parametrize("query,fragment", [
    ("COPY (SELECT 1) TO '{tmp}/out.csv'", "Cannot access file"),
    ("SELECT * FROM read_text('/etc/hostname')", "Cannot access file"),
    ("INSTALL httpfs", "Permission Error"),
    ("ATTACH '{tmp}/other.duckdb' AS o", "Cannot access file"),
    ("SET enable_external_access = true", "locked"),
])
def test_sql_is_read_only_by_default(session, tmp_path, query, fragment):
    one_line_error(run("sql", session, query.format(tmp=tmp_path)), fragment, "--unsafe")
    assert list(tmp_path.iterdir()) == []   # nothing written


def test_sql_read_only_on_a_parquet_export_and_unsafe_opt_in(session, tmp_path):
    out = tmp_path / "pq"
    assert run("export", session, "--format", "parquet", "-o", out).returncode == 0
    r = run("sql", out, "SELECT count(*) AS n FROM instructions", "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["n"] > 0, r.stderr
    one_line_error(run("sql", out, f"COPY instructions TO '{tmp_path}/x.csv'"), "--unsafe")
    note = tmp_path / "note.txt"
    note.write_text("mine")
    r = run("sql", session, f"SELECT content FROM read_text('{note}')", "--format", "json", "--unsafe")
    assert r.returncode == 0 and json.loads(r.stdout) == [{"content": "mine"}], r.stderr


def test_sql_every_format_takes_list_struct_and_map_columns(session, tmp_path):
    """``SystemProfileEvents.flow_id`` is VARCHAR[]: CSV (and every format) writes nested values, as JSON."""
    q = "SELECT [1, 2] AS l, ['a', NULL] AS s, {'k': 3} AS st, MAP {'m': 4} AS mp, NULL::VARCHAR[] AS none"
    csv_out = run("sql", session, q, "--format", "csv")
    assert csv_out.returncode == 0, csv_out.stderr
    assert csv_out.stdout.splitlines() == ['"l","s","st","mp","none"', '"[1, 2]","[""a"", null]","{""k"": 3}",'
                                                                         '"[[""m"", 4]]",']
    assert run("sql", session, q, "--format", "csv", "-o", tmp_path / "r.csv").returncode == 0
    assert (tmp_path / "r.csv").read_text().splitlines()[1].startswith('"[1, 2]"')
    assert json.loads(run("sql", session, q, "--format", "json").stdout)[0]["s"] == ["a", None]
    assert run("sql", session, q, "--format", "arrow", "-o", tmp_path / "r.arrow").returncode == 0
    table = run("sql", session, q)
    assert table.returncode == 0 and '["a", null]' in table.stdout, table.stdout


def test_sql_a_wide_row_stays_readable(session):
    """A single row wider than the terminal is printed transposed (column / type / value), several wide rows
    keep the columns that fit and say how many were left out; no column is squeezed to nothing."""
    env_cols = {"COLUMNS": "100"}
    import os

    def wide(*args):
        return subprocess.run([EXPLORER, *map(str, args)], capture_output=True, text=True, timeout=180,
                              env={**os.environ, **env_cols})

    one = wide("sql", session, "SELECT * FROM Summary")
    assert one.returncode == 0, one.stderr
    lines = one.stdout.splitlines()
    assert any(ln.split("│")[1:3] and ln.split("│")[1].strip() == "total_time" for ln in lines), one.stdout
    assert "execution_count" in one.stdout and "1 row" in one.stdout
    assert all(len(ln) <= 100 for ln in lines)
    many = wide("sql", session, "SELECT * FROM Instruction", "--max-rows", "3")
    assert "columns left out (…)" in many.stdout and "start_ts" in many.stdout and "exec_id" in many.stdout
    assert all(len(ln) <= 100 for ln in many.stdout.splitlines()[:-1])
    expanded = wide("sql", session, "SELECT * FROM Instruction", "--max-rows", "2", "--expanded")
    assert expanded.stdout.count("scalar_activation_fn") == 2 and "row 2" in expanded.stdout
    narrow = wide("sql", session, "SELECT engine, count(*) AS n FROM instructions GROUP BY 1")
    assert "left out" not in narrow.stdout and "engine" in narrow.stdout.splitlines()[1]
