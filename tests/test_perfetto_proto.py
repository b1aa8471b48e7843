"""Perfetto's protobuf output (``view --output-format perfetto``, ``export --format pftrace``), read back with
Perfetto's own ``Trace`` message (``perfetto_proto.read``, interned names resolved): the real file names, the
lanes, one slice per instruction and event, the host → device flows, the counters, the grouping flags and the
bound."""
from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter

import pyarrow as pa
import pytest
from test_explorer_profiles import build_tables, write_profile

import traces
from traces import perfetto_proto
from traces.export import _track_sql
from traces.schema import TABLES

CLI = [sys.executable, "-m", "explorer.cli"]


def system_tables(execs: pa.Table) -> dict[str, pa.Table]:
    """Around each execution, as the runtime records: a framework step enclosing nrt_execute (neuron_rt) enclosing
    nc_exec_running (neuron_hw), the two linked by a flow id; host CPU and memory samples."""
    rows, cpu, mem = [], [], []
    for i, e in enumerate(sorted(execs.to_pylist(), key=lambda e: e["start_ns"])):
        s, t = e["start_ns"], e["end_ns"]
        rows += [dict(ts_ns=s - 4000, dur_ns=t - s + 8000, name=f"step{i}", source="framework", thread_id=1),
                 dict(ts_ns=s - 2000, dur_ns=t - s + 4000, name="nrt_execute", source="neuron_rt", thread_id=1234,
                      core=e["core"], exec_id=e["exec_id"], flow_id=100 + i),
                 dict(ts_ns=s, dur_ns=t - s, name="nc_exec_running", source="neuron_hw", thread_id=1234,
                      core=e["core"], exec_id=e["exec_id"], flow_id=100 + i)]
        cpu.append(dict(ts_ns=s, cpu_id="average", util_percent=20.0 + i))
        mem.append(dict(ts_ns=s, used_bytes=(4 + i) << 30, used_percent=25.0))
    run = {"run_id": "run-1"}
    return {"system_events": pa.Table.from_pylist([{**run, **r} for r in rows], schema=TABLES["system_events"]),
            "cpu_usage": pa.Table.from_pylist([{**run, **r} for r in cpu], schema=TABLES["cpu_usage"]),
            "host_memory": pa.Table.from_pylist([{**run, **r} for r in mem], schema=TABLES["host_memory"])}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """A two-graph, two-core profile with a system profile, and what ``view --output-format perfetto`` wrote."""
    tables = build_tables(seqs=(64, 128), iterations=3, tiles=2)
    tables.update(system_tables(tables["executions"]))
    path = write_profile(tmp_path_factory.mktemp("pf") / "20260105-120000_mlp", tables)
    run = subprocess.run([*CLI, "view", str(path), "--output-format", "perfetto"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    return path


read = perfetto_proto.read


def begins(events) -> list:
    """The slices and instants (a slice's end is another event)."""
    return [e for e in events if e["type"] in "BI"]


def test_device_files_hold_every_instruction_on_the_real_lanes(session):
    with traces.open(session) as p:
        graphs = p.sql("SELECT graph_id, count(*) AS n FROM executions GROUP BY graph_id").to_pylist()
        assert len(graphs) == 2
        for g in graphs:
            tracks, events = read(session.parent / f"device_profile_model_{g['graph_id']}.pftrace")
            want = p.sql(f"""SELECT {_track_sql('i.')} AS track, count(*) AS n FROM instructions i
                             JOIN executions e USING (exec_id) WHERE e.graph_id = ? GROUP BY track""",
                         [g["graph_id"]]).to_pylist()
            lanes = Counter(tracks[e["track"]].name for e in begins(events))
            assert lanes == {**{r["track"]: r["n"] for r in want}, "Executions(nc0)": lanes["Executions(nc0)"],
                             "Executions(nc1)": lanes["Executions(nc1)"]}
            assert lanes["Executions(nc0)"] + lanes["Executions(nc1)"] == g["n"]
            parents = {tracks[t.parent_uuid].name for t in tracks.values() if t.parent_uuid}
            assert parents == {"NeuronCore nc0", "NeuronCore nc1"}
            ends = [e for e in events if e["type"] == "E"]
            assert len(ends) == len(begins(events))        # every slice closes
            first = next(e for e in begins(events) if not tracks[e["track"]].name.startswith("Exec"))
            row = p.sql("SELECT i.opcode, o.aten_op, s.file || ':' || s.line AS line FROM instructions i "
                        "JOIN ops o USING (op_id) JOIN sources s ON s.source_id = o.source_id "
                        "WHERE i.exec_id = ? AND i.pc = ? AND i.start_ns = ?",
                        [int(first["args"]["exec_id"]), first["args"]["pc"], first["ts"]]).to_pylist()
            assert (first["name"], first["args"]["op"], first["args"]["source"]) in \
                {(r["opcode"], r["aten_op"], r["line"]) for r in row}


def test_system_file_has_events_flows_and_counters(session):
    tracks, events = read(session.parent / "system_profile.pftrace")
    with traces.open(session) as p:
        n_sys = p.sql("SELECT count(*) FROM system_events").column(0)[0].as_py()
        n_host = p.sql("SELECT count(*) FROM events").column(0)[0].as_py()
        cpu_values = p.sql("SELECT util_percent FROM cpu_usage ORDER BY ts_ns").column(0).to_pylist()
        flows = set(p.sql("SELECT DISTINCT flow_id FROM system_events WHERE flow_id IS NOT NULL").column(0).to_pylist())
    sliced = begins(events)
    assert len(sliced) == n_sys + n_host
    starts = {f for e in sliced if e["name"] == "nrt_execute" for f in e["flows"]}
    ends = {f for e in sliced if e["name"] == "nc_exec_running" for f in e["flow_ends"]}
    assert starts == ends == flows
    # the real defaults: a parent per instance and process, a row per worker_gid, lnc_idx and thread
    tops = {t.name for t in tracks.values() if not t.parent_uuid and not t.counter.unit_name}
    assert "test/PID:1234" in tops
    rows = {t.name for t in tracks.values() if t.parent_uuid and tracks[t.parent_uuid].name == "test/PID:1234"}
    assert rows == {"TID:1", "GID:0/NC:0/TID:1234", "GID:1/NC:1/TID:1234"}
    with traces.open(session) as p:    # worker_gid as the real table has it, event by event
        real = {(r["start_ts"], r["name"], r["nc_idx"]): r["worker_gid"] for r in p.sql(
            'SELECT start_ts, name, nc_idx, worker_gid FROM "SystemProfileEvents"').to_pylist()}
    got = {(e["ts"], e["name"], e["args"].get("lnc_idx")): e["args"].get("worker_gid") for e in sliced
           if (e["ts"], e["name"], e["args"].get("lnc_idx")) in real}
    assert len(got) == n_sys and all(real[k] == v for k, v in got.items())
    cpu = next(u for u, t in tracks.items() if t.name == "host CPU %")
    assert [e["value"] for e in events if e["track"] == cpu and e["type"] == "C"] == cpu_values


def test_grouping_flags_change_the_parents_and_a_window_and_bad_flags(session, tmp_path):
    out = tmp_path / "grouped"
    run = subprocess.run([*CLI, "export", str(session), "--format", "pftrace", "-o", str(out),
                          "--system-trace-primary-group", "lnc_idx", "--system-trace-secondary-group", "thread_id"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    tracks, events = read(out / "system_profile.pftrace")
    kids = {(tracks[t.parent_uuid].name, t.name) for t in tracks.values() if t.parent_uuid}
    assert {("NC:0", "TID:1234"), ("NC:1", "TID:1234"), ("host", "TID:1")} <= kids
    assert len(begins(events)) == len(begins(read(session.parent / "system_profile.pftrace")[1]))

    with traces.open(session) as p:      # a window keeps the instructions that start in it
        lo, hi = p.trace_range()
        mid = lo + (hi - lo) // 2
        want = p.sql("SELECT e.graph_id, count(*) AS n FROM instructions i JOIN executions e USING (exec_id) "
                     "WHERE i.start_ns >= ? AND i.start_ns < ? GROUP BY e.graph_id", [lo, mid]).to_pylist()
    win = tmp_path / "window"
    run = subprocess.run([*CLI, "export", str(session), "--format", "pftrace", "-o", str(win),
                          "--start-ns", str(lo), "--end-ns", str(mid)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    for g in want:
        tracks, events = read(win / f"device_profile_model_{g['graph_id']}.pftrace")
        assert sum(1 for e in begins(events) if not tracks[e["track"]].name.startswith("Exec")) == g["n"]

    copy = tmp_path / "copy"              # the real --ignore-device-profile: the system file only
    copy.mkdir()
    shutil.copy(session, copy / "profile.duckdb")
    run = subprocess.run([*CLI, "view", str(copy / "profile.duckdb"), "--output-format", "perfetto",
                          "--ignore-device-profile"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert sorted(f.name for f in copy.glob("*.pftrace")) == ["system_profile.pftrace"]

    bad = subprocess.run([*CLI, "view", str(session), "--output-format", "perfetto",
                          "--system-trace-primary-group", "worker_gid"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "--system-trace-primary-group: unknown field 'worker_gid'; use instance_id" in bad.stderr


def test_a_file_holds_at_most_max_slices(session, tmp_path):
    with traces.open(session) as p:
        files = perfetto_proto.write(p, tmp_path, max_slices=10)
        total = p.sql("SELECT count(*) FROM instructions i JOIN executions e USING (exec_id) WHERE e.graph_id = "
                      "(SELECT min(graph_id) FROM executions)").column(0)[0].as_py()
        execs = p.sql("SELECT count(*) FROM executions WHERE graph_id = (SELECT min(graph_id) FROM executions)"
                      ).column(0)[0].as_py()
    device = next(f for f in files if f.path.name.startswith("device"))
    assert device.slices == 10 and device.cut == total + execs - 10
    assert len(begins(read(device.path)[1])) == 10
