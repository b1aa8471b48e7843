"""Trace datasets on object storage: many hosts' ranks, one hive-partitioned Parquet dataset.

With ``NEURON_RT_INSPECT_OUTPUT_DIR=s3://bucket/job`` each process (rank) writes its segments to a
local staging directory as usual, and lays out under the URL::

    segments/instance=<id>/rank=<r>/<segment>.arrow    each segment, uploaded as it is published
    <table>/instance=<id>/rank=<r>/part-0.parquet      the rank's finalised tables, when it ends

A crash loses what the local bound loses (the last flush interval): the uploaded segments stay, and
:func:`publish_segments` turns them into the rank's Parquet files later. No rank waits for another:
the dataset is the union of the partitions. ``traces.open(URL)`` queries it in place (:func:`connect`) (DuckDB scanning
Arrow datasets over ``pyarrow``'s S3 filesystem, no DuckDB extension), with the Summary computed by
the same SQL as a local profile's. Any engine that reads hive-partitioned Parquet reads it too
(``traces/spark_summary.py`` for Spark; docs/scale.md).

>>> partition("i-0a1b", 3)
'instance=i-0a1b/rank=3'
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa

from traces.errors import TraceError
from traces.objstore import Bucket, arrow_filesystem
from traces.schema import TABLES

#: Partition keys, outermost first (directory names ``instance=…/rank=…``).
PARTITIONS = (("instance", pa.string()), ("rank", pa.int32()))
#: Table name in the profile -> directory in the dataset. The one place to rename them.
DATASET_TABLES = {name: name for name in (*TABLES, "exec_engine_summary", "opcode_summary")}
SEGMENTS_DIR = "segments"
PART_NAME = "part-0.parquet"

#: How per-rank metadata values combine into the dataset's (anything else: one value per key).
_METADATA_COMBINE = {"instruction_count": "sum", "segment_count": "sum", "trace_start_ns": "min",
                     "trace_end_ns": "max", "max_instruction_dur_ns": "max"}


def partition(instance: str, rank: int) -> str:
    """The partition path of one rank. Example: ``partition("i-0123", 0)``."""
    return f"instance={instance}/rank={int(rank)}"


class SegmentUploader:
    """``Writer(on_segment=...)`` callback: uploads each published segment under ``segments/<partition>/``.

    Example: ``traces.Writer(staging, on_segment=SegmentUploader("s3://b/job", "i-0123", 0))``.
    """

    def __init__(self, url: str, instance: str, rank: int):
        self.bucket = Bucket(url)
        self.where = f"{SEGMENTS_DIR}/{partition(instance, rank)}"

    def __call__(self, path: Path) -> None:
        self.bucket.put_file(f"{self.where}/{path.name}", path)


def publish_rank(local_dir: str | os.PathLike, url: str, instance: str, rank: int) -> list[str]:
    """Finalise one rank's segments in ``local_dir`` and upload its tables to its partition of ``url``.

    Re-publishing replaces the rank's files (each PUT whole). Returns the keys written. Example:
    ``publish_rank("/tmp/staging", "s3://b/job", "i-0123", 0)``.
    """
    import duckdb

    from traces.store import finalize

    profile = finalize(local_dir)
    bucket = Bucket(url)
    written = []
    with tempfile.TemporaryDirectory(prefix="neuron-dataset-") as tmp, \
            duckdb.connect(str(profile), read_only=True) as con:
        for name, directory in DATASET_TABLES.items():
            file = Path(tmp) / f"{name}.parquet"
            # COPY takes its file name as a literal (quotes doubled); the table name is ours
            con.execute(f"COPY {name} TO '{str(file).replace(chr(39), chr(39) * 2)}' (FORMAT parquet)")
            key = f"{directory}/{partition(instance, rank)}/{PART_NAME}"
            bucket.put_file(key, file)
            written.append(key)
    return written


def publish_segments(url: str) -> list[str]:
    """Publish every rank whose segments are on ``url`` but whose tables are not (a rank that crashed
    before its end). Returns the partitions published. Example: ``publish_segments("s3://b/job")``."""
    bucket = Bucket(url)
    keys = bucket.list(SEGMENTS_DIR + "/")
    parts = sorted({k.rsplit("/", 1)[0].removeprefix(SEGMENTS_DIR + "/") for k in keys})
    done = {k.rsplit("/", 1)[0].removeprefix("runs/") for k in bucket.list("runs/")}
    published = []
    for part in parts:
        if part in done:
            continue
        fields = dict(p.split("=", 1) for p in part.split("/"))
        with tempfile.TemporaryDirectory(prefix="neuron-segments-") as tmp:
            for key in keys:
                if key.startswith(f"{SEGMENTS_DIR}/{part}/"):
                    bucket.get_file(key, Path(tmp) / key.rsplit("/", 1)[1])
            publish_rank(tmp, url, fields["instance"], int(fields["rank"]))
        published.append(part)
    return published


def fetch(url: str, out_dir: str | os.PathLike) -> Path:
    """Copy every rank's segments from ``url`` into ``out_dir`` and finalise them into one local
    ``profile.duckdb`` (for the web Explorer, or offline), when the job fits one machine. Example:
    ``fetch("s3://b/job", "run-42")``."""
    from traces.store import finalize

    bucket, out = Bucket(url), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for key in bucket.list(SEGMENTS_DIR + "/"):   # segment names are unique across ranks (run, pid, seq)
        bucket.get_file(key, out / key.rsplit("/", 1)[1])
    return finalize(out)


def metadata_sql(parts: str) -> str:
    """SQL (DuckDB and Spark alike) merging the ranks' ``metadata`` rows in table ``parts``: one value per
    key, counts summed and the trace's extent widened. Example: ``metadata_sql("metadata_parts")``."""
    # each aggregate over its own key only: CASE evaluates every branch, and a sum of all ranks'
    # trace_start_ns overflows BIGINT on Spark (DuckDB sums into HUGEINT)
    combine = " ".join(f"WHEN '{k}' THEN CAST({f}(try_cast(value AS BIGINT)) FILTER (WHERE key = '{k}') AS STRING)"
                       for k, f in _METADATA_COMBINE.items())
    return f"SELECT key, CASE key {combine} ELSE max(value) END AS value FROM {parts} GROUP BY key"


def table_schema(name: str, stored: pa.Schema | None = None) -> pa.Schema:
    """The schema of table ``name`` across every rank's files, whatever version wrote them: the trace
    schema's (or, for a derived table, the ``stored`` one of a file), then the partition columns it lacks.

    >>> table_schema("metadata").names, table_schema("runs").names.count("rank")
    (['key', 'value', 'instance', 'rank'], 1)
    """
    base = TABLES[name] if name in TABLES else stored
    return pa.schema(list(base) + [pa.field(k, t) for k, t in PARTITIONS if k not in base.names])


def tables_present(bucket: Bucket) -> set[str]:
    """The first-level directories of the dataset at ``bucket`` (one listing); TraceError, naming the fix,
    when none is a table's. Example: ``"instructions" in tables_present(Bucket("s3://b/job"))``."""
    present = bucket.dirs()
    if not present & set(DATASET_TABLES.values()):
        hint = (": its ranks have not finished; publish their uploaded segments with "
                "`python -m traces.dataset publish-segments URL`" if SEGMENTS_DIR in present else "")
        raise TraceError(f"{bucket.url} holds no trace dataset{hint} (write one with "
                         "NEURON_RT_INSPECT_OUTPUT_DIR=s3://... and NEURON_RT_INSPECT_ENABLE=1)")
    return present


def connect(url: str, *, external_access: bool = True, limits: dict | None = None) -> "_OneConnection":
    """A DuckDB connection over the dataset at ``url``, queried in place; ``traces.open(url)`` wraps it
    in a read-only :class:`traces.query.Profile`.

    Each table is a view over an Arrow dataset (``instance`` and ``rank`` columns from the
    partitions); ``summary`` and ``summary_per_core`` are views of the same Summary SQL a local
    profile stores. Example: ``traces.open("s3://bucket/job").summary()["total_time"]``.
    """
    import duckdb
    import pyarrow.dataset as ds

    from traces.summary_sql import summary_sql

    bucket = Bucket(url)
    fs = arrow_filesystem()
    present = tables_present(bucket)
    parts = ds.partitioning(pa.schema(list(PARTITIONS)), flavor="hive")
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False, **(limits or {})})
    try:
        for name, directory in DATASET_TABLES.items():
            base = f"{bucket.bucket}/{bucket.key(directory)}"
            if directory in present:
                schema = table_schema(name) if name in TABLES else None
                data = ds.dataset(base, filesystem=fs, format="parquet", partitioning=parts, schema=schema)
            else:
                data = TABLES[name].empty_table() if name in TABLES else pa.table({"exec_id": pa.array([], pa.int64())})
            con.register(f"_ds_{name}", data)
            if name != "metadata":
                con.execute(f"CREATE VIEW {name} AS SELECT * FROM _ds_{name}")
        con.execute(f"CREATE VIEW metadata AS {metadata_sql('_ds_metadata')}")
        warm = dict(con.execute("SELECT key, value FROM metadata").fetchall()).get("summary_includes_warmup") == "true"
        con.execute(f"CREATE VIEW summary AS {summary_sql(warm)}")
        con.execute(f"CREATE VIEW summary_per_core AS {summary_sql(warm, per_core=True)}")
        if not external_access:
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
    except (duckdb.Error, OSError, pa.ArrowException) as exc:
        con.close()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TraceError(f"{url} is not a readable trace dataset: {first}") from None
    return _OneConnection(con)


def main(argv=None) -> int:
    """``python -m traces.dataset publish-rank DIR URL INSTANCE RANK`` (what a rank runs at its end: a
    child process, since an exiting interpreter starts no threads), ``publish-segments URL`` or
    ``fetch URL DIR`` (one local ``profile.duckdb``)."""
    import argparse
    import sys

    from traces.errors import run_guarded

    ap = argparse.ArgumentParser(prog="python -m traces.dataset", description=main.__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("publish-rank", help="finalise DIR's segments into RANK's partition of URL")
    r.add_argument("dir")
    r.add_argument("url")
    r.add_argument("instance")
    r.add_argument("rank", type=int)
    s = sub.add_parser("publish-segments", help="publish every rank that uploaded segments but no tables")
    s.add_argument("url")
    f = sub.add_parser("fetch", help="copy URL's segments into DIR and finalise them into DIR/profile.duckdb")
    f.add_argument("url")
    f.add_argument("dir")
    args = ap.parse_args(argv)

    def run() -> int:
        if args.cmd == "publish-rank":
            publish_rank(args.dir, args.url, args.instance, args.rank)
        elif args.cmd == "fetch":
            print(fetch(args.url, args.dir))
        else:
            for part in publish_segments(args.url):
                print(f"published {args.url}/*/{part}", file=sys.stderr)
        return 0
    return run_guarded("traces.dataset", run)


if __name__ == "__main__":
    raise SystemExit(main())


class _OneConnection:
    """The dataset's connection for :class:`~traces.query.Profile`: a registered Arrow dataset is visible
    to its own connection only, not to cursors, so every "cursor" borrows this connection (one thread
    at a time: the CLI verbs; the web Explorer wants a local ``profile.duckdb``)."""

    def __init__(self, con):
        self._con = con

    def cursor(self) -> "_Borrowed":
        return _Borrowed(self._con)

    def close(self) -> None:
        self._con.close()


class _Borrowed:
    def __init__(self, con):
        self._con = con

    def __getattr__(self, name):
        return getattr(self._con, name)

    def close(self) -> None:   # the lender closes the connection
        pass
