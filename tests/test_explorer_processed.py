"""The real tool's default output: ``neuron-explorer view`` processes a profile into a directory of Parquet
tables (``<data-path>/profiles/global/<display-name>@latest/Instruction.parquet``, ...), once per profile,
read back with pyarrow / DuckDB as a user's script would."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
from servers import free_ports, wait_http

import traces
import traces.synthetic
from traces import processed
from traces.profile_schema import SCHEMA

VIEW = [sys.executable, "-m", "explorer.cli", "view"]


def _tables(out: Path) -> dict[str, int]:
    """Rows per table in a processed directory, split files (``X_0.parquet``...) read together."""
    rows: dict[str, int] = {}
    for f in out.glob("*.parquet"):
        stem = f.stem
        name = stem.rsplit("_", 1)[0] if stem.rsplit("_", 1)[-1].isdigit() else stem
        rows[name] = rows.get(name, 0) + pq.ParquetFile(f).metadata.num_rows
    return rows


def _profile_rows(path: Path) -> dict[str, int]:
    with traces.open(path) as p:
        return {n: p.sql(f'SELECT count(*) FROM {SCHEMA}."{n}"').column(0)[0].as_py() for n in p.real_tables()}


def test_ingest_only_writes_the_real_parquet_tables_once(tmp_path):
    out = tmp_path / "output"
    traces.synthetic.write_run(out / "s1", executions=2, instructions=3000)
    run = subprocess.run([*VIEW, "-d", str(out), "--ingest-only", "--display-name", "base line"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    done = out / "s1" / "profiles" / "global" / "base line@latest"
    assert f"Parquet tables written to {done}/" in run.stdout
    want = _profile_rows(out / "s1" / "profile.duckdb")
    # every table with rows is there with the view's row count; a table without rows writes no file
    assert _tables(done) == {n: c for n, c in want.items() if c}
    assert {"Instruction", "DmaPacket", "Summary", "SchemaFields", "Metadata"} <= set(_tables(done))
    con = duckdb.connect()
    total = con.execute("SELECT total_time FROM read_parquet(?)", [str(done / "Summary.parquet")]).fetchone()[0]
    with traces.open(out / "s1") as p:
        assert total == p.sql(f'SELECT total_time FROM {SCHEMA}."Summary"').column(0)[0].as_py()
        by_op = p.sql(f'SELECT opcode, count(*) AS n FROM {SCHEMA}."Instruction" GROUP BY 1 ORDER BY 1').to_pylist()
    assert con.execute("SELECT opcode, count(*) AS n FROM read_parquet(?) GROUP BY 1 ORDER BY 1",
                       [str(done / "Instruction.parquet")]).fetchall() == [(r["opcode"], r["n"]) for r in by_op]
    # up to date: not written again (same files, same times)
    before = {f.name: f.stat().st_mtime_ns for f in done.iterdir()}
    again = subprocess.run([*VIEW, str(out / "s1"), "--ingest-only"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "up to date in" in again.stdout, again.stdout + again.stderr
    assert {f.name: f.stat().st_mtime_ns for f in done.iterdir()} == before
    # renamed: written under the new name, the old name's directory removed; --data-path elsewhere
    ws = tmp_path / "ws"
    moved = subprocess.run([*VIEW, str(out / "s1"), "--output-format", "parquet", "--display-name", "v2",
                            "--data-path", str(ws)], capture_output=True, text=True, timeout=300)
    assert moved.returncode == 0, moved.stderr
    assert _tables(ws / "profiles" / "global" / "v2@latest") == _tables(done)
    subprocess.run([*VIEW, str(out / "s1"), "--ingest-only"], check=True, capture_output=True, timeout=300)
    assert sorted(p.name for p in (out / "s1" / "profiles" / "global").iterdir()) == ["v2@latest"]


def test_large_tables_are_split_and_read_back_by_a_glob(tmp_path):
    traces.synthetic.write_run(tmp_path / "s", executions=2, instructions=3000)
    done, wrote = processed.process(tmp_path / "s", split_rows=2048)
    assert wrote and (done / "Instruction_0.parquet").is_file() and not (done / "Instruction.parquet").exists()
    parts = sorted(glob.glob(str(done / "Instruction_*.parquet")))
    assert len(parts) >= 2
    n = sum(pq.read_table(f).num_rows for f in parts)     # as the real docs read a split table
    assert n == _profile_rows(tmp_path / "s" / "profile.duckdb")["Instruction"]
    stamp = json.loads((done / processed.STAMP).read_text())
    assert stamp["rows"]["Instruction"] == n


def test_view_writes_them_in_the_background_after_the_server_is_up(tmp_path):
    traces.synthetic.write_run(tmp_path / "s", executions=2, instructions=600)
    traces.open(tmp_path / "s").close()   # finalised, as `view DIR` needs
    (port,) = free_ports(1)
    log = tmp_path / "view.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as f:
        proc = subprocess.Popen([*VIEW, str(tmp_path / "s"), "--port", str(port)], stdout=f, stderr=f, env=env)
    done = None
    try:
        wait_http(f"http://127.0.0.1:{port}/", 120, proc, log)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and done is None:
            found = list((tmp_path / "s" / "profiles" / "global").glob("*@latest/" + processed.STAMP))
            done = found[0].parent if found else None
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert done is not None, log.read_text()[-2000:]
    assert "processed" in log.read_text() and "Summary" in _tables(done)
    assert _tables(done) == {n: c for n, c in _profile_rows(tmp_path / "s" / "profile.duckdb").items() if c}
    # the next view's writer finds it up to date: nothing written, nothing said
    before = {f.name: f.stat().st_mtime_ns for f in done.iterdir()}
    again = subprocess.run([sys.executable, "-m", "traces.processed", str(tmp_path / "s" / "profile.duckdb")],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert {f.name: f.stat().st_mtime_ns for f in done.iterdir()} == before
