"""Spark reads a trace dataset on ``s3://`` where it lies: a Python Data Source, no ``s3a`` jar.

Spark 4's Python Data Source API (``pyspark.sql.datasource``) lets Python code be a table's reader.
:func:`plan` runs in the driver's Python process with the one S3 client (:mod:`traces.objstore`):
it lists each table's objects, at most ``max_objects`` per table, and takes each table's schema (the
trace schema's, or a derived table's from its first file's footer), so a bad URL, missing
credentials or a runaway listing is one :class:`~traces.errors.TraceError` line before Spark runs a
task. :func:`frames` then reads each table through :class:`TraceObjects`: one input partition per
object; an executor opens its object with pyarrow's S3 filesystem (:func:`traces.objstore.arrow_filesystem`,
the same AWS configuration, resolved where the executor runs) and yields Arrow record batches, the
object's ``instance`` and ``rank`` (from its ``instance=…/rank=…`` path) added as columns, as
DuckDB's in-place dataset (:func:`traces.dataset.connect`) does.

Executors need this package importable and the AWS settings in their environment (on a cluster:
``--py-files`` or the image, and ``spark.executorEnv.AWS_ENDPOINT_URL`` for a non-AWS endpoint).

>>> partition_values("instructions/instance=i-0a1b/rank=3/part-0.parquet")
{'instance': 'i-0a1b', 'rank': '3'}
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from traces.dataset import DATASET_TABLES, PARTITIONS, table_schema, tables_present
from traces.errors import TraceError, one_line
from traces.objstore import Bucket, arrow_filesystem
from traces.schema import TABLES

#: The format name Spark knows the reader by (``spark.read.format(FORMAT)``).
FORMAT = "neuron_trace_objects"
#: Objects listed per table at most: one per rank, so a 10,000-rank job.
MAX_OBJECTS = 10_000
#: Rows per Arrow batch an executor hands Spark (bounds an executor's memory per object).
BATCH_ROWS = 65_536


@dataclass(frozen=True)
class TablePlan:
    """One table of the dataset: its Arrow schema and the keys (in the bucket) of its Parquet objects."""

    name: str
    schema: pa.Schema
    keys: tuple[str, ...]


def partition_values(key: str) -> dict[str, str]:
    """The hive partition values in an object's key. Example: ``partition_values("t/rank=0/p.parquet")``."""
    return dict(part.split("=", 1) for part in key.split("/")[:-1] if "=" in part)


def plan(url: str, max_objects: int = MAX_OBJECTS) -> tuple[str, list[TablePlan]]:
    """``(bucket, tables)`` of the dataset at ``url``, listed with the driver's S3 client; TraceError on a bad
    URL, missing credentials, no dataset, or a table of more than ``max_objects`` objects.

    Example: ``bucket, tables = plan("s3://ml-team/profiles/run-42")``.
    """
    bucket = Bucket(url)
    present = tables_present(bucket)
    tables = []
    for name, directory in DATASET_TABLES.items():
        keys = []
        if directory in present:
            listed = bucket.list(directory + "/", limit=max_objects + 1)
            if len(listed) > max_objects:
                raise TraceError(f"{bucket.url_of(directory)} holds more than {max_objects} objects, more than the "
                                 "ranks of a job: point at one job's dataset (or raise max_objects)")
            keys = [bucket.key(k) for k in listed if k.endswith(".parquet")]
        stored = None
        if name not in TABLES:   # a derived table: the schema its files carry
            stored = _footer_schema(bucket, keys) if keys else pa.schema([pa.field("exec_id", pa.int64())])
        tables.append(TablePlan(name, table_schema(name, stored), tuple(keys)))
    return bucket.bucket, tables


def _footer_schema(bucket: Bucket, keys: list[str]) -> pa.Schema:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(f"{bucket.bucket}/{keys[0]}", filesystem=arrow_filesystem())
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"s3://{bucket.bucket}/{keys[0]} is not a readable Parquet file: {one_line(exc)}") from None


def frames(spark, url: str, max_objects: int = MAX_OBJECTS) -> dict:
    """Each table of the dataset at ``url`` as a Spark DataFrame read in place, by name.

    Example: ``frames(spark, "s3://b/job")["instructions"].groupBy("rank").count().show()``.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    bucket, tables = plan(url, max_objects)
    spark.dataSource.register(TraceObjects)
    return {t.name: spark.read.format(FORMAT).schema(from_arrow_schema(t.schema))
            .option("bucket", bucket).option("keys", json.dumps(t.keys)).load() for t in tables}


class TraceObjects(DataSource):
    """The Data Source: options ``bucket`` and ``keys`` (a JSON list of Parquet objects), and the schema
    (:func:`frames` gives both). Example: ``spark.dataSource.register(TraceObjects)``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def reader(self, schema) -> "_Reader":
        return _Reader(self.options["bucket"], json.loads(self.options["keys"]), schema)


class _Object(InputPartition):
    """One Parquet object: one Spark partition."""


class _Reader(DataSourceReader):
    def __init__(self, bucket: str, keys: list[str], schema):
        self.bucket, self.keys, self.schema = bucket, keys, schema

    def partitions(self) -> list[InputPartition]:
        return [_Object(key) for key in self.keys]   # none: Spark reads one empty partition (value None)

    def read(self, partition: InputPartition):
        """The object's rows as Arrow batches of exactly the table's schema (runs in an executor)."""
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        if partition.value is None:
            return
        target = to_arrow_schema(self.schema, timezone="UTC")
        values = partition_values(partition.value)
        with arrow_filesystem().open_input_file(f"{self.bucket}/{partition.value}") as f:
            file = pq.ParquetFile(f)
            present = [n for n in target.names if n in file.schema_arrow.names]
            for batch in file.iter_batches(batch_size=BATCH_ROWS, columns=present):
                yield conform(batch, target, values)


def conform(batch: pa.RecordBatch, target: pa.Schema, values: dict[str, str]) -> pa.RecordBatch:
    """``batch`` as ``target``: partition columns from ``values`` (the object's path wins over a column of
    the file, as in pyarrow's hive datasets, hence DuckDB's), the others cast, a column the file lacks null
    (a file an older version wrote).

    >>> b = pa.record_batch({"x": pa.array([1, 2], pa.int32()), "rank": pa.array([0, 0], pa.int32())})
    >>> t = pa.schema([("x", pa.int64()), ("rank", pa.int32()), ("y", pa.string())])
    >>> conform(b, t, {"rank": "3"}).to_pylist()
    [{'x': 1, 'rank': 3, 'y': None}, {'x': 2, 'rank': 3, 'y': None}]
    """
    partition_types = dict(PARTITIONS)
    columns = []
    for field in target:
        if field.name in values and field.name in partition_types:
            value = pa.scalar(values[field.name]).cast(partition_types[field.name]).cast(field.type)
            columns.append(pa.array([value.as_py()] * batch.num_rows, field.type))
        elif field.name in batch.schema.names:
            columns.append(batch.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(batch.num_rows, field.type))
    return pa.RecordBatch.from_arrays(columns, schema=target)
