"""One number, one function: ``neuron-explorer summary``, the Explorer's Summary page and
``neuron-top --replay`` show the same headline figures, computed by ``traces.Profile.figures``.

Profiles: one with CPU fallbacks recorded as events (the Explorer's test MLP: two cores, warm-ups,
recompiles), a multi-execution synthetic run whose executions record their fallback host time, and
one execution written the way the runtime writes it (``device_ns`` spanning the host time too).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_explorer_profiles import make_profile

import traces
from explorer import data
from monitor.replay import Replay
from top.snapshot import Totals, build_snapshot
from traces.query import Profile
from traces.synthetic import write_run

ROOT = Path(__file__).resolve().parents[1]
DEVICE_PART, HOST_PART = 40_000, 900_000


def runtime_style(out):
    """One execution as the runtime records it: device_ns = end - start, CPU-fallback time inside it."""
    t = 1_000_000_000   # the run's window holds its compile, on the same clock, as the runtime's recorder stamps it
    w = traces.Writer(out, run={"run_id": "rt", "pid": 7, "tag": "rt", "target": "trn1", "start_ns": t - 10_000_000})
    w.append("metadata", {"key": ["tensor_engine_peak_bf16_flops", "target"],
                          "value": ["9.5e13", "trn1"]})
    w.append("graphs", {"graph_id": [1], "run_id": "rt", "name": "g", "compile_wall_ns": 5_000_000,
                        "cache_hit": False})
    w.append("ops", {"op_id": [11], "graph_id": 1, "name": "nonzero", "aten_op": "aten.nonzero.default",
                     "placement": "cpu_fallback"})
    w.append("events", {"ts_ns": [t - 6_000_000], "dur_ns": 5_000_000, "run_id": "rt", "kind": "compile",
                        "graph_id": 1, "detail": "{}"})
    w.append("executions", {"exec_id": [5], "run_id": "rt", "graph_id": 1, "core": 0, "iteration": 0,
                            "start_ns": t, "end_ns": t + DEVICE_PART + HOST_PART,
                            "device_ns": DEVICE_PART + HOST_PART, "cpu_fallback_ns": HOST_PART,
                            "tensor_busy_ns": DEVICE_PART // 2, "flops": 10**9, "status": "completed",
                            "warmup": False})
    w.append("instructions", {"exec_id": [5, 5], "core": 0, "engine": ["tensor", "cpu"],
                              "opcode": ["MATMUL", "CPU_OP"], "op_id": [None, 11],
                              "start_ns": [t, t + DEVICE_PART], "dur_ns": [DEVICE_PART // 2, HOST_PART]})
    w.append("events", {"ts_ns": [t + DEVICE_PART], "dur_ns": 0, "run_id": "rt", "kind": "cpu_fallback",
                        "op_id": 11, "core": 0, "detail": "{}"})
    w.close(status="ok", end_ns=t + DEVICE_PART + HOST_PART)
    return traces.finalize(out)


@pytest.fixture(scope="module", params=["events_fallbacks", "synthetic_multi", "runtime_style"])
def profile(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "events_fallbacks":
        return make_profile(out / "20260101-000000_mlp")
    if request.param == "synthetic_multi":
        write_run(out, executions=4, instructions=400, cores=(0, 1), warmup=1)
        return traces.finalize(out)
    return runtime_style(out)


@pytest.fixture
def calls(monkeypatch):
    """Every call of ``Profile.figures`` (who computed a figure), recorded as it happens."""
    seen = []
    original = Profile.figures

    def spy(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        seen.append(result)
        return result
    monkeypatch.setattr(Profile, "figures", spy)
    return seen


def cli_figures(profile, capsys, calls) -> dict:
    from explorer.cli import main

    before = len(calls)
    assert main(["summary", str(profile), "--json"]) == 0
    assert len(calls) == before + 1, "neuron-explorer summary must take its figures from Profile.figures"
    return json.loads(capsys.readouterr().out)["figures"]


def explorer_summary(profile, calls) -> dict:
    reg = data.Registry([profile])
    try:
        before = len(calls)
        s = data.summary(reg.get(reg.default_key()))
        assert len(calls) == before + 1 and s["figures"] is calls[-1]
        return s
    finally:
        reg.close()


def replay_figures(profile, calls):
    before = len(calls)
    totals = Totals()
    with Replay(profile, window_s=0.002) as replay:
        snaps = [build_snapshot(doc, totals=totals) for doc in replay]
    assert len(calls) == before + 1, "the replay must take its figures from Profile.figures"
    snap = snaps[-1]
    # the windows together hold every compile, those before the first execution included
    assert snap.apps[1].processes[0].compiles == calls[-1].compiles
    (process,) = snap.apps[1].processes       # the process's own tab
    assert snap.apps[0].processes == (process,)
    return process.profile


def test_summary_explorer_and_replay_show_the_same_figures(profile, capsys, calls):
    cli = cli_figures(profile, capsys, calls)
    page = explorer_summary(profile, calls)
    top = replay_figures(profile, calls)
    assert cli == calls[0].as_dict()
    pairs = {  # figure: (summary --json, Explorer Summary page, neuron-top --replay snapshot)
        "total device time": (cli["device_ns"], page["device_ns"], top.device_ns),
        "device busy %": (cli["device_busy_percent"], page["device_busy_percent"], top.device_busy_percent),
        "engine %": (cli["engine_percent"], page["engines"], top.engine_percent),
        "MFU": (cli["mfu_percent"], page["mfu_estimated_percent"], top.mfu_percent),
        "fallback host time": (cli["fallback_host_ns"], page["cpu_fallback_ns"], top.fallback_host_ns),
        "compiles": (cli["compiles"], page["compiles"], top.compiles),
        "recompiles": (cli["recompiles"], page["recompiles"], top.recompiles),
        "fallback calls": (cli["fallback_calls"], page["fallback_calls"], top.fallback_calls),
    }
    for name, (a, b, c) in pairs.items():
        assert a == b == c, f"{name}: summary {a}, Explorer {b}, neuron-top --replay {c}"


def test_the_figures_keep_device_and_host_time_apart(profile):
    with traces.open(profile) as p:
        f = p.figures()
        ex = p.sql("""SELECT sum(end_ns - start_ns)::BIGINT AS span_sum, sum(cpu_fallback_ns)::BIGINT AS host
                      FROM executions WHERE NOT warmup""").to_pylist()[0]
        events = p.sql("SELECT coalesce(sum(dur_ns), 0)::BIGINT AS ns, count(*) AS n FROM events "
                       "WHERE kind = 'cpu_fallback'").to_pylist()[0]
        compiles = p.sql("SELECT count(*) AS n FROM events WHERE kind = 'compile'").to_pylist()[0]
    assert f.fallback_host_ns == max(ex["host"] or 0, events["ns"]) > 0
    assert f.fallback_calls == events["n"] and f.compiles == compiles["n"] > 0
    assert 0 < f.device_ns <= ex["span_sum"] - (ex["host"] or 0)   # host time is never device time
    assert 0 < f.device_busy_percent <= 100.0
    assert f.engine_percent["tensor"] > 0


def test_runtime_style_execution_counts_only_its_device_part(tmp_path):
    with traces.open(runtime_style(tmp_path)) as p:
        f = p.figures()
        ops = {r["op_id"]: r for r in p.op_totals().to_pylist()}
        fb = p.fallbacks().to_pylist()
    assert f.device_ns == DEVICE_PART and f.fallback_host_ns == HOST_PART
    assert f.engine_percent["tensor"] == pytest.approx(50.0)
    assert f.device_busy_percent == pytest.approx(100.0 * DEVICE_PART / (DEVICE_PART + HOST_PART))
    # the CPU op: its host time from its 'cpu' instructions (its event is zero-length), no device time
    assert ops[11]["device_ns"] == 0 and ops[11]["host_ns"] == HOST_PART
    assert fb[0]["cpu_ns"] == HOST_PART and fb[0]["cpu_calls"] == 1


def _find(component, id_):
    """The Dash component with ``id`` in a layout tree."""
    if getattr(component, "id", None) == id_:
        return component
    children = getattr(component, "children", None)
    for c in children if isinstance(children, list) else [children] if children is not None else []:
        found = _find(c, id_)
        if found is not None:
            return found
    return None


def test_mbu_is_one_number_in_the_cli_the_summary_page_and_sql(recorded_samples, capsys, calls):
    """``mbu_estimated_percent`` of the sample encoder: ``neuron-explorer summary --json`` (its Summary row
    and its figures), the Explorer's Summary page (the number it shows) and plain SQL agree."""
    from explorer.cli import main
    from explorer.pages import summary as summary_page

    path = recorded_samples.get("bert_encoder")["bert_encoder"]
    assert main(["summary", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    with traces.open(path) as p:
        sql = p.sql("SELECT mbu_estimated_percent, total_bandwidth_available FROM summary").to_pylist()[0]
    reg = data.Registry([path])
    data.set_registry(reg)
    try:
        page = data.summary(reg.get(reg.default_key()))
        shown = _find(summary_page.layout(profile=reg.default_key()), "summary-mbu").children[1].children
    finally:
        data.set_registry(data.Registry([]))
    mbu = sql["mbu_estimated_percent"]
    assert 0 < mbu < 100
    assert out["summary"][0]["mbu_estimated_percent"] == out["figures"]["mbu_percent"] == page[
        "mbu_estimated_percent"] == mbu
    assert shown == f"{mbu:.2f}%"
    assert out["figures"]["total_bandwidth_available"] == page["total_bandwidth_available"] == \
        sql["total_bandwidth_available"] > 0


# ------------------------------------------------------------------ live busy and a capture's busy
STEADY = '''
"""A traced MLP run back to back; neuron-monitor's busy over the seconds before and during a capture."""
import json
import sys
import time

import torch

import neuron_stack
import neuron_stack.runtime.model as runtime_model
from monitor.collect import Collector
from monitor.config import load_config
from neuron_stack.device import clock
from traces import live

out, n = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128)).eval()
x = torch.randn(64, 128)
nm = neuron_stack.trace(model, x)
session, core = nm.model.session, str(nm.model.core)
monitor = Collector(load_config(None), directory=live.live_dir())
# neuron-monitor (another process) counts a process's clock past a snapshot older than PUBLISH_DELAY_MAX_S as
# idle time. Here the monitor runs inside this program's excluded time, where its clock stands, and under I/O
# load the snapshot's own write can take that long: no idle time of this program's (CI read 13 % for 19.7 %).
live.PUBLISH_DELAY_MAX_S = 3600


def busy():
    """The core's utilization since the last call, as neuron-monitor reports it. Reading it is the monitor's
    work (another process's, normally), so it is off this program's projected clock."""
    with clock.excluded():
        session.live.flush()
        (rt,) = monitor.collect()["neuron_runtime_data"]
    return rt["report"]["neuroncore_counters"]["neuroncores_in_use"][core]["neuroncore_utilization"]


for _ in range(n):
    nm(x)
assert session.start_capture(out, 3600)
rec = session.recorder
busy()   # the live figure from here: the capture's first moment, give or take one loop iteration
for _ in range(n):
    nm(x)
session.stop_capture(rec)
live_busy = busy()

# a slow recording (a full disk, a busy machine) must not look like the program's host time
record = runtime_model.record_execution
runtime_model.record_execution = lambda *a: (time.sleep(0.2), record(*a))
assert session.start_capture(out + ".slow", 3600)
rec = session.recorder
t0 = clock.now_ns()
nm(x)
projected = clock.now_ns() - t0
session.stop_capture(rec)
print(json.dumps({"live_busy": live_busy, "slow_recording_projected_ns": projected}))
'''


def test_live_busy_and_a_capture_of_the_same_seconds_agree(tmp_path):
    """Busy is one definition (docs/top.md): a core's device-busy time (the union of its executions' device
    intervals) over the projected seconds it is measured on. neuron-monitor's live figure over the seconds a
    capture recorded, the capture's Summary, a replay document over the capture's window and neuron-top's
    replay agree within 5 % of the figure (the window's edges: the capture starts and stops between two
    executions, live counts from the previous sample); the recording's own time is not on the clock."""
    script = tmp_path / "steady.py"
    script.write_text(STEADY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_")}
    env.update(NEURON_STACK_LIVE_DIR=str(tmp_path / "live"), NEURON_STACK_RUNTIME_DIR=str(tmp_path / "cores"),
               NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"), NEURON_RT_NUM_CORES="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "cap"), "200"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["slow_recording_projected_ns"] < 200_000_000   # the 0.2 s the recording slept is not there
    with traces.open(traces.finalize(tmp_path / "cap")) as p:
        f = p.figures(include_warmup=True)
        run = p.sql("SELECT start_ns, end_ns FROM runs").to_pylist()[0]
    assert f.executions == 200 and 0 < f.device_busy_percent < 100
    with Replay(tmp_path / "cap" / "profile.duckdb") as replay:
        doc = replay.document(run["start_ns"], run["end_ns"])
    (core,) = doc["neuron_runtime_data"][0]["report"]["neuroncore_counters"]["neuroncores_in_use"].values()
    top = build_snapshot(doc)
    for name, shown in (("live", seen["live_busy"]), ("replay of the window", core["neuroncore_utilization"]),
                        ("neuron-top replay", top.apps[0].utilization[0])):
        assert shown == pytest.approx(f.device_busy_percent, rel=0.05, abs=0.02), \
            f"{name}: {shown} %, the capture's Summary {f.device_busy_percent:.3f} %"
