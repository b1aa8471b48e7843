"""neuron-monitor's triggers attach to a running job by themselves: a recompile storm in a real workload (the
dynamic-shapes sample, profiling off) makes the monitor ask it for a window; the window's profile has device
rows, its path is the process's ``neuron_stack.attach`` in the monitor document (valid against the schema), and
the Prometheus exporter serves it as a label of ``neuron_stack_attach_capture``, which the fleet alert carries."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from monitor.config import ConfigError, parse_config

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "monitor" / "schema.json").read_text())
CONFIG = {"period": "500ms",
          "neuron_runtimes": [{"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"},
                                                               {"type": "neuron_stack"}]}],
          "triggers": [{"type": "recompile_storm", "threshold": 2, "duration": "6s", "window": "30s"}]}


def test_trigger_config_is_checked_in_one_line():
    with pytest.raises(ConfigError, match=r"triggers\[0\].type: unknown trigger 'storm': use one of recompile_storm"):
        parse_config({"triggers": [{"type": "storm"}]})
    with pytest.raises(ConfigError, match=r"triggers\[0\]: recompile_storm reads the neuron_stack metric group"):
        parse_config({"neuron_runtimes": [{"metrics": [{"type": "execution_stats"}]}],
                      "triggers": [{"type": "recompile_storm"}]})
    with pytest.raises(ConfigError, match=r"triggers\[0\].duration: at most 600s"):
        parse_config({**CONFIG, "triggers": [{"type": "fallback_burst", "duration": "1h"}]})
    [t] = parse_config(CONFIG).triggers
    assert (t.type, t.threshold, t.duration, t.window) == ("recompile_storm", 2.0, 6.0, 30.0)


def test_a_recompile_storm_attaches_by_itself(tmp_path, monkeypatch):
    from monitor.collect import Collector
    from monitor.prometheus import Exporter

    live = tmp_path / "live"
    monkeypatch.setenv("NEURON_STACK_LIVE_DIR", str(live))
    monkeypatch.chdir(tmp_path)                      # the trigger's default output_dir is relative
    collector = Collector(parse_config(CONFIG))      # running before the job: its recompiles are this period's
    env = dict(os.environ, PYTHONPATH=str(ROOT), NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"),
               NEURON_PROCESS_TAG="storm")
    env.pop("NEURON_RT_INSPECT_ENABLE", None)
    proc = subprocess.Popen([sys.executable, str(ROOT / "sample_workloads" / "dynamic_shapes.py"), "--small",
                             "--serve", "60"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    seen = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            doc = collector.collect()
            validator.validate(doc)
            [rt] = doc["neuron_runtime_data"] or [None]
            att = rt and rt["report"]["neuron_stack"].get("attach")
            if att and att["state"] == "done":
                seen = doc
                break
    finally:
        proc.terminate()
        err = proc.communicate(timeout=60)[1]
    assert seen is not None, f"no trigger capture (exit {proc.returncode}): {err[-2000:]}"
    att = seen["neuron_runtime_data"][0]["report"]["neuron_stack"]["attach"]
    assert att["trigger"] == "recompile_storm" and "neuron-monitor-captures/recompile_storm_storm_" in att["profile"]

    import traces
    with traces.open(att["profile"]) as prof:
        assert prof.sql("SELECT count(*) AS n FROM instructions").to_pylist()[0]["n"] > 0
        assert prof.runs().to_pylist()[0]["tag"] == "storm"

    exp = Exporter()
    exp.update(seen)
    [fam] = [m for m in exp.collect() if m.name == "neuron_stack_attach_capture"]
    [sample] = fam.samples
    assert sample.labels["profile_path"] == att["profile"] and sample.labels["trigger"] == "recompile_storm"
    assert sample.labels["state"] == "done" and sample.value == 0
