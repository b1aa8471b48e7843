"""The SQL console's gatekeeper: one read-only SELECT over the profile, structurally checked.

Three independent locks, so one mistake does not open the profile (or the filesystem) to a query:
1. the statement is parsed by DuckDB itself: exactly one statement and it must be a SELECT
   (``WITH`` included); comments cannot hide a second statement because the parser sees them;
2. the parsed tree (``json_serialize_sql``) may only call table functions from an allow-list,
   so ``read_csv('/etc/passwd')``, ``glob``, ``read_text`` and friends are refused before running;
3. the connection itself is read-only and has external access disabled and its configuration
   locked (see :func:`harden`), and results are capped at ``limit`` rows.

>>> check_select("SELECT 1")
'SELECT 1'
>>> check_select("DROP TABLE ops")
Traceback (most recent call last):
...
explorer.sqlguard.RefusedQuery: only a single SELECT (or WITH ... SELECT) is allowed; got DROP
"""
from __future__ import annotations

import json

#: Table functions a console query may use: generators only, nothing that reads files or settings.
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})

MAX_SQL_CHARS = 20_000
DEFAULT_ROW_LIMIT = 1000


class RefusedQuery(ValueError):
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
                           f"query the profile's tables (allowed generators: {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))})")


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


HARDEN_STATEMENTS = (("enable_external_access", "SET enable_external_access = false"),
                     ("lock_configuration", "SET lock_configuration = true"))
"""Run once on the Explorer's connection: no file access from SQL, and no way to undo that."""
