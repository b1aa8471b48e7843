"""Annotations: notes on a profile's timeline (a point or a range, with text), stored in the profile.

They live in the profile's ``metadata`` table under the key ``annotations`` (one JSON list), so they travel
with the ``profile.duckdb`` file and need no schema change (a profile re-finalised from its segments starts
without them, as it starts without anything added after finalise). Times are absolute ns on the
profile's projected clock, like every other time in it. ``neuron-explorer summary`` lists them; the
Explorer's timeline draws them and adds or deletes them (``explorer/annotations.py``).

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=2, instructions=50)
>>> with traces.open(d) as p:           # finalises the session into profile.duckdb
...     path = p.path
>>> a = add(path, 1_000, 1_000, "slow step starts")
>>> (a["kind"], a["text"]), [x["id"] for x in read(path)] == [a["id"]]
(('point', 'slow step starts'), True)
>>> delete(path, a["id"]); read(path)
[]
"""
from __future__ import annotations

import json

from traces.errors import TraceError

#: The metadata key that holds a profile's annotations (a JSON list).
KEY = "annotations"
#: Bounds on what a user can store: text per annotation, annotations per profile.
MAX_TEXT = 200
MAX_ANNOTATIONS = 500


def parse(value: str | None) -> list[dict]:
    """The annotations stored as ``value`` (the metadata row), each ``{"id", "start_ns", "end_ns", "kind",
    "text"}`` in time order; malformed entries are skipped (the file may have been edited by hand).

    >>> parse('[{"id": 1, "start_ns": 5, "end_ns": 9, "text": "x"}]')[0]["kind"]
    'range'
    """
    try:
        items = json.loads(value or "[]")
    except ValueError:
        return []
    out = []
    for a in items if isinstance(items, list) else []:
        try:
            s, e = int(a["start_ns"]), int(a["end_ns"])
            out.append({"id": int(a["id"]), "start_ns": min(s, e), "end_ns": max(s, e),
                        "kind": "point" if s == e else "range", "text": str(a.get("text", ""))[:MAX_TEXT]})
        except (KeyError, TypeError, ValueError):
            continue
    return sorted(out, key=lambda a: (a["start_ns"], a["id"]))


def of(p) -> list[dict]:
    """The annotations of an open profile (``traces.Profile``). Example: ``of(p)[0]["text"]``."""
    return parse(p.metadata().get(KEY))


def read(path) -> list[dict]:
    """The annotations of the profile at ``path``. Example: ``read("out/s/profile.duckdb")``."""
    import duckdb

    try:
        with duckdb.connect(str(path), read_only=True) as con:
            rows = con.execute("SELECT value FROM metadata WHERE key = ?", [KEY]).fetchall()
    except duckdb.Error as exc:
        raise TraceError(f"cannot read the annotations of {path}: {_reason(exc)}") from None
    return parse(rows[0][0] if rows else None)


def checked_text(text) -> str:
    """The text of an annotation: 1 to ``MAX_TEXT`` printable characters on one line.

    >>> checked_text("  all-reduce waits here ")
    'all-reduce waits here'
    """
    t = str(text or "").strip()
    if not t or len(t) > MAX_TEXT or not t.isprintable():
        raise TraceError(f"an annotation's text is 1 to {MAX_TEXT} printable characters on one line, "
                         "such as \"slow all-reduce\"")
    return t


def add(path, start_ns: int, end_ns: int, text: str) -> dict:
    """Store an annotation (a point when ``start_ns == end_ns``, else a range) in the profile at ``path``;
    returns it. Raises :class:`TraceError` (one line) for bad text, too many annotations, or a profile
    another program holds open."""
    text = checked_text(text)
    s, e = sorted((int(start_ns), int(end_ns)))

    def change(items):
        if len(items) >= MAX_ANNOTATIONS:
            raise TraceError(f"the profile holds {MAX_ANNOTATIONS} annotations, the most it keeps: delete some")
        items.append({"id": max((a["id"] for a in items), default=0) + 1, "start_ns": s, "end_ns": e,
                      "text": text})
        return items
    return _last_added(_write(path, change))


def delete(path, ann_id: int) -> None:
    """Delete the annotation ``ann_id`` from the profile at ``path`` (a missing one is an error)."""
    def change(items):
        kept = [a for a in items if a["id"] != int(ann_id)]
        if len(kept) == len(items):
            raise TraceError(f"the profile has no annotation {int(ann_id)}")
        return kept
    _write(path, change)


#: The profile manager's marks, stored beside the display name in ``metadata`` (``explorer/manager.py``).
MARKS = ("explorer_favourite", "explorer_folder")


def set_mark(path, key: str, value: str) -> None:
    """Store (or with ``value`` '' remove) one of :data:`MARKS` in the profile at ``path``.
    Example: ``set_mark("out/s/profile.duckdb", "explorer_folder", "runs/bf16")``."""
    import duckdb

    if key not in MARKS:
        raise TraceError(f"{key!r} is not a profile mark; use one of {', '.join(MARKS)}")
    try:
        with duckdb.connect(str(path)) as con:
            con.execute("DELETE FROM metadata WHERE key = ?", [key])
            if value:
                con.execute("INSERT INTO metadata VALUES (?, ?)", [key, str(value)[:MAX_TEXT]])
    except duckdb.Error as exc:
        raise TraceError(f"cannot write {path}: {_reason(exc)}; close other programs that have it open") from None


def _last_added(items: list[dict]) -> dict:
    return max(items, key=lambda a: a["id"])


def _write(path, change) -> list[dict]:
    import duckdb

    try:
        with duckdb.connect(str(path)) as con:
            rows = con.execute("SELECT value FROM metadata WHERE key = ?", [KEY]).fetchall()
            items = change(parse(rows[0][0] if rows else None))
            con.execute("DELETE FROM metadata WHERE key = ?", [KEY])
            con.execute("INSERT INTO metadata VALUES (?, ?)",
                        [KEY, json.dumps([{k: a[k] for k in ("id", "start_ns", "end_ns", "text")} for a in items])])
    except duckdb.Error as exc:
        raise TraceError(f"cannot store annotations in {path}: {_reason(exc)}; close other programs that have "
                         "it open (neuron-explorer sql, another view) and try again") from None
    return parse(json.dumps(items))


def _reason(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
