"""A profile's display name: the user's (``neuron-explorer view --display-name``) or one made from what it recorded.

The default is the script the runs executed (``runs.command``) and how its graphs were built
(``graphs.kind``): ``aws_train.py · eager`` when every graph is an eager op, ``· compiled`` when
``torch.compile`` built graphs (the optimizer's eager ops beside them do not change that),
``· traced`` for ``neuron_stack.trace``, ``· nki`` for kernels run alone. ``finalize`` stores it as
metadata ``default_profile_name``; ``view --display-name`` stores the user's as ``profile_name``
(the real Metadata field); every picker shows :func:`display_name` of the metadata.

>>> default_name(["python aws_train.py compiled"], ["eager", "forward", "backward"])
'aws_train.py · compiled'
>>> default_name(["torchrun --nproc-per-node 2 -m my_pkg.train --lr 1e-3"], ["eager"])
'my_pkg.train · eager'
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from traces.errors import TraceError

#: Reads what :func:`default_name` needs: every run's command line and every graph kind.
NAME_SQL = ("SELECT (SELECT list(command ORDER BY start_ns) FROM runs) AS commands, "
            "(SELECT list(DISTINCT kind) FROM graphs) AS kinds")

#: ``graphs.kind`` → how the user built it (kinds not listed, such as ``collective``, say nothing).
MODES = {"forward": "compiled", "backward": "compiled", "inference": "compiled", "trace": "traced", "nki": "nki"}

#: The longest display name accepted (it sits in a picker).
MAX_NAME_CHARS = 80


def script_of(command: str | None) -> str | None:
    """The program a command line ran: its ``.py`` file's name, the module after ``-m``, else the executable.

    >>> script_of("/usr/bin/python3 -u /home/me/aws_train.py eager"), script_of("neuron-explorer inspect")
    ('aws_train.py', 'neuron-explorer')
    """
    try:
        words = shlex.split(command or "")
    except ValueError:
        words = (command or "").split()
    for i, w in enumerate(words):
        if w.endswith(".py"):
            return Path(w).name
        if w == "-m" and i + 1 < len(words):
            return words[i + 1]
    return Path(words[0]).name if words else None


def default_name(commands, kinds) -> str | None:
    """``<script> · <mode>`` from the runs' command lines and the graph kinds (None when neither says anything).

    The mode is every non-eager way graphs were built (``compiled``, ``traced``, ``nki``), or ``eager``
    when the graphs are eager ops only. Example at the top of the module.
    """
    scripts = list(dict.fromkeys(s for s in map(script_of, commands or []) if s))
    script = " + ".join(scripts[:2]) + (f" + {len(scripts) - 2} more" if len(scripts) > 2 else "")
    kinds = set(kinds or [])
    modes = sorted({MODES[k] for k in kinds if k in MODES})
    mode = " + ".join(modes) or ("eager" if "eager" in kinds else "")
    name = " · ".join(p for p in (script, mode) if p)
    return name[:MAX_NAME_CHARS] or None


def display_name(metadata: dict[str, str]) -> str | None:
    """The name a profile shows as: the user's ``profile_name``, else the recorded ``default_profile_name``.

    >>> display_name({"profile_name": "baseline", "default_profile_name": "t.py · eager"})
    'baseline'
    """
    return metadata.get("profile_name") or metadata.get("default_profile_name") or None


def checked_name(name: str) -> str:
    """A user's display name, stripped; one clear line for an empty, multi-line or over-long one.

    >>> checked_name("  eager baseline ")
    'eager baseline'
    """
    text = (name or "").strip()
    if not text or not text.isprintable() or len(text) > MAX_NAME_CHARS:
        raise TraceError(f"--display-name {name[:40]!r}: give 1 to {MAX_NAME_CHARS} printable characters "
                         "on one line, such as \"eager baseline\"")
    return text


def set_display_name(path, name: str) -> None:
    """Store ``name`` as ``profile_name`` in the metadata of the finalised profile at ``path``.

    It stays until the next ``--display-name`` (re-finalising the session from its segments keeps it).
    Raises :class:`TraceError` (one line) when the profile cannot be written, e.g. while another process
    has it open. Example: ``set_display_name("out/s/profile.duckdb", "compiled, bf16")``.
    """
    import duckdb

    name = checked_name(name)
    try:
        with duckdb.connect(str(path)) as con:
            con.execute("DELETE FROM metadata WHERE key = 'profile_name'")
            con.execute("INSERT INTO metadata VALUES ('profile_name', ?)", [name])
    except duckdb.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TraceError(f"cannot store the display name in {path}: {reason}; close other programs that have "
                         "it open (neuron-explorer view, sql) and run again") from None


def kept_name(path) -> dict[str, str]:
    """``{"profile_name": ...}`` of the profile at ``path`` when the user named it (``finalize`` carries it
    into the rebuilt profile), else ``{}``. Example: ``kept_name("out/s/profile.duckdb")``."""
    import duckdb

    if not os.path.isfile(path):
        return {}
    try:
        with duckdb.connect(str(path), read_only=True) as con:
            rows = con.execute("SELECT value FROM metadata WHERE key = 'profile_name'").fetchall()
    except duckdb.Error:   # unreadable or from another era: the rebuild starts unnamed
        return {}
    return {"profile_name": rows[0][0]} if rows and rows[0][0] else {}
