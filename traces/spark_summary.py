"""The Summary of a trace dataset on Apache Spark: the same SQL as DuckDB's, over the same Parquet files.

A job on the bucket, read in place (docs/scale.md)::

    spark-submit traces/spark_summary.py s3://bucket/jobs/llama --per-core

Every table of the dataset (:mod:`traces.dataset`) becomes a temporary view: an ``s3://`` URL through
Spark's Python Data Source (:mod:`traces.spark_source`: pyarrow's S3 filesystem in the executors, one
partition per object, no jar), a path or ``s3a://`` URL through Spark's own Parquet reader (which finds
the ``instance=…/rank=…`` partitions itself). The ranks' metadata merge as
:func:`traces.dataset.metadata_sql` says, and the figures come from :func:`traces.summary_sql.summary_sql`,
the one formula DuckDB runs too. Spark is imported only here and in :mod:`traces.spark_source`, and only
when called.
"""
from __future__ import annotations

import argparse
import json
import sys

from traces.dataset import DATASET_TABLES, metadata_sql
from traces.errors import run_guarded
from traces.objstore import is_url
from traces.summary_sql import summary_sql


def register(spark, root: str) -> list:
    """Make each table of the dataset at ``root`` (a path, an ``s3://`` or an ``s3a://`` URL) a temporary view;
    returns the DataFrames it cached (unpersist them when done).

    Example: ``register(spark, "s3://ml-team/jobs/llama"); spark.sql("SELECT count(*) FROM instructions")``.
    """
    cached = []
    if is_url(root):
        from pyspark import StorageLevel

        from traces.spark_source import frames

        # the Summary reads each table many times: the executors read each object once, and Spark
        # keeps the rows (spilling to disk past its memory) instead of re-running Python readers
        tables = {name: frame.persist(StorageLevel.MEMORY_AND_DISK) for name, frame in frames(spark, root).items()}
        cached = list(tables.values())
    else:
        tables = {name: spark.read.option("basePath", f"{root}/{directory}").parquet(f"{root}/{directory}")
                  for name, directory in DATASET_TABLES.items()}
    for name, frame in tables.items():
        frame.createOrReplaceTempView("_ds_metadata" if name == "metadata" else name)
    spark.sql(metadata_sql("_ds_metadata")).createOrReplaceTempView("metadata")
    return cached


def summary(spark, root: str, include_warmup: bool | None = None, per_core: bool = False) -> list[dict]:
    """The Summary rows of the dataset at ``root`` (one, or one per run and core with ``per_core``).

    ``include_warmup=None`` follows the dataset's ``summary_includes_warmup``, as ``Profile.summary``.
    Example: ``summary(spark, "/data/jobs/llama")[0]["total_time"]``.
    """
    cached = register(spark, root)
    try:
        return summary_rows(spark, include_warmup, per_core)
    finally:
        for frame in cached:
            frame.unpersist()


def summary_rows(spark, include_warmup: bool | None = None, per_core: bool = False) -> list[dict]:
    """:func:`summary` of the dataset :func:`register` made the session's views: several Summaries of one
    dataset (whole and per core, say) read its objects once.

    Example: ``register(spark, url); whole, cores = summary_rows(spark), summary_rows(spark, per_core=True)``.
    """
    if include_warmup is None:
        stored = spark.sql("SELECT value FROM metadata WHERE key = 'summary_includes_warmup'").collect()
        include_warmup = bool(stored) and stored[0]["value"] == "true"
    return [{k: _plain(v) for k, v in row.asDict().items()}
            for row in spark.sql(summary_sql(include_warmup, per_core=per_core)).collect()]


def _plain(value):
    """Spark's DECIMAL results as floats, as DuckDB gives them (JSON numbers, not strings).

    >>> from decimal import Decimal
    >>> _plain(Decimal("12.5")), _plain("x")
    (12.5, 'x')
    """
    from decimal import Decimal
    return float(value) if isinstance(value, Decimal) else value


def main(argv=None) -> int:
    """``spark-submit traces/spark_summary.py DATASET [--per-core] [--include-warmup]``: JSON on stdout.

    Run with plain ``python -m traces.spark_summary`` it starts Spark in local mode, its Python workers on
    this interpreter. A bad dataset is one line on stderr, exit 1, checked before Spark starts.
    """
    import os

    ap = argparse.ArgumentParser(prog="spark_summary.py", description=__doc__.splitlines()[0])
    ap.add_argument("dataset", help="the dataset's root: s3://bucket/prefix (read in place), a path, or s3a://…")
    ap.add_argument("--per-core", action="store_true", help="one row per run and NeuronCore")
    ap.add_argument("--include-warmup", action="store_true", help="count warm-up executions too")
    args = ap.parse_args(argv)
    root = args.dataset.rstrip("/")

    def run() -> int:
        if is_url(root):
            from traces.spark_source import plan

            plan(root)   # a bad URL, missing credentials or no dataset: one line, before a JVM starts
        from pyspark.sql import SparkSession

        if "PYSPARK_GATEWAY_PORT" not in os.environ:   # not under spark-submit: local mode, whose Python
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)   # workers need this interpreter's packages
        spark = SparkSession.builder.appName("neuron-summary").getOrCreate()
        try:
            rows = summary(spark, root, True if args.include_warmup else None, args.per_core)
        finally:
            spark.stop()
        print(json.dumps({"summary": rows}, indent=2, default=str))
        return 0
    return run_guarded("spark_summary", run)


if __name__ == "__main__":
    sys.exit(main())
