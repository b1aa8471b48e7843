"""One query layer: the readers (explorer/, top/, monitor/) hold no SQL text; every query is a method
of the ``traces`` query API, and the user's own SQL runs only through ``traces.console.run_user_sql``."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READERS = ("explorer", "top", "monitor")

SQL = re.compile(r"""
      \bSELECT\b[\s\S]*?\bFROM\b          # a query
    | \bCREATE\s+(OR\s+REPLACE\s+)?(TEMP\w*\s+)?(TABLE|VIEW|MACRO|INDEX|SEQUENCE|SCHEMA)\b
    | \bINSERT\s+INTO\b
    | \bCOPY\b[\s\S]*?\b(TO|FROM)\b
    | \bWITH\b\s+(RECURSIVE\s+)?\w+\s+AS\s*\(   # a common table expression
""", re.IGNORECASE | re.VERBOSE)


def sql_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant in ``path`` that reads as SQL (f-string parts included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else " x "
                           for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if SQL.search(text):
            found.append((node.lineno, " ".join(text.split())[:80]))
    return found


def test_the_scanner_finds_sql_in_every_form(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('a = "SELECT x FROM t"\nb = f"""\n  select {c} from {t}"""\nc = "CREATE TEMP TABLE t AS 1"\n'
                      'd = "insert into t values (1)"\ne = "COPY t TO \'x.csv\'"\nf = "WITH w AS (SELECT 1) SELECT 2"\n'
                      'g = "select the lines from the file"\nh = "Press SELECT to choose"\n')
    lines = [line for line, _ in sql_strings(sample)]
    # prose that happens to say "select ... from" is flagged too: the readers say it differently
    assert lines == [1, 2, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("package", READERS)
def test_readers_hold_no_sql(package):
    offenders = [f"{path.relative_to(ROOT)}:{line}: {text}"
                 for path in sorted((ROOT / package).rglob("*.py")) for line, text in sql_strings(path)]
    assert not offenders, ("SQL text outside traces/ (add a traces query method instead):\n  "
                           + "\n  ".join(offenders))
