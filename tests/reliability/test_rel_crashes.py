"""Reliability battery 1, 5, 7: SIGKILL mid-run, races for cores, full disks and read-only directories."""
from __future__ import annotations

import harness
import pytest
from harness import Trial, failures


def _check(trials: list[Trial]) -> None:
    for t in trials:
        print(t)
    assert trials and not failures(trials), "\n".join(failures(trials))


def test_rel1_kill_mid_run_loses_at_most_a_second_and_frees_the_core(tmp_path, rng, count, compile_cache):
    # kills at a random moment within 1.5 s of running: three of the writer's 0.5 s flush periods, so
    # every phase of the flush cycle is hit as with bench/reliability.py's 3 s, at half the executing
    trials = harness.kill_mid_run(tmp_path, rng, count("kill"), run_s=1.5, cache=compile_cache)
    _check(trials)
    # the measurement itself works: at least one trial was killed while executing
    assert any(t.lost_s is not None for t in trials)


def test_rel5_racing_processes_never_share_a_core_and_killed_holders_free_theirs(tmp_path, rng, count):
    trials = harness.core_races(tmp_path, rng, seconds=count("races"))
    _check(trials)
    assert any(t.recover_s is not None and "kill pid" in t.test for t in trials)


def test_rel5_the_exclusivity_check_catches_an_overlap(tmp_path):
    # the checker of rel5 must be able to fail: two pids on core 3 at once
    log = tmp_path / "intervals.log"
    log.write_text("3 100 0 50\n3 200 40 90\n4 100 0 10\n")
    assert not harness._check_exclusive(log, []).ok
    log.write_text("3 100 0 50\n3 200 50 90\n")
    assert harness._check_exclusive(log, [(300, [3], 95, 99)]).ok
    assert not harness._check_exclusive(log, [(300, [3], 10, 20)]).ok


def test_rel7_disk_full_while_writing_and_finalising(tmp_path, rng, count, compile_cache):
    try:
        trials = harness.disk_full(tmp_path, rng, count("disk"), cache=compile_cache)
    except harness.MountUnavailable as exc:
        pytest.skip(f"needs a size-limited tmpfs (run as root): {exc}")
    _check(trials)


def test_rel7_read_only_directories(tmp_path, compile_cache):
    try:
        trials = harness.read_only(tmp_path, cache=compile_cache)
    except harness.MountUnavailable as exc:
        pytest.skip(f"needs a read-only tmpfs (run as root): {exc}")
    _check(trials)
