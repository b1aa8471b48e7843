"""The real tool's JSON output (``view --output-format json``): ``system_profile.json`` with the system profile's
tables and one ``device_profile_model_<graph_id>.json`` per graph with that graph's device rows, every real table
under its real name with as many rows as SQL counts; the ignore flags; the bound."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from test_explorer_profiles import build_tables, write_profile
from test_perfetto_proto import system_tables

import traces
from traces import json_files

CLI = [sys.executable, "-m", "explorer.cli"]


def count(p, table: str, where: str = "", params=None) -> int:
    return p.sql(f'SELECT count(*) FROM neuron_explorer."{table}"' + (f" WHERE {where}" if where else ""),
                 params).column(0)[0].as_py()


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """A two-graph, two-core profile with a system profile, and what ``view --output-format json`` wrote."""
    tables = build_tables(seqs=(64, 128), iterations=3, tiles=2)
    tables.update(system_tables(tables["executions"]))
    path = write_profile(tmp_path_factory.mktemp("js") / "20260105-120000_mlp", tables)
    run = subprocess.run([*CLI, "view", str(path), "--output-format", "json"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert "wrote" in run.stdout and "system_profile.json" in run.stdout
    return path


def test_the_system_file_holds_the_system_tables(session):
    doc = json.loads((session.parent / "system_profile.json").read_text())
    assert not (session.parent / "profile.json").exists()
    with traces.open(session) as p:
        want = [t for t in p.real_tables() if t in json_files.SYSTEM_TABLES]
        assert sorted(doc["tables"]) == sorted(want) and "SystemProfileEvents" in want and "CpuUsage" in want
        for t in want:
            assert len(doc["tables"][t]) == count(p, t), t
    assert doc["truncated"] == [] and doc["format"] == "neuron-explorer system profile json"
    names = {e["name"] for e in doc["tables"]["SystemProfileEvents"]}
    assert {"nrt_execute", "nc_exec_running"} <= names


def test_a_device_file_per_graph_holds_that_graphs_rows(session):
    with traces.open(session) as p:
        graphs = p.sql("SELECT DISTINCT graph_id FROM executions ORDER BY graph_id").column(0).to_pylist()
        assert len(graphs) == 2
        files = sorted(session.parent.glob("device_profile_model_*.json"))
        assert [f.name for f in files] == [f"device_profile_model_{g}.json" for g in graphs]
        device = [t for t in p.real_tables() if t not in json_files.SYSTEM_TABLES]
        of_graph = "exec_id IN (SELECT exec_id FROM main.executions WHERE graph_id = ?)"
        seen = 0
        for g in graphs:
            doc = json.loads((session.parent / f"device_profile_model_{g}.json").read_text())
            assert doc["model_id"] == g and sorted(doc["tables"]) == sorted(device)
            execs = set(p.sql("SELECT exec_id FROM executions WHERE graph_id = ?", [g]).column(0).to_pylist())
            rows = doc["tables"]["Instruction"]
            assert rows and {r["exec_id"] for r in rows} <= execs    # this graph's instructions, no other's
            assert len(rows) == count(p, "Instruction", of_graph, [g])
            for t in ("DmaPacket", "ActiveTime", "ExecutionInfo"):
                assert len(doc["tables"][t]) == count(p, t, of_graph, [g]) > 0, t
            assert len(doc["tables"]["NeffHeader"]) == count(p, "NeffHeader", "graph_id = ?", [g]) == 1
            # a table with no graph key is the profile's as a whole, and the file says so
            assert "Summary" in doc["profile_wide"] and "Instruction" not in doc["profile_wide"]
            for t in doc["profile_wide"]:
                assert len(doc["tables"][t]) == count(p, t), t
            seen += len(rows)
        assert seen == count(p, "Instruction")     # every instruction in one graph's file


def test_the_ignore_flags_leave_a_side_out(session, tmp_path):
    device = sorted(f.name for f in session.parent.glob("device_profile_model_*.json"))
    assert len(device) == 2
    for flag, want in (("--ignore-device-profile", ["system_profile.json"]), ("--ignore-system-profile", device)):
        copy = tmp_path / flag.strip("-")
        copy.mkdir()
        shutil.copy(session, copy / "profile.duckdb")
        run = subprocess.run([*CLI, "view", str(copy / "profile.duckdb"), "--output-format", "json", flag],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert sorted(f.name for f in copy.glob("*.json")) == want


def test_a_table_holds_at_most_max_rows_and_the_cut_are_listed(session, tmp_path):
    with traces.open(session) as p:
        files = json_files.write(p, tmp_path, max_rows=5, system=False)
    doc = json.loads(files[0].path.read_text())
    assert len(doc["tables"]["Instruction"]) == 5 and "Instruction" in doc["truncated"]
    assert files[0].rows["Instruction"] == 5 and "Instruction" in files[0].truncated
    assert "Metadata" not in doc["truncated"] and len(doc["tables"]["Metadata"]) == 1
