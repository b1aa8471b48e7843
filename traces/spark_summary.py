"""The Summary of a trace dataset on Apache Spark: the same SQL as DuckDB's, over the same Parquet files.

A cluster job (docs/scale.md)::

    spark-submit --packages org.apache.hadoop:hadoop-aws:<hadoop version> \\
        traces/spark_summary.py s3a://bucket/jobs/llama --per-core

Every table of the dataset (:mod:`traces.dataset`) becomes a temporary view (Spark finds the
``instance=…/rank=…`` partitions itself), the ranks' metadata merge as :func:`traces.dataset.metadata_sql`
says, and the figures come from :func:`traces.summary_sql.summary_sql`, the one formula DuckDB runs too.
Spark is imported only here, and only when called.
"""
from __future__ import annotations

import argparse
import json
import sys

from traces.dataset import DATASET_TABLES, metadata_sql
from traces.summary_sql import summary_sql


def register(spark, root: str) -> None:
    """Make each table of the dataset at ``root`` (a path or ``s3a://`` URL) a temporary view.

    Example: ``register(spark, "/data/jobs/llama"); spark.sql("SELECT count(*) FROM instructions")``.
    """
    for name, directory in DATASET_TABLES.items():
        frame = spark.read.option("basePath", f"{root}/{directory}").parquet(f"{root}/{directory}")
        frame.createOrReplaceTempView("_ds_metadata" if name == "metadata" else name)
    spark.sql(metadata_sql("_ds_metadata")).createOrReplaceTempView("metadata")


def summary(spark, root: str, include_warmup: bool | None = None, per_core: bool = False) -> list[dict]:
    """The Summary rows of the dataset at ``root`` (one, or one per run and core with ``per_core``).

    ``include_warmup=None`` follows the dataset's ``summary_includes_warmup``, as ``Profile.summary``.
    Example: ``summary(spark, "/data/jobs/llama")[0]["total_time"]``.
    """
    register(spark, root)
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
    """``spark-submit traces/spark_summary.py DATASET [--per-core] [--include-warmup]``: JSON on stdout."""
    ap = argparse.ArgumentParser(prog="spark_summary.py", description=__doc__.splitlines()[0])
    ap.add_argument("dataset", help="the dataset's root: a path, or s3a://bucket/prefix on a cluster")
    ap.add_argument("--per-core", action="store_true", help="one row per run and NeuronCore")
    ap.add_argument("--include-warmup", action="store_true", help="count warm-up executions too")
    args = ap.parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("neuron-summary").getOrCreate()
    try:
        rows = summary(spark, args.dataset.rstrip("/"), True if args.include_warmup else None, args.per_core)
    finally:
        spark.stop()
    print(json.dumps({"summary": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
