"""Reliability battery 2 and 6: many profiled workloads and every reader at once; a dying torchrun rank."""
from __future__ import annotations

import harness
from harness import failures


def test_rel2_many_writers_and_readers_at_once(tmp_path, count, compile_cache):
    trials = harness.many_at_once(tmp_path, count("many"), execs=20, cache=compile_cache)
    for t in trials:
        print(t)
    assert len(trials) == count("many") + 1 and not failures(trials), "\n".join(failures(trials))


def test_rel6_a_dying_rank_ends_the_job_and_every_trace_finalises(tmp_path, count, compile_cache):
    trials = [harness.dying_rank(tmp_path / f"n{n}", n, cache=compile_cache) for n in count("rank")]
    for t in trials:
        print(t)
    assert not failures(trials), "\n".join(failures(trials))
