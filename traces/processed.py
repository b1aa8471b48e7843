"""A processed profile: the real Neuron Explorer's default output, a directory of Parquet tables.

The real ``neuron-explorer view`` processes a profile into ``<data-path>/profiles/global/<display-name>@latest/``
holding one file per real table (``Instruction.parquet``, ``DmaPacket.parquet``, ``Summary.parquet``,
``SchemaFields.parquet``, ...; a large table split as ``Instruction_0.parquet``, ``Instruction_1.parquet``, ...;
a table with no rows left out). :func:`process` writes that directory once per profile, with
:func:`traces.export.real_table_files`, and skips it while it is up to date: a stamp file in it records the
profile's path, size and modification time, so an open of an unchanged profile never writes it again.
The default data path is the profile's own session directory (``output/<session>/profiles/global/...``).

Run as ``python -m traces.processed [--data-path DIR] PROFILE...`` (what ``neuron-explorer view`` starts in
the background); ``neuron-explorer view --ingest-only`` calls :func:`process` before it exits.

>>> import tempfile, traces.synthetic
>>> d = Path(tempfile.mkdtemp())
>>> _ = traces.synthetic.write_run(d / "run", executions=1, instructions=50)
>>> out, wrote = process(d / "run")
>>> out.parent.relative_to(d).as_posix(), out.name.endswith("@latest"), wrote, (out / "Summary.parquet").is_file()
('run/profiles/global', True, True, True)
>>> process(d / "run" / "profile.duckdb")[1]     # up to date: not written again
False
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path

from traces.errors import TraceError

#: the stamp file in a processed profile's directory (hidden: a ``*.parquet`` glob never meets it)
STAMP = ".neuron_stack_processed.json"


def stamp_of(profile_path: Path) -> dict:
    """What the processed output was made from: the profile's resolved path, size and modification time."""
    st = profile_path.stat()
    return {"profile": str(profile_path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def processed_dir(profile_path: Path, name: str | None, data_path: Path | None = None) -> Path:
    """``<data-path>/profiles/global/<display-name>@latest`` (data path: the profile's directory by default);
    the name made safe as one path component.

    >>> processed_dir(Path("out/s1/profile.duckdb"), "aws_train.py · eager").as_posix()
    'out/s1/profiles/global/aws_train.py · eager@latest'
    >>> processed_dir(Path("p.duckdb"), "../x/y", Path("ws")).as_posix()
    'ws/profiles/global/.._x_y@latest'
    """
    base = Path(data_path) if data_path is not None else profile_path.parent
    safe = re.sub(r"[\x00-\x1f/\\]", "_", name or profile_path.parent.name or "profile").strip()[:120]
    if safe in ("", ".", ".."):
        safe = "profile"
    return base / "profiles" / "global" / f"{safe}@latest"


def is_current(out: Path, stamp: dict) -> bool:
    """True when ``out`` holds a processed profile made from exactly ``stamp``'s profile file."""
    try:
        got = json.loads((out / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return {k: got.get(k) for k in stamp} == stamp


def process(profile_path: str | os.PathLike, data_path: str | os.PathLike | None = None,
            split_rows: int | None = None) -> tuple[Path, bool]:
    """Write the processed profile (the real tool's Parquet tables) for ``profile_path`` (a ``profile.duckdb``
    or its session directory) unless it is up to date; return ``(directory, written)``. A directory of the
    same profile under an older display name is removed. Example: ``process("output/s1/profile.duckdb")``.
    """
    import traces
    from traces import export

    path = Path(profile_path)
    if path.is_dir():   # a session directory: its profile, finalised from the segments first when stale
        traces.open(path).close()
        path = path / "profile.duckdb"
    stamp = stamp_of(path)
    with traces.open(path) as p:
        out = processed_dir(path, p.display_name(), Path(data_path) if data_path is not None else None)
        if is_current(out, stamp):
            return out, False

        def fill(tmp: Path) -> None:
            rows = {name: export.real_table_files(p, name, tmp, **({"split_rows": split_rows} if split_rows
                                                                    else {}))
                    for name in p.real_tables()}
            (tmp / STAMP).write_text(json.dumps({**stamp, "rows": rows}), encoding="utf-8")
        _replace_dir(out, fill)
    for old in out.parent.glob("*@latest"):   # the same profile processed under its former name
        if old != out and _stamp_profile(old) == stamp["profile"]:
            shutil.rmtree(old, ignore_errors=True)
    return out, True


def remove(profile_path: str | os.PathLike, data_path: str | os.PathLike) -> list[Path]:
    """Remove the processed directories under ``data_path`` made from ``profile_path`` (its profile is being
    deleted; under the profile's own directory they go with it); returns them.

    >>> import tempfile
    >>> remove("nowhere/profile.duckdb", tempfile.mkdtemp())
    []
    """
    path = Path(profile_path)
    profile = str((path / "profile.duckdb" if path.is_dir() else path).resolve())
    gone = [d for d in (Path(data_path) / "profiles" / "global").glob("*@latest") if _stamp_profile(d) == profile]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone


def _stamp_profile(d: Path) -> str | None:
    try:
        return json.loads((d / STAMP).read_text(encoding="utf-8")).get("profile")
    except (OSError, ValueError):
        return None


def _replace_dir(out: Path, fill) -> None:
    """Fill a temporary directory beside ``out`` and swap it in, so ``out`` is never half-written."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    old = out.with_name(f".{out.name}.{os.getpid()}.old")
    for d in (tmp, old):
        shutil.rmtree(d, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        fill(tmp)
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
    except OSError as exc:
        raise TraceError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m traces.processed [--data-path DIR] PROFILE...``: process each profile (lowest CPU priority:
    the Explorer that starts it serves pages meanwhile); one line per profile on stderr."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m traces.processed", description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", metavar="PROFILE")
    ap.add_argument("--data-path", metavar="DIR")
    args = ap.parse_args(argv)
    os.nice(19)
    # DuckDB's extension loads before the handler: a SystemExit raised inside its initialisation aborted the
    # interpreter ("Fatal Python error: Aborted" on the view's stderr, once in CI, when a view stopped at once).
    # A SIGTERM before the handler just ends the process: nothing is written yet.
    import duckdb  # noqa: F401

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # unwinds: the temporary directory is removed
    status = 0
    for path in args.profiles:
        try:
            out, wrote = process(path, args.data_path)
            if wrote:
                print(f"neuron-explorer: processed {path} into {out}/", file=sys.stderr, flush=True)
        except Exception as exc:   # noqa: BLE001 - one line per profile, never a traceback under the server
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"neuron-explorer: cannot process {path} into Parquet: {why}", file=sys.stderr, flush=True)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
