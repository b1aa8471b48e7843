"""neuron-cc as the user types it: compile (module:factory and .pt2), list-operators, analyze, errors."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CC = str(Path(sys.executable).parent / "neuron-cc")
MODELS = str(ROOT / "sample_workloads" / "models.py")


def cc(*args, cwd=None):
    return subprocess.run([CC, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_compile_factory_and_run_the_neff(tmp_path):
    out = tmp_path / "mlp.neff"
    r = cc("compile", f"{MODELS}:MLP", "--input-shapes", "4x64", "--target", "inf2", "-O1",
           "--auto-cast", "matmult", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "Compiler status PASS" in r.stdout and "inf2" in r.stdout
    assert "-> matmul" in (tmp_path / "log-neuron-cc.txt").read_text()
    import neuron_stack
    from neuron_stack.isa.neff import read_header
    h = read_header(out)
    assert h["target"] == "inf2" and h["flags"]["optlevel"] == 1 and h["flags"]["auto_cast"] == "matmult"
    assert neuron_stack.load(out).neff.program.stats["num_device_ops"] > 0


def test_compile_pt2(tmp_path):
    import importlib.util

    import torch

    # the .pt2 is the user's, saved by torch.export in any process: this one (a fresh interpreter only adds imports)
    spec = importlib.util.spec_from_file_location("models", MODELS)
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    m = models.CNN(4, 4).eval()
    torch.export.save(torch.export.export(m, (torch.randn(1, 3, 8, 8),)), tmp_path / "cnn.pt2")
    r = cc("compile", str(tmp_path / "cnn.pt2"), "--verbose", "info", "-o", str(tmp_path / "cnn.neff"))
    assert r.returncode == 0, r.stderr
    assert "legalize: " in r.stdout and "convolution" in r.stdout


def test_list_operators():
    r = cc("list-operators", "--json")
    rows = {o["operator"]: o for o in json.loads(r.stdout)}
    assert rows["aten.addmm"]["class"] == "matmul"
    assert rows["aten.nonzero"]["class"] == "cpu" and "data-dependent" in rows["aten.nonzero"]["lowering"]
    assert "OPERATOR" in cc("list-operators").stdout


def test_analyze():
    r = cc("analyze", f"{MODELS}:Ranker", "--input-shapes", "2x32")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["supported_operators"]["aten::addmm"] == 2
    assert any(u["kind"] == "aten::index" for u in rep["unsupported_operators"])


@pytest.mark.parametrize("args,needle", [
    (["compile", "nope.py:MLP"], "no such file nope.py"),
    (["compile", f"{MODELS}:Nope", "--input-shapes", "2x2"], "has no attribute 'Nope'"),
    (["compile", f"{MODELS}:MLP"], "needs example inputs: pass --input-shapes"),
    (["compile", f"{MODELS}:MLP", "--input-shapes", "4xq"], "bad input shape '4xq'"),
    (["compile", f"{MODELS}:MLP", "--auto-cast", "bogus"], "invalid choice: 'bogus'"),
    (["compile", "missing.pt2"], "no such file missing.pt2"),
])
def test_bad_input_is_one_line(args, needle):
    r = cc(*args)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuron-cc") and needle in lines[0], r.stderr


BRANCHY = '''import torch


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            return y * 2
        return y - 1
'''


def test_data_dependent_control_flow_is_one_line_naming_the_users_line_and_the_fix(tmp_path):
    # issue 31: 24 lines of torch's own output came first, and the error named neither the line nor the fix
    (tmp_path / "branchy.py").write_text(BRANCHY)
    r = cc("compile", "branchy.py:Branchy", "--input-shapes", "2x16", "-o", "m.neff", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("neuron-cc: error: torch.export could not capture Branchy: branchy.py:11 "
                               "`if y.sum() > 0:` branches on a tensor's value"), r.stderr
    assert "torch.where" in r.stderr and "torch.cond" in r.stderr
