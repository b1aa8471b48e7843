"""neuron-top over the real path: a workload process publishing through traces.live.LivePublisher,
the real monitor Collector, the app under Pilot; and the real `neuron-top` script driven in tmux."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from top.app import NeuronTop
from top.sources import LiveSource

pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)

NEURON_TOP = Path(sys.executable).parent / "neuron-top"

WORKLOAD = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from traces.attach import claim
    from traces.live import LivePublisher

    marker = Path(sys.argv[1])
    pub = LivePublisher(tag="live_app", target="trn1", instance_type="trn1.32xlarge",
                        command="python train.py",
                        hardware={"neuron_device_type": "trainium", "neuron_device_version": "v2",
                                  "neuroncore_version": "v2", "neuron_device_count": 16,
                                  "neuron_device_memory_size": 32 << 30, "neuroncore_per_device_count": 2,
                                  "logical_neuroncore_config": 1})
    pub.cores = [0, 1]
    pub.set_device_memory(0, "constants", 64 << 20)
    pub.set_device_memory(0, "model_code", 2 << 20)
    pub.set_host_memory("dma_buffers", 1 << 20)
    pub.model_loaded(name="mlp_neff", uuid="abc", model_id=10005, core=0,
                     device_bytes={"constants": 48 << 20, "model_code": 1 << 20})
    pub.count_event("compile")
    pub.count_event("recompile", reason="tensor 'x' dim 0: 8 -> 16", source="train.py:42")
    pub.count_event("cpu_fallback", reason="no device lowering", source="train.py:17", op="aten.nonzero.default")
    deadline = time.time() + 120
    while time.time() < deadline:
        time.sleep(0.01)
        now = time.time()
        for core in (0, 1):
            # 6 ms of device work every 10 ms on core 0, 3 ms on core 1
            dev = 0.006 if core == 0 else 0.003
            pub.record_execution(core=core, wall_end=now, proj_end_ns=int(now * 1e9), total_latency_s=dev + 0.001,
                                 device_latency_s=dev, busy_ns={"tensor": int(dev * 0.5e9), "vector": int(dev * 0.2e9),
                                                                "dma": int(dev * 0.6e9)},
                                 flops=int(dev * 50e12), status="completed")
        request = claim(pub.pid)
        if request is not None:
            marker.write_text(json.dumps(request))
""")


@pytest.fixture
def workload(tmp_path, monkeypatch):
    live = tmp_path / "live"
    monkeypatch.setenv("NEURON_STACK_LIVE_DIR", str(live))
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    marker = tmp_path / "capture_seen.json"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, str(script), str(marker)], env=env)
    for _ in range(300):  # bounded wait for the first published snapshot
        if live.exists() and any(live.glob("*.json")):
            break
        time.sleep(0.02)
    yield proc, marker, tmp_path
    proc.terminate()
    proc.wait(timeout=30)


def test_live_workload_through_the_real_collector(workload):
    proc, marker, tmp = workload

    async def main():
        # Period 0.5 s: the publisher flushes every 0.25 s, so every period sees new executions.
        app = NeuronTop(LiveSource(None), period=0.5, capture_dir=tmp / "caps", capture_seconds=2)
        async with app.run_test(size=(200, 50)) as pilot:
            for _ in range(600):   # bounded: until the process has a tab
                await pilot.pause(0.02)
                if app.snapshot and app.snapshot.has_processes:
                    break
            await pilot.press("2")
            busy = None
            for _ in range(600):   # bounded: until a frame shows the process busy
                await pilot.pause(0.02)
                snap = app.snapshot
                if snap and snap.has_processes and snap.apps[1].utilization.get(0, 0) > 0:
                    await pilot.pause()
                    busy = app.snapshot
                    screen = app.screen_text()
                    break
            await pilot.press("x")
            await pilot.pause()
            screen = (screen, app.screen_text())
            await pilot.press("c")
            await pilot.pause()
            for _ in range(500):
                if marker.exists():
                    break
                await pilot.pause(0.02)
            return screen, app.screen_text(), busy
    screen, after_capture, snap = asyncio.run(main())
    assert snap is not None, "neuron-top never showed the workload busy"
    app_view = snap.apps[1]
    assert app_view.tag == "live_app" and app_view.pid == proc.pid
    assert 0 < app_view.utilization[0] <= 100 and app_view.utilization[0] > app_view.utilization[1]
    busy_screen, screen = screen
    assert "Neuron Apps   [1]:all  >[2]:live_app<" in busy_screen
    assert "NeuronCore v2 Utilization (Avg:" in busy_screen and "Avg: 0.00%" not in busy_screen
    assert "mlp_neff" in screen and "10005" in screen
    assert "Recompiles 1" in screen and "train.py:42" in screen and "tensor 'x' dim 0: 8 -> 16" in screen
    assert "CPU fallbacks 1" in screen and "aten.nonzero.default: no device lowering" in screen
    assert "Engines of ND0 NC0 (core 0)" in screen
    # The capture key reached the workload: it consumed the request neuron-top wrote.
    request = json.loads(marker.read_text())
    assert request["seconds"] == 2.0 and request["output_dir"].startswith(str(tmp / "caps" / "live_app_"))
    assert "capture → " + request["output_dir"] in after_capture


def _pane(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                          text=True).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed: the terminal smoke test "
                                                         "needs it (apt-get install tmux)")
def test_real_script_in_tmux_80x24(workload):
    proc, marker, tmp = workload
    session = f"ntop{os.getpid()}"
    env = {"NEURON_STACK_LIVE_DIR": os.environ["NEURON_STACK_LIVE_DIR"], "TERM": "xterm-256color"}
    command = " ".join(f"{k}={v}" for k, v in env.items()) + f" {NEURON_TOP} --period 0.3"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", command], check=True)
    try:
        text = ""
        for _ in range(300):   # bounded: until the process appears on screen
            time.sleep(0.05)
            text = _pane(session)
            if "live_app" in text and "Avg: 0.00%" not in text and "Utilization (Avg" in text:
                break
        assert "neuron-top" in text and "(trn1.32xlarge)" in text
        assert "[2]:live_app" in text and "System vCPU Usage" in text
        subprocess.run(["tmux", "send-keys", "-t", session, "d"], check=True)
        for _ in range(100):
            time.sleep(0.05)
            text = _pane(session)
            if ">[2]:live_app<" in text:
                break
        assert ">[2]:live_app<" in text
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        for _ in range(100):
            time.sleep(0.05)
            alive = subprocess.run(["tmux", "has-session", "-t", session], capture_output=True)
            if alive.returncode != 0:
                break
        assert alive.returncode != 0, "q did not quit neuron-top"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_config_file_filters_processes_and_groups(workload, tmp_path):
    proc, marker, tmp = workload
    only_counters = tmp_path / "counters.json"
    only_counters.write_text(json.dumps({
        "period": "1s",
        "neuron_runtimes": [{"tag_filter": "^live_", "metrics": [{"type": "neuroncore_counters"},
                                                                  {"type": "memory_used"}]}],
        "system_metrics": [{"type": "vcpu_usage"}]}))
    nobody = tmp_path / "nobody.json"
    nobody.write_text(json.dumps({"neuron_runtimes": [{"tag_filter": "^other_job$",
                                                       "metrics": [{"type": "neuroncore_counters"}]}]}))

    async def watch(config):
        app = NeuronTop(LiveSource(str(config)), period=0.5)
        async with app.run_test(size=(200, 50)) as pilot:
            for _ in range(300):   # bounded: two refreshes
                await pilot.pause(0.02)
                if app.frames >= 2:
                    break
            await pilot.pause()
            return app.screen_text()
    shown = asyncio.run(watch(only_counters))
    assert "[2]:live_app" in shown and "mlp_neff" not in shown   # tree collapsed at NC level
    assert "Runtime vCPU Usage  n/a" in shown
    assert "recompiles, CPU fallbacks: not reported" in shown
    filtered = asyncio.run(watch(nobody))
    assert "No Neuron processes found — waiting…" in filtered and "live_app" not in filtered


RUNTIME_WORKLOAD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    import torch, neuron_stack
    from models import MLP

    stop = Path(sys.argv[1])
    mlp = neuron_stack.trace(MLP(16, 32, 4).eval(), torch.randn(3, 16))
    x = torch.randn(3, 16)
    deadline = time.time() + 120
    while time.time() < deadline and not stop.exists():
        mlp(x)
        time.sleep(0.005)
""")


def test_capture_key_records_a_profile_of_a_real_runtime_workload(tmp_path, monkeypatch):
    """The whole chain a user relies on: c in neuron-top → request file → the runtime records for
    --capture-seconds → a directory that finalises into a profile of that process."""
    import traces

    root = Path(__file__).resolve().parents[1]
    live = tmp_path / "live"
    monkeypatch.setenv("NEURON_STACK_LIVE_DIR", str(live))
    script, stop = tmp_path / "runtime_workload.py", tmp_path / "stop"
    script.write_text(RUNTIME_WORKLOAD)
    env = dict(os.environ, PYTHONPATH=str(root), NEURON_PROCESS_TAG="mlp_live",
               NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, str(script), str(stop), str(root / "sample_workloads")], env=env)
    try:
        async def main():
            app = NeuronTop(LiveSource(None), period=0.5, capture_dir=tmp_path / "caps", capture_seconds=1)
            async with app.run_test(size=(160, 40)) as pilot:
                for _ in range(3000):   # bounded: compiling the model, then its first executions
                    await pilot.pause(0.02)
                    snap = app.snapshot
                    if snap and snap.has_processes and any(snap.apps[1].utilization.values()):
                        break
                await pilot.press("2", "c")
                await pilot.pause()
                return app.last_capture, app.screen_text()
        capture, text = asyncio.run(main())
        assert capture is not None and f"capture → {capture}" in text
        for _ in range(600):   # bounded: one second of recording, then the recorder closes its run
            # (the run is published once when recording starts and once when it stops)
            if capture.exists() and any(capture.glob("executions.*")) and len(list(capture.glob("runs.*"))) >= 2:
                break
            time.sleep(0.05)
    finally:
        stop.write_text("")
        proc.wait(timeout=60)
    with traces.open(traces.finalize(capture)) as profile:
        runs = profile.runs().to_pylist()
        executions = profile.sql("SELECT count(*) AS n FROM executions").to_pylist()[0]["n"]
    assert [r["tag"] for r in runs] == ["mlp_live"] and runs[0]["pid"] == proc.pid
    assert executions > 0
