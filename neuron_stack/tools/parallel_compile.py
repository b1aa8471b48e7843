"""``neuron_parallel_compile``: extract every graph from a trial run, compile them in parallel.

    neuron_parallel_compile [--command collect|compile|clean|clear-locks|analyze]
                            [--num-parallel N] [--analyze-output DIR] [--analyze-verbosity 1|2]
                            <run command ...>

With no ``--command`` it does ``collect`` then ``compile``:

- **collect** runs the command with ``NEURON_EXTRACT_GRAPHS_ONLY=1``. In that mode the compiler
  (:func:`neuron_stack.compiler.driver.compile_program`, the one place every graph is compiled) records
  each graph it is asked for — the captured program, its weights and its flags — under the work
  directory (:func:`graphs_dir`) instead of compiling it, and hands back a quick roofline-timed NEFF
  that never enters the persistent cache. The script keeps running, but **its outputs, losses
  and timings are not valid** (as with the real tool): use the run only to discover graphs.
- **compile** compiles every collected graph in a pool of ``--num-parallel`` worker processes
  (default: the CPUs this process may use) into the persistent compile cache
  (``NEURON_COMPILE_CACHE_URL``), with the real log tags, retries
  (``NEURON_PARALLEL_COMPILE_MAX_RETRIES``, default 0), the JSON summary and the totals. A
  compiled graph leaves the work directory; a failed one stays for another ``compile``.
- **clean** deletes the collected graphs; **clear-locks** deletes compile-cache lock files (and
  half-written entries) that no live process holds; **analyze** collects into a scratch directory
  and writes the operator-support report of every graph to ``--analyze-output``/result.json.

A later normal run finds every graph in the cache (``graphs.cache_hit`` in its profile).
``NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE=1`` compiles what was collected even when the
script fails. Errors are one line and a non-zero exit.

>>> log_line("NEURON_PARALLEL_COMPILE", "Total graphs: 2").split("||", 1)[1]
'NEURON_PARALLEL_COMPILE||: Total graphs: 2'
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from pathlib import Path

from neuron_stack.compiler import hooks

# torch and the rest of the compiler are imported inside the functions that need them: `clean`, `clear-locks`
# and the collect parent (which only runs the user's script) start without paying for torch.

PROG = "neuron_parallel_compile"
EXTRACT_ENV = "NEURON_EXTRACT_GRAPHS_ONLY"
WORKDIR_ENV = "NEURON_PARALLEL_COMPILE_WORKDIR"
RETRIES_ENV = "NEURON_PARALLEL_COMPILE_MAX_RETRIES"
IGNORE_ERROR_ENV = "NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE"
COMMANDS = ("collect", "compile", "clean", "clear-locks", "analyze")
PC, CACHE = "NEURON_PARALLEL_COMPILE", "NEURON_CACHE"


class ParallelCompileError(RuntimeError):
    """Bad usage or setting; the message is one line naming the problem and the fix."""


def _on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def extract_only() -> bool:
    """True inside a collect run (``NEURON_EXTRACT_GRAPHS_ONLY=1``): record graphs, compile nothing."""
    return _on(EXTRACT_ENV)


def log_line(tag: str, msg: str, level: str = "INFO") -> str:
    """One log line in the real tool's shape: ``<time>:  <pid>  INFO ||TAG||: msg``."""
    ts = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
    return f"{ts}:  {os.getpid()}  {level} ||{tag}||: {msg}"


def log(tag: str, msg: str, level: str = "INFO", stream=None) -> None:
    print(log_line(tag, msg, level), file=stream or sys.stdout, flush=True)


def graphs_dir() -> Path:
    """Where collected graphs live: ``$NEURON_PARALLEL_COMPILE_WORKDIR``, else
    ``<compile cache>/neuron_parallel_compile`` (beside the cache the graphs are compiled into; under
    the default local cache directory when the cache is on S3)."""
    env = os.environ.get(WORKDIR_ENV, "").strip()
    if env:
        return Path(env)
    from neuron_stack.frontend.flags import DEFAULT_URL, cache_url, parse_flags  # no torch: clean, clear-locks
    url = cache_url(parse_flags())
    return Path(DEFAULT_URL if url.startswith("s3://") else url) / "neuron_parallel_compile"


def collected(gdir: Path) -> list[Path]:
    """The complete graph directories under ``gdir`` (``graph.json`` is written last), oldest first."""
    if not gdir.is_dir():
        return []
    dirs = [d for d in gdir.glob("MODULE_*") if (d / "graph.json").is_file()]
    return sorted(dirs, key=lambda d: (d / "graph.json").stat().st_mtime)


# -- the collect side: called by the compiler in extraction mode --------------------------------------

class CollectRecorder:
    """The compiler's graph recorder (:mod:`neuron_stack.compiler.hooks`) for collect runs: active
    while ``NEURON_EXTRACT_GRAPHS_ONLY`` is on (read at every compile), records with
    :func:`record_graph`. Installed by :func:`install_collector`."""

    def active(self) -> bool:
        return extract_only()

    def record(self, program, flags: dict, partitioner_config, graph_hash: str) -> Path:
        return record_graph(program, flags, partitioner_config, graph_hash)


COLLECTOR = CollectRecorder()


def install_collector() -> None:
    """Make every compile in this process go through :data:`COLLECTOR` (a no-op unless
    ``NEURON_EXTRACT_GRAPHS_ONLY`` is on when a graph is compiled). Called by the public API
    and ``neuron-cc compile``: the compiler itself never imports this tool."""
    hooks.set_graph_recorder(COLLECTOR)


def record_graph(program, flags: dict, partitioner_config, graph_hash: str) -> Path:
    """Save ``program`` (before any pass touches it), its weights and flags for a later compile.

    Called by :func:`neuron_stack.compiler.driver.compile_program` (through :data:`COLLECTOR`) when
    :func:`extract_only` is true.
    Identical graphs (same graph and flags hash, e.g. from several ranks) are kept once: a graph
    directory is built under a temporary name and renamed into place, so a half-written one is
    never seen. Example: ``record_graph(prog, parse_flags(), None, graph_hash(prog))``.
    """
    import torch

    from neuron_stack.compiler.cache import cache_url
    from neuron_stack.frontend.flags import flags_hash

    gdir = graphs_dir()
    dest = gdir / f"MODULE_{graph_hash}+{flags_hash(flags)}"
    if (dest / "graph.json").is_file():
        return dest
    tmp = gdir / f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir(parents=True)
    (tmp / "program.json").write_text(json.dumps(program.to_json()))
    torch.save({k: v.detach().contiguous() for k, v in program.constants.items()}, tmp / "constants.pt")
    forced = sorted(getattr(partitioner_config, "ops_to_partition", None) or ())
    meta = {"graph_hash": graph_hash, "flags_hash": flags_hash(flags), "flags": flags,
            "cache_url": cache_url(flags), "ops_to_partition": forced, "name": program.name,
            "num_ops": sum(n.is_compute for n in program.nodes),
            "collected_by": {"pid": os.getpid(), "rank": os.environ.get("RANK", "0"),
                             "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}}
    (tmp / "graph.json").write_text(json.dumps(meta, indent=1))
    try:
        os.rename(tmp, dest)
    except OSError:  # another process recorded the same graph first
        shutil.rmtree(tmp, ignore_errors=True)
        return dest
    log(PC, f"Extracted graph {dest.name} ({program.name}, {meta['num_ops']} ops) to {gdir}", stream=sys.stderr)
    return dest


def load_graph(gdir: Path):
    """``(meta, program, partitioner_config)`` of a collected graph directory."""
    import torch

    from neuron_stack.compiler.support import PartitionerConfig
    from neuron_stack.ir import Program

    meta = json.loads((gdir / "graph.json").read_text())
    constants = torch.load(gdir / "constants.pt", weights_only=True)
    program = Program.from_json(json.loads((gdir / "program.json").read_text()), constants)
    cfg = PartitionerConfig(ops_to_partition=set(meta["ops_to_partition"])) if meta["ops_to_partition"] else None
    return meta, program, cfg


# -- the compile side -------------------------------------------------------------------------------

def compile_graph(gdir: str) -> dict:
    """Compile one collected graph into the compile cache (runs in a worker process).

    Returns ``{"ok", "cache_hit", "entry", "seconds", "instructions", "error"}``; never raises, so
    one bad graph cannot take the pool down. Example: ``compile_graph("/tmp/g/MODULE_1+ab")``.
    """
    t0 = time.perf_counter()
    os.environ.pop(EXTRACT_ENV, None)   # a worker compiles for real even if the user exported it
    try:
        import torch
        torch.set_num_threads(1)        # the pool is the parallelism: one thread per worker
        from neuron_stack.compiler.cache import compile_cached
        from neuron_stack.compiler.driver import compile_program

        meta, program, cfg = load_graph(Path(gdir))
        flags = dict(meta["flags"], no_cache=False, cache_dir=meta["cache_url"])
        ghash = meta["graph_hash"]
        neff, hit, entry = compile_cached(
            ghash, flags, lambda: compile_program(program, flags, partitioner_config=cfg, graph_hash_value=ghash),
            constants=program.constants)
        return {"ok": True, "cache_hit": hit, "entry": str(entry), "seconds": time.perf_counter() - t0,
                "instructions": int(neff.program.stats.get("num_instructions", 0)), "error": ""}
    except Exception as exc:  # reported in the summary, one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"ok": False, "cache_hit": False, "entry": "", "seconds": time.perf_counter() - t0,
                "instructions": 0, "error": f"{type(exc).__name__}: {first}"}


def _entry_path(meta_dir: Path) -> str:
    """The cache entry a graph compiles into (for the report, also when it failed)."""
    try:
        from neuron_stack.compiler.cache import open_cache
        meta = json.loads((meta_dir / "graph.json").read_text())
        return str(open_cache(meta["cache_url"]).entry_dir(meta["graph_hash"], meta["flags_hash"]))
    except (OSError, ValueError, KeyError):
        return str(meta_dir)


def compile_all(dirs: list[Path], num_parallel: int, max_retries: int) -> dict:
    """Compile ``dirs`` with ``num_parallel`` worker processes; print progress; return the report.

    The report is the real tool's ``{"compilation_summary": {"true": n, "false": m},
    "compilation_report": {<entry>: {"status", "retry", ...}}}``.
    """
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    total = len(dirs)
    pending = deque(dirs)
    retries = {d: 0 for d in dirs}
    report: dict[str, dict] = {}
    done = failed = 0
    # fork: the parent has imported but never run torch, so the workers start without re-importing it
    ctx = mp.get_context("fork")
    pool = ProcessPoolExecutor(max_workers=num_parallel, mp_context=ctx)
    running: dict = {}

    def status() -> None:
        log(PC, f"Current remaining items are {len(pending)}, locked are {len(running)}, failed are {failed}, "
                f"done are {done}, total is {total}")

    try:
        status()
        while pending or running:
            while pending and len(running) < num_parallel:
                d = pending.popleft()
                running[pool.submit(compile_graph, str(d))] = d
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                d = running.pop(fut)
                try:
                    res = fut.result()
                except BrokenProcessPool:   # a worker died (killed, out of memory): new pool, count a failure
                    res = {"ok": False, "cache_hit": False, "entry": "", "seconds": 0.0, "instructions": 0,
                           "error": "the compile worker process died"}
                    pool.shutdown(wait=False, cancel_futures=True)
                    pending.extend(running.values())
                    running.clear()
                    pool = ProcessPoolExecutor(max_workers=num_parallel, mp_context=ctx)
                key = res["entry"] or _entry_path(d)
                if res["ok"]:
                    done += 1
                    if res["cache_hit"]:
                        log(CACHE, f"Using a cached neff at {key}/model.neff. Exiting with a successfully "
                                   "compiled graph.")
                    else:
                        log(PC, f"Compiled {d.name} in {res['seconds']:.1f} s ({res['instructions']} instructions): "
                                f"Compiler status PASS; saved to {key}")
                    report[key] = {"status": True, "retry": retries[d], "cache_hit": res["cache_hit"]}
                    shutil.rmtree(d, ignore_errors=True)   # in the cache now; a failed graph stays
                elif retries[d] < max_retries:
                    retries[d] += 1
                    log(PC, f"Compilation of {d.name} failed ({res['error']}); retry {retries[d]} of {max_retries}",
                        level="WARNING")
                    pending.append(d)
                else:
                    failed += 1
                    log(PC, f"Compilation of {d.name} failed: {res['error']}; the graph stays in {d.parent} "
                            f"(run `{PROG} --command compile` again, or raise {RETRIES_ENV})", level="ERROR")
                    report[key] = {"status": False, "retry": retries[d], "error": res["error"], "graph": str(d)}
                status()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    summary: dict[str, int] = {}
    for r in report.values():
        summary[str(r["status"]).lower()] = summary.get(str(r["status"]).lower(), 0) + 1
    return {"compilation_summary": summary, "compilation_report": report}


def print_summary(result: dict) -> None:
    """The JSON line and the three totals the real tool ends with."""
    rep = result["compilation_report"]
    ok = sum(1 for r in rep.values() if r["status"])
    log(PC, json.dumps(result))
    log(PC, f"Total graphs: {len(rep)}")
    log(PC, f"Total successful compilations: {ok}")
    log(PC, f"Total failed compilations: {len(rep) - ok}")


# -- the other commands ----------------------------------------------------------------------------

def collect(cmd: list[str], gdir: Path) -> int:
    """Run ``cmd`` in graph-extraction mode, recording graphs into ``gdir``; return its exit status."""
    if not cmd:
        raise ParallelCompileError("no run command: neuron_parallel_compile [--command collect] python train.py ...")
    gdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, EXTRACT_ENV: "1", WORKDIR_ENV: str(gdir.resolve())}
    log(PC, f"Running `{shlex.join(cmd)}` in graph extraction mode ({EXTRACT_ENV}=1): graphs are recorded, "
            "not compiled; the script's outputs, losses and timings are NOT valid in this run")
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        raise ParallelCompileError(f"cannot run {cmd[0]!r}: {exc.strerror}; check the run command") from None
    try:
        return proc.wait()
    except KeyboardInterrupt:   # the child got the same SIGINT
        return proc.wait()


def clear_locks(root: Path) -> int:
    """Delete lock files and half-written entries in the cache under ``root`` that no live process
    holds (a compile killed mid-way leaves them). Returns how many were removed."""
    removed = 0
    for lock in sorted(root.glob("neuronxcc-*/MODULE_*.lock")):
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # fails while a compile holds it
        except OSError:
            log(CACHE, f"{lock} is held by a running compile; left in place", level="WARNING")
            os.close(fd)
            continue
        try:
            entry = lock.with_name(lock.name.removesuffix(".lock"))
            for tmp in lock.parent.glob(f".{entry.name}.*.tmp"):
                shutil.rmtree(tmp, ignore_errors=True)
                removed += 1
            lock.unlink(missing_ok=True)
            removed += 1
        finally:
            os.close(fd)
    return removed


def analyze(gdirs: list[Path], verbosity: int) -> dict:
    """The operator-support report of every collected graph (``torch_neuronx.analyze``'s fields,
    summed over graphs, plus one row per graph). ``verbosity`` 2 adds each unsupported op's call site."""
    from types import SimpleNamespace

    from neuron_stack.compiler.legalize import aten_name, legalize
    from neuron_stack.compiler.version import compiler_version, stack_version
    from neuron_stack.ir import Program

    supported: dict[str, int] = {}
    unsupported: list[dict] = []
    graphs = []
    total_ops = 0
    for d in gdirs:
        meta = json.loads((d / "graph.json").read_text())
        program = Program.from_json(json.loads((d / "program.json").read_text()))
        legalize(program, SimpleNamespace(ops_to_partition=set(meta["ops_to_partition"])))
        ops = [n for n in program.nodes if n.is_compute]
        dev = [n for n in ops if n.placement == "device"]
        total_ops += len(ops)
        for n in dev:
            supported[aten_name(n.target)] = supported.get(aten_name(n.target), 0) + 1
        for n in ops:
            if n.placement == "device":
                continue
            row = {"kind": aten_name(n.target), "graph": d.name,
                   "failureAt": "Lowering to HLO" if "data-dependent" in n.fallback_reason else "neuronx-cc",
                   "reason": n.fallback_reason}
            if verbosity >= 2:
                s = n.source
                row["call"] = f"{s.file}({s.line}): {s.function}\n" if s else ""
                row["module"] = n.module_path
            unsupported.append(row)
        graphs.append({"graph": d.name, "name": meta["name"], "num_ops": len(ops), "num_device_ops": len(dev),
                       "support_percentage": f"{100.0 * len(dev) / len(ops) if ops else 100.0:.2f}%"})
    pct = 100.0 * sum(supported.values()) / total_ops if total_ops else 100.0
    return {"torch_neuronx_version": stack_version(), "neuronx_cc_version": compiler_version(),
            "support_percentage": f"{pct:.2f}%", "supported_operators": dict(sorted(supported.items())),
            "unsupported_operators": unsupported, "graphs": graphs}


# -- the command line -------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        self.exit(2, f"{PROG}: error: {message}; see {PROG} --help\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Extract the graphs of a trial run and compile them in parallel "
                                       "into the persistent compile cache.",
                epilog=f"Environment: {RETRIES_ENV} (default 0), {IGNORE_ERROR_ENV}=1, {WORKDIR_ENV}, "
                       "NEURON_COMPILE_CACHE_URL, NEURON_CC_FLAGS.")
    p.add_argument("--command", choices=COMMANDS, default=None,
                   help="one step only (default: collect, then compile)")
    p.add_argument("--num-parallel", "--num_parallel", dest="num_parallel", type=int, default=None,
                   help="compile worker processes (default: the CPUs this process may use)")
    p.add_argument("--analyze-output", default=None, help="analyze: output directory (default ./model_analysis_result)")
    p.add_argument("--analyze-verbosity", type=int, choices=(1, 2), default=1,
                   help="analyze: 2 adds each unsupported op's source line")
    p.add_argument("run", nargs=argparse.REMAINDER, help="the command of a short trial run, e.g. python train.py")
    return p


def _max_retries() -> int:
    raw = os.environ.get(RETRIES_ENV, "0").strip() or "0"
    if not raw.isdigit():
        raise ParallelCompileError(f"{RETRIES_ENV}={raw!r} is not a whole number: set it to 0, 1, 2, ...")
    return int(raw)


def _compile_step(gdir: Path, num_parallel: int) -> int:
    from neuron_stack.compiler.cache import cache_url  # imports torch once, before the workers fork
    from neuron_stack.frontend.flags import parse_flags

    max_retries = _max_retries()
    log(CACHE, f"Compile cache path: {cache_url(parse_flags())}")
    dirs = collected(gdir)
    if not dirs:
        log(PC, f"No collected graphs in {gdir}: run `{PROG} --command collect <run command>` first "
                "(or the run compiled nothing)", level="WARNING")
    result = compile_all(dirs, num_parallel, max_retries) if dirs else {"compilation_summary": {},
                                                                        "compilation_report": {}}
    print_summary(result)
    return 1 if any(not r["status"] for r in result["compilation_report"].values()) else 0


def run(argv: list[str] | None) -> int:
    """Parse ``argv`` and run the command; returns the exit status. Example: ``run(["python", "t.py"])``."""
    args = _parser().parse_args(argv)
    cmd = args.run[1:] if args.run[:1] == ["--"] else args.run
    num_parallel = args.num_parallel if args.num_parallel is not None else len(os.sched_getaffinity(0))
    if num_parallel < 1:
        raise ParallelCompileError(f"--num-parallel {args.num_parallel}: use at least 1 worker")
    _max_retries()   # a bad value fails before the trial run, not after it
    command = args.command
    if command == "analyze":
        out = Path(args.analyze_output or Path.cwd() / "model_analysis_result")
        with tempfile.TemporaryDirectory(prefix="neuron_parallel_compile_analyze_") as tmp:
            status = collect(cmd, Path(tmp))
            if status != 0 and not _on(IGNORE_ERROR_ENV):
                return _script_failed(status, len(collected(Path(tmp))))
            result = analyze(collected(Path(tmp)), args.analyze_verbosity)
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps(result, indent=2))
        log(PC, f"Analyzed {len(result['graphs'])} graphs: {result['support_percentage']} of their operators run on "
                f"the NeuronCore, {len(result['unsupported_operators'])} fall back to the CPU; "
                f"report written to {out / 'result.json'}")
        return 0
    gdir = graphs_dir()
    if command == "clean":
        n = len(collected(gdir))
        shutil.rmtree(gdir, ignore_errors=True)
        log(PC, f"Removed {n} collected graphs from {gdir}")
        return 0
    if command == "clear-locks":
        from neuron_stack.frontend.flags import cache_url, parse_flags
        root = Path(cache_url(parse_flags()))
        log(CACHE, f"Removed {clear_locks(root)} stale lock files and unfinished entries from {root}")
        return 0
    if command in (None, "collect"):
        status = collect(cmd, gdir)
        n = len(collected(gdir))
        if status != 0 and not _on(IGNORE_ERROR_ENV):
            return _script_failed(status, n)
        if status != 0:
            log(PC, f"the run command exited with status {status}; compiling the {n} graphs collected so far "
                    f"({IGNORE_ERROR_ENV} is set)", level="WARNING")
        log(PC, f"Collected {n} graphs in {gdir}")
        if command == "collect":
            return 0
    return _compile_step(gdir, num_parallel)


def _script_failed(status: int, n: int) -> int:
    print(f"{PROG}: error: the run command exited with status {status} during graph extraction; fix it, or "
          f"set {IGNORE_ERROR_ENV}=1 to compile the {n} graphs collected so far", file=sys.stderr)
    return status if 0 < status < 256 else 1


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``neuron_parallel_compile``); errors are one line, non-zero exit."""
    from traces.errors import run_guarded
    return run_guarded(PROG, lambda: run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
