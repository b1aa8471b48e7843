"""monitor.replay: a finished profile played back as neuron-monitor documents, checked against the
monitor's JSON schema and against the profile's own totals; and neuron-top --replay on screen."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import traces
from monitor.replay import Replay
from top.app import NeuronTop
from top.sources import ReplaySource
from traces.synthetic import write_run

ROOT = Path(__file__).resolve().parents[1]
VALIDATOR = jsonschema.Draft202012Validator(json.loads((ROOT / "monitor" / "schema.json").read_text()))
NEURON_TOP = Path(sys.executable).parent / "neuron-top"
EXECUTIONS, CORES = 5, (0, 1)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("replay")
    write_run(out, executions=EXECUTIONS, instructions=300, cores=CORES, tag="train_job")
    return traces.finalize(out)


@pytest.fixture(scope="module")
def totals(profile):
    with traces.open(profile) as p:
        return p.sql("""SELECT core, sum(device_ns)::BIGINT AS device_ns, count(*) AS n,
                               sum(tensor_busy_ns)::BIGINT AS tensor FROM executions GROUP BY core""").to_pylist()


def test_documents_follow_the_monitor_schema_and_cover_the_profile(profile, totals):
    window_s = 0.0005
    with Replay(profile, window_s=window_s) as replay:
        docs = list(replay)
        assert replay.position_s == pytest.approx(replay.duration_s)
    assert len(docs) == int(replay.duration_s / window_s) + 1
    for doc in docs:
        VALIDATOR.validate(doc)
    busy = {c: 0.0 for c in CORES}
    tensor = {c: 0.0 for c in CORES}
    completed = recompiles = fallbacks = 0
    for doc in docs:
        (entry,) = doc["neuron_runtime_data"]
        assert entry["neuron_runtime_tag"] == "train_job"
        report = entry["report"]
        for core, values in report["neuroncore_counters"]["neuroncores_in_use"].items():
            busy[int(core)] += values["neuroncore_utilization"] / 100 * window_s * 1e9
        for core, engines in report["neuron_stack"]["engines"].items():
            tensor[int(core)] += engines["tensor"] / 100 * window_s * 1e9
        completed += report["execution_stats"]["execution_summary"]["completed"]
        recompiles += report["neuron_stack"]["recompiles"]["count"]
        fallbacks += report["neuron_stack"]["cpu_fallbacks"]["count"]
    for row in totals:
        # Every window's busy time adds up to the device time recorded (2-decimal percentages).
        assert busy[row["core"]] == pytest.approx(row["device_ns"], rel=1e-3)
        assert tensor[row["core"]] == pytest.approx(row["tensor"], rel=1e-3)
    assert completed == EXECUTIONS * len(CORES)
    assert recompiles == 1
    assert fallbacks == EXECUTIONS * len(CORES)


def test_last_reasons_sources_memory_and_hardware(profile):
    with Replay(profile, window_s=1.0) as replay:
        (doc,) = list(replay)
    report = doc["neuron_runtime_data"][0]["report"]
    extra = report["neuron_stack"]
    assert extra["recompiles"]["last_reason"] == "tensor 'x' dim 1: 128 -> 136"
    assert extra["recompiles"]["last_source"] == "model.py:6"
    assert extra["cpu_fallbacks"]["last_op"] == "aten.nonzero.default"
    assert extra["cpu_fallbacks"]["last_source"] == "model.py:10"
    assert extra["command"] == "python model.py" and extra["target"] == "trn1"
    per_core = report["memory_used"]["neuron_runtime_used_bytes"]["usage_breakdown"]["neuroncore_memory_usage"]
    assert per_core == {str(c): {"constants": 0, "model_code": 0, "model_shared_scratchpad": 0,
                                 "runtime_memory": 0, "tensors": 1 << 20} for c in CORES}
    latency = report["execution_stats"]["latency_stats"]["device_latency"]
    assert latency["p0"] == latency["p100"] > 0      # the same static schedule every execution
    assert doc["instance_info"]["instance_type"] == "trn1.32xlarge"
    assert doc["neuron_hardware_info"]["neuroncore_version"] == "v2"


def test_missing_and_empty_profiles_are_one_line_errors(tmp_path):
    with pytest.raises(traces.TraceError, match="does not exist"):
        Replay(tmp_path / "nope.duckdb")
    with pytest.raises(traces.TraceError, match="positive"):
        Replay(tmp_path, window_s=0)
    bad = tmp_path / "not_a_profile.duckdb"
    bad.write_text("hello")
    with pytest.raises(traces.TraceError):
        Replay(bad)


@pytest.mark.parametrize("argv, message", [
    (["--replay", "/nonexistent/profile.duckdb"], "does not exist"),
    (["--period", "0"], "--period must be a positive number"),
    (["--replay", "PROFILE", "--speed", "-2"], "--speed must be positive"),
    (["-c", "/nonexistent/monitor.json"], "/nonexistent/monitor.json"),
])
def test_cli_bad_input_is_one_line(argv, message, profile):
    argv = [str(profile) if a == "PROFILE" else a for a in argv]
    out = subprocess.run([str(NEURON_TOP), *argv], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuron-top: error:") and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_neuron_top_replays_a_profile_with_the_same_screens(profile, totals):
    async def main():
        # 1 ms of profile per refresh: the executions show up as busy cores.
        app = NeuronTop(ReplaySource(str(profile), period=0.01, speed=0.1), period=0.01)
        seen = []
        async with app.run_test(size=(200, 50)) as pilot:
            for _ in range(2000):   # bounded: the replay has ~50 windows
                await pilot.pause(0.01)
                snap = app.snapshot
                if snap is not None and snap.apps[0].utilization:
                    seen.append(app.screen_text())
                    break
            for _ in range(2000):
                if "replay finished" in app.status_text:
                    break
                await pilot.pause(0.01)
            await pilot.pause()
            return seen, app.screen_text()
    seen, final = asyncio.run(main())
    assert seen, "the replay never showed a busy core"
    text = seen[0]
    assert "neuron-top" in text and "running on replay:profile.duckdb (trn1.32xlarge)" in text
    assert "replay of" in text
    assert "NeuronCore v2 Utilization (Avg:" in text and "Avg: 0.00%" not in text
    assert "Neuron Apps  >[1]:all<  [2]:train_job" in text
    assert "Tensor" in text and "Engines of ND0 NC0 (core 0)" in text
    assert "replay finished" in final and "Recompiles" in final


def test_each_recorded_process_is_its_own_tab(tmp_path):
    # Two ranks of one job writing into one session directory, as torchrun does.
    write_run(tmp_path, executions=3, instructions=200, cores=(0,), tag="rank0", run_id="r0", seed=1)
    write_run(tmp_path, executions=3, instructions=200, cores=(1,), tag="rank1", run_id="r1", seed=2)
    with Replay(traces.finalize(tmp_path), window_s=1.0) as replay:
        (doc,) = list(replay)
    VALIDATOR.validate(doc)
    tags = {e["neuron_runtime_tag"]: e for e in doc["neuron_runtime_data"]}
    assert set(tags) == {"rank0", "rank1"}
    assert set(tags["rank0"]["report"]["neuroncore_counters"]["neuroncores_in_use"]) == {"0"}
    assert set(tags["rank1"]["report"]["neuroncore_counters"]["neuroncores_in_use"]) == {"1"}


def test_replay_pause_and_speed_keys(profile):
    async def main():
        source = ReplaySource(str(profile), period=0.02, speed=0.01)
        app = NeuronTop(source, period=0.02)
        async with app.run_test(size=(120, 30)) as pilot:
            for _ in range(500):
                if app.frames >= 2:
                    break
                await pilot.pause(0.01)
            await pilot.press("space")
            await pilot.pause(0.1)
            frozen = app.frames
            await pilot.pause(0.3)          # several periods: nothing new while paused
            paused_screen, still = app.screen_text(), app.frames
            await pilot.press("plus", "plus", "minus")
            await pilot.press("space")
            for _ in range(500):
                if app.frames > still:
                    break
                await pilot.pause(0.01)
            return frozen, still, paused_screen, app.frames, source.speed, app.screen_text()
    frozen, still, paused_screen, resumed, speed, text = asyncio.run(main())
    assert still == frozen and "PAUSED (space resumes)" in paused_screen
    assert resumed > still and "PAUSED" not in text
    assert speed == pytest.approx(0.02) and "at ×0.02" in text


def test_replay_of_a_real_runtime_profile(tmp_path):
    """The runtime's own records (load events, memory samples, executions), not synthetic ones."""
    explorer = Path(sys.executable).parent / "neuron-explorer"
    env = dict(os.environ, NEURON_PROCESS_TAG="mlp_replay")
    run = subprocess.run([str(explorer), "inspect", "-o", str(tmp_path), "--", sys.executable,
                          str(ROOT / "sample_workloads" / "mlp.py"), "--small"],
                         capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr
    (profile,) = tmp_path.glob("*/profile.duckdb")
    with traces.open(profile) as p:
        executions = p.sql("SELECT count(*) AS n FROM executions").to_pylist()[0]["n"]
        model = p.sql("SELECT name FROM graphs LIMIT 1").to_pylist()[0]["name"]
    with Replay(profile) as replay:
        duration_s = replay.duration_s
    # 2,000 windows: the profile spans the compiles too (~17 s), and 0.1 ms windows made ~170,000 documents,
    # each validated; what is checked (schema, tag, a busy core, every execution once, the loaded model) does
    # not depend on the window count, and a ~9 ms window still shows a few-µs execution as > 0.05 % busy.
    with Replay(profile, window_s=duration_s / 2000) as replay:
        docs = list(replay)
    busy, completed, models = 0.0, 0, set()
    for doc in docs:
        VALIDATOR.validate(doc)
        for entry in doc["neuron_runtime_data"]:
            assert entry["neuron_runtime_tag"] == "mlp_replay"
            report = entry["report"]
            busy = max([busy] + [c["neuroncore_utilization"]
                                 for c in report["neuroncore_counters"]["neuroncores_in_use"].values()])
            completed += report["execution_stats"]["execution_summary"]["completed"]
            models |= {m["name"] for m in report["memory_used"]["loaded_models"]}
    assert busy > 0 and completed == executions and model in models
