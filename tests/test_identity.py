"""One instance identity (issue 42 item 1): neuron-ls, neuron-monitor, neuron-top and Prometheus name the same
instance under every setting of NEURON_STACK_INSTANCE_TYPE / NEURON_STACK_TARGET, with any processes running;
nothing depends on which workload described itself last; processes of several targets on one machine are each
reported under their own instance; a real workload's snapshot and profile carry the instance the variable set."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monitor.collect import Collector
from monitor.config import load_config
from monitor.prometheus import Exporter
from neuron_stack.device.profiles import get_profile
from neuron_stack.runtime.cores import get_instance
from top.snapshot import build_snapshot
from traces.identity import DEFAULT_INSTANCE
from traces.live import LivePublisher

ROOT = Path(__file__).resolve().parents[1]


def test_default_instances_are_the_device_profiles():
    assert DEFAULT_INSTANCE == {t: get_profile(t).instance_type for t in ("trn1", "inf2", "trn2")}


def publisher(live: Path, target: str) -> LivePublisher:
    """A process of ``target`` as the runtime publishes it (its instance, its hardware)."""
    inst = get_instance(target)
    pub = LivePublisher(tag=f"job_{target}", target=target, instance_type=inst.instance_type,
                        hardware=inst.hardware_info(), directory=live)
    pub.cores = [0]
    pub.flush()
    return pub


def names(live: Path) -> tuple[str, str, str]:
    """(neuron-ls, neuron-monitor, neuron-top) instance types."""
    doc = Collector(load_config(None), directory=live).collect()
    return get_instance().instance_type, doc["instance_info"]["instance_type"], build_snapshot(doc).instance_type


# (variables, targets running oldest first, the instance every tool names)
SETTINGS = [
    ({}, [], "trn1.32xlarge"),
    ({}, ["inf2"], "inf2.48xlarge"),
    ({}, ["trn1", "inf2"], "trn1.32xlarge"),
    ({"NEURON_STACK_INSTANCE_TYPE": "trn1.2xlarge"}, ["inf2"], "trn1.2xlarge"),
    ({"NEURON_STACK_INSTANCE_TYPE": "inf2.xlarge"}, [], "inf2.xlarge"),
    ({"NEURON_STACK_TARGET": "inf2"}, [], "inf2.48xlarge"),
    ({"NEURON_STACK_TARGET": "trn2"}, ["trn1"], "trn2.48xlarge"),
]


@pytest.mark.parametrize("env,running,expected", SETTINGS)
def test_every_tool_names_the_same_instance(tmp_path, monkeypatch, env, running, expected):
    live = tmp_path / "live"
    monkeypatch.setenv("NEURON_STACK_LIVE_DIR", str(live))
    for var in ("NEURON_STACK_INSTANCE_TYPE", "NEURON_STACK_TARGET"):
        monkeypatch.delenv(var, raising=False)
    pubs = [publisher(live, t) for t in running]   # the workloads' own environment: no variable
    for k, v in env.items():                        # the tools'
        monkeypatch.setenv(k, v)
    try:
        assert names(live) == (expected,) * 3
    finally:
        for p in pubs:
            p.close()


def test_no_cross_talk_through_a_shared_file(tmp_path, monkeypatch):
    live = tmp_path / "live"
    monkeypatch.setenv("NEURON_STACK_LIVE_DIR", str(live))
    for var in ("NEURON_STACK_INSTANCE_TYPE", "NEURON_STACK_TARGET"):
        monkeypatch.delenv(var, raising=False)
    publisher(live, "trn1").close()
    publisher(live, "inf2").close()        # the last to describe itself, and gone
    assert names(live) == ("trn1.32xlarge",) * 3
    monkeypatch.setenv("NEURON_STACK_TARGET", "inf2")   # its description is still there for whoever asks for it
    doc = Collector(load_config(None), directory=live).collect()
    assert doc["neuron_hardware_info"]["neuron_device_count"] == 12 and doc["neuron_hardware_info"]["error"] == ""


def test_several_targets_each_under_their_own(tmp_path, monkeypatch):
    live = tmp_path / "live"
    monkeypatch.setenv("NEURON_STACK_LIVE_DIR", str(live))
    pubs = [publisher(live, t) for t in ("trn1", "inf2")]
    try:
        doc = Collector(load_config(None), directory=live).collect()
    finally:
        for p in pubs:
            p.close()
    own = {rt["neuron_runtime_tag"]: [t["instance_type"] for t in rt["report"]["neuron_stack"]["targets"].values()]
           for rt in doc["neuron_runtime_data"]}
    assert own == {"job_trn1": ["trn1.32xlarge"], "job_inf2": ["inf2.48xlarge"]}
    exp = Exporter()
    exp.update(doc)
    [fam] = [m for m in exp.collect() if m.name == "neuron_stack_cpu_fallbacks"]
    assert {s.labels["runtime_tag"]: s.labels["instance_type"] for s in fam.samples if s.name.endswith("_total")} \
        == {"job_trn1": "trn1.32xlarge", "job_inf2": "inf2.48xlarge"}


WORKLOAD = textwrap.dedent("""
    import sys, torch, neuron_stack
    from traces.live import read_all
    sys.path.insert(0, sys.argv[1])
    from models import MLP
    nm = neuron_stack.trace(MLP(8, 16, 4).eval(), torch.randn(2, 8))
    nm(torch.randn(2, 8))
    [snap] = read_all()
    print(snap["instance_type"], snap["hardware"]["neuron_device_count"])
""")


def test_a_workload_publishes_and_records_the_instance_it_was_given(tmp_path):
    import traces
    env = dict(os.environ, PYTHONPATH=str(ROOT), NEURON_STACK_LIVE_DIR=str(tmp_path / "live"),
               NEURON_STACK_INSTANCE_TYPE="trn1.2xlarge", NEURON_RT_INSPECT_ENABLE="1",
               NEURON_RT_INSPECT_OUTPUT_DIR=str(tmp_path / "prof"), NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"),
               NEURON_STACK_RUNTIME_DIR=str(tmp_path / "cores"))
    out = subprocess.run([sys.executable, "-c", WORKLOAD, str(ROOT / "sample_workloads")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["trn1.2xlarge", "1"]
    with traces.open(traces.finalize(tmp_path / "prof")) as prof:
        meta = {r["key"]: r["value"] for r in prof.sql("SELECT key, value FROM metadata").to_pylist()}
    assert meta["instance_type"] == "trn1.2xlarge" and meta["neuron_device_count"] == "1"
