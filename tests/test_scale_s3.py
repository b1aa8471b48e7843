"""Object storage as the real stack uses it, against a real S3 server (SeaweedFS on 127.0.0.1):
the compile cache shared by processes on different simulated hosts, and profiles written by the
ranks of a multi-host job into one hive-partitioned dataset that ``neuron-explorer`` queries in place."""
import hashlib
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from servers import free_ports, subprocess_env

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

CACHE_SCRIPT = textwrap.dedent("""
    import torch, neuron_stack
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()).eval()
    x = torch.randn(4, 16)
    nm = neuron_stack.trace(m, x)
    torch.testing.assert_close(nm(x), m(x), rtol=1e-4, atol=1e-5)
    print("hit" if nm.cache_hit else "compiled", nm.model.compile_info["cache_path"])
""")


def run_host(server, host: str, tmp_path: Path, script: str, **env) -> subprocess.CompletedProcess:
    """One process on its own simulated host: its own host name, instance id and local temp dir."""
    local = tmp_path / host
    local.mkdir(exist_ok=True)
    full = subprocess_env({**server.env, "NEURON_STACK_HOSTNAME": host, "TMPDIR": str(local), **env})
    return subprocess.run([sys.executable, "-c", script], env=full, capture_output=True, text=True, timeout=300,
                          cwd=local)


def test_two_hosts_share_an_s3_compile_cache(s3_env, tmp_path):
    url = s3_env.url("cache/shared")
    first = run_host(s3_env, "host-a", tmp_path, CACHE_SCRIPT, NEURON_COMPILE_CACHE_URL=url)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("compiled")
    keys = s3_env.keys("cache/shared/")
    entry = {k.rsplit("/", 1)[1] for k in keys}
    assert entry == {"model.neff", "compile_flags.json", "model.log", "model.done"}, keys
    assert all(k.split("/")[2].startswith("neuronxcc-") and k.split("/")[3].startswith("MODULE_") for k in keys)
    second = run_host(s3_env, "host-b", tmp_path, CACHE_SCRIPT, NEURON_COMPILE_CACHE_URL=url)
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("hit"), second.stdout + second.stderr
    assert s3_env.keys("cache/shared/") == keys           # a hit writes nothing
    assert AWS_SECRET not in first.stderr + second.stderr


AWS_SECRET = "neuronstack-test-secret-0123456789"


def trace_here(monkeypatch, url: str):
    """CACHE_SCRIPT's model traced in this process (torch already loaded), with the cache at ``url``."""
    import torch

    import neuron_stack

    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", url)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()).eval()
    x = torch.randn(4, 16)
    nm = neuron_stack.trace(m, x)
    torch.testing.assert_close(nm(x), m(x), rtol=1e-4, atol=1e-5)
    return nm


def test_concurrent_writers_never_half_publish(s3_env, tmp_path, monkeypatch):
    url = s3_env.url("cache/race")
    env = subprocess_env({**s3_env.env, "NEURON_COMPILE_CACHE_URL": url})
    procs = [subprocess.Popen([sys.executable, "-c", CACHE_SCRIPT], env={**env, "NEURON_STACK_HOSTNAME": f"h{i}"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
             for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    # whoever won, the published entry is whole: its model.done names the NEFF that is there
    [done] = [k for k in s3_env.keys("cache/race/") if k.endswith("model.done")]
    manifest = json.loads(s3_env.client().get_object(Bucket=s3_env.bucket, Key=done)["Body"].read())
    assert set(manifest["sha256"]) == {"model.neff", "compile_flags.json", "model.log"}
    assert trace_here(monkeypatch, url).cache_hit


def test_a_writer_never_replaces_a_member_another_wrote(s3_env, monkeypatch):
    """The race CI once lost: a writer that loses to another must not overwrite the members the winner's
    model.done describes. Staged deterministically: a writer that uploaded its members and died before
    model.done; the next writer hashes the members that are there instead of replacing them."""
    url, s3 = s3_env.url("cache/crashed"), s3_env.client()
    assert not trace_here(monkeypatch, url).cache_hit
    keys = s3_env.keys("cache/crashed/")
    [done] = [k for k in keys if k.endswith("model.done")]
    [log] = [k for k in keys if k.endswith("model.log")]
    s3.delete_object(Bucket=s3_env.bucket, Key=done)
    s3.put_object(Bucket=s3_env.bucket, Key=log, Body=b"the other writer's log")
    assert not trace_here(monkeypatch, url).cache_hit          # no model.done: a miss, compiled and published
    manifest = json.loads(s3.get_object(Bucket=s3_env.bucket, Key=done)["Body"].read())
    assert manifest["sha256"]["model.log"] == hashlib.sha256(b"the other writer's log").hexdigest()
    assert s3.get_object(Bucket=s3_env.bucket, Key=log)["Body"].read() == b"the other writer's log"
    assert trace_here(monkeypatch, url).cache_hit


def test_a_damaged_s3_entry_is_a_miss_never_a_bad_neff_and_heals(s3_env, monkeypatch, capfd):
    url = s3_env.url("cache/damaged")
    assert not trace_here(monkeypatch, url).cache_hit
    [neff] = [k for k in s3_env.keys("cache/damaged/") if k.endswith("model.neff")]
    s3_env.client().put_object(Bucket=s3_env.bucket, Key=neff, Body=b"half a neff")
    capfd.readouterr()
    assert not trace_here(monkeypatch, url).cache_hit           # a miss (output equals eager), then healed
    err = capfd.readouterr().err.strip().splitlines()
    entry = "s3://" + s3_env.bucket + "/" + neff.rsplit("/", 1)[0]
    assert err[0] == (f"neuron_stack: warning: compile cache entry {entry}: model.neff does not match its model.done "
                      "(damaged, or being replaced); compiling instead; this process then replaces the entry (or "
                      f"remove it: aws s3 rm --recursive {entry}/)"), err
    assert err[1:] == [f"neuron_stack: compile cache entry {entry} replaced (healed)"]
    assert trace_here(monkeypatch, url).cache_hit               # the next process hits
    assert capfd.readouterr().err == ""


def test_a_heal_never_replaces_an_entry_published_meanwhile(s3_env, monkeypatch):
    """Two processes miss the same damaged entry: the first heals it; the second's conditional replace sees
    a model.done that is no longer the damaged one and keeps it."""
    from neuron_stack.compiler.cache import S3CompileCache
    url = s3_env.url("cache/twoheal")
    assert not trace_here(monkeypatch, url).cache_hit
    keys = s3_env.keys("cache/twoheal/")
    [neff] = [k for k in keys if k.endswith("model.neff")]
    [done] = [k for k in keys if k.endswith("model.done")]
    s3 = s3_env.client()
    good = s3.get_object(Bucket=s3_env.bucket, Key=neff)["Body"].read()
    s3.put_object(Bucket=s3_env.bucket, Key=neff, Body=b"damaged")
    cache = S3CompileCache(url)
    rel = neff.split("cache/twoheal/", 1)[1].rsplit("/", 1)[0]
    _, damaged_etag = cache.bucket.get_versioned(f"{rel}/model.done")
    healed = s3.get_object(Bucket=s3_env.bucket, Key=done)["Body"].read()
    s3.put_object(Bucket=s3_env.bucket, Key=neff, Body=good)             # the first healer's members...
    s3.put_object(Bucket=s3_env.bucket, Key=done, Body=healed + b" ")    # ...and its model.done (a new version)
    assert not cache.bucket.put_bytes(f"{rel}/model.done", b"{}", if_match=damaged_etag)
    assert s3.get_object(Bucket=s3_env.bucket, Key=done)["Body"].read() == healed + b" "
    assert trace_here(monkeypatch, url).cache_hit


def test_neuron_parallel_compile_warms_an_s3_cache(s3_env, tmp_path):
    url = s3_env.url("cache/warmed")
    env = subprocess_env({**s3_env.env, "NEURON_COMPILE_CACHE_URL": url,
                          "NEURON_PARALLEL_COMPILE_WORKDIR": str(tmp_path / "graphs")})
    r = subprocess.run([str(BIN / "neuron_parallel_compile"), "--num-parallel", "2", sys.executable, "train_mlp.py",
                        "--small"], cwd=ROOT / "sample_workloads", env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"Compile cache path: {url}" in r.stdout
    done = [k for k in s3_env.keys("cache/warmed/") if k.endswith("/model.done")]
    assert len(done) == 2   # forward + backward, on the bucket


def test_bad_credentials_are_one_line_without_the_secret(s3_env, tmp_path):
    r = run_host(s3_env, "a", tmp_path, CACHE_SCRIPT, NEURON_COMPILE_CACHE_URL=s3_env.url("cache/denied"),
                 AWS_SECRET_ACCESS_KEY="wrong-secret-value-xyz")
    assert r.returncode != 0
    assert "SignatureDoesNotMatch" in r.stderr or "InvalidAccessKeyId" in r.stderr or "AccessDenied" in r.stderr, \
        r.stderr
    assert "wrong-secret-value-xyz" not in r.stderr + r.stdout


TORCHRUN = str(BIN / "torchrun")
EXPLORER = str(BIN / "neuron-explorer")
HOSTS = ("trn1-node-a", "trn1-node-b", "trn1-node-c")


@pytest.fixture
def three_host_job(s3_server, tmp_path_factory):
    """``torchrun --nnodes 3`` as three hosts would run it: one torchrun per simulated host (its own host
    name, instance id, runtime dir and temp dir), profiles to one S3 URL, the compile cache on S3 too."""
    tmp = tmp_path_factory.mktemp("job")
    url = s3_server.url("jobs/ddp")
    port = free_ports(1)[0]
    procs = []
    for node, host in enumerate(HOSTS):
        local = tmp / host
        local.mkdir()
        env = subprocess_env({**s3_server.env, "NEURON_STACK_HOSTNAME": host, "TMPDIR": str(local),
                              "NEURON_STACK_RUNTIME_DIR": str(local / "rt"), "OMP_NUM_THREADS": "1",
                              "NEURON_COMPILE_CACHE_URL": s3_server.url("jobs/cache"),
                              "NEURON_RT_INSPECT_ENABLE": "1", "NEURON_RT_INSPECT_OUTPUT_DIR": url})
        for var in ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_STACK_INSTANCE_TYPE"):
            env.pop(var, None)
        procs.append(subprocess.Popen(
            [TORCHRUN, "--nnodes", "3", "--node-rank", str(node), "--nproc-per-node", "1",
             "--master-addr", "127.0.0.1", "--master-port", str(port),
             str(ROOT / "sample_workloads" / "ddp_train.py"), "--small"],
            env=env, cwd=local, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=400)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)
    return url, tmp


def check_one_partitioned_dataset(three_host_job, s3_server):
    url, _ = three_host_job
    keys = s3_server.keys("jobs/ddp/")
    parts = {tuple(k.split("/")[3:5]) for k in keys if k.startswith("jobs/ddp/executions/")}
    import traces.ids
    assert parts == {(f"instance={traces.ids.instance_id(h)}", f"rank={r}") for r, h in enumerate(HOSTS)}
    assert all(k.endswith("/part-0.parquet") for k in keys if not k.startswith("jobs/ddp/segments/"))
    assert any(k.startswith("jobs/ddp/segments/instance=") and k.endswith(".arrow") for k in keys)

    import traces
    with traces.open(url) as p:
        runs = p.sql("SELECT rank, node, host, instance, status FROM runs ORDER BY rank").to_pylist()
        assert [(r["rank"], r["node"], r["host"], r["status"]) for r in runs] == \
            [(0, 0, HOSTS[0], "ok"), (1, 1, HOSTS[1], "ok"), (2, 2, HOSTS[2], "ok")]
        dataset_summary = p.summary()
        ranks = p.ranks().to_pylist()
    assert [(r["node"], r["rank"]) for r in ranks] == [(0, 0), (1, 1), (2, 2)]
    assert dataset_summary["run_count"] == 3 and dataset_summary["execution_count"] > 0
    assert dataset_summary["core_count"] == 3          # each host's core 0 is a core of its own

    # the same rows finalised the one-machine way (all segments in one directory) give the same Summary
    with tempfile.TemporaryDirectory() as d:
        for k in keys:
            if k.startswith("jobs/ddp/segments/"):
                s3_server.client().download_file(s3_server.bucket, k, str(Path(d) / k.rsplit("/", 1)[1]))
        with traces.open(traces.finalize(d)) as local:
            assert_same_summary(local.summary(), dataset_summary)


def assert_same_summary(mine: dict, theirs: dict) -> None:
    assert set(mine) == set(theirs)
    for name, value in theirs.items():   # figures a job lacks (no spill, say) are NULL in both
        assert (mine[name] is None and value is None) or mine[name] == pytest.approx(value, rel=1e-9), name


def check_explorer_queries_the_url(three_host_job, s3_server):
    url, _ = three_host_job
    env = subprocess_env(s3_server.env)
    out = subprocess.run([EXPLORER, "summary", url, "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["summary"][0]["run_count"] == 3 and len(doc["ranks"]) == 3
    q = "SELECT instance, rank, count(*) AS n FROM instructions WHERE rank = ? GROUP BY ALL"
    out = subprocess.run([EXPLORER, "sql", url, q, "-p", "1", "--format", "json"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    assert row["rank"] == 1 and row["n"] > 0 and row["instance"].startswith("i-")
    # read-only as for a local profile: the query cannot write files
    out = subprocess.run([EXPLORER, "sql", url, "COPY runs TO '/tmp/x.csv'"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0 and "read-only" in out.stderr
    # bad URLs are one line
    out = subprocess.run([EXPLORER, "summary", s3_server.url("jobs/none")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "holds no trace dataset" in out.stderr and len(out.stderr.splitlines()) == 1


def check_spark_summary_equals_duckdb(three_host_job, s3_server, tmp_path, monkeypatch):
    import shutil

    if shutil.which("java") is None:
        pytest.skip("no Java runtime for Spark: apt-get install openjdk-17-jre-headless (.ci/run does)")
    from pyspark.sql import SparkSession

    import traces
    from traces.spark_summary import register, summary_rows

    url, _ = three_host_job
    # Spark's own Parquet reader (what s3a:// uses on a cluster with the hadoop-aws jar) on a copy of the
    # dataset's files, laid out as on the bucket
    for key in s3_server.keys("jobs/ddp/"):
        if not key.startswith("jobs/ddp/segments/"):
            dest = tmp_path / key.removeprefix("jobs/ddp/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            s3_server.client().download_file(s3_server.bucket, key, str(dest))
    per_rank = "SELECT instance, rank, count(*) AS n FROM instructions GROUP BY instance, rank ORDER BY rank"
    with traces.open(url) as p:
        duck, duck_cores = p.summary(), p.summary_per_core().to_pylist()
        duck_ranks = p.sql(per_rank).to_pylist()
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)   # the executors' Python readers: this interpreter
    spark = (SparkSession.builder.master("local[1]").appName("neuron-summary-test")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g").getOrCreate())
    try:
        # the bucket itself (pyarrow's S3 filesystem in the executors), registered once for both Summaries
        # as summary() does for one: the executors read each object once, not once per Summary
        cached = register(spark, url)
        [row] = summary_rows(spark)
        cores = summary_rows(spark, per_core=True)
        for frame in cached:
            frame.unpersist()
        register(spark, str(tmp_path))        # the copy (a third whole Summary would cost a minute)
        copied_ranks = [r.asDict() for r in spark.sql(per_rank).collect()]
    finally:
        spark.stop()
    assert copied_ranks == duck_ranks
    assert set(row) == set(duck)
    # JSON numbers, as DuckDB's: Spark's DECIMAL percentages are floats, never strings
    assert not [k for k, v in row.items() if isinstance(duck[k], float) and not isinstance(v, float)], row
    for name, value in duck.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert float(row[name]) == pytest.approx(value, rel=1e-12, abs=1e-12), name
        else:
            assert row[name] == value, name
    key = lambda r: (r["run_id"], r["core"])  # noqa: E731
    assert [key(r) for r in sorted(cores, key=key)] == [key(r) for r in sorted(duck_cores, key=key)]
    for mine, theirs in zip(sorted(cores, key=key), sorted(duck_cores, key=key)):
        assert float(mine["total_time"]) == pytest.approx(theirs["total_time"], rel=1e-12)


def test_a_three_host_job_on_s3_is_one_dataset_for_duckdb_and_spark(three_host_job, s3_server, s3_env, tmp_path,
                                                                    monkeypatch):
    """One test over the job (pytest -n 2 would run a module fixture once per worker): the partitioned
    dataset, the CLI on its URL, then Spark, in place and on a copy."""
    check_one_partitioned_dataset(three_host_job, s3_server)
    check_explorer_queries_the_url(three_host_job, s3_server)
    check_spark_summary_equals_duckdb(three_host_job, s3_server, tmp_path, monkeypatch)


def publish_synthetic(url: str, tmp_path: Path, ranks: int = 2) -> None:
    """``ranks`` small synthetic ranks published to ``url`` as ranks of a job do, one host each."""
    import traces.synthetic
    from traces.dataset import publish_rank
    from traces.ids import instance_id

    for rank in range(ranks):
        traces.synthetic.write_run(tmp_path / f"r{rank}", executions=3, instructions=300, seed=rank,
                                   run_id=f"rank{rank}", cores=(0, 1))
        publish_rank(tmp_path / f"r{rank}", url, instance_id(f"host-{rank}"), rank)


def test_spark_reads_one_partition_per_object_as_duckdb_does(s3_env, tmp_path):
    """The Data Source's executor side, driven without a JVM: each object's batches, with its partition's
    instance and rank, are the rows DuckDB's in-place dataset holds; the listing is bounded."""
    from pyspark.sql.pandas.types import from_arrow_schema

    import traces
    from traces.errors import TraceError
    from traces.spark_source import TraceObjects, plan

    url = s3_env.url("jobs/spark-plan")
    publish_synthetic(url, tmp_path)
    bucket, tables = plan(url)
    by_name = {t.name: t for t in tables}
    assert [k.split("/")[-2:] for k in by_name["instructions"].keys] == [["rank=0", "part-0.parquet"],
                                                                         ["rank=1", "part-0.parquet"]]
    with traces.open(url) as p:
        for name in ("runs", "executions", "instructions", "exec_engine_summary"):
            table = by_name[name]
            reader = TraceObjects({"bucket": bucket, "keys": json.dumps(table.keys)}).reader(
                from_arrow_schema(table.schema))
            rows = [r for part in reader.partitions() for batch in reader.read(part) for r in batch.to_pylist()]
            theirs = p.sql(f"SELECT * FROM {name}").to_pylist()
            order = lambda r: json.dumps(r, sort_keys=True, default=str)  # noqa: E731
            assert sorted(rows, key=order) == sorted(theirs, key=order), name
    with pytest.raises(TraceError, match=r"holds more than 1 objects"):
        plan(url, max_objects=1)


def test_spark_summary_of_a_bad_s3_dataset_is_one_line_before_spark_starts(s3_env, tmp_path):
    env = subprocess_env(s3_env.env)
    no_creds = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    no_creds.update(AWS_EC2_METADATA_DISABLED="true", AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
                    AWS_CONFIG_FILE=str(tmp_path / "none"))
    cases = [(env, s3_env.url("jobs/none"), "holds no trace dataset"),
             (env, "s3://Not_A_Bucket/x", "is not an S3 URL"),
             (no_creds, s3_env.url("jobs/none"), "no AWS credentials found")]
    for case_env, url, why in cases:
        r = subprocess.run([sys.executable, "-m", "traces.spark_summary", url], env=case_env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 1 and r.stdout == "", (url, r.stderr)
        assert r.stderr.startswith("spark_summary: error: ") and why in r.stderr, r.stderr
        assert len(r.stderr.splitlines()) == 1, r.stderr


def test_a_rank_that_died_before_publishing_is_published_from_its_segments(s3_env, tmp_path):
    """Segments reach the bucket as they are published; a rank killed before its end has no tables,
    and `python -m traces.dataset publish-segments URL` builds them from what it uploaded."""
    import traces
    import traces.synthetic
    from traces.dataset import SegmentUploader

    url = s3_env.url("jobs/crashed")
    w = traces.Writer(tmp_path / "rank0", run={"run_id": "r0", "rank": 0},
                      metadata=traces.synthetic.TRN1_METADATA, on_segment=SegmentUploader(url, "i-0dead", 0))
    traces.synthetic.write_run(tmp_path / "rank0", executions=3, instructions=300, writer=w, close=False)
    w.flush()   # the process dies here: no close, no publish
    env = subprocess_env(s3_env.env)
    r = subprocess.run([EXPLORER, "summary", url], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "publish-segments" in r.stderr
    r = subprocess.run([sys.executable, "-m", "traces.dataset", "publish-segments", url], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "instance=i-0dead/rank=0" in r.stderr, r.stderr
    with traces.open(url) as p:
        assert p.summary()["execution_count"] == 2   # three executions, the first a warm-up
        assert p.runs().column("status").to_pylist() == ["incomplete"]
        in_place = p.summary()
    # the same job as one local profile.duckdb (what the web Explorer opens)
    r = subprocess.run([sys.executable, "-m", "traces.dataset", "fetch", url, str(tmp_path / "local")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("profile.duckdb"), r.stderr
    with traces.open(r.stdout.strip()) as local:
        assert_same_summary(local.summary(), in_place)
