"""Multi-host trace dataset benchmark (docs/scale.md): a synthetic 64-rank job on a real S3 server.

Starts SeaweedFS on 127.0.0.1 (tests/servers.py), records ``--ranks`` synthetic runs (each its own
instance and rank; the synthetic transformer block of ``traces.synthetic``, every execution
profiled), publishes each rank's partition as a rank does at its end, then measures, in this run:

* publish: finalise + upload per rank (mean, and the whole job run one rank after another);
* rows and bytes per rank, and per rank-hour of device time (the rank's executions' span);
* DuckDB in place on S3: open + ``summary()``, a full scan grouped by (instance, rank), one rank
  (partition pruning), a 1% time window;
* the baseline: the same queries on one local ``profile.duckdb`` of all the ranks' segments;
* with ``--spark``: the Summary on Spark local mode over a local copy of the dataset, and in place
  on the bucket (``traces/spark_source.py``).

Prints a Markdown table (ratios are dataset / local profile). Usage:
``.venv/bin/python bench/scale.py [--ranks 64] [--executions 4] [--instructions 20000] [--spark]``
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import traces  # noqa: E402
from traces import objstore, synthetic  # noqa: E402
from traces.dataset import SEGMENTS_DIR, partition, publish_rank  # noqa: E402
from traces.ids import instance_id  # noqa: E402


def best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def queries(p, rank: int, dataset: bool) -> dict:
    """The same questions on the dataset (partition columns) and on a local profile (joins to runs)."""
    lo, hi = p.trace_range()
    t0 = lo + (hi - lo) // 2
    t1 = t0 + (hi - lo) // 100
    per_rank = ("SELECT instance, rank, count(*), sum(dur_ns) FROM instructions GROUP BY ALL" if dataset else
                "SELECT e.run_id, count(*), sum(i.dur_ns) FROM instructions i JOIN executions e USING (exec_id) "
                "GROUP BY ALL")
    one = ("SELECT engine, sum(dur_ns) FROM instructions WHERE rank = ? GROUP BY ALL" if dataset else
           "SELECT engine, sum(dur_ns) FROM instructions WHERE exec_id IN "
           "(SELECT exec_id FROM executions WHERE run_id = ?) GROUP BY ALL")
    return {
        "summary()": lambda: p.summary(),
        "full scan: instructions per rank": lambda: p.sql(per_rank),
        "one rank: engine time": lambda: p.sql(one, [rank if dataset else f"rank{rank}"]),
        "1% time window: instructions per engine": lambda: p.sql(
            "SELECT engine, count(*) FROM instructions WHERE start_ns >= ? AND start_ns < ? GROUP BY ALL",
            [t0, t1]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--executions", type=int, default=4, help="per rank, one of them warm-up")
    ap.add_argument("--instructions", type=int, default=20000, help="instruction rows per execution")
    ap.add_argument("--spark", action="store_true", help="also time the Summary on Spark local mode")
    args = ap.parse_args()
    from servers import start_seaweedfs, stop

    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    proc, server = start_seaweedfs(work / "seaweedfs", bucket="bench")
    os.environ.update(server.env)
    try:
        url = server.url("jobs/synthetic64")
        rows = devspan = 0
        publish_s = []
        local = work / "all_segments"
        local.mkdir()
        for rank in range(args.ranks):
            d = work / f"rank{rank}"
            synthetic.write_run(d, executions=args.executions, instructions=args.instructions, seed=rank,
                                run_id=f"rank{rank}")
            for seg in d.glob("*.arrow"):
                shutil.copy(seg, local / seg.name)
            t = time.perf_counter()
            publish_rank(d, url, instance_id(f"host-{rank // 8}"), rank)   # 8 ranks per host
            publish_s.append(time.perf_counter() - t)
            with traces.open(d / "profile.duckdb") as p:
                rows += p.sql("SELECT count(*) AS n FROM instructions").column("n")[0].as_py()
                devspan += p.sql("SELECT max(end_ns) - min(start_ns) AS s FROM executions").column("s")[0].as_py()
            shutil.rmtree(d)
        bucket = objstore.Bucket(url)
        pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=server.bucket,
                                                                          Prefix="jobs/synthetic64/")
        nbytes = sum(o["Size"] for page in pages for o in page.get("Contents", [])
                     if not o["Key"].startswith(f"jobs/synthetic64/{SEGMENTS_DIR}/"))
        files = len([k for k in bucket.list("") if not k.startswith(SEGMENTS_DIR)])
        hours = devspan / 3.6e12
        t = time.perf_counter()
        profile = traces.finalize(local)
        local_finalise = time.perf_counter() - t

        print(f"{args.ranks} ranks on {args.ranks // 8 or 1} hosts, {args.executions} executions x "
              f"{args.instructions} instructions per rank: {rows:,} instruction rows, {nbytes / 2**20:.1f} MiB of "
              f"Parquet in {files} files (example partition: {partition(instance_id('host-0'), 0)})")
        print(f"per rank: {rows // args.ranks:,} rows, {nbytes / args.ranks / 2**20:.2f} MiB; per rank-hour of device "
              f"time: {rows / hours:.3g} rows, {nbytes / hours / 2**30:.3g} GiB")
        print(f"publish per rank: mean {sum(publish_s) / len(publish_s):.2f} s (finalise + upload); one finalise "
              f"of all segments on one machine: {local_finalise:.1f} s; load average {os.getloadavg()[0]:.1f}")
        print()
        print("| query | DuckDB on S3 (in place) | local profile.duckdb | ratio |")
        print("|---|---|---|---|")
        t = time.perf_counter()
        with traces.open(url) as ds:
            opened = time.perf_counter() - t
            with traces.open(profile) as lp:
                print(f"| open | {opened:.3f} s | – | |")
                pairs = zip(queries(ds, args.ranks // 2, True).items(), queries(lp, args.ranks // 2, False).values())
                for (name, q_ds), q_lp in pairs:
                    a, b = best(q_ds), best(q_lp)
                    print(f"| {name} | {a:.3f} s | {b:.3f} s | {a / b:.1f} |")
                assert ds.summary()["execution_count"] == lp.summary()["execution_count"]
        if args.spark:
            copy = work / "copy"
            for key in server.keys("jobs/synthetic64/"):
                if not key.startswith(f"jobs/synthetic64/{SEGMENTS_DIR}/"):
                    dest = copy / key.removeprefix("jobs/synthetic64/")
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    server.client().download_file(server.bucket, key, str(dest))
            from pyspark.sql import SparkSession

            from traces.spark_summary import summary
            os.environ["PYSPARK_PYTHON"] = sys.executable   # in place: the executors' Python readers
            t = time.perf_counter()
            spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                     .config("spark.sql.shuffle.partitions", "4").config("spark.ui.showConsoleProgress", "false")
                     .getOrCreate())
            started = time.perf_counter() - t
            spark.sparkContext.setLogLevel("ERROR")
            first = best(lambda: summary(spark, str(copy)), repeat=1)
            again = best(lambda: summary(spark, str(copy)))
            in_place = best(lambda: summary(spark, url), repeat=1)
            in_place_again = best(lambda: summary(spark, url), repeat=1)
            spark.stop()
            print(f"| Spark local[2]: start session | {started:.1f} s | | |")
            print(f"| Spark local[2]: summary on a local copy (first, then best of 3) | {first:.2f} s, "
                  f"{again:.2f} s | | |")
            print(f"| Spark local[2]: summary in place on s3:// (Python Data Source; first, then again) | "
                  f"{in_place:.2f} s, {in_place_again:.2f} s | | |")
    finally:
        stop(proc)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
