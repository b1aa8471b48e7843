"""The reliability battery's scenarios, shared by the tests (quick mode) and bench/reliability.py (--full).

Each scenario drives the real tools the way a user does (processes, CLIs as typed, signals, mounts)
and returns one :class:`Trial` per trial: did it hold its promise, and the figures the report
prints (seconds of trace lost, seconds until a resource was free again). A scenario never raises
for a broken promise; it records the problem, so the benchmark can count failures.

>>> t = Trial("kill mid-run", ok=True, lost_s=0.4, recover_s=0.01)
>>> t.ok, t.problem
(True, '')
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BIN = Path(sys.executable).parent
PYTHON = sys.executable
WORKLOAD = HERE / "workload.py"

#: The writer publishes at least once a second (docs/traces.md, "Durability"); the promise is that a
#: SIGKILL loses at most about that much. The checks allow this much on top for a loaded CI machine
#: (the flush thread competes with the workload for the GIL and for 2 shared cores).
FLUSH_INTERVAL_S = 0.5   # traces.Writer's default
LOST_SLACK_S = 0.5       # one flush under load: the promise is 'at most the last second'
#: A dead process's cores must be free again within this time (the kernel drops flocks at exit).
RECOVER_BOUND_S = 5.0

#: Variables of the caller that would change what the battery's processes do.
_SCRUB = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_STACK_INSTANCE_TYPE",
          "NEURON_RT_INSPECT_ENABLE", "NEURON_RT_INSPECT_OUTPUT_DIR", "NEURON_PROCESS_TAG",
          "NEURON_STACK_DEBUG", "NEURON_RT_INSPECT_EVENT_FILTER_NC", "NEURON_RT_INSPECT_DEVICE_PROFILE")
#: Profiling on with device rows for every execution (the real runtime's device profile is off by default).
PROFILED = {"NEURON_RT_INSPECT_ENABLE": "1", "NEURON_RT_INSPECT_DEVICE_PROFILE": "session"}


@dataclass
class Trial:
    """One trial of one test: whether every promise held, and its figures (None when not measured)."""

    test: str
    ok: bool
    problem: str = ""
    lost_s: float | None = None
    recover_s: float | None = None


def failures(trials: list[Trial]) -> list[str]:
    """The problems of the failed trials, for an assertion message."""
    return [f"{t.test}: {t.problem}" for t in trials if not t.ok]


def base_env(root: Path, cache: Path | None = None) -> dict[str, str]:
    """An environment isolated under ``root``: own core locks, live dir and compile cache.

    Example: ``subprocess.run(cmd, env=base_env(tmp_path))``.
    """
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update({"NEURON_STACK_RUNTIME_DIR": str(root / "cores"), "NEURON_STACK_LIVE_DIR": str(root / "live"),
                "NEURON_COMPILE_CACHE_URL": str(cache or root / "cache"), "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"})   # SIGABRT dumps every thread's stack
    return env


@contextlib.contextmanager
def environ(env: dict[str, str]):
    """Run a block of this process under ``env`` (the cores API reads its settings from os.environ)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def is_one_line_error(text: str, prog: str) -> bool:
    """True when ``text`` (stderr) is a clean refusal: no traceback and a ``prog: error: ...`` line."""
    return "Traceback" not in text and any(line.startswith(f"{prog}: error: ") and len(line) > len(prog) + 12
                                           for line in text.splitlines())


def run_cli(args: list[str], env: dict[str, str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run a console script of this environment as typed (``neuron-explorer summary DIR``)."""
    return subprocess.run([str(BIN / args[0]), *args[1:]], env=env, capture_output=True, text=True,
                          timeout=timeout, **kw)


def wait_cores_free(env: dict[str, str], cores: list[int], t0: float, bound: float = RECOVER_BOUND_S,
                    target: str = "trn1") -> float | None:
    """Seconds from ``t0`` (time.monotonic) until this process can take ``cores``; None if not within ``bound``.

    Uses the public reservation API, so "free" means what the runtime means by it.
    """
    from neuron_stack.runtime.cores import CoreAllocationError, acquire

    with environ(env):
        while True:
            try:
                acquire(target, cores=cores).release()
                return time.monotonic() - t0
            except CoreAllocationError:
                if time.monotonic() - t0 > bound:
                    return None
                time.sleep(0.002)


def _lines(path: Path) -> list[list[str]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    # the last line may be cut off by the kill: only whole lines count
    return [line.split() for line in text.splitlines(keepends=True) if line.endswith("\n")]


def workload_output(path: Path) -> dict:
    """Parse the workload's stdout: core, instructions per execution, execution end times, done."""
    out = {"core": None, "per_exec": None, "execs": [], "done": None}
    for parts in _lines(path):
        if parts[0] == "ready":
            out["core"], out["per_exec"] = int(parts[1]), int(parts[2])
        elif parts[0] == "exec":
            out["execs"].append(int(parts[2]))
        elif parts[0] == "done":
            out["done"] = int(parts[1])
    return out


def workload_cmd(env: dict[str, str], *args: str) -> list[str]:
    """The workload's command line: it loads the NEFF kept next to ``env``'s compile cache (the first
    workload of that cache traces and saves it), so a start-up is an import and a load, not a capture.
    Example: ``subprocess.run(workload_cmd(env, "--execs", "2"), env=env)``.
    """
    neff = env["NEURON_COMPILE_CACHE_URL"].rstrip("/") + ".workload.neff"
    return [PYTHON, str(WORKLOAD), "--neff", neff, *args]


def start_workload(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen:
    """Start tests/reliability/workload.py with stdout to ``log`` (readable even after a SIGKILL)."""
    with open(log, "w") as out, open(log.with_suffix(".err"), "w") as err:
        return subprocess.Popen(workload_cmd(env, *args), stdout=out, stderr=err, env=env, cwd=log.parent)


def wait_for(predicate, timeout: float, step: float = 0.02) -> bool:
    """Poll ``predicate()`` until true or ``timeout`` seconds pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def run_rows(profile: Path, pid: int) -> dict:
    """What the finalised profile holds of the run of process ``pid``."""
    import traces

    with traces.open(profile) as p:
        runs = p.sql("SELECT run_id, status FROM runs WHERE pid = ?", [pid]).to_pylist()
        if not runs:
            return {"status": None, "execs": 0, "with_instr": 0, "torn": 0, "per_exec": set()}
        rid = runs[0]["run_id"]
        n_exec = p.sql("SELECT count(*) AS n FROM executions WHERE run_id = ?", [rid]).column("n")[0].as_py()
        per = p.sql("SELECT i.exec_id, count(*) AS n FROM instructions i JOIN executions e USING (exec_id) "
                    "WHERE e.run_id = ? GROUP BY ALL", [rid]).column("n").to_pylist()
    return {"status": runs[0]["status"], "execs": n_exec, "with_instr": len(per), "per_exec": set(per)}


# -- 1. kill mid-run ---------------------------------------------------------------------------

def kill_mid_run(root: Path, rng: random.Random, trials: int, run_s: float = 3.0,
                 cache: Path | None = None) -> list[Trial]:
    """SIGKILL a profiled workload at random moments; every trial writes into one output directory.

    Per trial: the flushed segments finalise (``neuron-explorer summary DIR`` as typed), the run is
    marked ``incomplete``, at most about a second of executions is lost (measured against the
    workload's own log of executions), no execution is torn (all its instructions or none), and the
    core it held is free again. Afterwards the directory (with every killed run's leftovers) still
    takes a new run and finalises, and neuron-monitor / neuron-ls read the dead processes' files.
    """
    root.mkdir(parents=True, exist_ok=True)
    prof = root / "prof"
    env = {**base_env(root, cache), **PROFILED, "NEURON_RT_INSPECT_OUTPUT_DIR": str(prof)}
    results: list[Trial] = []
    for k in range(trials):
        log = root / f"trial{k}.out"
        proc = start_workload(env, log, "--seconds", "120")
        early = k % 5 == 4   # every fifth trial dies during start-up (import, compile, load)
        if early:
            time.sleep(rng.uniform(0.3, 4.0))
        else:
            if not wait_for(lambda: workload_output(log)["core"] is not None or proc.poll() is not None, 180):
                proc.kill()
            time.sleep(rng.uniform(0.0, run_s))
        kill_ns, t_kill = time.time_ns(), time.monotonic()
        proc.send_signal(signal.SIGKILL)
        recover = wait_cores_free(env, list(range(32)), t_kill)
        proc.wait()
        results.append(_check_killed(k, proc, log, prof, env, kill_ns, recover))
    results.append(_later_commands_after_kills(root, prof, env))
    return results


def _check_killed(k: int, proc, log: Path, prof: Path, env, kill_ns: int, recover: float | None) -> Trial:
    name = f"kill mid-run #{k}"
    seen = workload_output(log)
    err = log.with_suffix(".err").read_text()
    if proc.returncode != -signal.SIGKILL:
        return Trial(name, False, f"workload ended with {proc.returncode} before the kill: {err[-300:]}")
    if recover is None:
        return Trial(name, False, f"cores still held {RECOVER_BOUND_S} s after the holder was killed")
    summary = run_cli(["neuron-explorer", "summary", str(prof), "--json"], env)
    if summary.returncode != 0:
        if not any(prof.glob("*.arrow")) and is_one_line_error(summary.stderr, "neuron-explorer"):
            return Trial(name, True, recover_s=recover)   # killed before anything was recorded: nothing to lose
        return Trial(name, False, f"summary of the killed run's directory failed: {summary.stderr.strip()[-300:]}")
    if "Traceback" in summary.stderr:
        return Trial(name, False, f"traceback while finalising: {summary.stderr[-300:]}")
    rows = run_rows(prof / "profile.duckdb", proc.pid)
    if rows["status"] is None:
        if seen["execs"]:
            return Trial(name, False, f"{len(seen['execs'])} executions ran but the run is not in the profile")
        return Trial(name, True, lost_s=0.0 if seen["core"] is not None else None, recover_s=recover)
    if rows["status"] != "incomplete":
        return Trial(name, False, f"a killed run shows status {rows['status']!r}, not 'incomplete'")
    if seen["per_exec"] is not None and rows["per_exec"] - {seen["per_exec"]}:
        return Trial(name, False, f"torn execution: instruction rows per execution {sorted(rows['per_exec'])}, "
                                  f"expected {seen['per_exec']}")
    kept = min(rows["execs"], rows["with_instr"])
    lost = 0.0
    if len(seen["execs"]) > kept:   # the first execution the trace does not have
        lost = max(0.0, (kill_ns - seen["execs"][kept]) / 1e9)
    if seen["core"] is None:
        return Trial(name, True, recover_s=recover)
    ok = lost <= FLUSH_INTERVAL_S + LOST_SLACK_S
    return Trial(name, ok, "" if ok else f"lost {lost:.2f} s of trace ({len(seen['execs']) - kept} executions)",
                 lost_s=lost, recover_s=recover)


def _later_commands_after_kills(root: Path, prof: Path, env) -> Trial:
    name = "kill mid-run: later commands"
    log = root / "after.out"
    proc = start_workload(env, log, "--execs", "3")
    proc.wait(timeout=300)
    if proc.returncode != 0:
        return Trial(name, False, f"a new run in the killed runs' directory failed: "
                                  f"{log.with_suffix('.err').read_text()[-300:]}")
    summary = run_cli(["neuron-explorer", "summary", str(prof)], env)
    if summary.returncode != 0 or "Traceback" in summary.stderr:
        return Trial(name, False, f"summary after the kills failed: {summary.stderr.strip()[-300:]}")
    rows = run_rows(prof / "profile.duckdb", proc.pid)
    if rows["status"] != "ok" or rows["execs"] != 3:
        return Trial(name, False, f"the clean run after the kills shows {rows}")
    cfg = root / "monitor.json"
    cfg.write_text(json.dumps({"period": "100ms", "neuron_runtimes": [{"tag_filter": ".*", "metrics": [
        {"type": "neuroncore_counters"}, {"type": "execution_stats"}]}]}))
    mon = run_cli(["neuron-monitor", "--once", "-c", str(cfg)], env, timeout=60)
    if mon.returncode != 0 or mon.stderr.strip():
        return Trial(name, False, f"neuron-monitor over the killed runs' live files: {mon.stderr.strip()[-300:]}")
    doc = json.loads(mon.stdout.splitlines()[0])
    if doc.get("neuron_runtime_data"):
        return Trial(name, False, f"neuron-monitor still lists dead processes: "
                                  f"{[r.get('pid') for r in doc['neuron_runtime_data']]}")
    ls = run_cli(["neuron-ls", "--wide"], env)
    if ls.returncode != 0 or "python" in ls.stdout:
        return Trial(name, False, f"neuron-ls after the kills: rc {ls.returncode}, "
                                  f"{ls.stdout[-300:]}{ls.stderr[-300:]}")
    return Trial(name, True)


# -- 5. races for cores ------------------------------------------------------------------------

def _flock_pids() -> set[int]:
    """Pids holding any flock right now, from the kernel's own table."""
    pids = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            parts = line.split()
            if len(parts) > 4 and parts[1] == "FLOCK" and parts[4].isdigit():
                pids.add(int(parts[4]))
    return pids


def core_races(root: Path, rng: random.Random, seconds: float, racers: int = 16,
               kills: int | None = None) -> list[Trial]:
    """``racers`` processes reserve overlapping core sets in a loop while some are SIGKILLed.

    Promises: never two holders of one core (checked from every holder's log of its holdings, the
    killed ones' holdings ending at their kill), and a killed holder's cores are free again within
    a bounded time (the kernel's lock table and neuron-ls no longer name it). One Trial per kill,
    plus one for exclusivity and one for the final cleanup.
    """
    from neuron_stack.runtime.cores import core_holders, get_instance

    root.mkdir(parents=True, exist_ok=True)
    (root / "claims").mkdir(exist_ok=True)
    env = base_env(root)
    kills = kills if kills is not None else max(1, int(seconds))
    spawn = lambda i: subprocess.Popen([PYTHON, str(HERE / "core_holder.py"), str(root), str(rng.randrange(1 << 30))],
                                       env=env, stderr=subprocess.PIPE, text=True)
    procs = {}
    for i in range(racers):
        p = spawn(i)
        procs[p.pid] = p
    held_at_kill: list[tuple[int, list[int], int, int]] = []   # pid, cores, t0, t_kill
    results: list[Trial] = []
    with environ(env):
        inst = get_instance("trn1")
    # the clock starts once the racers fight (imports take long on a loaded machine)
    wait_for(lambda: (root / "intervals.log").exists() and
             len((root / "intervals.log").read_text().splitlines()) >= 2 * racers, 180, step=0.1)
    end = time.monotonic() + seconds
    gap = seconds / (kills + 1)
    while time.monotonic() < end:
        time.sleep(gap)
        holding = [int(f.name) for f in (root / "claims").iterdir() if f.name.isdigit() and int(f.name) in procs]
        if not holding:
            continue
        pid = rng.choice(holding)
        try:
            claim = json.loads((root / "claims" / str(pid)).read_text())
        except (OSError, ValueError):
            claim = None   # released just now: kill it anyway, it may hold the next set already
        t_kill_ns, t_kill = time.monotonic_ns(), time.monotonic()
        procs[pid].send_signal(signal.SIGKILL)
        if claim is not None:
            held_at_kill.append((pid, claim["cores"], claim["t0"], t_kill_ns))
        # free = the kernel no longer lists a lock of the dead process, and neuron-ls no longer names it
        def released():
            if pid in _flock_pids():
                return False
            with environ(env):
                return all(h.get("pid") != pid for h in core_holders(inst).values())
        freed = wait_for(released, RECOVER_BOUND_S, step=0.002)
        recover = time.monotonic() - t_kill
        procs.pop(pid).wait()
        results.append(Trial(f"core races: kill pid {pid}", freed, "" if freed else
                             f"pid {pid}'s cores still held {RECOVER_BOUND_S} s after SIGKILL", recover_s=recover))
        p = spawn(len(procs))   # a new racer takes its place
        procs[p.pid] = p
    t_stop_ns, t_stop = time.monotonic_ns(), time.monotonic()
    for p in procs.values():
        p.send_signal(signal.SIGKILL)
    for pid in list(procs):
        with contextlib.suppress(OSError, ValueError):
            claim = json.loads((root / "claims" / str(pid)).read_text())
            held_at_kill.append((pid, claim["cores"], claim["t0"], t_stop_ns))
    all_free = wait_cores_free(env, list(range(inst.num_cores)), t_stop)
    for p in procs.values():
        p.wait()
        err = p.stderr.read()
        if err.strip():
            results.append(Trial("core races: racer stderr", False, err.strip()[-300:]))
    results.append(Trial("core races: all free after the last kills", all_free is not None,
                         "" if all_free is not None else "cores still held after every racer was killed",
                         recover_s=all_free))
    results.append(_check_exclusive(root / "intervals.log", held_at_kill))
    return results


def _check_exclusive(log: Path, held_at_kill) -> Trial:
    by_core: dict[int, list[tuple[int, int, int]]] = {}
    text = log.read_text() if log.exists() else ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4:
            c, pid, t0, t1 = map(int, parts)
            by_core.setdefault(c, []).append((t0, t1, pid))
    for pid, cores, t0, t_kill in held_at_kill:
        for c in cores:
            by_core.setdefault(c, []).append((t0, t_kill, pid))
    holdings = sum(len(v) for v in by_core.values())
    for c, spans in by_core.items():
        spans.sort()
        active: list[tuple[int, int, int]] = []   # spans not yet ended at the current start
        for b0, b1, pb in spans:
            active = [s for s in active if s[1] > b0]
            for a0, a1, pa in active:
                if pa != pb:
                    return Trial("core races: exclusivity", False,
                                 f"core {c} held by pid {pa} and pid {pb} at once ({(a1 - b0) / 1e6:.3f} ms overlap)")
            active.append((b0, b1, pb))
    ok = holdings > 0
    return Trial(f"core races: exclusivity ({holdings} holdings)", ok, "" if ok else "no racer ever held a core")


# -- 7. disk full and read-only directories ----------------------------------------------------

class MountUnavailable(RuntimeError):
    """This machine cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN): the test skips."""


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "16m"):
    """A real size-limited filesystem at ``path`` (tmpfs), unmounted afterwards. Needs root."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise MountUnavailable(f"cannot mount a tmpfs at {path}: {(r.stderr or r.stdout).strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: Path, options: str) -> None:
    """Remount ``path`` with ``options`` (``ro``, ``rw``, ``size=64m``)."""
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True, capture_output=True)


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` to the last byte with one file; delete it to free the space."""
    filler = directory / "filler.bin"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            block = bytes(chunk)
            try:
                while True:
                    f.write(block)
            except OSError:
                continue
    return filler


def _sha(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _newest_mtime_ns(directory: Path) -> int:
    times = [0]
    for f in directory.glob("*.arrow"):
        with contextlib.suppress(OSError):
            times.append(f.stat().st_mtime_ns)
    return max(times)


def disk_full(root: Path, rng: random.Random, trials: int, cache: Path | None = None) -> list[Trial]:
    """Fill the disk under a profiled workload at a random moment, with and without space coming back.

    Promises: the workload keeps running and says so in one warning line (no traceback); when space
    comes back every buffered row lands (exact counts, status ``ok``); when it does not, finalising
    on the full disk is one clear error and leaves no temporary files, the run is never presented
    as complete (``status = 'incomplete'`` unless every execution is there), and a profile that
    existed before is byte-for-byte unchanged. Raises MountUnavailable when tmpfs cannot be mounted.
    """
    root.mkdir(parents=True, exist_ok=True)
    cache = cache or root / "cache"
    # a finished session (segments and profile), recorded once and copied into each trial's directory
    first = root / "first"
    env = {**base_env(root, cache=cache), **PROFILED, "NEURON_RT_INSPECT_OUTPUT_DIR": str(first)}
    p = start_workload(env, root / "first.out", "--execs", "2")
    p.wait(timeout=300)
    r = run_cli(["neuron-explorer", "summary", str(first)], env)
    if p.returncode != 0 or r.returncode != 0:
        return [Trial("disk full: setup run", False, f"{(root / 'first.err').read_text()[-300:]}{r.stderr[-300:]}")]
    results = []
    for k in range(trials):
        comes_back = k % 2 == 0
        with tmpfs(root / f"disk{k}", "64m") as disk:
            results.append(_disk_full_trial(root, disk, first, rng, comes_back, k, cache))
    return results


def _disk_full_trial(root: Path, disk: Path, first: Path, rng: random.Random, comes_back: bool, k: int,
                     cache: Path) -> Trial:
    import shutil

    name = f"disk full #{k} ({'space comes back' if comes_back else 'stays full'})"
    prof = disk / "prof"
    env = {**base_env(root, cache=cache), **PROFILED,
           "NEURON_RT_INSPECT_OUTPUT_DIR": str(prof)}
    # a finished profile from an earlier run in the same directory: it must survive everything
    shutil.copytree(first, prof)
    before = _sha(prof / "profile.duckdb")
    log, stop = root / f"full{k}.out", root / f"stop{k}"
    # paced: unpaced, a quiet machine runs ~10k executions/s and the trace alone outgrows the 64 MiB disk;
    # it runs until told to stop (at most 30 s), once what this trial checks has happened
    proc = start_workload(env, log, "--seconds", "30", "--interval", "0.002", "--stop-file", str(stop))
    wait_for(lambda: workload_output(log)["core"] is not None or proc.poll() is not None, 180)
    time.sleep(rng.uniform(0.2, 1.5))
    t_full = time.monotonic()
    filler = fill(disk)
    warned = wait_for(lambda: "cannot write trace segment" in log.with_suffix(".err").read_text()
                      or proc.poll() is not None, 10)
    recover = None
    if comes_back:
        time.sleep(rng.uniform(0.2, 1.0))
        t_back = time.time_ns()
        filler.unlink()
        recover = time.monotonic() - t_full
        # the rows buffered while the disk was full land in a segment written after the space came back
        wait_for(lambda: _newest_mtime_ns(prof) >= t_back, 10)
    # and the workload keeps executing afterwards (on the full disk, or after the recovery)
    n = len(workload_output(log)["execs"])
    wait_for(lambda: len(workload_output(log)["execs"]) >= n + 50 or proc.poll() is not None, 30, step=0.05)
    stop.touch()
    proc.wait(timeout=300)
    err = log.with_suffix(".err").read_text()
    seen = workload_output(log)
    if proc.returncode != 0 or "Traceback" in err:
        return Trial(name, False, f"the workload did not survive the full disk (rc {proc.returncode}): {err[-400:]}")
    if not warned or "No space left on device" not in err:
        return Trial(name, False, f"no warning about the full disk on stderr: {err[-300:]!r}")
    if not comes_back:
        r = run_cli(["neuron-explorer", "summary", str(prof)], env)
        leftovers = [f.name for f in prof.iterdir() if f.name.endswith(".tmp") or f.name.endswith(".wal")]
        if r.returncode == 0 or not is_one_line_error(r.stderr, "neuron-explorer"):
            return Trial(name, False, f"finalising on a full disk: rc {r.returncode}, {r.stderr.strip()[-300:]}")
        if leftovers:
            return Trial(name, False, f"failed finalise left {leftovers}")
        if _sha(prof / "profile.duckdb") != before:
            return Trial(name, False, "the earlier profile changed during a failed finalise")
        r = run_cli(["neuron-explorer", "summary", str(prof / "profile.duckdb")], env)
        if r.returncode != 0:
            return Trial(name, False, f"the earlier profile is unreadable on a full disk: {r.stderr[-300:]}")
        filler.unlink()
        recover = time.monotonic() - t_full
    r = run_cli(["neuron-explorer", "summary", str(prof)], env)
    if r.returncode != 0:
        return Trial(name, False, f"finalise after freeing space failed: {r.stderr[-300:]}")
    rows = run_rows(prof / "profile.duckdb", proc.pid)
    n = len(seen["execs"])
    complete = rows["execs"] == n and rows["with_instr"] == n and rows["per_exec"] <= {seen["per_exec"]}
    if rows["status"] == "ok" and not complete:
        return Trial(name, False, f"partial run presented as complete: status ok with {rows['execs']} of {n} "
                                  f"executions ({rows['with_instr']} with instructions)")
    if comes_back and not (complete and rows["status"] == "ok"):
        return Trial(name, False, f"rows lost although space came back: {rows['execs']}/{n} executions, "
                                  f"{rows['with_instr']} with instructions, status {rows['status']}")
    return Trial(name, True, recover_s=recover)


def read_only(root: Path, cache: Path | None = None) -> list[Trial]:
    """Read-only directories: the profile output, the live-statistics directory, inspect's -o, a finished
    session on read-only media. Each refusal is one clear line; reading a finished profile still works.
    """
    import shutil

    root.mkdir(parents=True, exist_ok=True)
    env = base_env(root, cache)
    results = []
    # a finished session to put on read-only media, plus one segment newer than its profile
    prof = root / "prof"
    p = start_workload({**env, **PROFILED, "NEURON_RT_INSPECT_OUTPUT_DIR": str(prof)},
                       root / "setup.out", "--execs", "2")
    p.wait(timeout=300)
    run_cli(["neuron-explorer", "summary", str(prof)], env)
    with tmpfs(root / "ro") as ro:
        (ro / "out").mkdir()
        shutil.copytree(prof, ro / "done")
        shutil.copytree(prof, ro / "stale")
        newest = max((ro / "stale").glob("*.arrow"))
        shutil.copy(newest, newest.with_name(newest.name.replace(".arrow", "9.arrow")))
        remount(ro, "ro")

        log = root / "ro-output.out"
        p = start_workload({**env, **PROFILED, "NEURON_RT_INSPECT_OUTPUT_DIR": str(ro / "out")},
                           log, "--execs", "2")
        p.wait(timeout=300)
        last = (log.with_suffix(".err").read_text().strip().splitlines() or [""])[-1]
        ok = p.returncode != 0 and "Read-only file system" in last and "writable" in last
        results.append(Trial("read-only: profiling output directory", ok,
                             "" if ok else f"rc {p.returncode}, last line {last!r}"))

        log = root / "ro-live.out"
        p = start_workload({**env, "NEURON_STACK_LIVE_DIR": str(ro / "live")}, log, "--execs", "2")
        p.wait(timeout=300)
        err = log.with_suffix(".err").read_text()
        ok = p.returncode == 0 and "Traceback" not in err and "NEURON_STACK_LIVE_DIR" in err
        results.append(Trial("read-only: live statistics directory", ok,
                             "" if ok else f"the workload did not keep running: rc {p.returncode}, {err[-300:]}"))

        r = run_cli(["neuron-explorer", "inspect", "-o", str(ro / "out"), "--", *workload_cmd(env, "--execs", "1")],
                    env)
        ok = r.returncode != 0 and is_one_line_error(r.stderr, "neuron-explorer") and "writable" in r.stderr
        results.append(Trial("read-only: neuron-explorer inspect -o", ok,
                             "" if ok else f"rc {r.returncode}: {r.stderr[-300:]}"))

        r = run_cli(["neuron-explorer", "summary", str(ro / "done" / "profile.duckdb"), "--json"], env)
        s = run_cli(["neuron-explorer", "sql", str(ro / "done"), "SELECT count(*) AS n FROM executions",
                     "--format", "json"], env)
        ok = r.returncode == 0 and s.returncode == 0 and '"n": 2' in s.stdout.replace('"n":2', '"n": 2')
        results.append(Trial("read-only: reading a finished profile", ok,
                             "" if ok else f"summary rc {r.returncode} {r.stderr[-200:]}; "
                                           f"sql rc {s.returncode} {s.stdout[-100:]} {s.stderr[-200:]}"))

        r = run_cli(["neuron-explorer", "summary", str(ro / "stale")], env)
        ok = (r.returncode == 0 and "Traceback" not in r.stderr) or \
            (is_one_line_error(r.stderr, "neuron-explorer") and "free disk space" not in r.stderr)
        results.append(Trial("read-only: a session that needs finalising", ok,
                             "" if ok else f"rc {r.returncode}: {r.stderr.strip()[-300:]}"))
    return results


# -- 4. hostile browser ------------------------------------------------------------------------------

HOSTILE_SQL = [
    "DROP TABLE ops", "DELETE FROM instructions", "INSERT INTO ops (op_id) VALUES (1)", "UPDATE runs SET status = 'x'",
    "CREATE TABLE t AS SELECT 1", "ALTER TABLE ops RENAME TO o", "ATTACH '/tmp/x.duckdb' AS x",
    "ATTACH ':memory:' AS m", "DETACH profile", "COPY ops TO '/tmp/ops.csv'", "COPY (SELECT 1) TO '/tmp/x.parquet'",
    "EXPORT DATABASE '/tmp/dump'", "IMPORT DATABASE '/tmp/dump'", "INSTALL httpfs", "LOAD httpfs", "FORCE INSTALL x",
    "PRAGMA database_list", "SET enable_external_access = true", "RESET enable_external_access",
    "SET lock_configuration = false", "CALL pragma_version()", "CHECKPOINT", "VACUUM", "BEGIN TRANSACTION",
    "SELECT 1; DROP TABLE ops", "SELECT 1 /* ok */; /* hidden */ DELETE FROM ops", "SELECT 1; -- x\nDROP TABLE ops",
    "/* DROP */ SELECT 1; DROP TABLE ops", "-- SELECT\nDROP TABLE ops",
    "WITH x AS (SELECT 1) INSERT INTO ops (op_id) SELECT * FROM x", "EXPLAIN ANALYZE SELECT 1",
    "SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_blob('/etc/passwd')",
    "SELECT * FROM glob('/*')", "SELECT * FROM '/etc/passwd'", "SELECT * FROM read_parquet('/tmp/*.parquet')",
    "SELECT * FROM read_json_auto('/etc/hosts')", "SELECT * FROM duckdb_settings()", "SELECT getenv('HOME')",
    "SELECT * FROM sniff_csv('/etc/passwd')",
    "SELECT * FROM (SELECT * FROM read_csv_auto('/etc/passwd'))", "SELECT * FROM query('DROP TABLE ops')",
    "SELECT * FROM query_table('ops')", "USE memory",
    "CREATE MACRO m() AS 1", "CREATE SECRET s (TYPE S3)", "SELECT 1" + "\n" * 10 + "; DROP TABLE ops",
    "SELECT " + "1 + " * 6000 + "1", "SELECT * FROM range(100000000000) a, range(100000000000) b",
    "SELECT count(*) FROM range(100000000000) a, range(1000) b",   # endless: must be stopped, not hold the profile
]
#: Statements the console must still answer (the console is not simply refusing everything).
GOOD_SQL = "SELECT engine, count(*) AS n FROM instructions GROUP BY ALL ORDER BY n DESC"


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def hostile_browser(root: Path, profile: Path, env: dict[str, str], rounds: int = 1) -> list[Trial]:
    """A running ``neuron-explorer view`` (as typed) under attack over HTTP.

    Write/DDL/ATTACH/COPY/INSTALL statements (also hidden after comments or in a second statement),
    table functions that read files, path-like and oversized parameters, requests for files outside
    the profile, very large results. Zero successes: the database is unchanged, no file is read or
    written, the server answers every request (never 500) and keeps serving; it binds 127.0.0.1.
    """
    import psutil

    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    before = _sha(profile)
    canary = root / "canary"
    server = subprocess.Popen([str(BIN / "neuron-explorer"), "view", str(profile), "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root)
    base = f"http://127.0.0.1:{port}"
    results: list[Trial] = []
    try:
        up = wait_for(lambda: _http_ok(base + "/"), 120, step=0.2)
        if not up:
            return [Trial("hostile browser: server starts", False,
                          server.stderr.read()[-300:] if server.poll() is not None else "no answer")]
        listen = [c.laddr for c in psutil.Process(server.pid).net_connections("inet") if c.status == "LISTEN"]
        ok = bool(listen) and all(a.ip == "127.0.0.1" for a in listen)
        results.append(Trial("hostile browser: binds 127.0.0.1", ok, "" if ok else f"listening on {listen}"))
        key = profile.parent.name
        outputs = [{"id": "sql-result", "property": "children"}, {"id": "sql-message", "property": "children"},
                   {"id": "sql-chart", "property": "figure"}, {"id": "sql-url", "property": "data"},
                   {"id": "sql-history", "property": "data"}]

        def console(query, k=key):
            body = {"output": "..sql-result.children...sql-message.children...sql-chart.figure...sql-url.data"
                              "...sql-history.data..",
                    "outputs": outputs, "inputs": [{"id": "sql-run", "property": "n_clicks", "value": 1}],
                    "state": [{"id": "sql-query", "property": "value", "value": query},
                              {"id": "sql-profile", "property": "data", "value": k},
                              {"id": "sql-history", "property": "data", "value": []}],
                    "changedPropIds": ["sql-run.n_clicks"]}
            return _http(base + "/_dash-update-component", body)

        status, data = console(GOOD_SQL)
        ok = status == 200 and b"tensor" in data
        results.append(Trial("hostile browser: console answers a SELECT", ok,
                             "" if ok else f"HTTP {status}: {data[:200]!r}"))
        for _ in range(rounds):
            for q in HOSTILE_SQL + [s.replace("/tmp/", f"{canary}/") for s in HOSTILE_SQL if "/tmp/" in s]:
                status, data = console(q)
                text = data.decode(errors="replace")
                refused = status == 200 and ("Refused" in text or "Error" in text) and "root:x:0" not in text
                results.append(Trial(f"hostile browser: SQL {q[:50]!r}", refused,
                                     "" if refused else f"HTTP {status}: {text[:200]}"))
            big = console("SELECT * FROM range(10000000)")
            ok = big[0] == 200 and len(big[1]) < 5_000_000
            results.append(Trial("hostile browser: a 10M-row result is capped", ok,
                                 "" if ok else f"HTTP {big[0]}, {len(big[1])} bytes"))
            for k in ["../../etc/passwd", "/etc/passwd", str(profile), "..", "", "x" * 100_000]:
                status, data = console("SELECT 1", k)
                ok = status in (200, 204, 400, 404, 413) and b"root:x:0" not in data
                results.append(Trial(f"hostile browser: profile key {k[:30]!r}", ok, "" if ok else f"HTTP {status}"))
            for path in ["/../../../etc/passwd", "/assets/../../../../etc/passwd",
                         "/assets/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "/_dash-component-suites/../../../etc/passwd",
                         "/_dash-component-suites/dash/../../../../etc/passwd",
                         f"/{profile}", "/profile.duckdb", "/timeline?profile=../../etc&start=-1&end=1e400&sel=line:x",
                         f"/source?profile={key}&file=/etc/passwd", f"/source?profile={key}&file=-1",
                         f"/timeline?profile={key}&start={'9' * 5000}", "/?" + "a=b&" * 20000]:
                status, data = _http(base + path)
                ok = status < 500 and b"root:x:0" not in data and b"DUCK" not in data[:64]
                results.append(Trial(f"hostile browser: GET {path[:50]}", ok, "" if ok else f"HTTP {status}"))
        alive = server.poll() is None and _http_ok(base + "/")
        results.append(Trial("hostile browser: still serving", alive, "" if alive else "the server stopped answering"))
        status, data = console(GOOD_SQL)
        intact = _sha(profile) == before and not canary.exists() and status == 200 and b"tensor" in data
        results.append(Trial("hostile browser: profile unchanged, no file written", intact,
                             "" if intact else "the profile or the file system changed"))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            results.append(Trial("hostile browser: server stops", False, "still running 30 s after SIGTERM"))
    err = server.stderr.read()
    ok = "Traceback" not in err
    results.append(Trial("hostile browser: no traceback in the server log", ok,
                         "" if ok else err[err.find("Traceback"):][:400]))
    return results


def _http_ok(url: str) -> bool:
    try:
        return _http(url, timeout=5)[0] == 200
    except OSError:
        return False


# -- 2. many at once ---------------------------------------------------------------------------------

def many_at_once(root: Path, workloads: int, execs: int = 30, cache: Path | None = None) -> list[Trial]:
    """``workloads`` profiled processes write into one directory while every reader works at once:
    ``neuron-monitor`` streaming, a neuron-top replay of a finished profile (its document source,
    ``top.sources.ReplaySource``), a running ``neuron-explorer view`` answering pages and SQL, and
    ``neuron-explorer summary`` finalising the directory being written, again and again.
    Promises: no lock error anywhere, every writer finishes, and the final profile holds exactly the
    rows each workload produced (executions, and instructions per execution).
    """
    import threading

    root.mkdir(parents=True, exist_ok=True)
    env = base_env(root, cache)
    done_dir, live_dir_ = root / "finished", root / "shared"
    p = start_workload({**env, **PROFILED, "NEURON_RT_INSPECT_OUTPUT_DIR": str(done_dir)},
                       root / "finished.out", "--execs", "3")
    p.wait(timeout=600)
    finished = Path(run_cli(["neuron-explorer", "summary", str(done_dir)], env) and done_dir / "profile.duckdb")
    if p.returncode != 0 or not finished.exists():
        return [Trial("many at once: setup", False, (root / "finished.err").read_text()[-300:])]
    cfg = root / "monitor.json"
    cfg.write_text(json.dumps({"period": "200ms", "neuron_runtimes": [{"tag_filter": ".*", "metrics": [
        {"type": "neuroncore_counters"}, {"type": "execution_stats"}, {"type": "neuron_stack"}]}]}))
    # outputs go to files, not pipes nobody drains while the test runs (a full pipe would block them)
    mon_out, mon_err = open(root / "monitor.jsonl", "w"), open(root / "monitor.err", "w")
    monitor = subprocess.Popen([str(BIN / "neuron-monitor"), "-c", str(cfg)], env=env, stdout=mon_out, stderr=mon_err)
    port = _free_port()
    view_out, view_err = open(root / "view.out", "w"), open(root / "view.err", "w")
    view = subprocess.Popen([str(BIN / "neuron-explorer"), "view", str(finished), "--port", str(port)], env=env,
                            stdout=view_out, stderr=view_err)
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _http_ok(base + "/") or view.poll() is not None, 180, step=0.2)   # readers first
    wenv = {**env, **PROFILED, "NEURON_RT_INSPECT_OUTPUT_DIR": str(live_dir_)}
    # --linger: twenty executions take milliseconds; the monitor's 200 ms period must get to see them
    procs = [start_workload(wenv, root / f"w{i}.out", "--execs", str(execs), "--linger", "1")
             for i in range(workloads)]
    problems: list[str] = []
    reads = {"summary": 0, "replay": 0, "http": 0}
    stop = threading.Event()

    def replay_reader():
        from top.sources import ReplaySource
        while not stop.is_set():
            try:
                src = ReplaySource(str(finished), period=0.05, speed=1000)
                while src.next_document() is not None and not stop.is_set():
                    reads["replay"] += 1
            except Exception as exc:   # a lock error or anything else: the replay must not fail
                problems.append(f"replay: {type(exc).__name__}: {exc}")
                return

    t = threading.Thread(target=replay_reader, daemon=True)
    t.start()
    while any(p.poll() is None for p in procs):
        if any(live_dir_.glob("*.arrow")):
            r = run_cli(["neuron-explorer", "summary", str(live_dir_), "--json"], env)
            reads["summary"] += 1
            if r.returncode != 0 or "lock" in r.stderr.lower():
                problems.append(f"summary during writing: {r.stderr.strip()[-200:]}")
        if _http_ok(base + "/"):
            reads["http"] += 1
        time.sleep(0.1)
    stop.set()
    t.join(timeout=60)
    for p in (monitor, view):   # SIGTERM: SIGINT is ignored when this battery runs in the background
        p.send_signal(signal.SIGTERM)
    for p in (monitor, view):
        try:
            p.wait(timeout=90)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGABRT)   # faulthandler: where it hangs, on its stderr (read below)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
            problems.append(f"{p.args[0]} did not stop within 90 s of SIGTERM")
    for f in (mon_out, mon_err, view_out, view_err):
        f.close()
    for name, log in (("neuron-monitor", "monitor.err"), ("neuron-explorer view", "view.err")):
        err = (root / log).read_text()
        if "Traceback" in err or "lock" in err.lower() or "Fatal Python error" in err:
            problems.append(f"{name}: {err.strip()[-1500:]}")
    docs = [json.loads(line) for line in (root / "monitor.jsonl").read_text().splitlines() if line.strip()]
    if not any(d.get("neuron_runtime_data") for d in docs):
        problems.append(f"neuron-monitor never saw a workload ({len(docs)} documents)")
    results = [Trial(f"many at once: readers ({reads['summary']} summaries, {reads['replay']} replay documents, "
                     f"{reads['http']} pages)", not problems, "; ".join(problems[:3]))]
    r = run_cli(["neuron-explorer", "summary", str(live_dir_)], env)
    if r.returncode != 0:
        return results + [Trial("many at once: final profile", False, r.stderr[-300:])]
    for i, p in enumerate(procs):
        seen = workload_output(root / f"w{i}.out")
        err = (root / f"w{i}.err").read_text()
        if p.returncode != 0:
            results.append(Trial(f"many at once: writer {i}", False, f"rc {p.returncode}: {err[-300:]}"))
            continue
        rows = run_rows(live_dir_ / "profile.duckdb", p.pid)
        exact = (rows["status"] == "ok" and rows["execs"] == execs == seen["done"] and rows["with_instr"] == execs
                 and rows["per_exec"] == {seen["per_exec"]})
        results.append(Trial(f"many at once: writer {i}", exact, "" if exact else f"rows {rows} vs produced "
                             f"{seen['done']} executions x {seen['per_exec']} instructions"))
    return results


# -- 6. a dying rank ---------------------------------------------------------------------------------

def dying_rank(root: Path, nprocs: int, cache: Path | None = None, timeout_s: int = 20) -> Trial:
    """Kill one rank of an ``nprocs``-process torchrun job (as typed) mid-training.

    Promises: the job ends within NEURON_STACK_DIST_TIMEOUT (+ slack) of the kill with a clear message
    (the survivors' one-line ``ddp_train: error: ...`` or torchrun's report naming the killed rank),
    and every rank's flushed trace finalises into one profile.
    """
    import psutil

    root.mkdir(parents=True, exist_ok=True)
    prof = root / "prof"
    env = {**base_env(root, cache), **PROFILED, "NEURON_RT_INSPECT_OUTPUT_DIR": str(prof),
           "NEURON_STACK_DIST_TIMEOUT": str(timeout_s)}
    victim_rank = nprocs - 1
    job = subprocess.Popen([str(BIN / "torchrun"), "--nproc-per-node", str(nprocs), "--standalone",
                            str(ROOT / "sample_workloads" / "ddp_train.py"), "--small", "--steps", "100000"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=root)
    out = []
    victim = None
    seen_ranks = set()
    for line in job.stdout:
        out.append(line)
        seen_ranks.update(int(r) for r, step in re.findall(r"rank (\d+) \([^)]*\) step (\d+)", line) if int(step) >= 2)
        if len(seen_ranks) == nprocs:
            kids = psutil.Process(job.pid).children(recursive=True)
            victim = next((k for k in kids if "ddp_train.py" in " ".join(k.cmdline())
                           and k.environ().get("RANK") == str(victim_rank)), None)
            break
    name = f"dying rank: {nprocs} processes"
    if victim is None:
        job.kill()
        return Trial(name, False, "the job never reached step 2 on every rank: " + "".join(out)[-400:])
    t_kill = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    try:
        rest = job.communicate(timeout=timeout_s + 60)[0]
    except subprocess.TimeoutExpired:
        job.kill()
        return Trial(name, False, f"the job still ran {timeout_s + 60} s after rank {victim_rank} was killed")
    ended = time.monotonic() - t_kill
    text = "".join(out) + rest
    clear = "ddp_train: error:" in text or f"local_rank: {victim_rank}" in text or "Signal 9" in text
    if job.returncode == 0 or not clear:
        return Trial(name, False, f"rc {job.returncode}, no clear message: {text[-500:]}", recover_s=ended)
    r = run_cli(["neuron-explorer", "sql", str(prof), "SELECT count(DISTINCT rank) AS n FROM runs",
                 "--format", "csv"], env)
    ranks = r.stdout.strip().splitlines()[-1] if r.returncode == 0 else ""
    ok = ranks == str(nprocs)
    return Trial(name, ok, "" if ok else f"the profile holds {ranks or r.stderr[-200:]} ranks, expected {nprocs}",
                 recover_s=ended)
