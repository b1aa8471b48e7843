"""The profile manager: the profiles of an output directory, named, starred and filed in folders, deleted
(after a confirmation, and only inside that directory) and uploaded (bounded, validated).

A profile's favourite mark and folder are stored in the profile itself (``metadata`` keys
``explorer_favourite`` and ``explorer_folder``), as its display name is (``profile_name``), so they travel
with the file; writing closes and reopens it (``Registry.write``). Delete and upload need an output
directory (``neuron-explorer view -d DIR``, or the inspect output directory when ``view`` lists it): a
profile is deleted only when its file lies inside that directory (its session directory goes with it),
and an upload is written only there, as ``DIR/uploaded_<name>/profile.duckdb``.

>>> checked_folder(" runs/bf16 ")
'runs/bf16'
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from explorer import data
from traces import annotate, processed
from traces.errors import TraceError

#: Bytes an uploaded profile may have (the browser sends it whole, base64, through the server's memory).
MAX_UPLOAD_BYTES = 256 * 2**20
FAVOURITE, FOLDER = "explorer_favourite", "explorer_folder"
_FOLDER = re.compile(r"[A-Za-z0-9 _.-]{1,40}(/[A-Za-z0-9 _.-]{1,40}){0,3}")

#: The directory this server manages (None: profiles named one by one, no delete or upload).
SETTINGS: dict = {"directory": None, "data_path": None}
#: The background processing children started here, with the profiles each was given.
_CHILDREN: list = []


def checked_folder(text) -> str:
    """A folder name: up to four ``/``-separated parts of letters, digits, space, ``_.-``; '' for none."""
    t = str(text or "").strip().strip("/")
    if t and (not _FOLDER.fullmatch(t) or ".." in t):
        raise data.ExplorerError(f"folder {t[:40]!r}: use letters, digits, spaces and _ . - in up to four "
                                 "parts separated by /, such as \"runs/bf16\"")
    return t


def entry_info(key: str) -> dict:
    """What the manager shows for a profile: name, favourite, folder, file, whether it may be deleted."""
    reg = data.registry()
    e = reg.entries[key]
    info = {"key": key, "name": reg.label(key), "file": str(e.path), "error": e.error, "favourite": False,
            "folder": "", "deletable": inside(e.path) is not None}
    if not e.error:
        try:
            md = data.metadata(reg.get(key))
            info.update(favourite=md.get(FAVOURITE) == "true", folder=md.get(FOLDER, ""))
        except data.ExplorerError as exc:
            info["error"] = str(exc)
    return info


def listing() -> list[dict]:
    """Every served profile, favourites first, then by folder, else in the order given."""
    rows = [entry_info(k) for k in data.registry().keys()]
    return sorted(rows, key=lambda r: (not r["favourite"], r["folder"]))


def _set(key: str, name: str, value: str) -> None:
    def change(path):
        try:
            annotate.set_mark(path, name, value)
        except TraceError as exc:
            raise data.ExplorerError(str(exc)) from None
    data.registry().write(key, change)


def set_favourite(key: str, on: bool) -> None:
    _set(key, FAVOURITE, "true" if on else "")


def set_folder(key: str, folder) -> None:
    _set(key, FOLDER, checked_folder(folder))


def rename(key: str, name) -> None:
    """Store the display name (``traces.naming.set_display_name``: the same as ``view --display-name``)."""
    from traces.naming import set_display_name

    def change(path):
        try:
            set_display_name(path, str(name or ""))
        except TraceError as exc:
            raise data.ExplorerError(str(exc).replace("--display-name", "a display name")) from None
    data.registry().write(key, change)


def inside(path: Path) -> Path | None:
    """The session directory (or file) to delete for ``path`` when it lies inside the managed directory."""
    root = SETTINGS.get("directory")
    if root is None:
        return None
    root, path = Path(root).resolve(), Path(path).resolve()
    if root not in path.parents:
        return None
    target = path.parent if path.name == "profile.duckdb" and path.parent != root else path
    return target if root in target.parents else None


def delete(key: str) -> str:
    """Delete a profile (its session directory) from disk and from the server; only inside the directory."""
    reg = data.registry()
    if key not in reg.keys():
        raise data.ExplorerError(f"unknown profile {str(key)[:60]!r}")
    target = inside(reg.entries[key].path)
    if target is None:
        raise data.ExplorerError("only profiles inside the output directory can be deleted: start the Explorer "
                                 "with `neuron-explorer view -d DIR`")
    path = reg.entries[key].path
    reg.remove(key)
    _stop_processing(path)   # its child would write its Parquet tables into the directory being deleted
    if SETTINGS.get("data_path"):   # its Parquet tables, processed outside its directory (view --data-path)
        processed.remove(path, SETTINGS["data_path"])
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    return str(target)


def upload(filename: str, blob: bytes) -> str:
    """Save an uploaded profile as ``DIR/uploaded_<name>/profile.duckdb`` after checking it is one (size,
    DuckDB header, ``traces.open``); serve it; returns its key."""
    import traces

    root = SETTINGS.get("directory")
    if root is None:
        raise data.ExplorerError("uploads need an output directory: start the Explorer with "
                                 "`neuron-explorer view -d DIR`")
    if len(blob) > MAX_UPLOAD_BYTES:
        raise data.ExplorerError(f"{filename[:60]!r} is {len(blob) / 2**20:.0f} MiB; uploads are at most "
                                 f"{MAX_UPLOAD_BYTES // 2**20} MiB (copy larger profiles into the directory)")
    if blob[8:12] != b"DUCK":
        raise data.ExplorerError(f"{filename[:60]!r} is not a profile (no DuckDB header): upload a "
                                 "profile.duckdb written by neuron-explorer inspect")
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(filename)).stem).strip("-.")[:40] or "profile"
    n, target = 1, Path(root) / f"uploaded_{stem}"
    while target.exists():
        n += 1
        target = Path(root) / f"uploaded_{stem}-{n}"
    target.mkdir(parents=True)
    path = target / "profile.duckdb"
    path.write_bytes(blob)
    try:
        traces.open(path, external_access=False).close()
    except Exception as exc:   # any reason it is not a profile: remove it and say why
        shutil.rmtree(target)
        raise data.ExplorerError(f"{filename[:60]!r} is not a readable profile: {data._one_line(exc)}") from None
    key = data.registry().add(path)
    process_in_background([path])
    return key


def process_in_background(paths: list[Path]):
    """The real tool's default output: the Parquet tables of each profile not processed yet (or changed since),
    under ``SETTINGS["data_path"]`` (default: each profile's directory), written by a child process at the
    lowest CPU priority, so no page waits for it (``python -m traces.processed``: an up-to-date profile is
    skipped, a written one is one line on stderr). Returns the child, or None without profiles."""
    import subprocess
    import sys

    todo = [str(p) for p in paths if Path(p).is_file()]
    if not todo:
        return None
    data_path = SETTINGS.get("data_path")
    cmd = [sys.executable, "-m", "traces.processed", *(["--data-path", str(data_path)] if data_path else []), *todo]
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    _CHILDREN[:] = [(t, c) for t, c in _CHILDREN if c.poll() is None] + [(todo, child)]
    return child


def _stop_processing(path) -> None:
    """Stop the background children processing ``path`` and start one for the other profiles they had left
    (an up-to-date profile is skipped, so nothing is written twice)."""
    path = Path(path).resolve()
    for todo, child in list(_CHILDREN):
        if child.poll() is None and path in {Path(p).resolve() for p in todo}:
            child.kill()
            child.wait(10)
            _CHILDREN.remove((todo, child))
            process_in_background([p for p in todo if Path(p).resolve() != path])
