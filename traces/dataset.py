"""Trace datasets on object storage: many hosts' ranks, one hive-partitioned Parquet dataset.

With ``NEURON_RT_INSPECT_OUTPUT_DIR=s3://bucket/job`` each process (rank) writes its segments to a
local staging directory as usual, and lays out under the URL::

    segments/instance=<id>/rank=<r>/<segment>.arrow    each segment, uploaded as it is published
    <table>/instance=<id>/rank=<r>/part-0.parquet      the rank's finalised tables, when it ends

A crash loses what the local bound loses (the last flush interval): the uploaded segments stay, and
:func:`publish_segments` turns them into the rank's Parquet files later. No rank waits for another:
the dataset is the union of the partitions. :func:`open_dataset` queries it in place (DuckDB scanning
Arrow datasets over ``pyarrow``'s S3 filesystem, no DuckDB extension), with the Summary computed by
the same SQL as a local profile's. Any engine that reads hive-partitioned Parquet reads it too
(``traces/spark_summary.py`` for Spark; docs/scale.md).

>>> partition("i-0a1b", 3)
'instance=i-0a1b/rank=3'
"""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pyarrow as pa

from traces.errors import TraceError
from traces.objstore import Bucket, arrow_filesystem
from traces.schema import TABLES

log = logging.getLogger("traces")

#: Partition keys, outermost first (directory names ``instance=…/rank=…``).
PARTITIONS = (("instance", pa.string()), ("rank", pa.int32()))
#: Table name in the profile -> directory in the dataset. The one place to rename them.
DATASET_TABLES = {name: name for name in (*TABLES, "exec_engine_summary")}
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


def open_dataset(url: str, *, external_access: bool = True):
    """Open the dataset at ``url`` as a read-only :class:`traces.query.Profile`, queried in place.

    Each table is a view over an Arrow dataset (``instance`` and ``rank`` columns from the
    partitions); ``summary`` and ``summary_per_core`` are views of the same Summary SQL a local
    profile stores. Example: ``traces.open("s3://bucket/job").summary()["total_time"]``.
    """
    import duckdb
    import pyarrow.dataset as ds

    from traces.query import Profile, one_line
    from traces.store import summary_sql

    bucket = Bucket(url)
    fs = arrow_filesystem()
    present = {k.split("/", 1)[0] for k in bucket.list("")}
    if not present & set(DATASET_TABLES.values()):
        hint = (": its ranks have not finished; publish their uploaded segments with "
                "`neuron-explorer publish URL`" if SEGMENTS_DIR in present else "")
        raise TraceError(f"{url} holds no trace dataset{hint} (write one with "
                         "NEURON_RT_INSPECT_OUTPUT_DIR=s3://... and NEURON_RT_INSPECT_ENABLE=1)")
    parts = ds.partitioning(pa.schema(list(PARTITIONS)), flavor="hive")
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    try:
        for name, directory in DATASET_TABLES.items():
            base = f"{bucket.bucket}/{bucket.key(directory)}"
            if directory in present:
                schema = None
                if name in TABLES:   # one schema for every rank's files, whatever version wrote them
                    extra = [pa.field(k, t) for k, t in PARTITIONS if k not in TABLES[name].names]
                    schema = pa.schema(list(TABLES[name]) + extra)
                data = ds.dataset(base, filesystem=fs, format="parquet", partitioning=parts, schema=schema)
            else:
                data = TABLES[name].empty_table() if name in TABLES else pa.table({"exec_id": pa.array([], pa.int64())})
            con.register(f"{name}_parts" if name == "metadata" else name, data)
        combine = " ".join(f"WHEN '{k}' THEN CAST({f}(try_cast(value AS BIGINT)) AS VARCHAR)"
                           for k, f in _METADATA_COMBINE.items())
        con.execute(f"CREATE VIEW metadata AS SELECT key, CASE key {combine} ELSE max(value) END AS value "
                    "FROM metadata_parts GROUP BY key")
        warm = dict(con.execute("SELECT key, value FROM metadata").fetchall()).get("summary_includes_warmup") == "true"
        con.execute(f"CREATE VIEW summary AS {summary_sql(warm)}")
        con.execute(f"CREATE VIEW summary_per_core AS {summary_sql(warm, per_core=True)}")
        if not external_access:
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
    except (duckdb.Error, OSError, pa.ArrowException) as exc:
        con.close()
        raise TraceError(f"{url} is not a readable trace dataset: {one_line(exc)}") from None
    profile = Profile(con, Path(url))
    profile.path = url
    profile._check_version()
    return profile
