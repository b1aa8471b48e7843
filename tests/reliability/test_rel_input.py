"""Reliability battery 3 and 4: fuzzed input (NEFFs, profiles, segments, monitor configs, Explorer
requests) and a hostile browser against a running ``neuron-explorer view``."""
from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import harness
import pytest
from harness import failures

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))   # tests/: the Explorer's profile builder


def _check(trials):
    for t in trials:
        print(t)
    assert trials and not failures(trials), "\n".join(failures(trials))


@pytest.fixture(scope="module")
def small_profile(tmp_path_factory) -> Path:
    from test_explorer_profiles import make_profile
    return make_profile(tmp_path_factory.mktemp("rel-prof") / "20260101-000000_mlp", iterations=1, seqs=(57, 64))


@pytest.fixture(scope="module")
def neff_file(tmp_path_factory, compile_cache) -> Path:
    """A real NEFF: the workload compiles once, the cache keeps the archive."""
    root = tmp_path_factory.mktemp("rel-neff")
    env = harness.base_env(root, compile_cache)   # the battery's workload: it traces once per cache, then loads
    p = subprocess.run(harness.workload_cmd(env, "--execs", "1"), env=env,
                       capture_output=True, text=True, timeout=600, cwd=root)
    assert p.returncode == 0, p.stderr[-2000:]
    return next(compile_cache.rglob("*.neff"))


def test_rel3_fuzzed_neffs_are_refused_in_one_line(tmp_path, count, neff_file, monkeypatch):
    import fuzz
    for k, v in harness.base_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    _check(fuzz.fuzz_neff(neff_file, tmp_path, count("fuzz")))


def test_rel3_fuzzed_profiles_and_segments(tmp_path, count, caplog):
    import fuzz

    import traces
    from traces import synthetic
    caplog.set_level(logging.ERROR, logger="traces")   # skipped-segment warnings are expected here
    session = tmp_path / "session"
    synthetic.write_run(session, executions=3, instructions=300)
    traces.finalize(session)
    _check(fuzz.fuzz_profile(session, tmp_path, count("fuzz")))


def test_rel3_fuzzed_monitor_configs(tmp_path, count):
    import fuzz
    _check(fuzz.fuzz_monitor_config(tmp_path, count("fuzz")))


def test_rel3_fuzzed_explorer_requests(tmp_path, count, small_profile, caplog):
    import fuzz

    from explorer import data
    from explorer.app import create_app
    caplog.set_level(logging.ERROR, logger="explorer")   # each refusal logs one warning line
    app = create_app([small_profile])
    try:
        _check(fuzz.fuzz_explorer_requests(app, tmp_path, count("fuzz"), data.registry().default_key()))
    finally:
        data.registry().close()


def test_rel3_cli_refusals_are_one_line(tmp_path, neff_file):
    # the same damage through the commands a user types
    env = harness.base_env(tmp_path)
    bad = tmp_path / "bad.neff"
    bad.write_bytes(neff_file.read_bytes()[:5000])
    cfg = tmp_path / "bad.json"
    cfg.write_bytes(b'{"period": "1s", \xff\xfe')
    db = tmp_path / "20260101_x"
    db.mkdir()
    (db / "profile.duckdb").write_bytes(b"DUCK" + bytes(range(256)) * 64)
    for argv, prog in [(["neuron-explorer", "capture", "-n", str(bad), "-s", str(tmp_path / "s")], "neuron-explorer"),
                       (["neuron-monitor", "--once", "-c", str(cfg)], "neuron-monitor"),
                       (["neuron-explorer", "summary", str(db / "profile.duckdb")], "neuron-explorer"),
                       (["neuron-explorer", "sql", str(db), "SELECT 1"], "neuron-explorer")]:
        r = harness.run_cli(argv, env)
        assert r.returncode != 0 and "Traceback" not in r.stderr, (argv, r.stderr[-1000:])
        assert r.stderr.strip() and len(r.stderr.strip().splitlines()) <= 2, (argv, r.stderr)


def test_rel4_hostile_browser(tmp_path, small_profile, count):
    profile = tmp_path / small_profile.parent.name / "profile.duckdb"
    shutil.copytree(small_profile.parent, profile.parent)
    _check(harness.hostile_browser(tmp_path, profile, harness.base_env(tmp_path), rounds=count("browser")))


def test_rel3_special_files_for_every_path_argument(tmp_path):
    import fuzz
    _check(fuzz.fuzz_special_files(tmp_path))


def test_rel3_huge_values_in_every_environment_variable(count):
    import fuzz
    _check(fuzz.fuzz_env_values(count("fuzz")))


def test_rel3_byte_heavy_console_sql(small_profile, count):
    import fuzz

    from explorer import data
    reg = data.Registry([small_profile])
    try:
        _check(fuzz.fuzz_console_bytes(reg.get(reg.default_key()), count("fuzz")))
    finally:
        reg.close()


def test_rel3_issue31_bounds(small_profile, count):
    """Heavy console SQL (alone and four at once), backtracking regexes, bad periods, huge LLM sizes."""
    import fuzz

    from explorer import data
    reg = data.Registry([small_profile])
    try:
        _check(fuzz.fuzz_bounds(reg.get(reg.default_key()), count("fuzz")))
    finally:
        reg.close()
