"""The reliability battery with figures (issue 9): run every scenario and print one table.

    .venv/bin/python bench/reliability.py            # quick counts (what CI runs), a few minutes
    .venv/bin/python bench/reliability.py --full     # the issue's counts: 50 kills, 10 000 fuzzed inputs
                                                     # of each kind, 16 racers, 2- and 4-rank jobs (hours)
    .venv/bin/python bench/reliability.py --only kill,races --seed 7
    .venv/bin/python bench/reliability.py --full --only odd   # issue 15's classes only
    .venv/bin/python bench/reliability.py --full --only bounds   # issue 31's classes only

Columns: test, trials, failures, worst lost-trace window (s of executions a SIGKILL cost, measured
against the workload's own log), worst time to recover (s until a killed holder's cores were free,
a dying rank's job ended, or a full disk's space was usable again). The scenarios are the ones in
tests/reliability/harness.py and fuzz.py; a failure's problem is printed under the table. Needs
root for the tmpfs mounts of the disk tests (they are reported as skipped otherwise).
"""
from __future__ import annotations

import argparse
import logging
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "reliability"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import harness  # noqa: E402

QUICK = {"kill": 2, "many": 3, "fuzz": 40, "odd": 40, "bounds": 40, "browser": 1, "races": 3.0, "rank": (2,),
         "disk": 2}
FULL = {"kill": 50, "many": 8, "fuzz": 10_000, "odd": 10_000, "bounds": 1_000, "browser": 20, "races": 60.0,
        "rank": (2, 4), "disk": 10}
#: fuzz = damaged files and Explorer requests; odd = issue 15's classes (special files for every path
#: argument, huge values in every environment variable, byte-heavy console SQL); bounds = issue 31's
#: (console queries past the memory bound, four at once; backtracking regexes; bad periods; huge LLM sizes)
ORDER = ("kill", "many", "fuzz", "odd", "bounds", "browser", "races", "rank", "disk")


def _neff(work: Path, cache: Path) -> Path:
    r = subprocess.run([sys.executable, str(harness.WORKLOAD), "--execs", "1"], env=harness.base_env(work, cache),
                       capture_output=True, text=True, cwd=work)
    if r.returncode != 0:
        raise SystemExit(f"reliability: error: the workload does not run: {r.stderr.strip()[-300:]}")
    return next(cache.rglob("*.neff"))


def run(name: str, n, work: Path, cache: Path, rng: random.Random) -> list[harness.Trial]:
    """One test's trials with count ``n`` (see QUICK / FULL)."""
    import fuzz

    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    if name == "kill":
        return harness.kill_mid_run(d, rng, n, cache=cache)
    if name == "many":
        return harness.many_at_once(d, n, execs=20, cache=cache)
    if name == "fuzz":
        import traces
        from traces import synthetic
        logging.getLogger("traces").setLevel(logging.ERROR)
        logging.getLogger("explorer").setLevel(logging.ERROR)
        session = d / "session"
        synthetic.write_run(session, executions=3, instructions=300)
        traces.finalize(session)
        with harness.environ(harness.base_env(d, cache)):
            out = fuzz.fuzz_neff(_neff(d, cache), d, n)
        out += fuzz.fuzz_profile(session, d, n) + fuzz.fuzz_monitor_config(d, n)
        from test_explorer_profiles import make_profile

        from explorer import data
        from explorer.app import create_app
        prof = make_profile(d / "20260101-000000_mlp", iterations=1, seqs=(57, 64))
        app = create_app([prof])
        out += fuzz.fuzz_explorer_requests(app, d, n, data.registry().default_key())
        data.registry().close()
        return out
    if name == "odd":
        import fuzz
        from test_explorer_profiles import make_profile

        from explorer import data
        logging.getLogger("explorer").setLevel(logging.ERROR)
        prof = make_profile(d / "20260101-000000_mlp", iterations=1, seqs=(57, 64))
        reg = data.Registry([prof])
        try:
            out = fuzz.fuzz_console_bytes(reg.get(reg.default_key()), n)
        finally:
            reg.close()
        with harness.environ(harness.base_env(d, cache)):
            return out + fuzz.fuzz_special_files(d) + fuzz.fuzz_env_values(n)
    if name == "bounds":
        from test_explorer_profiles import make_profile

        from explorer import data
        logging.getLogger("explorer").setLevel(logging.ERROR)
        prof = make_profile(d / "20260101-000000_mlp", iterations=1, seqs=(57, 64))
        reg = data.Registry([prof])
        try:
            return fuzz.fuzz_bounds(reg.get(reg.default_key()), n)
        finally:
            reg.close()
    if name == "browser":
        from test_explorer_profiles import make_profile
        prof = make_profile(d / "20260101-000000_mlp", iterations=1, seqs=(57, 64))
        return harness.hostile_browser(d, prof, harness.base_env(d, cache), rounds=n)
    if name == "races":
        return harness.core_races(d, rng, seconds=n, kills=int(n))
    if name == "rank":
        return [harness.dying_rank(d / f"n{k}", k, cache=cache) for k in n]
    if name == "disk":
        try:
            return harness.disk_full(d, rng, n, cache=cache) + harness.read_only(d / "ro", cache=cache)
        except harness.MountUnavailable as exc:
            print(f"reliability: note: disk tests skipped: {exc}", file=sys.stderr)
            return []
    raise ValueError(name)


def _size(t: harness.Trial) -> int:
    """A fuzz Trial stands for its inputs ("... (400 inputs)"); any other Trial for one trial."""
    m = re.search(r"\((\d+) inputs\)", t.test)
    return int(m.group(1)) if m else 1


def _bad(t: harness.Trial) -> int:
    m = re.match(r"(\d+) bad outcomes", t.problem)
    return int(m.group(1)) if m else 1


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run the reliability battery and print its table.")
    ap.add_argument("--full", action="store_true", help="the issue's counts (slow)")
    ap.add_argument("--only", default="", help=f"comma list of {','.join(ORDER)}")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args(argv)
    counts = FULL if args.full else QUICK
    only = [s for s in args.only.split(",") if s] or list(ORDER)
    bad = [s for s in only if s not in ORDER]
    if bad:
        ap.error(f"unknown test {bad[0]!r}: use {','.join(ORDER)}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"reliability battery ({'full' if args.full else 'quick'} counts, seed {seed})", flush=True)
    work = Path(tempfile.mkdtemp(prefix="reliability-"))
    cache = work / "cache"
    rows, problems = [], []
    try:
        for name in only:
            t0 = time.monotonic()
            trials = run(name, counts[name], work, cache, random.Random(seed))
            fails = [t for t in trials if not t.ok]
            lost = [t.lost_s for t in trials if t.lost_s is not None]
            rec = [t.recover_s for t in trials if t.recover_s is not None]
            rows.append((name, sum(_size(t) for t in trials), sum(_bad(t) for t in fails),
                         max(lost) if lost else None, max(rec) if rec else None, time.monotonic() - t0))
            problems += [f"{t.test}: {t.problem}" for t in fails]
            print(f"  {name}: {len(trials)} trials, {len(fails)} failures ({rows[-1][-1]:.0f} s)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"{'test':<10} {'trials':>7} {'failures':>9} {'worst lost trace':>17} {'worst recovery':>15} {'took':>8}")
    for name, n, f, lost, rec, took in rows:
        print(f"{name:<10} {n:>7} {f:>9} {_fmt(lost):>17} {_fmt(rec):>15} {took:>7.0f}s")
    for p in problems:
        print(f"FAILED {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
