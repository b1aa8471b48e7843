"""``view --framework-source-root DIR``: a profile's source paths resolved under a directory of the user's,
as the real tool's flag. The profile embeds the text of the files its ops ran from; with a root, the Source
page reads the current file under it instead (and shows files the profile names but does not embed, such as
a graph's call site).

A recorded path ``/home/me/proj/model.py`` resolves to the longest of its tails that exists under the root
(``DIR/home/me/proj/model.py``, ``DIR/me/proj/model.py``, ..., ``DIR/model.py``), never to a path outside it.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> (root / "proj").mkdir(); _ = (root / "proj" / "model.py").write_text("x = 1\\n")
>>> resolve("/home/me/proj/model.py", root).relative_to(root).as_posix()
'proj/model.py'
>>> resolve("/home/me/../../etc/passwd", root) is None
True
"""
from __future__ import annotations

from pathlib import Path, PurePath

from explorer.profiles import ExplorerError

#: set by ``neuron-explorer view --framework-source-root DIR`` (an absolute, existing directory) or None
SETTINGS: dict = {"root": None}

#: the largest source file read from the root (a bound on what one page loads)
MAX_BYTES = 4 * 2**20


def root() -> Path | None:
    """The source root in force, or None."""
    return SETTINGS["root"]


def set_root(directory, flag: str = "--framework-source-root") -> Path | None:
    """Check and install ``--framework-source-root DIR`` (None clears it); a bad DIR is one line naming ``flag``."""
    if directory is None:
        SETTINGS["root"] = None
        return None
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise ExplorerError(f"{flag} {str(directory)[:200]}: no such directory; give the "
                            "directory that holds your model's source files")
    SETTINGS["root"] = path.resolve()
    return SETTINGS["root"]


def resolve(file, base: Path | None = None) -> Path | None:
    """``file`` (a path the profile recorded) under ``base`` (default: the source root): the longest tail
    of it that is a file under the root, or None."""
    base = base or root()
    if base is None or not file:
        return None
    parts = [p for p in PurePath(str(file)[:4096]).parts if p not in ("/", "\\", "", ".")]
    parts = [p for p in parts if not PurePath(p).anchor]     # a drive or root anchor is not a name
    for i in range(len(parts)):
        candidate = (base / Path(*parts[i:])).resolve()
        if candidate.is_relative_to(base) and candidate.is_file():
            return candidate
    return None


def read(file) -> str | None:
    """The text of ``file`` under the source root (at most ``MAX_BYTES``), or None when it is not there."""
    path = resolve(file)
    if path is None:
        return None
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise ExplorerError(f"{path}: larger than {MAX_BYTES // 2**20} MiB, not shown; point "
                            "--framework-source-root at the model's sources")
    return raw.decode("utf-8", errors="replace")
