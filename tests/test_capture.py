"""``neuron-explorer capture`` as the user types it: a NEFF made by ``neuron_stack.trace(...,
compiler_workdir=...)``, inputs by name from .npy files (the rest zero-filled), N executions with
instructions for the Nth only, outputs saved, the summary read back; bad input is one line."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import numpy as np
import pytest

BIN = Path(sys.executable).parent
EXPLORER = str(BIN / "neuron-explorer")

MAKE_NEFF = textwrap.dedent("""
    import numpy as np, torch, neuron_stack

    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 16)
            self.out = torch.nn.Linear(16, 4)

        def forward(self, x, scale):
            return self.out(torch.relu(self.fc(x)) * scale), x.sum(-1)

    torch.manual_seed(0)
    m = Gate().eval()
    x, scale = torch.randn(2, 8), torch.rand(2, 16)
    neuron_stack.trace(m, (x, scale), compiler_workdir="wd")
    np.save("x.npy", x.numpy()); np.save("scale.npy", scale.numpy())
    with torch.no_grad():
        y, s = m(x, scale)
        y0, _ = m(x, torch.zeros_like(scale))
    np.save("want_y.npy", y.numpy()); np.save("want_s.npy", s.numpy()); np.save("want_y0.npy", y0.numpy())
    np.save("bad_shape.npy", np.zeros((3, 8), np.float32)); np.save("bad_dtype.npy", np.zeros((2, 8), np.int64))
""")


def _env(cache: Path) -> dict:
    return {**os.environ, "NEURON_COMPILE_CACHE_URL": str(cache)}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("capture")
    (d / "make_neff.py").write_text(MAKE_NEFF)
    subprocess.run([sys.executable, "make_neff.py"], cwd=d, env=_env(d / "cache"), check=True, timeout=300,
                   capture_output=True)
    assert (d / "wd" / "model.neff").is_file()
    return d


def capture(work, *args):
    return subprocess.run([EXPLORER, "capture", "-n", "wd/model.neff", *args], cwd=work, env=_env(work / "cache"),
                          capture_output=True, text=True, timeout=300)


def test_capture_named_inputs_nth_exec_and_outputs(work):
    r = capture(work, "-s", "prof", "x", "x.npy", "scale", "scale.npy",
                "--num-exec", "3", "--profile-nth-exec", "2", "--save-output-npy", "outs")
    assert r.returncode == 0, r.stderr
    assert "profile written to prof/profile.duckdb" in r.stdout
    np.testing.assert_allclose(np.load(work / "outs/output0.npy"), np.load(work / "want_y.npy"), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.load(work / "outs/output1.npy"), np.load(work / "want_s.npy"), rtol=1e-4, atol=1e-5)
    con = duckdb.connect(str(work / "prof/profile.duckdb"), read_only=True)
    rows = con.sql("SELECT e.iteration, e.warmup, count(i.exec_id) FROM executions e "
                   "LEFT JOIN instructions i USING (exec_id) GROUP BY ALL ORDER BY 1").fetchall()
    con.close()
    assert [(it, w) for it, w, _ in rows] == [(0, True), (1, False), (2, False)]
    assert rows[0][2] == 0 and rows[1][2] > 0 and rows[2][2] == 0, rows   # the 2nd execution only

    # the summary a user asks for next: warm-up excluded, the profiled execution's instructions in it
    s = subprocess.run([EXPLORER, "summary", "prof/profile.duckdb", "--json"], cwd=work, capture_output=True,
                       text=True, timeout=120)
    assert s.returncode == 0, s.stderr
    row = json.loads(s.stdout)["summary"][0]
    assert row["execution_count"] == 2 and row["event_count"] == rows[1][2]
    assert row["total_time"] > 0


def test_missing_inputs_are_zero_filled_and_profiling_can_be_off(work):
    r = capture(work, "-s", "prof0", "x", "x.npy", "--num-exec", "2", "--profile-nth-exec", "0",
                "--save-output-npy", "outs0")
    assert r.returncode == 0, r.stderr
    assert "zero-filled inputs: scale [2, 16] float32" in r.stdout
    # no device rows on purpose: said once, as information (issue 36)
    assert ("  info: no device rows: --profile-nth-exec 0 (no device profile); 2 device executions are in the "
            "system profile only: pass --profile-nth-exec 1") in r.stdout.splitlines(), r.stdout
    assert "warning" not in r.stderr
    np.testing.assert_allclose(np.load(work / "outs0/output0.npy"), np.load(work / "want_y0.npy"), rtol=1e-4, atol=1e-5)
    con = duckdb.connect(str(work / "prof0/profile.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM executions").fetchall()[0][0] == 2
    assert con.execute("SELECT count(*) FROM instructions").fetchall()[0][0] == 0
    con.close()


@pytest.mark.parametrize("args,needle", [
    (["x", "bad_shape.npy"], "input 'x': bad_shape.npy is [3, 8] float32 but the NEFF expects [2, 8] float32"),
    (["x", "bad_dtype.npy"], "is [2, 8] int64 but the NEFF expects [2, 8] float32"),
    (["nope", "x.npy"], "unknown input 'nope': this NEFF's inputs are x [2, 8] float32, scale [2, 16] float32"),
    (["x", "missing.npy"], "input 'x': no such file missing.npy"),
    (["x", "make_neff.py"], "make_neff.py is not a readable .npy file"),
])
def test_bad_input_is_one_line(work, args, needle):
    r = capture(work, "-s", f"bad_{abs(hash(needle))}", *args)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuron-explorer capture: error:") and needle in lines[0], r.stderr
    assert not (work / f"bad_{abs(hash(needle))}" / "profile.duckdb").exists()


@pytest.mark.real_python   # it checks what the process imports: a warm one has torch
def test_inputs_are_checked_before_torch_loads(work):
    """A NEFF's inputs are read, and a bad .npy refused, without importing torch (1.5 s): the error comes at once."""
    code = ("import sys\nfrom neuron_stack.tools.capture import gather_inputs, input_specs\n"
            "specs = input_specs('wd/model.neff')\ngather_inputs(['x', 'x.npy'], specs)\n"
            "print(sorted(specs), 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["['scale',", "'x']", "False"], r.stderr[-2000:]


def test_bad_neff_is_one_line(tmp_path):
    (tmp_path / "junk.neff").write_bytes(b"not a neff at all")
    r = subprocess.run([EXPLORER, "capture", "-n", "junk.neff", "-s", "out"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "junk.neff: not a NEFF archive" in lines[0], r.stderr


def test_capture_to_a_profile_file_as_the_real_command_line(work):
    """``capture -n x.neff -s profile.ntff IN x.npy`` (the real command line, unchanged) writes exactly that file (a
    DuckDB profile: the real NTFF format is not public) and nothing else; ``summary``, ``sql`` and the real
    ``view -n x.neff -s profile.ntff`` open it; a second capture rewrites it."""
    before = set(work.iterdir())
    r = capture(work, "-s", "profile.ntff", "x", "x.npy", "scale", "scale.npy")
    assert r.returncode == 0, r.stderr
    assert "profile written to profile.ntff" in r.stdout and "neuron-explorer summary profile.ntff" in r.stdout
    assert set(work.iterdir()) - before == {work / "profile.ntff"}   # no session directory, no segments left
    run = lambda *a: subprocess.run([EXPLORER, *a], cwd=work, capture_output=True, text=True, timeout=120)  # noqa: E731
    s = run("summary", "profile.ntff", "--json")
    assert s.returncode == 0, s.stderr
    [row] = json.loads(s.stdout)["summary"]
    assert row["execution_count"] == 1 and row["event_count"] > 0
    q = run("sql", "profile.ntff", "SELECT count(*) AS n FROM Instruction", "--format", "json")
    assert q.returncode == 0 and json.loads(q.stdout)[0]["n"] == row["event_count"], q.stdout + q.stderr
    v = run("view", "-n", "wd/model.neff", "-s", "profile.ntff", "--output-format", "summary-json")
    assert v.returncode == 0, v.stderr
    assert json.loads(v.stdout)["summary"][0]["total_time"] == row["total_time"]
    first = (work / "profile.ntff").stat().st_mtime_ns
    r = capture(work, "-s", "profile.ntff", "x", "x.npy", "--num-exec", "2")
    assert r.returncode == 0, r.stderr
    assert (work / "profile.ntff").stat().st_mtime_ns != first
    assert json.loads(run("summary", "profile.ntff", "--json").stdout)["summary"][0]["execution_count"] == 2


@pytest.mark.parametrize("args,needle", [
    (["-s", "nodir/profile.ntff"], "capture -s nodir/profile.ntff: the directory nodir does not exist"),
    (["-s", "x.npy"], "capture -s x.npy: the file exists and is not a profile, so capture will not overwrite it"),
    (["-s", "other.duckdb"], "capture -s other.duckdb: the file exists and is not a profile"),
    (["-s", "profile_view.ntff", "--num-exec", "0"], "--num-exec must be >= 1"),
])
def test_a_bad_profile_file_is_one_line(work, args, needle):
    if not (work / "other.duckdb").exists():   # a DuckDB database of the user's, not a profile: kept
        duckdb.connect(str(work / "other.duckdb")).execute("CREATE TABLE t AS SELECT 1 AS a").close()
    before = {p: p.stat().st_mtime_ns for p in work.iterdir()}
    r = capture(work, *args)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert {p: p.stat().st_mtime_ns for p in work.iterdir()} == before   # nothing written, nothing overwritten


def test_view_checks_the_neff_profile_pair(work, tmp_path):
    """The real ``view -n x.neff -s profile.ntff`` needs the matching pair: another NEFF is one line."""
    r = capture(work, "-s", str(tmp_path / "p.ntff"))
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "other.neff"
    bad.write_bytes(b"PK\x03\x04 not really")
    v = subprocess.run([EXPLORER, "view", "-n", str(bad), "-s", str(tmp_path / "p.ntff"), "--output-format",
                        "summary-json"], capture_output=True, text=True, timeout=120)
    assert v.returncode == 1 and v.stderr.count("\n") == 1 and "not a NEFF" in v.stderr, v.stderr
    v = subprocess.run([EXPLORER, "view", "-n", str(work / "wd/model.neff"), "--output-format", "summary-json"],
                       capture_output=True, text=True, timeout=120)
    assert v.returncode == 1 and "give the profile it was captured into too" in v.stderr, v.stderr
