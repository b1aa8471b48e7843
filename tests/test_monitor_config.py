"""monitor.config and the scheduler: the real config format, period precedence, and the document
schema checked against the real tool's example (reference neuron_conventions.md §1.5)."""
import json
from pathlib import Path

import jsonschema
import pytest

from monitor.cli import Scheduler
from monitor.config import ConfigError, load_config, parse_config, parse_duration

ROOT = Path(__file__).resolve().parents[1]

REAL_EXAMPLE_CONFIG = {
    "period": "1s",
    "neuron_runtimes": [
        {"tag_filter": ".*",
         "metrics": [{"type": "neuroncore_counters"}, {"type": "memory_used"},
                     {"type": "neuron_runtime_vcpu_usage"}, {"type": "execution_stats"}]}],
    "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"},
                       {"period": "2s", "type": "neuron_hw_counters"}],
}


def test_the_real_guides_example_config_loads(tmp_path):
    path = tmp_path / "monitor.conf"
    path.write_text(json.dumps(REAL_EXAMPLE_CONFIG))
    cfg = load_config(path)
    assert [g.type for g in cfg.runtimes[0].metrics] == [
        "neuroncore_counters", "memory_used", "neuron_runtime_vcpu_usage", "execution_stats"]
    assert {g.type: g.period for g in cfg.system} == {"vcpu_usage": 1.0, "memory_info": 1.0, "neuron_hw_counters": 2.0}


def test_no_config_means_every_group_every_5s():
    cfg = load_config(None)
    periods = {key: g.period for key, g in cfg.groups()}
    assert set(periods.values()) == {5.0}
    assert {k[-1] for k in periods} == {"neuroncore_counters", "execution_stats", "memory_used",
                                        "neuron_runtime_vcpu_usage", "neuron_stack", "vcpu_usage",
                                        "memory_info", "neuron_hw_counters"}


def test_most_specific_period_wins():
    cfg = parse_config({"period": "3s", "neuron_runtimes": [
        {"tag_filter": "^a", "period": "2s", "metrics": [{"type": "execution_stats", "period": "500ms"},
                                                          {"type": "memory_used"}]},
        {"tag_filter": "^b", "metrics": [{"type": "memory_used"}]}],
        "system_metrics": [{"type": "memory_info"}, {"type": "vcpu_usage", "period": "1m"}]})
    assert [g.period for g in cfg.runtimes[0].metrics] == [0.5, 2.0]
    assert [g.period for g in cfg.runtimes[1].metrics] == [3.0]
    assert [g.period for g in cfg.system] == [3.0, 60.0]
    assert parse_config({}).period == 5.0


def test_tag_filter_is_a_regex_search_first_entry_wins():
    cfg = parse_config({"neuron_runtimes": [{"tag_filter": "train", "metrics": []},
                                            {"tag_filter": ".*", "metrics": [{"type": "memory_used"}]}]})
    assert cfg.selector_for("my_train_job")[0] == 0
    assert cfg.selector_for("12345")[0] == 1
    assert parse_config({"neuron_runtimes": [{"tag_filter": "^x$", "metrics": []}]}).selector_for("y") is None


@pytest.mark.parametrize("text,seconds", [("1s", 1.0), ("500ms", 0.5), ("2m", 120.0), ("1m30s", 90.0),
                                          ("1.5s", 1.5), ("1h", 3600.0), (2, 2.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "1", "s", "1 sec", "-1s", "1s2", True, None, [1], "1ns"])
def test_bad_durations(bad):
    with pytest.raises(ConfigError):
        parse_duration(bad)


def test_scheduler_runs_each_group_on_its_own_period():
    cfg = parse_config(REAL_EXAMPLE_CONFIG)
    s = Scheduler(cfg, start=0.0)
    ticks = []
    now = 0.0
    for _ in range(4):
        now += s.wait_time(now)
        due = s.due(now)
        ticks.append((now, sorted(k[-1] for k in due)))
        s.advance(due, now)
    assert [t for t, _ in ticks] == [1.0, 2.0, 3.0, 4.0]
    assert "neuron_hw_counters" not in ticks[0][1] and "neuron_hw_counters" in ticks[1][1]
    assert "neuron_hw_counters" not in ticks[2][1] and "execution_stats" in ticks[2][1]


def test_scheduler_does_not_burst_after_a_stall():
    s = Scheduler(parse_config({"period": "1s", "system_metrics": [{"type": "memory_info"}]}), start=0.0)
    due = s.due(10.0)  # suspended for 10 s
    s.advance(due, 10.0)
    assert s.due(10.5) == set() and s.wait_time(10.0) == 1.0


def test_the_schema_accepts_the_real_tools_example_document():
    # Reference §1.5, the guide's own per-group examples assembled (the typo in its skeleton fixed).
    example = {
        "neuron_runtime_data": [{
            "pid": 257726, "address": "", "neuron_runtime_tag": "my_app_1", "error": "",
            "report": {
                "neuroncore_counters": {"period": 1.000113182, "neuroncores_in_use": {
                    "0": {"neuroncore_utilization": 42.01, "flops": 1234567891011,
                          "v3d": {"nc_v3.0": {"neuroncore_utilization": 21.01},
                                  "nc_v3.1": {"neuroncore_utilization": 63.01}}}}, "error": ""},
                "execution_stats": {
                    "period": 1.030613214,
                    "error_summary": {"generic": 0, "numerical": 0, "transient": 0, "model": 0, "runtime": 0,
                                      "hardware": 0},
                    "execution_summary": {"completed": 123, "completed_with_err": 0, "completed_with_num_err": 0,
                                          "timed_out": 0, "incorrect_input": 0, "failed_to_queue": 0},
                    "latency_stats": {
                        "total_latency": {"p0": 0.01100001, "p1": 0.01100002, "p25": 0.01100004, "p50": 0.01100008,
                                          "p75": 0.01100010, "p99": 0.01100012, "p100": 0.01100013},
                        "device_latency": {"p0": 0.01000001, "p1": 0.01000002, "p25": 0.01000004, "p50": 0.01000008,
                                           "p75": 0.01000010, "p99": 0.01000012, "p100": 0.01000013}},
                    "error": ""},
                "memory_used": {
                    "period": 1.00001,
                    "neuron_runtime_used_bytes": {
                        "host": 6997643264, "neuron_device": 12519788544,
                        "usage_breakdown": {
                            "host": {"application_memory": 6996594688, "constants": 0, "dma_buffers": 1048576,
                                     "tensors": 0},
                            "neuroncore_memory_usage": {"0": {"constants": 193986816, "model_code": 176285056,
                                                              "model_shared_scratchpad": 0, "runtime_memory": 0,
                                                              "tensors": 20971520}}}},
                    "loaded_models": [{
                        "name": "neff", "uuid": "91f2f66e83ea419dace1da07617ad39f", "model_id": 10005,
                        "is_running": False,
                        "subgraphs": {"sg_00": {
                            "memory_used_bytes": {"host": 20480, "neuron_device": 21001024, "usage_breakdown": {
                                "host": {"application_memory": 20480, "constants": 0, "dma_buffers": 0, "tensors": 0},
                                "neuron_device": {"constants": 20971520, "model_code": 29504, "runtime_memory": 0,
                                                  "tensors": 0}}},
                            "neuroncore_index": 0, "neuron_device_index": 12}}}],
                    "error": ""},
                "neuron_runtime_vcpu_usage": {"period": 1.030604818, "vcpu_usage": {"user": 42.01, "system": 12.34},
                                              "error": ""}}}],
        "system_data": {
            "neuron_hw_counters": {"period": 1.030359284, "neuron_devices": [{
                "neuron_device_index": 0, "mem_ecc_corrected": 0, "mem_ecc_uncorrected": 0,
                "sram_ecc_uncorrected": 0, "sram_ecc_corrected": 0}], "error": ""},
            "vcpu_usage": {"period": 0.999974868,
                           "average_usage": {"user": 32.77, "nice": 0, "system": 22.87, "idle": 39.36, "io_wait": 0,
                                             "irq": 0, "soft_irq": 0},
                           "usage_data": {"0": {"user": 34.41, "nice": 0, "system": 27.96, "idle": 37.63, "io_wait": 0,
                                                "irq": 0, "soft_irq": 0}},
                           "context_switch_count": 123456, "error": ""},
            "memory_info": {"period": 5.346411129, "memory_total_bytes": 49345835008, "memory_used_bytes": 16042344448,
                            "swap_total_bytes": 0, "swap_used_bytes": 0, "error": ""}},
        "instance_info": {"instance_name": "My_Instance", "instance_id": "i-0011223344556677a",
                          "instance_type": "trn2n.48xlarge", "instance_availability_zone": "us-west-2b",
                          "instance_availability_zone_id": "usw2-az2", "instance_region": "us-west-2",
                          "ami_id": "ami-0011223344556677b", "subnet_id": "subnet-112233ee", "error": ""},
        "neuron_hardware_info": {"neuron_device_type": "trainium2", "neuron_device_version": "v4",
                                 "neuroncore_version": "v3d", "neuron_device_count": 16,
                                 "neuron_device_memory_size": 103079215104, "neuroncore_per_device_count": 4,
                                 "logical_neuroncore_config": 2, "error": ""},
    }
    schema = json.loads((ROOT / "monitor" / "schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    assert not [e.message for e in v.iter_errors(example)]
    # ... and it is strict: a misspelt key or a count as a string is refused.
    bad = json.loads(json.dumps(example))
    bad["neuron_runtime_data"][0]["report"]["execution_stats"]["execution_summary"]["completed"] = "123"
    assert list(v.iter_errors(bad))
    bad = json.loads(json.dumps(example))
    bad["system_data"]["memory_info"]["memory_free_bytes"] = 1
    assert list(v.iter_errors(bad))


# ------------------------------------------------------------------------------ issue 31: bounded
def test_tag_filter_is_linear_time_and_refuses_what_re2_cannot_do():
    cfg = parse_config({"neuron_runtimes": [{"tag_filter": "^(a+)+$", "metrics": []}]})
    # catastrophic for a backtracking engine (Python's re does not finish); RE2 answers at once
    assert cfg.selector_for("a" * 100_000 + "b") is None and cfg.selector_for("a" * 1000) is not None
    for bad in ("(a)\\1", "(?=a)b", "(?<!x)y"):
        with pytest.raises(ConfigError, match=r"tag_filter: bad regex .*RE2 syntax") as err:
            parse_config({"neuron_runtimes": [{"tag_filter": bad}]})
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("text", ['{"period": NaN}', '{"period": Infinity}', '{"period": -Infinity}',
                                  '{"period": 1e308}', '{"period": "99999999999h"}', '{"period": 86401}'])
def test_periods_are_bounded(tmp_path, text):
    path = tmp_path / "m.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match="period: .* (is not a duration|is too short|is too long)"):
        load_config(path)


def test_deep_nesting_is_one_line(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("[" * 300_000 + "]" * 300_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(path)


def test_once_says_when_it_will_wait_long(tmp_path):
    import signal
    import subprocess
    import sys

    path = tmp_path / "m.json"
    path.write_text('{"period": "1h", "system_metrics": [{"type": "memory_info"}]}')
    proc = subprocess.Popen([str(Path(sys.executable).parent / "neuron-monitor"), "-c", str(path), "--once"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert line.startswith("neuron-monitor: --once waits 3600 s") and proc.returncode == 0
    assert json.loads(out)["neuron_hardware_info"]   # the stop still ends with one complete document


def test_a_bad_regex_with_a_newline_is_one_whole_line(tmp_path, capsys):
    """RE2 quotes the pattern raw: a newline in it cut the error line short (issue 42)."""
    from monitor.cli import main
    path = tmp_path / "c.json"
    entry = {"tag_filter": "train(\nx", "metrics": [{"type": "memory_used"}]}
    path.write_text(json.dumps({"neuron_runtimes": [entry]}))
    assert main(["-c", str(path)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert "neuron_runtimes[0].tag_filter: bad regex 'train(\\nx' (missing ): train(\\nx)" in line
    assert line.endswith("no backreferences or lookaround"), line
