"""Object storage as the real stack uses it, against a real S3 server (SeaweedFS on 127.0.0.1):
the compile cache shared by processes on different simulated hosts, and profiles written by the
ranks of a multi-host job into one hive-partitioned dataset that ``neuron-explorer`` queries in place."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from servers import s3_env, s3_server, subprocess_env  # noqa: F401 - fixtures

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


def test_concurrent_writers_never_half_publish(s3_env, tmp_path):
    url = s3_env.url("cache/race")
    env = subprocess_env({**s3_env.env, "NEURON_COMPILE_CACHE_URL": url})
    procs = [subprocess.Popen([sys.executable, "-c", CACHE_SCRIPT], env={**env, "NEURON_STACK_HOSTNAME": f"h{i}"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
             for i in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    # whoever won, the published entry is whole: its model.done names the NEFF that is there
    [done] = [k for k in s3_env.keys("cache/race/") if k.endswith("model.done")]
    manifest = json.loads(s3_env.client().get_object(Bucket=s3_env.bucket, Key=done)["Body"].read())
    assert set(manifest["sha256"]) == {"model.neff", "compile_flags.json", "model.log"}
    after = run_host(s3_env, "late", tmp_path, CACHE_SCRIPT, NEURON_COMPILE_CACHE_URL=url)
    assert after.stdout.startswith("hit"), after.stderr


def test_a_damaged_s3_entry_is_a_miss_never_a_bad_neff(s3_env, tmp_path):
    url = s3_env.url("cache/damaged")
    assert run_host(s3_env, "a", tmp_path, CACHE_SCRIPT, NEURON_COMPILE_CACHE_URL=url).stdout.startswith("compiled")
    [neff] = [k for k in s3_env.keys("cache/damaged/") if k.endswith("model.neff")]
    s3_env.client().put_object(Bucket=s3_env.bucket, Key=neff, Body=b"half a neff")
    r = run_host(s3_env, "b", tmp_path, CACHE_SCRIPT, NEURON_COMPILE_CACHE_URL=url)
    assert r.returncode == 0 and r.stdout.startswith("compiled"), r.stderr
    assert "does not match its model.done" in r.stderr


def test_bad_credentials_are_one_line_without_the_secret(s3_env, tmp_path):
    r = run_host(s3_env, "a", tmp_path, CACHE_SCRIPT, NEURON_COMPILE_CACHE_URL=s3_env.url("cache/denied"),
                 AWS_SECRET_ACCESS_KEY="wrong-secret-value-xyz")
    assert r.returncode != 0
    assert "SignatureDoesNotMatch" in r.stderr or "InvalidAccessKeyId" in r.stderr or "AccessDenied" in r.stderr, \
        r.stderr
    assert "wrong-secret-value-xyz" not in r.stderr + r.stdout
