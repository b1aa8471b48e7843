"""Capture as Neuron users do: torch.profiler with NeuronConfig / NeuronProfiler (issue 25), and the real
NEURON_RT_INSPECT_* variables; the profile answers through the real schema's tables."""
import json
import os
import subprocess
import sys
import textwrap

import duckdb
import pytest

from neuron_stack.runtime.inspect_config import InspectConfig, InspectConfigError

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from torch.profiler import profile, ProfilerActivity, schedule, record_function
    import neuron_stack
    from neuron_stack.profiling import NeuronConfig, ProfileMode, NeuronProfiler

    traced = neuron_stack.load(sys.argv[2])     # the module's saved NEFF (see `neff`)
    x = torch.ones(2, 8)
    traced(x)
    out, paths = sys.argv[1], {}
    runs = {"full": dict(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME, ProfileMode.CPU_UTIL,
                                ProfileMode.HOST_MEMORY]),
            "other_core": dict(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], capture_enabled_for_nc="1"),
            "ring": dict(modes=[ProfileMode.RUNTIME], max_events_per_nc=1)}
    for name, kw in runs.items():
        cfg = NeuronConfig(profile_output_dir=f"{out}/{name}", **kw)
        neuron = NeuronProfiler(cfg)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=cfg,
                     schedule=schedule(wait=1, warmup=1, active=2), on_trace_ready=neuron.export_trace) as p:
            for i in range(5):
                with record_function(f"step{i}"):
                    traced(x)
                p.step()
        p.export_chrome_trace(f"{out}/{name}_chrome.json")
        paths[name] = [str(t) for t in neuron.traces]
    print(json.dumps(paths))
""")


@pytest.fixture(scope="module")
def neff(tmp_path_factory):
    """The model every workload here runs, compiled once for the module: the profilers and variables are the
    runtime's, so each process loads the saved NEFF (torch.jit.load on the real stack) instead of repeating
    torch.export."""
    import torch

    import neuron_stack
    return neuron_stack.trace(torch.nn.Linear(8, 4), torch.ones(2, 8)).save(
        tmp_path_factory.mktemp("neff") / "linear.neff")


@pytest.fixture(scope="module")
def captured(tmp_path_factory, neff):
    tmp = tmp_path_factory.mktemp("profiling")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_INSPECT")}
    env.update(NEURON_COMPILE_CACHE_URL=str(tmp / "cache"), NEURON_STACK_LIVE_DIR=str(tmp / "live"),
               NEURON_STACK_RUNTIME_DIR=str(tmp / "cores"))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp / "out"), str(neff)], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "not a valid device option" not in r.stderr   # PrivateUse1 without a C++ backend: silenced
    return tmp / "out", json.loads(r.stdout.strip().splitlines()[-1])


def q(path, sql):
    with duckdb.connect(path, read_only=True) as con:
        return con.sql(sql).fetchall()


def test_one_profile_per_active_window_with_framework_runtime_and_device_events(captured):
    out, paths = captured
    [path] = paths["full"]
    # schedule(wait=1, warmup=1, active=2): steps 2 and 3 only
    assert q(path, "SELECT count(*) FROM executions") == [(2,)]
    by = dict(q(path, "SELECT name, count(*) FROM SystemProfileEvents WHERE name IN "
                      "('step0', 'step1', 'step2', 'step3', 'step4', 'nrt_execute', 'nc_exec_running') GROUP BY 1"))
    assert by == {"step2": 1, "step3": 1, "nrt_execute": 2, "nc_exec_running": 2}
    sources = dict(q(path, "SELECT name, trace_event_source FROM SystemProfileEvents "
                           "WHERE name IN ('step2', 'nrt_execute', 'nc_exec_running')"))
    assert sources == {"step2": "framework", "nrt_execute": "neuron_rt", "nc_exec_running": "neuron_hw"}
    # the framework region encloses its runtime call, on the same (projected) clock
    [(s0, s1, e0, e1)] = q(path, "SELECT f.start_ts, f.end_ts, r.start_ts, r.end_ts FROM SystemProfileEvents f, "
                                 "SystemProfileEvents r WHERE f.name = 'step3' AND r.name = 'nrt_execute' "
                                 "AND r.start_ts BETWEEN f.start_ts AND f.end_ts")
    assert s0 <= e0 <= e1 <= s1
    # the runtime call and its device execution share a flow id and carry process, thread and core ids
    rows = q(path, "SELECT name, flow_id, process_id, thread_id, nc_idx, instance_id FROM SystemProfileEvents "
                   "WHERE name IN ('nrt_execute', 'nc_exec_running')")
    assert len({r[1][0] for r in rows}) == 2 and all(r[2] > 0 and r[3] > 0 and r[4] == 0 and r[5] for r in rows)
    # the done-when query of issue 25, answered from the device rows of the window
    [(pcore, total)] = q(path, "SELECT pcore_idx, sum(duration_ns) FROM Instruction GROUP BY 1")
    [(device,)] = q(path, "SELECT sum(dur_ns) FROM instructions")
    assert pcore == 0 and total == device > 0
    assert q(path, "SELECT count(*) > 0, bool_and(cpu_id IS NOT NULL) FROM CpuUsage") == [(True, True)]
    [(n, pct)] = q(path, "SELECT count(*), max(used_percent) FROM HostMemUsage")
    assert n >= 2 and 0 < pct <= 100


def test_torch_chrome_traces_keep_working(captured):
    out, paths = captured
    window = os.path.dirname(paths["full"][0])
    for f in (os.path.join(window, "trace.json"), out / "full_chrome.json"):
        with open(f) as fh:
            names = {e.get("name") for e in json.load(fh)["traceEvents"]}
        assert "step2" in names or f == out / "full_chrome.json"


def test_capture_enabled_for_nc_and_ring_buffer(captured):
    _, paths = captured
    [other] = paths["other_core"]
    assert q(other, "SELECT count(*) FROM instructions") == [(0,)]
    assert q(other, "SELECT count(*) FROM SystemProfileEvents WHERE trace_event_source <> 'framework'") == [(0,)]
    [ring] = paths["ring"]
    # RUNTIME only: no device rows; max_events_per_nc=1 keeps the newest system event of core 0
    assert q(ring, "SELECT count(*) FROM instructions") == [(0,)]
    assert q(ring, "SELECT name FROM SystemProfileEvents WHERE nc_idx = 0") == [("nc_exec_running",)]
    # the verdicts (issue 36): a filter excluding the core used is incomplete; RUNTIME alone and the ring's
    # dropped events are information, each one line
    import traces
    with traces.open(other) as p:
        assert p.capture_verdict().status == "incomplete"
    with traces.open(ring) as p:
        verdict, md = p.capture_verdict(), p.metadata()
    assert verdict.status == "info" and int(md["system_events_dropped"]) > 0
    assert verdict.lines[0].startswith("no device rows: ProfileMode.DEVICE is not in NeuronConfig(modes)")
    assert verdict.lines[1] == md["system_events_note"] and "max_events_per_nc=1 keeps the newest" in md[
        "system_events_note"]


ENV_SCRIPT = textwrap.dedent("""
    import sys, torch, neuron_stack
    m = neuron_stack.load(sys.argv[1])
    for _ in range(3):
        m(torch.ones(2, 8))
""")


def _env_run(tmp_path, neff, **variables):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_INSPECT")}
    env.update(NEURON_RT_INSPECT_ENABLE="1", NEURON_RT_INSPECT_OUTPUT_DIR=str(tmp_path / "out"),
               NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"), NEURON_STACK_LIVE_DIR=str(tmp_path / "live"),
               NEURON_STACK_RUNTIME_DIR=str(tmp_path / "cores"), **variables)
    return subprocess.run([sys.executable, "-c", ENV_SCRIPT, str(neff)], env=env, capture_output=True, text=True,
                          timeout=600)


def test_env_vars_have_the_real_defaults_and_filters(tmp_path, neff):
    import traces
    r = _env_run(tmp_path, neff, NEURON_RT_INSPECT_EVENT_FILTER_TYPE="hardware")
    assert r.returncode == 0, r.stderr[-2000:]
    path = str(traces.finalize(tmp_path / "out"))
    # device profile off by default (system profile on), the filter keeps the hardware group only
    assert q(path, "SELECT count(*) FROM instructions") == [(0,)]
    assert q(path, "SELECT count(*) FROM executions") == [(3,)]
    assert q(path, "SELECT DISTINCT name FROM SystemProfileEvents") == [("nc_exec_running",)]
    with traces.open(path) as p:   # no device rows by the real default: said, as information
        verdict = p.capture_verdict()
    assert verdict.status == "info" and verdict.lines[0].startswith(
        "no device rows: NEURON_RT_INSPECT_DEVICE_PROFILE is 0 (the runtime's default: system profile only)")
    assert "no device rows" not in r.stderr


def test_inspect_n_keeps_the_newest_system_events(tmp_path, neff):
    """``neuron-explorer inspect -n N`` (the real ``--num-trace-events``) caps the system events per NeuronCore as
    ``NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC`` does; a bad N is one line, before anything runs."""
    (tmp_path / "w.py").write_text(ENV_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_INSPECT")}
    env.update(NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"), NEURON_STACK_LIVE_DIR=str(tmp_path / "live"),
               NEURON_STACK_RUNTIME_DIR=str(tmp_path / "cores"))
    run = [sys.executable, "-m", "explorer.cli", "inspect", "-o", str(tmp_path / "out")]
    bad = subprocess.run([*run, "-n", "lots", "--", sys.executable, "w.py", str(neff)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and not (tmp_path / "out").exists()
    assert "-n 'lots' is not a positive whole number of system events per NeuronCore" in bad.stderr
    r = subprocess.run([*run, "-n", "2", "--", sys.executable, "w.py", str(neff)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    [path] = (tmp_path / "out").glob("*/profile.duckdb")
    per_core = q(str(path), "SELECT nc_idx, count(*) FROM SystemProfileEvents WHERE trace_event_source <> "
                            "'framework' GROUP BY nc_idx")
    assert per_core and all(n <= 2 for _, n in per_core), per_core
    assert q(str(path), "SELECT count(*) FROM executions")[0][0] == 3   # the workload ran whole


def test_a_bad_variable_is_one_clear_line(tmp_path, neff):
    r = _env_run(tmp_path, neff, NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC="lots")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].endswith(
        "NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC='lots' is not a positive whole number of events per "
        "NeuronCore (default 1,000,000)"), r.stderr[-1000:]


@pytest.mark.parametrize("env, message", [
    ({"NEURON_RT_INSPECT_SYSTEM_PROFILE": "yes"}, "NEURON_RT_INSPECT_SYSTEM_PROFILE='yes' is not 0 or 1"),
    ({"NEURON_RT_INSPECT_EVENT_FILTER_TYPE": "nrt execute"}, "'nrt execute' is not an event type"),
    ({"NEURON_RT_INSPECT_DEVICE_PROFILE": "always"}, "is not one of 0, 1, model, session"),
])
def test_inspect_config_refuses_bad_values(env, message):
    with pytest.raises(InspectConfigError, match=message):
        InspectConfig.from_env(env)


def test_inspect_config_groups_and_exclusions():
    c = InspectConfig.from_env({"NEURON_RT_INSPECT_EVENT_FILTER_TYPE": "software,^nrt_tensor"})
    assert c.wants("nrt_execute") and not c.wants("nrt_tensor_write") and not c.wants("nc_exec_running")
    off = InspectConfig.from_env({"NEURON_RT_INSPECT_SYSTEM_PROFILE": "0"})
    assert not off.wants("nrt_execute") and not off.cpu_util and not off.host_memory


def test_real_schema_views_parquet_names_and_schema_fields(captured, tmp_path):
    import traces
    from traces.export import export
    from traces.profile_schema import TABLES as REAL

    _, paths = captured
    [path] = paths["full"]
    # one wide row each; every field of the definition is a column of its view
    for name, table in REAL.items():
        cols = [r[0] for r in q(path, f'DESCRIBE neuron_explorer."{name}"')]
        assert cols[:len(table.fields)] == [f.name for f in table.fields], name
    assert q(path, "SELECT count(*) FROM neuron_explorer.Metadata") == [(1,)]
    assert q(path, "SELECT count(*), min(total_time) > 0 FROM neuron_explorer.Summary") == [(1, True)]
    [(n,)] = q(path, "SELECT count(*) FROM SchemaFields WHERE table_name = 'Instruction'")
    assert n == 55 + 2   # the real fields, then nc_idx and exec_id
    from test_profile_schema import _described

    _described(path)   # every table and view of a real capture, Flow and SemaphoreUpdate included
    with traces.open(path) as p:
        out = export(p, "parquet", tmp_path / "pq")
    for name in ("Instruction", "Summary", "Metadata", "SystemProfileEvents", "SchemaFields", "CpuUsage"):
        assert (out / f"{name}.parquet").is_file(), name
    con = duckdb.connect()
    [(events,)] = con.execute("SELECT count(*) FROM read_parquet(?) WHERE name = 'nc_exec_running'",
                              [str(out / "SystemProfileEvents.parquet")]).fetchall()
    assert events == 2


def test_perfetto_has_system_tracks_and_host_to_device_flows(captured, tmp_path):
    import traces
    from traces.export import perfetto

    _, paths = captured
    with traces.open(paths["full"][0]) as p:
        doc = json.loads(perfetto(p, tmp_path / "t.json").read_text())
    ev = doc["traceEvents"]
    names = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    assert any(n.endswith("/neuron_rt/NC:0") for n in names) and any("/framework/TID:" in n for n in names)
    flows = {}
    for e in ev:
        if e["ph"] in "stf":
            flows.setdefault(e["id"], []).append(e["ph"])
    assert len(flows) == 2 and all(sorted(v) == ["f", "s", "t"] for v in flows.values())


def test_show_profile_schema_prints_the_openapi_yaml():
    exe = os.path.join(os.path.dirname(sys.executable), "neuron-explorer")
    r = subprocess.run([exe, "--show-profile-schema"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("openapi: 3.0.3")
    for name in ("Instruction:", "Summary:", "Metadata:", "SystemProfileEvents:", "SchemaFields:"):
        assert f"    {name}" in r.stdout


def test_view_system_trace_flags():
    import argparse

    from explorer.view import system_trace_settings
    args = argparse.Namespace(system_trace_filter_neuron_core="0,1", system_trace_filter_event_type="nrt_execute",
                              system_trace_filter_instance_id=None, ignore_device_profile=True,
                              ignore_system_profile=False)
    assert system_trace_settings(args) == {"cores": [0, 1], "names": ["nrt_execute"], "instances": None,
                                           "ignore_device": True, "ignore_system": False}
    args.system_trace_filter_neuron_core = "0,x"
    with pytest.raises(ValueError, match="--system-trace-filter-neuron-core '0,x': expected a comma-separated list"):
        system_trace_settings(args)


def test_sql_csv_of_the_system_profile_with_its_list_column(captured):
    """Issue 36: ``sql --format csv "SELECT * FROM SystemProfileEvents"`` failed on ``flow_id`` (VARCHAR[])."""
    import csv
    import io

    _, paths = captured
    exe = os.path.join(os.path.dirname(sys.executable), "neuron-explorer")
    r = subprocess.run([exe, "sql", paths["full"][0], "--format", "csv", "SELECT * FROM SystemProfileEvents"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    flows = [json.loads(row["flow_id"]) for row in rows if row["name"] == "nrt_execute"]
    assert len(flows) == 2 and all(isinstance(f, list) and len(f) == 1 for f in flows)


def test_dependency_chain_links_the_framework_region_its_runtime_call_and_device_run(captured):
    """What the System Trace's Dependency Chain Viewer lists for a real capture (traces.q_chain)."""
    import traces
    _, paths = captured
    [path] = paths["full"]
    with traces.open(path) as p:
        [rt] = p.sql("SELECT t.track, s.ts_ns FROM system_events AS s JOIN system_tracks AS t ON "
                     "hash(s.run_id, s.source, s.core, s.thread_id) = t.h WHERE s.name = 'nrt_execute' "
                     "ORDER BY s.ts_ns DESC LIMIT 1").to_pylist()
        c = p.system_chain(rt["track"], rt["ts_ns"], "nrt_execute")
        up = [c.events[i]["name"] for i in c.upstream]
        # the call stack torch.profiler recorded on the same thread encloses the call: the step's region
        assert "step3" in up and all(c.events[i]["source"] == "framework" for i in c.upstream)
        [hw] = [c.events[i] for i in c.downstream]
        assert hw["name"] == "nc_exec_running" and hw["flow_id"] == c.events[c.at]["flow_id"]
        assert (c.upstream[-1], c.at) in c.edges and (c.at, c.downstream[0]) in c.edges
        # from the device run: upstream the runtime call and its stack, nothing downstream
        d = p.system_chain(hw["track"], hw["start_ns"], "nc_exec_running")
        assert [d.events[i]["name"] for i in d.upstream][-2:] == [up[-1], "nrt_execute"] and d.downstream == []
        # from the step's region: the call it made and its device run
        step = next(c.events[i] for i in c.upstream if c.events[i]["name"] == "step3")
        s = p.system_chain(step["track"], step["start_ns"], "step3")
        assert [s.events[i]["name"] for i in s.downstream] == ["nrt_execute", "nc_exec_running"]
        assert p.system_chain(rt["track"], rt["ts_ns"] + 1, "nrt_execute") is None
