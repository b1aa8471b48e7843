"""``neuron-explorer inspect`` and ``capture``: run a workload with profiling on, then finalise.

Both run the workload in a child process with the real runtime switches set
(``NEURON_RT_INSPECT_ENABLE=1``, ``NEURON_RT_INSPECT_OUTPUT_DIR=<session>``), so this command never
imports torch. Whatever the child does — succeed, fail, get killed — the segments it flushed are
finalised into ``<session>/profile.duckdb``.

Example::

    neuron-explorer inspect -o profiles -- python sample_workloads/mlp.py --small
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from traces.errors import TraceError
from traces.safeio import special_kind


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="run a command with profiling on and finalise its profile",
                       description="Run COMMAND with NEURON_RT_INSPECT_ENABLE=1, then finalise the profile. "
                                   "Unlike the real runtime's default (NEURON_RT_INSPECT_DEVICE_PROFILE=0: system "
                                   "profile only), inspect also records the device profile of every execution "
                                   "(NEURON_RT_INSPECT_DEVICE_PROFILE=session) unless that variable is set.")
    p.add_argument("-o", "--output-dir", default=os.environ.get("NEURON_RT_INSPECT_OUTPUT_DIR", "output"),
                   help="where session directories are made (default: ./output)")
    p.add_argument("--name", help="session name (default: the script's name)")
    p.add_argument("-n", "--num-trace-events", metavar="N",
                   help="keep at most N system events per NeuronCore, the newest (as the real flag; sets "
                        "NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC; default 1,000,000)")
    p.add_argument("--include-warmup", action="store_true",
                   help="keep warm-up executions in the summary (excluded by default)")
    p.add_argument("--compat", action="store_true",
                   help="run a Python COMMAND through the compat runner (python -m neuron_stack.compat), so a script "
                        "written for the Neuron SDK (nki, neuronxcc.nki, torch_neuronx, torch_xla) runs unchanged")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    p.set_defaults(func=_inspect)

    c = sub.add_parser("capture", help="run a saved NEFF with given or generated inputs and profile it",
                       description="Execute a NEFF on a simulated NeuronCore and write its profile.")
    c.add_argument("-n", "--neff", default="file.neff", help="the NEFF to run (default: file.neff)")
    c.add_argument("-s", "--session-file", "--session-dir", dest="session", default=None, metavar="PATH",
                   help="where the profile goes: FILE.ntff (or .duckdb, or an existing profile) is written as "
                        "that one file, as the real flag (a DuckDB profile under that name: the real NTFF format "
                        "is not public); any other PATH is a session directory, made if missing, that gets "
                        "profile.duckdb (default: ./output/<timestamp>_<neff name>)")
    c.add_argument("--num-exec", type=int, default=1, help="number of executions (default 1)")
    c.add_argument("--profile-nth-exec", type=int, default=1,
                   help="record instructions of the Nth execution only (0 disables device profiling)")
    c.add_argument("--save-output-npy", metavar="DIR", help="write each output as DIR/<name>.npy")
    c.add_argument("inputs", nargs="*", metavar="NAME FILE.npy",
                   help="input name and .npy file pairs; missing inputs are zero-filled")
    c.set_defaults(func=_capture)


def _session_dir(root: str, name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "session"
    path = Path(root) / f"{time.strftime('%Y%m%d-%H%M%S')}_{safe}"
    n = 1
    while path.exists():  # two sessions in the same second
        n += 1
        path = Path(root) / f"{time.strftime('%Y%m%d-%H%M%S')}_{safe}_{n}"
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise TraceError(f"cannot create the session directory {path}: {exc.strerror}; "
                         "pass a writable directory with -o DIR") from None
    return path


def _script_name(cmd: list[str]) -> str:
    for arg in cmd[1:] if Path(cmd[0]).name.startswith("python") else cmd:
        if not arg.startswith("-"):
            return Path(arg).stem
    return Path(cmd[0]).stem


def _run_profiled(cmd: list[str], session: Path, extra_env: dict[str, str]) -> tuple[int, bool]:
    """Run ``cmd`` profiled into ``session``: (exit status as a shell gives it, whether Ctrl-C stopped it)."""
    # The real runtime's device profile is off by default; inspect and capture want the device rows, so
    # they turn it on (every execution) unless the user chose a mode.
    env = {**os.environ, "NEURON_RT_INSPECT_ENABLE": "1",
           "NEURON_RT_INSPECT_DEVICE_PROFILE": os.environ.get("NEURON_RT_INSPECT_DEVICE_PROFILE") or "session",
           "NEURON_RT_INSPECT_OUTPUT_DIR": str(session.resolve()), **extra_env}
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        raise TraceError(f"cannot run {cmd[0]!r}: {exc.strerror}; check the command after '--'") from None
    # Ctrl-C reaches the child too: the first lets it stop (flushing), then what it recorded is finalised;
    # a second means "stop now" (KeyboardInterrupt, for the caller to say what is left unfinished).
    hits = 0

    def on_sigint(signum, frame):
        nonlocal hits
        hits += 1
        if hits > 1:
            raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:   # a background job keeps ignoring it
        signal.signal(signal.SIGINT, on_sigint)
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    interrupted = hits > 0 or code == -signal.SIGINT
    if code < 0:   # killed by a signal: exit 128+N as a shell does (sys.exit(-9) would be 247)
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        if not interrupted:   # Ctrl-C is said once, by _finish
            print(f"neuron-explorer: the workload was killed by {name}; its profile keeps what it recorded "
                  f"before that (exit {128 - code})", file=sys.stderr)
        code = 128 - code
    return code, interrupted


def _finish(session: Path, code: int, include_warmup: bool, interrupted: bool = False,
            dest: Path | None = None) -> int:
    """Finalise ``session`` into its profile.duckdb, or into the file ``dest`` (``capture -s profile.ntff``)."""
    import traces

    has_segments = any(p.is_file() for p in session.rglob("*") if p.name != "profile.duckdb")
    if interrupted and not has_segments:
        with contextlib.suppress(OSError):
            session.rmdir()   # empty: nothing to keep (never removes a file)
        print("neuron-explorer: interrupted (Ctrl-C) before the workload recorded any Neuron execution: "
              "no profile was kept", file=sys.stderr)
        return code
    if not has_segments and code:   # it failed before its first execution: its own error is above
        print(f"neuron-explorer: error: the workload ended with exit status {code} before recording any "
              f"Neuron execution, so {dest or session} holds no profile (its own output above says why)",
              file=sys.stderr)
        return code
    if not has_segments:
        print(f"neuron-explorer: error: no Neuron executions were recorded in {dest or session}: does the script "
              "run a model through neuron_stack.trace or torch.compile(backend='neuron')?", file=sys.stderr)
        return 1
    profile = traces.finalize(session, include_warmup=include_warmup)
    if dest is not None:   # one rename on the same file system: the file is the whole profile or untouched
        os.replace(profile, dest)
        profile = dest
    if interrupted:
        print(f"neuron-explorer: interrupted (Ctrl-C): the profile keeps what the workload recorded before it, "
              f"written to {profile}")
    else:
        status = "finished" if code == 0 else f"exited with status {code}"
        print(f"neuron-explorer: workload {status}; profile written to {profile}")
    with traces.open(profile) as p:
        verdict = p.capture_verdict()
    for line in verdict.lines:   # e.g. a core filter that excluded every core the workload ran on
        print(f"  {verdict.status}: {line}")
    print(f"  summary:  neuron-explorer summary {profile}")
    print(f"  explore:  neuron-explorer view {profile}")
    return code


def _inspect(args: argparse.Namespace) -> int:
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        raise TraceError("inspect needs a command: neuron-explorer inspect -o DIR -- python script.py")
    if args.compat and not Path(cmd[0]).name.startswith("python"):
        raise TraceError("--compat runs a Python script: neuron-explorer inspect --compat -- python script.py")
    extra = {}
    if args.num_trace_events is not None:
        n = str(args.num_trace_events).strip()
        if not re.fullmatch(r"[0-9]{1,10}", n) or int(n) == 0:
            raise TraceError(f"-n {n[:40]!r} is not a positive whole number of system events per NeuronCore: "
                             "e.g. inspect -n 100000 -- python script.py")
        extra["NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC"] = n
    session = _session_dir(args.output_dir, args.name or _script_name(cmd))
    if args.compat:
        cmd = [cmd[0], "-m", "neuron_stack.compat", *cmd[1:]]
    try:
        code, interrupted = _run_profiled(cmd, session, extra)
        return _finish(session, code, args.include_warmup, interrupted)
    except KeyboardInterrupt:   # a second Ctrl-C (or one during finalising): stop now, and say what is left
        _unfinished(session)
        return 130


def _unfinished(session: Path) -> None:
    if not session.is_dir() or not any(session.iterdir()):
        with contextlib.suppress(OSError):
            session.rmdir()
        print("neuron-explorer: interrupted: nothing was recorded, no profile was kept", file=sys.stderr)
        return
    print(f"neuron-explorer: interrupted again: {session} is left unfinished (the segments recorded so far, "
          f"not finalised); `neuron-explorer summary {session}` (or view) finalises it", file=sys.stderr)


def _capture(args: argparse.Namespace) -> int:
    neff = Path(args.neff)
    if not neff.is_file():
        kind = special_kind(neff)   # /dev/zero or a FIFO exists: "not found" would mislead
        raise TraceError(f"NEFF {neff} is {kind}, not a file; pass the compiled model with -n model.neff" if kind
                         else f"NEFF not found: {neff}; pass the compiled model with -n model.neff")
    with open(neff, "rb") as f:   # cheap checks before the capture child imports torch (seconds)
        magic = f.read(4)
    if magic != b"PK\x03\x04":
        raise TraceError(f"{neff}: {'an empty file (0 bytes)' if not magic else 'not a NEFF archive (no zip header)'}; "
                         "pass the compiled model with -n model.neff (neuron-cc compile -o, or NeuronModule.save)")
    if len(args.inputs) % 2:
        raise TraceError("inputs come in pairs: NAME file.npy [NAME file.npy ...]")
    if args.num_exec < 1 or not 0 <= args.profile_nth_exec <= args.num_exec:
        raise TraceError("--num-exec must be >= 1 and --profile-nth-exec between 0 and --num-exec")
    target = _profile_file(Path(args.session)) if args.session else None
    if target:   # the segments go to a hidden directory beside the file, removed once it is written
        session = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".segments", dir=target.parent))
    else:
        session = Path(args.session) if args.session else _session_dir("output", neff.stem)
        session.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "neuron_stack.tools.capture", str(neff), "--num-exec", str(args.num_exec),
           "--profile-nth-exec", str(args.profile_nth_exec)]
    if args.save_output_npy:
        cmd += ["--save-output-npy", args.save_output_npy]
    try:
        code, interrupted = _run_profiled(cmd + ["--", *args.inputs], session, {})
        if code != 0 and not interrupted and not any(session.iterdir()):
            return code  # the child already printed its one-line error (bad NEFF, bad input)
        return _finish(session, code, include_warmup=args.profile_nth_exec == 1, interrupted=interrupted,
                       dest=target)
    except KeyboardInterrupt:   # a second Ctrl-C: the segments stay (finalisable), nothing is removed
        _unfinished(session)
        target = None
        return 130
    finally:
        if target:
            shutil.rmtree(session, ignore_errors=True)


#: ``capture -s`` names a profile file, not a session directory, by these endings (the real ``profile.ntff``).
PROFILE_FILE_SUFFIXES = (".ntff", ".duckdb")


def _profile_file(path: Path) -> Path | None:
    """The file ``capture -s PATH`` writes the profile to, or None when PATH is a session directory (an existing
    directory, or a new path not ending in .ntff / .duckdb, as before). Refuses, as one line, a file whose directory
    is missing and an existing file that is no profile (it would be overwritten).

    >>> _profile_file(Path("/proc")) is None, _profile_file(Path("/proc/profile.ntff"))
    (True, PosixPath('/proc/profile.ntff'))
    """
    if path.is_dir():
        return None
    kind = special_kind(path)
    if kind:
        raise TraceError(f"capture -s {path}: it is {kind}, not a file; pass a new file name such as profile.ntff")
    if not path.exists() and path.suffix.lower() not in PROFILE_FILE_SUFFIXES:
        return None
    if not path.parent.is_dir():
        raise TraceError(f"capture -s {path}: the directory {path.parent} does not exist; create it first, "
                         "or pass a file in an existing directory")
    if path.exists():   # a profile is rewritten; anything else (another DuckDB database too) is kept
        import traces

        try:
            traces.open(path).close()
        except TraceError:
            raise TraceError(f"capture -s {path}: the file exists and is not a profile, so capture will not "
                             "overwrite it; pass a new file name such as profile.ntff") from None
    return path
