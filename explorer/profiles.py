"""The profiles an Explorer server may read, by key, and the checks every request parameter passes.

The pages never touch DuckDB or the filesystem: they name a profile by the *key* the server gave it
(``?profile=mlp``), and this module maps that key to a file given on the command line. Anything a
request carries (time range, selection, row limit) is validated here before it reaches a query.

>>> reg = Registry([])          # the server builds one from the command line
>>> reg.keys()
[]
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path


class ExplorerError(Exception):
    """A request the Explorer cannot serve; the message is one line for the page to show."""


# ----------------------------------------------------------------------------------------- profiles
@dataclass
class Entry:
    key: str
    path: Path
    error: str = ""


class Loaded:
    """One open profile: the ``traces`` Profile and a cache (Dash serves requests on threads).

    Profiles never change after finalising, so derived answers are cached for the server's life.
    Example: ``Loaded("mlp", Path("output/s/profile.duckdb")).profile.figures()``.
    """

    def __init__(self, key: str, path: Path):
        import traces

        self.key, self.path = key, path
        # external_access=False: no query can read or write any other file, and that setting is locked
        self.profile = traces.open(path, external_access=False)
        self.name = self.profile.display_name() or key   # what every picker shows
        self.lock = threading.RLock()
        self._cache: dict = {}

    def cached(self, name, fn):
        with self.lock:
            if name not in self._cache:
                self._cache[name] = fn()
            return self._cache[name]

    def close(self):
        with self.lock:
            worker = self._cache.pop("console_worker", None)   # the SQL console's process, if started
            if worker is not None:
                worker.close()
            self.profile.close()


class Registry:
    """The profiles this server may read: exactly the files named on the command line.

    Keys are short names derived from the session directory (``20251121-101500_mlp``) or the file
    stem; requests use only keys, so no request can name a path.
    >>> Registry([]).get("x")
    Traceback (most recent call last):
    ...
    explorer.profiles.ExplorerError: unknown profile 'x'; open one of: (none given)
    """

    def __init__(self, paths):
        self.entries: dict[str, Entry] = {}
        self._loaded: dict[str, Loaded] = {}
        self._lock = threading.RLock()
        for p in paths:
            self.add(p)

    def add(self, p) -> str:
        """Serve one more profile file (an upload); returns its key, derived from its session directory."""
        path = Path(p).resolve()
        base = path.parent.name if path.name == "profile.duckdb" else path.stem
        base = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.") or "profile"
        key, n = base, 2
        with self._lock:
            while key in self.entries:
                key, n = f"{base}-{n}", n + 1
            self.entries[key] = Entry(key, path)
        return key

    def remove(self, key) -> None:
        """Stop serving ``key`` (its file is closed; the caller deletes it)."""
        with self._lock:
            loaded = self._loaded.pop(key, None)
            if loaded is not None:
                loaded.close()
            self.entries.pop(key, None)

    def keys(self) -> list[str]:
        return list(self.entries)

    def label(self, key: str) -> str:
        """What a picker shows for ``key``: the profile's display name (``aws_train.py · eager``, or the
        user's ``view --display-name``), with the key beside it when another profile has the same name;
        the key alone for a profile that cannot be opened."""
        labels = {k: self._name(k) for k in self.entries}
        name = labels.get(key, key)
        if name != key and sum(v == name for v in labels.values()) > 1:
            name = f"{name} ({key})"
        return name

    def _name(self, key: str) -> str:
        if self.entries[key].error:
            return key
        try:
            return self.get(key).name
        except ExplorerError:
            return key

    def default_key(self) -> str | None:
        return next(iter(self.entries), None)

    def get(self, key) -> Loaded:
        if not isinstance(key, str) or key not in self.entries:
            known = ", ".join(self.entries) or "(none given)"
            raise ExplorerError(f"unknown profile {str(key)[:60]!r}; open one of: {known}")
        with self._lock:
            if key not in self._loaded:
                entry = self.entries[key]
                try:
                    self._loaded[key] = Loaded(key, entry.path)
                except Exception as exc:  # a bad profile must not take the server down
                    entry.error = _one_line(exc)
                    raise ExplorerError(f"profile {key!r} ({entry.path.name}) cannot be opened: "
                                        f"{entry.error}") from None
            return self._loaded[key]

    def write(self, key, change):
        """Run ``change(path)`` (it writes the profile file: an annotation, a display name) with the profile
        closed, its console worker too, so the next request reopens it and sees the change; returns what
        ``change`` returns. Example: ``registry.write("mlp", lambda path: annotate.add(path, t, t, "x"))``."""
        self.get(key)                       # a known key that opens
        with self._lock:
            loaded = self._loaded.pop(key, None)
            if loaded is not None:
                loaded.close()
            return change(self.entries[key].path)

    def close(self):
        with self._lock:
            for loaded in self._loaded.values():
                loaded.close()
            self._loaded.clear()


_REGISTRY = Registry([])


def set_registry(registry: Registry) -> None:
    """Install the profiles the server serves (called by ``create_app``)."""
    global _REGISTRY
    if _REGISTRY is not registry:
        _REGISTRY.close()
    _REGISTRY = registry


def registry() -> Registry:
    return _REGISTRY


def resolve(key) -> Loaded:
    """The open profile for a URL's ``profile`` key; :class:`ExplorerError` if unknown or broken."""
    return _REGISTRY.get(key)


def _plain(v):
    # DuckDB's sum(BIGINT) is a HUGEINT, which Arrow hands over as Decimal: make it a Python number.
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    return v


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ------------------------------------------------------------------------------------ validation
_SEL = re.compile(r"^(lines|line|op|module|graph|path):([A-Za-z0-9_.\-/:]{1,200})$")


def parse_int(value, name: str, lo: int = 0, hi: int = 2**63 - 1) -> int | None:
    """A URL/form integer within bounds, or None when absent; anything else is refused.

    >>> parse_int("42", "start")
    42
    """
    if value in (None, ""):
        return None
    number = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value.strip()):
        number = int(value.strip())   # exact: ids are 63-bit, a float would round them
    if number is None or not lo <= number <= hi:
        raise ExplorerError(f"{name} must be an integer between {lo} and {hi}")
    return number


def parse_selection(sel) -> tuple[str, str] | None:
    """``"line:123"`` → ``("line", "123")``; kinds: line (source_id), lines (``a..b``: the lines between two
    source_ids of one file), op (op_id), module (path), graph, path (``module/aten_op``: one op of the model
    across all its graphs).

    >>> parse_selection("op:17")
    ('op', '17')
    """
    if sel in (None, ""):
        return None
    m = _SEL.match(str(sel))
    if not m:
        raise ExplorerError("selection must look like line:<source_id>, lines:<source_id>..<source_id>, "
                            "op:<op_id>, module:<path>, path:<module>/<aten op> or graph:<graph_id>")
    return m.group(1), m.group(2)
