"""Fuzzed input for the reliability battery: NEFFs, profiles, segments, monitor configs, Explorer requests.

Each ``fuzz_*`` function feeds ``examples`` mutated inputs (hypothesis generates them) to the real
loader and returns one :class:`harness.Trial` per kind of input, counting every example whose
outcome broke a promise: an exception other than the loader's documented one, a message that is not
one clear line, or more than ``TIME_BOUND_S`` spent on one input (a hang). Failures are collected,
not raised, so one run counts them all (the benchmark's table); the tests assert there are none.

>>> one_line_ok("profile x is not a neuron_stack profile: pass a profile.duckdb")
True
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import zipfile
from pathlib import Path

from harness import Trial
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: Longest any single input may take before it counts as a hang.
TIME_BOUND_S = 20.0


class Hang(Exception):
    """One input took longer than TIME_BOUND_S."""


@contextlib.contextmanager
def time_bound(seconds: float = TIME_BOUND_S):
    """Raise :class:`Hang` in the main thread if the block runs longer than ``seconds``."""
    def _alarm(signum, frame):
        raise Hang(f"no answer within {seconds:.0f} s")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def one_line_ok(message: str) -> bool:
    """A refusal message is one line that says something (not a bare type name or repr)."""
    return bool(message) and "\n" not in message.strip() and len(message.strip()) >= 20 and \
        "Traceback" not in message


def _settings(examples: int):
    return settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                    suppress_health_check=list(HealthCheck), print_blob=False)


class Tally:
    """Counts examples and collects the first few problems of one kind of input."""

    def __init__(self, test: str):
        self.test, self.count, self.problems = test, 0, []

    def check(self, fn, allowed: tuple[type[BaseException], ...], what: str) -> None:
        """Run ``fn()``; record a problem unless it returns or raises ``allowed`` with one clear line."""
        self.count += 1
        try:
            with time_bound():
                fn()
        except Hang as exc:
            self.problems.append(f"{what}: hang ({exc})")
        except allowed as exc:
            if not one_line_ok(str(exc)):
                self.problems.append(f"{what}: unclear refusal {type(exc).__name__}: {str(exc)[:200]!r}")
        except Exception as exc:  # the loader let something else through: a traceback for the user
            self.problems.append(f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")

    def trial(self) -> Trial:
        n = len(self.problems)
        kinds: dict[str, str] = {}   # one example per distinct outcome (the text after the input)
        for p in self.problems:
            kinds.setdefault(p.rsplit(": ", 2)[-2] if p.count(": ") >= 2 else p, p)
        return Trial(f"{self.test} ({self.count} inputs)", n == 0,
                     "" if n == 0 else f"{n} bad outcomes, e.g. " + " | ".join(list(kinds.values())[:6]))


# -- byte-level mutations, shared ----------------------------------------------------------------

def byte_mutations():
    """A strategy of functions bytes -> bytes: flips, truncations, insertions, splices."""
    flip = st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255), st.integers(1, 64))
    cut = st.tuples(st.just("cut"), st.floats(0, 1))
    ins = st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=64))
    zero = st.tuples(st.just("zero"), st.floats(0, 1), st.integers(1, 4096))
    return st.lists(st.one_of(flip, cut, ins, zero), min_size=1, max_size=4)


def apply_mutations(data: bytes, ops) -> bytes:
    """Apply the ``byte_mutations`` ops to ``data``."""
    buf = bytearray(data)
    for op in ops:
        at = int(op[1] * max(len(buf) - 1, 0))
        if op[0] == "flip":
            for i in range(at, min(at + op[3], len(buf))):
                buf[i] ^= op[2]
        elif op[0] == "cut":
            del buf[at:]
        elif op[0] == "insert":
            buf[at:at] = op[2]
        elif op[0] == "zero":
            buf[at:at + op[2]] = bytes(len(buf[at:at + op[2]]))
    return bytes(buf)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)


def _mutate_json(value, path_choices, replacement):
    """Replace one node of ``value`` (chosen by the floats in ``path_choices``) with ``replacement``."""
    if not path_choices or not isinstance(value, (dict, list)) or not value:
        return replacement
    keys = list(value) if isinstance(value, dict) else list(range(len(value)))
    key = keys[int(path_choices[0] * (len(keys) - 1))]
    out = dict(value) if isinstance(value, dict) else list(value)
    out[key] = _mutate_json(value[key], path_choices[1:], replacement)
    return out


# -- NEFF ------------------------------------------------------------------------------------------

def fuzz_neff(base: Path, work: Path, examples: int) -> list[Trial]:
    """Mutated NEFFs into ``neuron_stack.isa.neff.load`` and, when it accepts one, ``neuron_stack.load``.

    Two kinds: raw byte damage (the archive as a whole), and a valid archive whose header or one
    member is changed with checksums recomputed (so the mutation reaches the parsers behind them).
    """
    import hashlib

    import neuron_stack
    from neuron_stack.isa import neff as neff_mod
    from neuron_stack.runtime.cores import CoreAllocationError

    data = base.read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = {n: z.read(n) for n in z.namelist()}
    header = json.loads(members["neff.json"])
    names = sorted(n for n in members if n != "neff.json")
    path = work / "fuzz.neff"
    allowed = (neff_mod.NeffError, CoreAllocationError)
    raw, deep = Tally("fuzz NEFF bytes"), Tally("fuzz NEFF members")

    def load_both():
        neff_mod.load(path)
        neuron_stack.load(path)   # what a user calls: the runtime must refuse with one line too

    @_settings(examples)
    @given(byte_mutations())
    def raw_case(ops):
        path.write_bytes(apply_mutations(data, ops))
        raw.check(lambda: neff_mod.load(path), allowed, f"bytes {ops!r}"[:120])

    @_settings(examples)
    @given(st.sampled_from(["neff.json", *names]), byte_mutations(),
           st.lists(st.floats(0, 1), max_size=4), json_values, st.booleans())
    def member_case(member, ops, where, value, as_json):
        new = dict(members)
        hdr = dict(header)
        if member == "neff.json" or (as_json and member.endswith(".json")):
            doc = json.loads(members[member]) if member != "neff.json" else hdr
            doc = _mutate_json(doc, where, value)
            blob = json.dumps(doc).encode()
        else:
            blob = apply_mutations(members[member], ops)
        if member == "neff.json":
            hdr = doc if isinstance(doc, dict) else hdr
            new["neff.json"] = blob
        else:
            new[member] = blob
            if isinstance(hdr.get("checksums"), dict):
                hdr["checksums"] = {**hdr["checksums"], member: hashlib.sha256(blob).hexdigest()}
            new["neff.json"] = json.dumps(hdr).encode()
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
            for n, b in new.items():
                z.writestr(n, b)
        deep.check(load_both, allowed, f"{member}: {value!r}"[:120])

    raw_case()
    member_case()
    return [raw.trial(), deep.trial()]


# -- profiles and segments ---------------------------------------------------------------------------

def _read_profile(path: Path) -> None:
    import traces
    with traces.open(path) as p:
        p.summary()
        p.sql("SELECT engine, count(*), sum(dur_ns) FROM instructions GROUP BY ALL")
        p.top_ops(5)
        p.utilization(buckets=50)


def fuzz_profile(session: Path, work: Path, examples: int) -> list[Trial]:
    """Mutated ``profile.duckdb`` files into ``traces.open`` + queries; mutated segments into ``finalize``."""
    import shutil

    import traces

    base = (session / "profile.duckdb").read_bytes()
    segs = sorted(p.name for p in session.glob("*.arrow"))
    db = work / "fuzz.duckdb"
    prof, seg = Tally("fuzz profile.duckdb"), Tally("fuzz segments")

    @_settings(examples)
    @given(byte_mutations())
    def db_case(ops):
        for junk in (db, Path(f"{db}.wal")):
            junk.unlink(missing_ok=True)
        db.write_bytes(apply_mutations(base, ops))
        prof.check(lambda: _read_profile(db), (traces.TraceError,), f"{ops!r}"[:120])

    seg_dir = work / "segs"

    @_settings(examples)
    @given(st.sampled_from(segs), byte_mutations(), st.booleans())
    def seg_case(name, ops, also_profile):
        shutil.rmtree(seg_dir, ignore_errors=True)
        seg_dir.mkdir(parents=True)
        for s in segs:
            os.link(session / s, seg_dir / s) if s != name else \
                (seg_dir / s).write_bytes(apply_mutations((session / s).read_bytes(), ops))

        def go():
            out = traces.finalize(seg_dir)
            if also_profile:
                _read_profile(out)
        seg.check(go, (traces.TraceError,), f"{name} {ops!r}"[:120])

    db_case()
    seg_case()
    return [prof.trial(), seg.trial()]


# -- monitor configs -----------------------------------------------------------------------------------

VALID_CONFIG = {
    "period": "1s",
    "neuron_runtimes": [{"tag_filter": "^train", "period": "2s", "metrics": [
        {"type": "neuroncore_counters"}, {"type": "memory_used"}, {"type": "neuron_runtime_vcpu_usage"},
        {"type": "execution_stats", "period": "500ms"}, {"type": "neuron_stack"}]}],
    "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"}, {"period": "2s", "type": "neuron_hw_counters"}],
}


def fuzz_monitor_config(work: Path, examples: int) -> list[Trial]:
    """Mutated neuron-monitor configs (structure-aware, raw text, raw bytes) into ``load_config``."""
    from monitor.config import ConfigError, load_config

    path = work / "monitor.json"
    tally = Tally("fuzz monitor configs")
    base = json.dumps(VALID_CONFIG).encode()

    @_settings(examples)
    @given(st.integers(0, 2), st.lists(st.floats(0, 1), max_size=5), json_values, byte_mutations(),
           st.sampled_from(["500ms", "1m30s", "0s", "-1s", "1e9h", "99999999999999h", "1.5.5s", "", "1", "ms",
                            "(", "[a-", "(?P<x", "a{99999}{99999}", "\x00", "😀"]))
    def case(kind, where, value, ops, token):
        if kind == 0:     # one node of a valid config replaced by any JSON value
            path.write_text(json.dumps(_mutate_json(VALID_CONFIG, where, value)))
        elif kind == 1:   # one node replaced by a tricky duration / regex / text
            path.write_text(json.dumps(_mutate_json(VALID_CONFIG, where, token)))
        else:             # damaged bytes
            path.write_bytes(apply_mutations(base, ops))
        tally.check(lambda: load_config(path), (ConfigError,), path.read_bytes()[:120].decode(errors="replace"))

    case()
    return [tally.trial()]


# -- Explorer requests ----------------------------------------------------------------------------------

HOSTILE_TEXT = ["../../../../etc/passwd", "/etc/passwd", "..%2f..%2f..%2fetc%2fpasswd", "%00", "\x00",
                "line:1 OR 1=1", "'; DROP TABLE ops; --", "op:-1", "module:" + "a." * 2000,
                "graph:99999999999999999999",
                "path:x/y", "9" * 400, "-1", "1e309", "NaN", "sel=line:1&sel=op:2", "😀" * 50, "A" * 100_000]


def _outputs(spec: str):
    parts = spec[2:-2].split("...") if spec.startswith("..") else [spec]
    out = [dict(zip(("id", "property"), p.rsplit(".", 1))) for p in parts]
    return out if spec.startswith("..") else out[0]


def fuzz_explorer_requests(app, work: Path, examples: int, profile_key: str) -> list[Trial]:
    """Random and hostile values into every Dash callback and page URL of a running app (Flask client).

    A request may be refused (4xx, or 204 when a callback ignores it) but never crash (500): Dash
    answers 500 when a callback raised, which means a traceback in the server log.
    """
    client = app.server.test_client()
    deps = [d for d in client.get("/_dash-dependencies").get_json()
            if not any(i["id"].startswith("{") for i in d["inputs"] + d.get("state", []))
            and not d["output"].startswith("{")]
    tally = Tally("fuzz Explorer requests")
    pages = ["/", "/timeline", "/hierarchy", "/source", "/fallbacks", "/recompiles", "/sql", "/compare"]
    params = ["profile", "start", "end", "sel", "file", "a", "b", "q", "page"]
    text = st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=40), st.integers().map(str),
                     st.just(profile_key))
    search = st.lists(st.tuples(st.sampled_from(params), text), max_size=5).map(
        lambda kv: "?" + "&".join(f"{k}={v}" for k, v in kv))

    class ServerError(Exception):
        pass

    def post(body):
        r = client.post("/_dash-update-component", json=body)
        if r.status_code >= 500:
            raise ServerError(f"HTTP {r.status_code} for callback {body['output'][:60]}")

    @_settings(examples)
    @given(st.sampled_from(deps), st.data())
    def callback_case(dep, data):
        def value_for(prop):
            if prop in ("pathname",):
                return data.draw(st.sampled_from(pages) | text)
            if prop == "search":
                return data.draw(search)
            return data.draw(json_values | text)
        inputs = [dict(i, value=value_for(i["property"])) for i in dep["inputs"]]
        state = [dict(s, value=value_for(s["property"])) for s in dep.get("state", [])]
        body = {"output": dep["output"], "outputs": _outputs(dep["output"]), "inputs": inputs, "state": state,
                "changedPropIds": [f"{inputs[0]['id']}.{inputs[0]['property']}"]}
        tally.check(lambda: post(body), (), f"{dep['output'][:40]} {str(inputs)[:80]}")

    @_settings(examples)
    @given(st.sampled_from(pages + ["/assets/../../../etc/passwd", "/_dash-component-suites/../../etc/passwd",
                                    "/static/../../etc/passwd", "/profile.duckdb", "/%2e%2e/%2e%2e/etc/passwd"]),
           search)
    def get_case(page, query):
        def go():
            r = client.get(page + query)
            if r.status_code >= 500:
                raise ServerError(f"HTTP {r.status_code} for GET {page}{query[:60]}")
            if b"root:x:0:0" in r.data:
                raise ServerError(f"GET {page} served /etc/passwd")
        tally.check(go, (), f"GET {page}{query}"[:120])

    callback_case()
    get_case()
    return [tally.trial()]


# -- special files as paths, huge values in environment variables, byte-heavy console SQL (issue 15) ----

@contextlib.contextmanager
def memory_bound(extra_bytes: int = 1 << 30):
    """Lower this process's address-space soft limit to what it uses now plus ``extra_bytes``.

    A reader that tries to slurp /dev/zero then gets ``MemoryError`` (a counted problem) instead of
    taking the machine down; the soft limit is restored afterwards (the hard one never changes).
    """
    import resource

    import psutil
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    bound = psutil.Process().memory_info().vms + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (bound if hard == resource.RLIM_INFINITY else min(bound, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def special_paths(work: Path) -> dict[str, Path]:
    """Paths that are not small regular files: a FIFO, devices, a directory, a sparse 1 GiB file, links."""
    work.mkdir(parents=True, exist_ok=True)
    fifo = work / "special.fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    sparse = work / "sparse.bin"
    with open(sparse, "wb") as f:
        f.truncate(1 << 30)
    link = work / "to-fifo"
    if not link.is_symlink():
        link.symlink_to(fifo)
    loop = work / "loop"
    if not loop.is_symlink():
        loop.symlink_to(loop)
    return {"fifo": fifo, "/dev/zero": Path("/dev/zero"), "/dev/urandom": Path("/dev/urandom"),
            "/dev/null": Path("/dev/null"), "directory": work, "sparse 1 GiB": sparse,
            "symlink to a FIFO": link, "symlink loop": loop, "missing": work / "missing.json"}


def fuzz_special_files(work: Path) -> list[Trial]:
    """Every path a user gives (monitor/top config, profile, NEFF, capture input, Explorer PROFILE, stdin of
    `sql P -` and the Prometheus exporter) as each special file."""
    import traces
    from explorer.view import resolve_profile
    from monitor.config import ConfigError, load_config
    from monitor.prometheus import input_lines
    from neuron_stack.isa.neff import NeffError
    from neuron_stack.isa.neff import load as load_neff
    from neuron_stack.tools.capture import CaptureError, read_input
    from traces.cli import _stdin_sql
    from traces.errors import TraceError

    def as_stdin(fn):
        """Run ``fn`` with ``path`` as stdin, opened as a shell's ``< path`` opens it."""
        def go(path):
            with open(path, "rb") as raw, _stdin(raw):
                return fn()
        return go

    readers = {"monitor/top config (-c)": (load_config, (ConfigError,)),
               "profile (traces.open)": (traces.open, (TraceError,)),
               "NEFF (load)": (load_neff, (NeffError,)),
               "capture input (NAME file.npy)": (lambda p: read_input("x", str(p), ((2,), "float32")),
                                                 (CaptureError,)),
               "Explorer view/diff/recommend PROFILE": (resolve_profile, (ValueError,)),
               "SQL on stdin (sql P - < path)": (as_stdin(_stdin_sql), (TraceError,)),
               # the first line only: the exporter keeps reading an endless stream, in bounded memory
               "Prometheus stdin (< path)": (as_stdin(lambda: next(input_lines(sys.stdin.buffer), None)), ())}
    tally = Tally("special files as paths")
    for what, path in special_paths(work / "special").items():
        for reader, (fn, allowed) in readers.items():
            if "stdin" in reader and not _shell_opens(path):
                continue   # `< path` fails (or, for a FIFO, waits) in the shell, before the command starts
            with memory_bound():
                tally.check(lambda: fn(path), allowed, f"{reader} <- {what}")
    return [tally.trial()]


def _shell_opens(path: Path) -> bool:
    """Whether a shell's ``< path`` would open ``path`` at once (not missing, a loop, a directory or a FIFO)."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISDIR(mode) or stat.S_ISFIFO(mode))


@contextlib.contextmanager
def _stdin(raw):
    """``sys.stdin`` reading the binary file ``raw``, decoded as Python decodes its own stdin."""
    old = sys.stdin
    sys.stdin = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape")
    try:
        yield
    finally:
        sys.stdin.detach()
        sys.stdin = old


ENV_READERS = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_CC_FLAGS", "NEURON_STACK_DIST_TIMEOUT",
               "RANK", "GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE")


def fuzz_env_values(examples: int) -> list[Trial]:
    """Huge ranges, long digit runs, non-ASCII digits and junk in every numeric/flag environment variable."""
    from neuron_stack.frontend.flags import FlagError, parse_flags
    from neuron_stack.runtime import cores, distributed

    def read(name: str, value: str):
        os.environ[name] = value
        try:
            if name == "NEURON_RT_VISIBLE_CORES":
                cores.parse_core_list(value, 32)
            elif name == "NEURON_RT_NUM_CORES":
                cores._env_num_cores()
            elif name == "NEURON_CC_FLAGS":
                parse_flags()
            elif name == "NEURON_STACK_DIST_TIMEOUT":
                distributed._env_timeout()
            else:   # torchrun's integers: the runtime and the recorder both read them with this
                distributed._env_int(name, 0)
        finally:
            del os.environ[name]

    digits = st.text("0123456789٣²０", min_size=1, max_size=12)
    huge = st.integers(0, 5000).map(lambda n: "9" * n)
    value = st.one_of(
        st.tuples(digits, huge).map(lambda t: f"{t[0]}-{t[1]}"),
        st.tuples(digits, digits).map(lambda t: f"{t[0]}-{t[1]}"),
        st.lists(digits, max_size=50).map(",".join),
        huge, digits, st.text(max_size=40),
        st.sampled_from(['"unbalanced', "'", "--target 'trn1", "inf", "nan", "-1", "1e309", "0-100000000",
                         "1," * 4000, "0-" + "9" * 100_000]))
    tally = Tally("huge and odd environment values")

    @_settings(examples)
    @given(st.sampled_from(ENV_READERS), value)
    def case(name, val):
        with memory_bound():
            tally.check(lambda: read(name, val.replace("\x00", "")),
                        (cores.CoreAllocationError, FlagError, distributed.DistributedError),
                        f"{name}={val[:40]!r}")

    case()
    return [tally.trial()]


def fuzz_console_bytes(loaded, examples: int) -> list[Trial]:
    """Byte-heavy SELECTs in the Explorer console: every answer stays within the byte caps."""
    from explorer import data
    from traces.console import MAX_CELL_BYTES, MAX_RESULT_BYTES, RefusedQuery

    tally = Tally("byte-heavy console SQL")
    templates = ["SELECT repeat('x', {n}) AS s FROM range({m})",
                 "SELECT string_agg(repeat('x', {n}), ',') AS s FROM range({m})",
                 "SELECT list(repeat('y', {n})) AS l FROM range({m})",
                 "SELECT repeat('é', {n}) AS a, repeat('b', {n}) AS a, {m} AS n FROM range({m})",
                 "SELECT CAST(repeat('z', {n}) AS BLOB) AS b FROM range({m})",
                 "SELECT {{'k': repeat('v', {n})}} AS s FROM range({m})"]

    def run(sql: str) -> None:
        res = data.run_console(loaded, sql)
        size = sum(len(str(v).encode()) for r in res["rows"] for v in r.values())
        cells = max((len(str(v).encode()) for r in res["rows"] for v in r.values()), default=0)
        if size > MAX_RESULT_BYTES + MAX_CELL_BYTES * len(res["columns"]) or cells > 2 * MAX_CELL_BYTES + 16:
            raise AssertionError(f"answer of {size} bytes (largest cell {cells})")

    @_settings(examples)
    @given(st.sampled_from(templates), st.integers(0, 200_000), st.integers(0, 3000))
    def case(template, n, m):
        sql = template.format(n=n, m=m)
        with memory_bound(2 << 30):
            tally.check(lambda: run(sql), (RefusedQuery, data.ExplorerError), sql)

    case()
    return [tally.trial()]


# -- issue 31: bounds on heavy SQL, regexes, periods and sizes -------------------------------------

def fuzz_bounds(loaded, examples: int) -> list[Trial]:
    """Issue 31's classes: console queries past the memory bound (alone and four at once), backtracking
    regexes as ``tag_filter`` against long tags, non-finite and huge periods, and huge, negative, zero
    or missing sizes for ``neuron-llm``. Each ends within the time bound with a result within its caps
    or one clear line; the serving process's memory stays flat (the console's worker holds the query).
    And executions overlapping at random on a core: busy is their union everywhere, never over 100 %."""
    import threading

    import psutil

    from explorer import data
    from monitor.config import ConfigError, parse_config
    from neuron_stack.llm.configs import ConfigError as LlmConfigError
    from neuron_stack.llm.configs import validate_projection
    from traces.console import MEMORY_BOUND_BYTES, RefusedQuery

    console, regex, period, sizes = (Tally("console past its bounds"), Tally("backtracking tag_filter"),
                                     Tally("monitor periods"), Tally("neuron-llm sizes"))
    heavy = ["SELECT repeat('x', {n}) || 'a' AS s", "SELECT repeat('x', {n}) AS s",
             "SELECT string_agg(repeat('x', {m}), ',') AS s FROM range({m})",
             "SELECT count(*) FROM range({n}), range({m})", "SELECT sum(length(repeat('y', {m}))) FROM range({n})"]
    server = psutil.Process()
    start_rss = server.memory_info().rss

    def ask(sql: str) -> None:
        data.run_console(loaded, sql)
        if server.memory_info().rss - start_rss > MEMORY_BOUND_BYTES:
            raise AssertionError(f"the server grew by {(server.memory_info().rss - start_rss) >> 20} MiB")

    @_settings(max(1, examples // 10))
    @given(st.sampled_from(heavy), st.integers(0, 2_000_000_000), st.integers(0, 100_000))
    def console_case(template, n, m):
        sql = template.format(n=n, m=m)
        console.check(lambda: ask(sql), (RefusedQuery, data.ExplorerError), sql)

    def four_at_once() -> None:
        errors: list[BaseException] = []

        def one():
            try:
                ask("SELECT repeat('x', 1000000000) || 'a' AS s")
            except data.ExplorerError as exc:
                if not one_line_ok(str(exc)):
                    errors.append(exc)
            except BaseException as exc:   # noqa: BLE001 (counted)
                errors.append(exc)
        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise AssertionError(f"{type(errors[0]).__name__}: {errors[0]}")

    patterns = ["^(a+)+$", "(a|a)*b", "(a*)*$", "^(([a-z])+.)+[A-Z]([a-z])+$", "(x+x+)+y", "(\\w+\\s?)+$"]
    tags = ["a" * 50_000 + "b", "x" * 50_000, "ab " * 20_000 + "!"]

    @_settings(examples)
    @given(st.one_of(st.sampled_from(patterns), st.text(max_size=40)), st.sampled_from(tags))
    def regex_case(pattern, tag):
        def run():
            cfg = parse_config({"neuron_runtimes": [{"tag_filter": pattern, "metrics": []}]})
            cfg.selector_for(tag)
        regex.check(run, (ConfigError,), f"tag_filter {pattern!r}"[:120])

    @_settings(examples)
    @given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30),
                     st.from_regex(r"\A[0-9]{1,400}(ns|ms|s|m|h)\Z")))
    def period_case(value):
        period.check(lambda: parse_config({"period": value}), (ConfigError,), f"period {value!r}"[:120])

    fields = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
              "num_key_value_heads")
    values = st.one_of(st.none(), st.integers(-10**18, 10**18), st.floats(allow_nan=True), st.booleans())

    @_settings(examples)
    @given(st.fixed_dictionaries({f: values for f in fields}), st.integers(-10**18, 10**18))
    def sizes_case(config, tp):
        cfg = {"model_type": "llama", **{k: v for k, v in config.items() if v is not None}}

        class Config:   # what validate_projection reads from a transformers config object
            def to_dict(self):
                return cfg
        sizes.check(lambda: validate_projection(Config(), tp_degree=tp, max_cores=64), (LlmConfigError,),
                    f"{cfg} --tp {tp}"[:120])

    busy = Tally("overlapping executions")
    execs = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1,
                     max_size=40)
    windows = st.lists(st.tuples(st.integers(-10**5, 2 * 10**6), st.integers(1, 2 * 10**6)), min_size=1, max_size=6)

    @_settings(max(1, examples // 20))
    @given(execs, windows)
    def busy_case(execs, windows):
        busy.check(lambda: check_overlapping_executions(execs, windows), (), f"{len(execs)} executions {execs[:3]}")

    console_case()
    console.check(four_at_once, (), "four heavy console queries at once")
    regex_case()
    period_case()
    sizes_case()
    busy_case()
    return [console.trial(), regex.trial(), period.trial(), sizes.trial(), busy.trial()]


def _union(intervals) -> int:
    """Length of the union of ``(start, end)`` intervals: the reference the product's unions must equal."""
    total, reach = 0, None
    for a, b in sorted(intervals):
        if reach is None or a > reach:
            total, reach = total + b - a, b
        elif b > reach:
            total, reach = total + b - reach, b
    return total


def check_overlapping_executions(execs, windows) -> None:
    """Executions ``(core, start, device ns)`` overlapping at random on up to three cores: each core's busy
    time is the union of its intervals in the Summary (``Profile.core_busy``), the live publisher and every
    replay window, and no monitor document shows a core over 100 %."""
    import tempfile

    import traces
    from monitor.replay import Replay
    from traces.live import LivePublisher, read_all
    from traces.writer import Writer

    base = 1_750_000_000_000_000_000
    by_core: dict[int, list] = {}
    for core, start, dur in execs:
        by_core.setdefault(core, []).append((start, start + dur))
    with tempfile.TemporaryDirectory() as d:
        w = Writer(d, run={"run_id": "r", "pid": 1, "tag": "t", "target": "trn1", "start_ns": base},
                   metadata={"target": "trn1"})
        w.append("executions", {"exec_id": list(range(1, len(execs) + 1)), "run_id": "r",
                                "core": [c for c, _, _ in execs], "start_ns": [base + s for _, s, _ in execs],
                                "end_ns": [base + s + n for _, s, n in execs], "device_ns": [n for _, _, n in execs],
                                "warmup": False, "status": "completed", "flops": 0})
        w.close(end_ns=base + 3 * 10**6)
        path = traces.finalize(d)
        with traces.open(path) as p:
            summary = {r["core"]: r["active_ns"] for r in p.core_busy(include_warmup=True).to_pylist()}
            for t0, length in windows:
                got = {r["core"]: r["busy_ns"] for r in p.replay_window(base + t0, base + t0 + length).busy}
                for core, spans in by_core.items():
                    clipped = [(max(a, t0), min(b, t0 + length)) for a, b in spans if min(b, t0 + length) > max(a, t0)]
                    want = _union(clipped)
                    if got.get(core, 0) != want or want > length:
                        raise AssertionError(f"window {t0}+{length} core {core}: busy {got.get(core)} != union {want}")
        for core, spans in by_core.items():
            if summary.get(core, 0) != _union(spans):
                raise AssertionError(f"core {core}: Summary busy {summary.get(core)} != union {_union(spans)}")
        with Replay(path, window_s=2e-4) as replay:
            for doc in replay:
                for rt in doc["neuron_runtime_data"]:
                    for core, c in rt["report"]["neuroncore_counters"]["neuroncores_in_use"].items():
                        if not 0.0 <= c["neuroncore_utilization"] <= 100.0:
                            raise AssertionError(f"replay core {core}: {c['neuroncore_utilization']} %")
        live = LivePublisher(tag="fuzz", target="trn1", directory=Path(d) / "live")
        try:   # the runtime records one core's executions in start order
            for core, start, dur in sorted(execs, key=lambda e: e[1]):
                live.record_execution(core, 0.0, base + start + dur, dur / 1e9, dur / 1e9, start_ns=base + start)
            live.flush()
            (snap,) = read_all(live.directory)
            for core, spans in by_core.items():
                if snap["core_stats"][str(core)]["active_ns"] != _union(spans):
                    raise AssertionError(f"live core {core}: {snap['core_stats'][str(core)]['active_ns']} "
                                         f"!= union {_union(spans)}")
        finally:
            live.close()
