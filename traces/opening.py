"""Opening a profile: a finalised ``profile.duckdb`` (finalising its segments first when they are newer),
a directory of exported Parquet, or a published dataset on object storage, each as a read-only
:class:`~traces.query.Profile` (what you can ask it lives there).

>>> import tempfile, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=2, instructions=400)
>>> with open_profile(d) as p:
...     len(p.sql("SELECT * FROM executions"))
2
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pyarrow as pa

from traces.console import DUCKDB_LIMITS
from traces.errors import TraceError, one_line
from traces.query import Profile
from traces.safeio import special_kind
from traces.schema import TABLES
from traces.segments import list_segments
from traces.store import DERIVED_TABLES, PROFILE_NAME, finalize

log = logging.getLogger("traces")


def _stale(target: Path, segments: list[Path]) -> bool:
    """Whether ``target`` misses segments: absent, older than one, or built from fewer of them.

    The count matters because a segment published while finalise ran can carry an older mtime
    (written before its rename) than the profile that does not contain it; writers only ever add.
    """
    import duckdb

    if not target.exists() or target.stat().st_mtime_ns < max(s.stat().st_mtime_ns for s in segments):
        return True
    try:
        with duckdb.connect(str(target), read_only=True) as con:
            row = con.execute("SELECT value FROM metadata WHERE key = 'segment_count'").fetchone()
    except duckdb.Error:
        return True
    return row is None or int(row[0]) != len(segments)


def open_profile(path: str | os.PathLike, *, external_access: bool = True, bounded: bool = False) -> "Profile":
    """Open ``path`` read-only and return a :class:`Profile`.

    ``path`` is a ``profile.duckdb``; a directory holding one or holding segments (finalised
    first if the profile is missing or older than its segments, with a note on the log); or a
    Parquet dataset written by ``neuron-explorer export --format parquet``; or the ``s3://`` URL of a
    multi-host trace dataset (:mod:`traces.dataset`, queried in place). With
    ``external_access=False`` SQL cannot read or write other files (for a shared SQL console); with
    ``bounded`` DuckDB's memory and threads are capped for user SQL (:data:`traces.console.DUCKDB_LIMITS`).
    Example: ``p = open_profile("output/session")``.
    """
    import duckdb

    if str(path).startswith("s3://"):
        return _open_dataset_url(str(path), external_access, bounded)
    path = Path(path)
    if special_kind(path) == "a symbolic link loop":
        raise TraceError(f"profile {path} is a symbolic link loop: pass the {PROFILE_NAME} it should point to")
    if not path.exists():
        raise TraceError(f"profile {path} does not exist: pass a profile.duckdb or the directory "
                         "`neuron-explorer inspect` wrote")
    if path.is_dir():
        if (path / "metadata.parquet").is_file():
            return _open_parquet_dataset(path, external_access, bounded)
        segments = list_segments(path)
        target = path / PROFILE_NAME
        if segments and _stale(target, segments):
            log.info("finalising the segments in %s into %s", path, target)
            target = finalize(path)
        if not target.exists():
            raise TraceError(f"{path} is not a profile: it has no {PROFILE_NAME}, no trace segments and no "
                             "Parquet export")
        path = target
    kind = special_kind(path)
    if kind is not None:   # DuckDB would block on a FIFO forever
        raise TraceError(f"{path} is {kind}, not a profile: pass the {PROFILE_NAME} that "
                         "`neuron-explorer inspect` wrote")
    _refuse_non_duckdb(path)
    config = {"autoinstall_known_extensions": False, "autoload_known_extensions": False,
              **(DUCKDB_LIMITS if bounded else {})}
    if not external_access:
        # no file access from any query, and no way to turn it back on
        config["enable_external_access"] = False
        config["lock_configuration"] = True
    try:
        con = duckdb.connect(str(path), read_only=True, config=config)
    except duckdb.Error as exc:
        msg = one_line(exc)
        # told apart by the error's type and the kernel's lock table, not its words ("block" holds "lock")
        if isinstance(exc, duckdb.IOException) and _write_locked(path):
            raise TraceError(f"profile {path} is open for writing by another process: wait until it is "
                             "finalised, or open a copy") from None
        if not isinstance(exc, duckdb.IOException):
            raise TraceError(f"profile {path} is damaged ({msg}): finalise it again from its segments "
                             "(neuron-explorer summary DIR) or restore a copy") from None
        raise TraceError(f"{path} is not a neuron_stack profile (not a readable DuckDB database: {msg}): "
                         f"pass the {PROFILE_NAME} that `neuron-explorer inspect` wrote") from None
    return _checked(Profile(con, path))


def _refuse_non_duckdb(path: Path) -> None:
    """One line naming what ``path`` is when its header says it is no DuckDB database (a NEFF, an empty
    or a text file), before DuckDB's longer message.

    >>> _refuse_non_duckdb(Path("/nonexistent"))
    """
    try:
        with path.open("rb") as f:
            head = f.read(12)
    except OSError:
        return   # DuckDB's own open reports it
    fix = f"pass the {PROFILE_NAME} that `neuron-explorer inspect` wrote"
    if head.startswith(b"PK\x03\x04"):   # a NEFF is a zip archive
        raise TraceError(f"{path} is a NEFF (a compiled model), not a profile: profile it with "
                         f"`neuron-explorer capture -n {path}`, then open the profile it writes")
    if not head:
        raise TraceError(f"{path} is an empty file (0 bytes), not a profile: {fix}")
    if head[8:12] != b"DUCK":   # DuckDB's magic bytes follow an 8-byte checksum
        raise TraceError(f"{path} is not a profile (not a DuckDB database): {fix}")


def _write_locked(path: Path) -> bool:
    """Whether another process holds a write lock on ``path`` (the kernel's ``/proc/locks``).

    >>> _write_locked(Path("/nonexistent"))
    False
    """
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            table = f.read(1 << 20)
    except OSError:
        return False
    # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF": device (hex major:minor) and inode in the 6th field
    file_id = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(len(parts) > 5 and parts[3] == "WRITE" and parts[5] == file_id and parts[4] != str(os.getpid())
               for parts in (line.split() for line in table.splitlines()))


def _open_parquet_dataset(path: Path, external_access: bool, bounded: bool = False) -> "Profile":
    import duckdb

    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False,
                                             **(DUCKDB_LIMITS if bounded else {})})
    try:
        for name in (*TABLES, *DERIVED_TABLES):
            file = path / f"{name}.parquet"
            part_dir = path / name
            # DDL cannot take parameters: the path is a quoted literal (quotes doubled)
            if name == "instructions" and part_dir.is_dir() and not any(part_dir.rglob("*.parquet")):
                # a profile without device rows (the device profile is off by default) writes no partition
                cols = ", ".join(f"CAST(NULL AS {_sql_type(f.type)}) AS {f.name}" for f in TABLES["instructions"])
                con.execute(f"CREATE VIEW instructions AS SELECT {cols} WHERE FALSE")
            elif name == "instructions" and part_dir.is_dir():
                glob = _literal(str(part_dir / "**" / "*.parquet"))
                cols = ", ".join(f"CAST({c} AS {_sql_type(TABLES['instructions'].field(c).type)}) AS {c}"
                                 for c in TABLES["instructions"].names)
                con.execute(f"CREATE VIEW instructions AS SELECT {cols} "
                            f"FROM read_parquet({glob}, hive_partitioning = true)")
            elif file.is_file():
                con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({_literal(str(file))})")
        if not external_access:
            # a view over a file stops working once file access is off, and allowed_directories would
            # also let COPY ... TO write there: load the tables into this in-memory database instead
            for (name,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall():
                con.execute(f"CREATE TABLE {name}_loaded AS SELECT * FROM {name}")
                con.execute(f"DROP VIEW {name}")
                con.execute(f"ALTER TABLE {name}_loaded RENAME TO {name}")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
    except duckdb.Error as exc:
        con.close()
        raise TraceError(f"{path} is not a readable Parquet export of a profile: {one_line(exc)}") from None
    profile = Profile(con, path)
    profile._check_version()
    return profile


def _open_dataset_url(url: str, external_access: bool, bounded: bool = False) -> "Profile":
    from traces.dataset import connect

    profile = Profile(connect(url, external_access=external_access, limits=DUCKDB_LIMITS if bounded else None),
                      Path(url))
    profile.path = url   # a URL, which Path would fold to s3:/...
    return _checked(profile)


def _checked(profile: "Profile") -> "Profile":
    """``profile`` once its schema version is one we read; closed if not."""
    try:
        profile._check_version()
    except BaseException:
        profile.close()
        raise
    return profile


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _sql_type(t: pa.DataType) -> str:
    return {pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.string(): "VARCHAR", pa.bool_(): "BOOLEAN",
            pa.float64(): "DOUBLE"}[t]
