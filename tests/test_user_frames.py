"""A torch.profiler ``with_stack`` capture shows what the user's program did, never this project's own Python
(issue 36 item 2), on real thread ids, in bounded files; the simulator's recording stays off the projected
clock; a small profile is small (item 5)."""
import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

import traces
from neuron_stack.device import clock
from neuron_stack.runtime import host_frames
from traces import synthetic

SCRIPT = textwrap.dedent("""
    import json, sys, threading, torch
    from torch.profiler import profile, ProfilerActivity, schedule, record_function
    from neuron_stack.profiling import NeuronConfig, ProfileMode, NeuronProfiler

    def train_step(model, opt, x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step(); opt.zero_grad()
        return loss.item()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out, paths = sys.argv[1], {}
    for name, kw in {"stack": {}, "ring": dict(max_events_per_nc=1)}.items():
        cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir=f"{out}/{name}", **kw)
        neuron = NeuronProfiler(cfg)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=cfg,
                     schedule=schedule(wait=0, warmup=1, active=2), on_trace_ready=neuron.export_trace,
                     with_stack=True) as p:
            for step in range(3):
                x, y = torch.randn(8, 16).to("neuron"), torch.randint(0, 4, (8,)).to("neuron")
                with record_function("step"):
                    train_step(model, opt, x, y)
                p.step()
        paths[name] = [str(t) for t in neuron.traces]
    print(json.dumps({"paths": paths, "main_tid": threading.get_native_id()}))
""")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frames")
    script = tmp / "user_train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_INSPECT")}
    env.update(NEURON_COMPILE_CACHE_URL=str(tmp / "cache"), NEURON_STACK_LIVE_DIR=str(tmp / "live"),
               NEURON_STACK_RUNTIME_DIR=str(tmp / "cores"))
    r = subprocess.run([sys.executable, str(script), str(tmp / "out")], env=env, capture_output=True, text=True,
                       timeout=600, cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _ours(name: str) -> bool:
    return name.startswith(host_frames.our_prefixes()) or any(
        f"{pkg}/" in name.split("(")[0] for pkg in ("neuron_stack", "traces"))


def test_framework_events_are_the_users_and_torchs_frames_on_real_threads(captured):
    [path] = captured["paths"]["stack"]
    with traces.open(path) as p:
        rows = p.sql("SELECT name, thread_id FROM system_events WHERE source = 'framework'").to_pylist()
        assert p.dropped_events() == {"framework": 0, "system": 0}
    names = {r["name"] for r in rows}
    assert any(n.startswith("user_train.py(") and n.endswith(": train_step") for n in names)
    assert {"step", "aten::addmm", "aten::relu"} <= names                    # regions and torch's ops
    assert any(n.startswith("torch/nn/modules/") for n in names)             # torch's own frames stay
    assert not [n for n in names if _ours(n)]                                # none of this project's
    assert not [n for n in names if n.startswith(("json/", "dataclasses.py", "threading.py("))]
    tids = {r["thread_id"] for r in rows}
    assert captured["main_tid"] in tids and max(tids) < 2 ** 32               # OS thread ids, not 2**63 - 1


def test_trace_json_is_filtered_the_same_way_and_bounded(captured):
    [path] = captured["paths"]["stack"]
    trace = os.path.join(os.path.dirname(path), "trace.json")
    assert os.path.getsize(trace) < 2_000_000
    with open(trace) as f:
        doc = json.load(f)
    names = [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert "aten::addmm" in names and any(n.endswith(": train_step") for n in names)
    assert not [n for n in names if _ours(n)]
    assert doc["neuron_framework_events_dropped"] == 0


def test_a_full_ring_says_how_many_system_events_it_dropped(captured):
    [path] = captured["paths"]["ring"]
    with traces.open(path) as p:
        assert p.dropped_events()["system"] > 0


def test_over_the_bound_ops_and_regions_are_kept_and_the_dropped_counted():
    ev = [SimpleNamespace(name=f"train.py({i}): f", ts=i * 10, dur=i + 1, type="python_function", tid=1)
          for i in range(5)]
    ev.append(SimpleNamespace(name="aten::mm", ts=100, dur=1, type="cpu_op", tid=1))
    kept, dropped = host_frames.user_events(ev, ours=("neuron_stack/",), get=host_frames._get, limit=3)
    assert dropped == 3
    assert [e.name for e in kept] == ["train.py(3): f", "train.py(4): f", "aten::mm"]   # longest frames, in time


def test_a_thread_this_project_started_is_dropped_whole():
    ev = [SimpleNamespace(name="threading.py(1002): _bootstrap", ts=0, dur=100, type="python_function", tid=2),
          SimpleNamespace(name="traces/live.py(385): _flusher", ts=1, dur=90, type="python_function", tid=2),
          SimpleNamespace(name="threading.py(629): wait", ts=2, dur=80, type="python_function", tid=2)]
    assert host_frames.user_events(ev, ours=("traces/",), get=host_frames._get) == ([], 0)


def test_recording_time_is_taken_off_the_projected_clock(monkeypatch):
    wall = [1_000_000_000]
    monkeypatch.setattr(clock, "time", SimpleNamespace(time_ns=lambda: wall[0]))
    # a fresh clock: earlier tests in this process left offsets stamped at real wall times, which the fake
    # wall above would sort before
    monkeypatch.setattr(clock, "_offset", 0)
    monkeypatch.setattr(clock, "_history", [])
    start = clock.now_ns()
    with clock.excluded():
        wall[0] += 5_000_000                   # 5 ms of the simulator writing its trace
        assert clock.now_ns() == start         # stands still inside
    wall[0] += 1_000                           # then 1 us of the user's own work
    assert clock.now_ns() - start == 1_000
    assert clock.projected_at(wall[0]) == clock.now_ns()


def test_a_small_profile_is_small(tmp_path):
    # 51 instructions: 6.3 MB of mostly empty 256 KiB blocks before issue 36
    synthetic.write_run(tmp_path, executions=3, instructions=17, warmup=1)
    assert traces.finalize(tmp_path).stat().st_size < 1_000_000
