"""User SQL: the one place a user's own SQL text runs (``neuron-explorer sql``, the Explorer's console).

:func:`run_user_sql` runs it bounded: a row cap and a time limit (the query is interrupted).
With ``select_only`` (the shared console) it is also structurally checked, with three
independent locks, so one mistake does not open the profile (or the filesystem) to a query:
1. the statement is parsed by DuckDB itself: exactly one statement and it must be a SELECT
   (``WITH`` included); comments cannot hide a second statement because the parser sees them;
2. the parsed tree (``json_serialize_sql``) may only call table functions from an allow-list,
   so ``read_csv('/etc/passwd')``, ``glob``, ``read_text`` and friends are refused before running;
3. the connection itself is read-only, with external access disabled and its configuration locked
   (``traces.open(path, external_access=False)``), and results are capped at ``max_rows`` rows.

>>> check_select("SELECT 1")
'SELECT 1'
>>> check_select("DROP TABLE ops")
Traceback (most recent call last):
...
traces.console.RefusedQuery: only a single SELECT (or WITH ... SELECT) is allowed; got DROP
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pyarrow as pa

from traces.errors import OutOfMemory, TraceError
from traces.profile_schema import SCHEMA as REAL_SCHEMA

#: Table functions a console query may use: generators only, nothing that reads files or settings.
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})

#: Starting points offered by the Explorer's console (each passes the console's checks).
def table_query(table: str, limit: int = 100) -> str:
    """The console's first look at a table of ``main`` (the SQL page's schema inspector puts it in the editor);
    qualified, since user SQL resolves the real tool's names first (``metadata`` would be the wide ``Metadata``).

    >>> table_query("Flow")
    'SELECT * FROM main."Flow" LIMIT 100'
    """
    return f'SELECT * FROM main."{table.replace(chr(34), chr(34) * 2)}" LIMIT {int(limit)}'


EXAMPLE_QUERIES = {
    "Busy time per engine": "SELECT engine, count(*) AS instructions, sum(dur_ns) AS busy_ns\n"
                            "FROM instructions GROUP BY engine ORDER BY busy_ns DESC",
    "Costliest source lines": "SELECT s.file, s.line, sum(i.dur_ns) AS device_ns, count(*) AS instructions\n"
                              "FROM instructions i JOIN ops o USING (op_id) JOIN sources s USING (source_id)\n"
                              "WHERE i.engine <> 'cpu' GROUP BY ALL ORDER BY device_ns DESC LIMIT 20",
    "CPU fallbacks": "SELECT aten_op, fallback_reason, count(*) AS ops FROM ops\n"
                     "WHERE placement = 'cpu_fallback' GROUP BY ALL",
    "Recompiles": "SELECT name, input_signature, recompile_reason, compile_wall_ns FROM graphs\n"
                  "WHERE recompile_of IS NOT NULL ORDER BY compile_wall_ns DESC",
    "Tables": "SELECT table_name, table_type FROM information_schema.tables ORDER BY table_name",
}

#: The promise for one user query: the process's memory stays under this. The web console's worker process
#: and ``neuron-explorer sql`` (unless ``--unsafe``) are capped with ``RLIMIT_AS`` (:func:`cap_address_space`):
#: DuckDB's allocations past it fail with its own out-of-memory error (measured: a 1 GB ``repeat`` fails at
#: once instead of running 49 s at 4 GB).
MEMORY_BOUND_BYTES = 1 << 30
#: DuckDB's own bounds on a user-SQL connection, inside the address-space cap: its buffer manager
#: refuses first (with a message naming the limit), and a query cannot take every core.
DUCKDB_LIMITS = {"memory_limit": "512MB", "threads": 2}
#: The web console's worker is killed when a query has not answered this long after its time limit
#: (DuckDB checks the interrupt between chunks; one huge value can take longer).
KILL_GRACE_S = 5.0
#: A worker that has not started within this long is a failure (a fresh interpreter and DuckDB).
START_TIMEOUT_S = 60.0

MAX_SQL_CHARS = 20_000
DEFAULT_ROW_LIMIT = 1000
#: A console cell longer than this (bytes of its text) is cut and ends in "…": one
#: ``string_agg`` over a big range would otherwise send hundreds of MB to a browser.
MAX_CELL_BYTES = 4096
#: A console result stops (``truncated``) before its cells pass this many bytes in total.
MAX_RESULT_BYTES = 2 << 20


class RefusedQuery(TraceError):
    """A console query that was not run; the message says why and what is allowed."""


def check_select(sql: str) -> str:
    """Return the single SELECT statement in ``sql`` (comments kept, trailing ``;`` dropped).

    Raises :class:`RefusedQuery` for anything else. Example: ``check_select("WITH x AS (SELECT 1) SELECT * FROM x")``.
    """
    import duckdb

    if not isinstance(sql, str) or not sql.strip():
        raise RefusedQuery("empty query: type a SELECT statement")
    if len(sql) > MAX_SQL_CHARS:
        raise RefusedQuery(f"query is {len(sql)} characters; the console accepts at most {MAX_SQL_CHARS}")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise RefusedQuery(f"syntax error: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise RefusedQuery(f"only one statement is allowed; got {len(statements)}")
    kind = statements[0].type.name
    if kind != "SELECT":
        raise RefusedQuery(f"only a single SELECT (or WITH ... SELECT) is allowed; got {kind}")
    return statements[0].query.strip().rstrip(";").strip()


def check_tree(tree_json: str) -> None:
    """Refuse a serialised statement tree that calls a non-allowed table function.

    ``tree_json`` is the output of DuckDB's ``json_serialize_sql(query)``.
    Example: ``check_tree(json.dumps({"error": False, "statements": []}))``.
    """
    tree = json.loads(tree_json)
    if tree.get("error"):
        raise RefusedQuery(f"syntax error: {tree.get('error_message', 'could not parse the query')}")
    bad = sorted({name for name in _table_functions(tree) if name.lower() not in ALLOWED_TABLE_FUNCTIONS})
    if bad:
        raise RefusedQuery(f"table function {bad[0]}() is not allowed in the console; "
                           "query the profile's tables (allowed generators: "
                           f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))})")


def _table_functions(node):
    """Yield the names of every TABLE_FUNCTION anywhere in a parsed tree."""
    if isinstance(node, dict):
        if node.get("type") == "TABLE_FUNCTION":
            fn = node.get("function") or {}
            yield str(fn.get("function_name", "?"))
        for value in node.values():
            yield from _table_functions(value)
    elif isinstance(node, list):
        for value in node:
            yield from _table_functions(value)


def limited(sql: str, limit: int) -> str:
    """Wrap a checked SELECT so that at most ``limit + 1`` rows come back (the +1 tells "truncated").

    The newline before ``)`` keeps a trailing ``-- comment`` from swallowing the wrapper.
    >>> limited("SELECT 1", 10)
    'SELECT * FROM (\\nSELECT 1\\n) AS console_query LIMIT 11'
    """
    return f"SELECT * FROM (\n{sql}\n) AS console_query LIMIT {int(limit) + 1}"




def capped_cells(sql: str, columns: list[tuple[str, str]], cap: int = MAX_CELL_BYTES) -> str:
    """Wrap a checked SELECT so that no text cell is longer than ``cap`` bytes (cut ones end in "…").

    ``columns`` are the query's ``(name, type)`` from ``DESCRIBE``; numbers, booleans and times pass
    as they are, anything else (text, blobs, lists, structs) is cut as text inside DuckDB, before it
    is fetched. Columns are renamed positionally so that duplicate names cannot clash.
    >>> print(capped_cells("SELECT 1 AS n", [("n", "INTEGER")]))
    SELECT c0 AS "n" FROM (
    SELECT 1 AS n
    ) AS capped(c0)
    """
    keep = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
            "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "BOOLEAN", "DATE", "TIMESTAMP", "DECIMAL")
    cols = []
    for i, (name, kind) in enumerate(columns):
        alias = '"' + name.replace('"', '""') + '"'
        if kind.upper().split("(")[0] in keep:
            cols.append(f"c{i} AS {alias}")
        else:
            text = f"CAST(c{i} AS VARCHAR)"
            cols.append(f"CASE WHEN strlen({text}) > {int(cap)} THEN left({text}, {int(cap)}) || '…' "
                        f"ELSE {text} END AS {alias}")
    names = ", ".join(f"c{i}" for i in range(len(columns)))
    return f"SELECT {', '.join(cols)} FROM (\n{sql}\n) AS capped({names})"


def _rows_within(table: pa.Table, max_bytes: int) -> int:
    """How many leading rows of ``table`` fit in ``max_bytes`` of cell text (at least one row)."""
    total = 0
    for i, row in enumerate(table.to_pylist()):
        total += sum(len(str(v).encode()) for v in row.values())
        if total > max_bytes:
            return max(i, 1)
    return table.num_rows


@dataclass(frozen=True)
class UserResult:
    """A user query's result: at most the asked-for rows, and whether more existed."""

    table: pa.Table
    truncated: bool


def run_user_sql(profile, sql: str, params=None, *, select_only: bool = False, max_rows: int | None = None,
                 timeout_s: float | None = None, max_bytes: int | None = None) -> UserResult:
    """Run the user's ``sql`` over ``profile`` (values in ``params``), bounded; the only place user SQL runs.

    ``select_only``: refuse anything but one SELECT calling allowed table functions
    (:class:`RefusedQuery`); ``max_rows``: keep at most that many rows (``truncated`` says more
    existed); ``timeout_s``: interrupt the query after that long (:class:`TraceError` naming the
    limit); ``max_bytes`` (with ``select_only``): cut each text cell at :data:`MAX_CELL_BYTES` inside
    DuckDB and stop the result (``truncated``) before its cells pass ``max_bytes``.
    Example: ``run_user_sql(p, "SELECT count(*) FROM instructions", max_rows=10).table``.
    """
    if not isinstance(sql, str) or not sql.strip():
        raise RefusedQuery("empty SQL statement: pass a query such as \"SELECT * FROM summary\"")
    with real_names_first(profile):
        return _run(profile, sql, params, select_only, max_rows, timeout_s, max_bytes)


@contextlib.contextmanager
def real_names_first(profile):
    """User SQL resolves a name in the real tool's schema first (``neuron_explorer``, then ``main``): DuckDB names
    are case-insensitive, so ``Metadata`` and ``Summary`` could not otherwise be the real tables beside our
    ``metadata`` (key/value: ``main.metadata`` here) and ``summary``. Only this thread's cursor, for this query."""
    cur = profile._cursor()
    real = profile.sql("SELECT count(*) AS n FROM duckdb_schemas() WHERE schema_name = ?",
                       [REAL_SCHEMA]).column(0)[0].as_py()
    if real:
        cur.execute(f"SET search_path = '{REAL_SCHEMA},main'")
    try:
        yield
    finally:
        if real:
            cur.execute("RESET search_path")


def _run(profile, sql, params, select_only, max_rows, timeout_s, max_bytes) -> UserResult:
    """:func:`run_user_sql` once the names resolve."""
    if select_only:
        sql = check_select(sql)
        check_tree(profile.sql("SELECT json_serialize_sql($q) AS tree", {"q": sql}).column(0)[0].as_py())
    if max_bytes is not None and select_only:
        columns = profile.sql(f"DESCRIBE {sql}").select(["column_name", "column_type"]).to_pylist()
        sql = capped_cells(sql, [(c["column_name"], c["column_type"]) for c in columns])
    if max_rows is not None:
        max_rows = max(0, int(max_rows))
        if select_only:
            sql = limited(sql, max_rows)
    # this thread's cursor runs the query below, so the timer interrupts this query only
    timer = threading.Timer(timeout_s, profile._cursor().interrupt) if timeout_s else None
    if timer is not None:
        timer.start()
    try:
        table = profile.sql(sql, params)
    except OutOfMemory:
        raise OutOfMemory(f"query needed more than its memory bound ({MEMORY_BOUND_BYTES >> 20} MiB): narrow it "
                          "(a WHERE on start_ns, fewer or shorter columns)") from None
    except TraceError:
        if timer is not None and not timer.is_alive():
            raise TraceError(f"query stopped after {timeout_s:g} s: narrow it (a WHERE on start_ns, a smaller "
                             "range)") from None
        raise
    finally:
        if timer is not None:
            timer.cancel()
    truncated = False
    if max_rows is not None:
        truncated = table.num_rows > max_rows
        table = table.slice(0, max_rows)
    if max_bytes is not None:
        keep = _rows_within(table, max_bytes)
        truncated = truncated or keep < table.num_rows
        table = table.slice(0, keep)
    return UserResult(table, truncated)


def cap_address_space(extra_bytes: int | None = None) -> int:
    """Cap this process's address space (``RLIMIT_AS``) at its current size plus ``extra_bytes``; returns the cap.

    For a process that runs user SQL: an allocation past the cap fails (DuckDB raises its
    out-of-memory error, Python ``MemoryError``) instead of growing the machine's memory. By default the
    process's peak memory stays under :data:`MEMORY_BOUND_BYTES`: new allocations get that bound less what the
    process already holds (its resident set), since what it holds counts too.
    Example: ``cap_address_space(1 << 30)`` (for good: a process cannot raise it back).
    """
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/statm") as f:
        size, resident = (int(x) * page for x in f.read().split()[:2])
    if extra_bytes is None:
        extra_bytes = max(MEMORY_BOUND_BYTES - resident, MEMORY_BOUND_BYTES // 4)
    cap = size + int(extra_bytes)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap


class ConsoleWorker:
    """Runs checked console queries for one profile in a child process whose address space is capped.

    The web console's bound by construction: a query's memory cannot reach the server (the child has
    :data:`MEMORY_BOUND_BYTES` above its start), a query that outlives its time limit by
    :data:`KILL_GRACE_S` is killed with its process, and a worker that dies is started again for the
    next query; each failure is one :class:`TraceError` line. Queries to one profile run one at a
    time; one that waits longer than its time limit for the worker is refused (the console is busy).

    >>> import tempfile, traces.synthetic
    >>> d = tempfile.mkdtemp()
    >>> _ = traces.synthetic.write_run(d, executions=2, instructions=10)
    >>> w = ConsoleWorker(traces.finalize(d))
    >>> w.run("SELECT count(*) AS n FROM executions", max_rows=10, timeout_s=30).table.to_pylist()
    [{'n': 2}]
    >>> w.close()
    """

    def __init__(self, path, memory_bytes: int = MEMORY_BOUND_BYTES):
        self.path, self.memory_bytes = str(path), int(memory_bytes)
        self._proc: subprocess.Popen | None = None
        self._answered = 0      # queries the running worker has answered: its memory is no longer as it started
        self._buf = b""
        self._lock = threading.Lock()

    def run(self, sql: str, *, max_rows: int, timeout_s: float, max_bytes: int | None = None) -> UserResult:
        """Run one checked SELECT in the worker (see :func:`run_user_sql` for the arguments)."""
        check_select(sql)   # cheap refusals without a round trip
        if not self._lock.acquire(timeout=timeout_s):
            raise TraceError(f"the console is busy with another query for more than {timeout_s:g} s: "
                             "try again when it has finished")
        try:
            try:
                return self._run(sql, max_rows, timeout_s, max_bytes)
            except OutOfMemory:
                if self._answered == 0:
                    raise
            # earlier queries left the worker's heap fragmented: the bound is the query's, so a fresh worker tries once
            self.close()
            return self._run(sql, max_rows, timeout_s, max_bytes)
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop the worker (it also stops by itself when this process exits: its stdin closes)."""
        proc, self._proc, self._buf, self._answered = self._proc, None, b"", 0
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                pipe.close()

    def _run(self, sql, max_rows, timeout_s, max_bytes) -> UserResult:
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._start()
        request = {"sql": sql, "max_rows": max_rows, "timeout_s": timeout_s, "max_bytes": max_bytes}
        try:
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            self._proc.stdin.flush()
            head = json.loads(self._read_line(time.monotonic() + timeout_s + KILL_GRACE_S))
            if "error" in head:
                raise (RefusedQuery if head.get("refused") else
                       OutOfMemory if head.get("out_of_memory") else TraceError)(head["error"])
            body = self._read_exact(head["size"], time.monotonic() + KILL_GRACE_S)
        except TimeoutError:
            self.close()
            raise TraceError(f"query stopped after {timeout_s:g} s: narrow it (a WHERE on start_ns, a smaller "
                             "range) or run it with neuron-explorer sql") from None
        except (EOFError, OSError, ValueError):
            self.close()
            raise TraceError(f"query stopped: it needed more than the console's {self.memory_bytes >> 20} MiB of "
                             "memory; narrow it (a WHERE on start_ns, fewer or shorter columns)") from None
        import pyarrow.ipc as ipc

        self._answered += 1
        return UserResult(ipc.open_stream(body).read_all(), bool(head["truncated"]))

    def _start(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # importable as in this process
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "traces.console_worker", self.path, str(self.memory_bytes)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      env=env, close_fds=True)
        try:
            ready = json.loads(self._read_line(time.monotonic() + START_TIMEOUT_S))
        except (TimeoutError, EOFError, OSError, ValueError):
            self.close()
            raise TraceError(f"the console's query process did not start within {START_TIMEOUT_S:g} s: "
                             "try again, or use neuron-explorer sql") from None
        if "error" in ready:
            self.close()
            raise TraceError(ready["error"])

    def _fill(self, deadline: float) -> None:
        """Read what the worker has sent, waiting at most until ``deadline``."""
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            if not sel.select(max(0.0, deadline - time.monotonic())):
                raise TimeoutError
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise EOFError
        self._buf += chunk

    def _read_line(self, deadline: float) -> bytes:
        while b"\n" not in self._buf:
            self._fill(deadline)
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _read_exact(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            self._fill(deadline)
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

