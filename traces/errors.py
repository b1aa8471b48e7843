"""The one exception type of the trace store, and the guard every command-line tool runs under.

>>> run_guarded("demo", lambda: 0)
0
"""
from __future__ import annotations

import os
import sys


class TraceError(Exception):
    """Any failure reading or writing traces; its message is one line naming the problem and the fix."""


class OutOfMemory(TraceError):
    """A query that needed more memory than its bound (DuckDB's ``OutOfMemoryException``)."""


def run_guarded(prog: str, fn) -> int:
    """Run ``fn() -> int|None``; any exception becomes ``prog: error: <message>`` on stderr, exit 1.

    Set ``NEURON_STACK_DEBUG=1`` to get the traceback instead. A closed stdout pipe
    (``... | head``) is not an error.
    """
    try:
        return int(fn() or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except SystemExit:
        raise
    except Exception as exc:  # the single place that turns failures into one line
        if os.environ.get("NEURON_STACK_DEBUG"):
            raise
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 1


def one_line(exc: BaseException) -> str:
    r"""The first line of an error message (DuckDB's "Did you mean" hint kept on the same line).

    >>> one_line(ValueError("Catalog Error: no table x\n\nDid you mean \"y\"?"))
    'Catalog Error: no table x Did you mean "y"?'
    """
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    hint = next((ln for ln in lines[1:] if ln.startswith("Did you mean")), "")
    return f"{lines[0]} {hint}".strip()
