"""Writing a bench's figures into the docs: the block between its two generated markers, nothing else.

A helper the ``--write`` benches share (not a bench: the leading underscore keeps it out of
tests/test_bench_smoke.py's list). Importing it costs nothing (no torch).

>>> markers("bench/top.py")[0]
'<!-- begin: written by bench/top.py --write; do not edit by hand -->'
"""
from __future__ import annotations

import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def markers(script: str) -> tuple[str, str]:
    """The begin and end markers of the block ``script`` (``bench/NAME.py``) owns in a docs page."""
    return (f"<!-- begin: written by {script} --write; do not edit by hand -->",
            f"<!-- end: written by {script} --write -->")


def conditions(command: str, loads: tuple[float, float]) -> str:
    """The line a written block opens with: the command, the date and the load average before and after.

    >>> "load average 0.5 before and 0.7 after" in conditions("bench/x.py", (0.5, 0.7))
    True
    """
    return (f"`.venv/bin/python {command}`, {time.strftime('%Y-%m-%d', time.gmtime())}, load average "
            f"{loads[0]:.1f} before and {loads[1]:.1f} after on {os.cpu_count()} CPUs")


def write_block(page: Path, script: str, text: str) -> None:
    """Replace the block between ``script``'s markers in ``page`` with ``text``; a page without them is an
    error naming the markers to add."""
    begin, end = markers(script)
    head, sep, rest = page.read_text().partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise SystemExit(f"{page.relative_to(ROOT)} has no {begin} ... {end} block to write into")
    page.write_text(f"{head}{begin}\n{text}\n{end}{tail}")
    print(f"wrote {page.relative_to(ROOT)}")
