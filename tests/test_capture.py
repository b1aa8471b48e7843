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


def test_bad_neff_is_one_line(tmp_path):
    (tmp_path / "junk.neff").write_bytes(b"not a neff at all")
    r = subprocess.run([EXPLORER, "capture", "-n", "junk.neff", "-s", "out"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "junk.neff: not a NEFF archive" in lines[0], r.stderr
