"""``neuron-explorer diff`` of one training script run eager and ``torch.compile``'d on the ``neuron``
device: backward ops on the ``loss.backward()`` line in both, with the forward line they came from; the
same op of the same module under one op path; no forward line carrying backward time."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = '''\
import sys
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = self.fc1(x)
        h = torch.relu(h)
        return self.fc2(h)


torch.manual_seed(0)
model = Net().to("neuron")
x, y = torch.randn(8, 16).to("neuron"), torch.randn(8, 4).to("neuron")
step = torch.compile(model) if sys.argv[1] == "compiled" else model
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for _ in range(3):
    loss = torch.nn.functional.mse_loss(step(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
'''
LINES = {text.strip(): n for n, text in enumerate(SCRIPT.splitlines(), 1)}
FC1, RELU, FC2 = LINES["h = self.fc1(x)"], LINES["h = torch.relu(h)"], LINES["return self.fc2(h)"]
LOSS, BACKWARD, STEP = (LINES["loss = torch.nn.functional.mse_loss(step(x), y)"], LINES["loss.backward()"],
                        LINES["opt.step()"])


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """The script profiled eager and compiled (device profile on): ``{mode: profile.duckdb}``."""
    import traces
    d = tmp_path_factory.mktemp("align")
    (d / "train.py").write_text(SCRIPT)
    procs = {}
    for mode in ("eager", "compiled"):   # side by side, each on its own simulated instance
        env = dict(os.environ, NEURON_RT_INSPECT_ENABLE="1", NEURON_RT_INSPECT_DEVICE_PROFILE="session",
                   NEURON_RT_INSPECT_OUTPUT_DIR=str(d / mode), NEURON_STACK_RUNTIME_DIR=str(d / f"{mode}.rt"),
                   NEURON_COMPILE_CACHE_URL=str(d / "cache"), PYTHONPATH=str(ROOT))
        procs[mode] = subprocess.Popen([sys.executable, str(d / "train.py"), mode], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env=env)
    out = {}
    for mode, proc in procs.items():
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-2000:]
        out[mode] = traces.finalize(str(d / mode))
    return out


def _ops(path, include_warmup: bool | None = None) -> list[dict]:
    import traces
    with traces.open(path) as p:
        totals = {r["op_id"]: r["device_ns"] for r in p.op_totals(include_warmup).to_pylist()}
        return [dict(r, device_ns=totals.get(r["op_id"], 0)) for r in p.ops().to_pylist()]


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_backward_ops_are_on_the_backward_line_with_their_forward_line(profiles, mode):
    ops = [o for o in _ops(profiles[mode]) if o["device_ns"]]
    backward = [o for o in ops if o["fwd_line"] is not None]
    forward = [o for o in ops if o["fwd_line"] is None]
    assert backward and {o["line"] for o in backward} == {BACKWARD}
    # every forward line of the model and the loss has backward ops, each with its forward op's module
    assert {o["fwd_line"] for o in backward} == {FC1, RELU, FC2, LOSS}
    assert {(o["fwd_line"], o["module_path"]) for o in backward if o["fwd_line"] in (FC1, FC2)} == \
        {(FC1, "fc1"), (FC2, "fc2")}
    # forward lines hold forward ops only: no backward time on them
    assert {o["line"] for o in forward} == {FC1, RELU, FC2, LOSS, BACKWARD, STEP}
    assert all(o["line"] != BACKWARD or o["aten_op"] == "aten.ones_like.default" for o in forward)
    assert {(o["module_path"], o["aten_op"]) for o in forward if o["line"] in (FC1, FC2)} == \
        {("fc1", "aten.addmm.default"), ("fc2", "aten.addmm.default")}


def test_diff_aligns_eager_and_compiled_by_line_and_op_path(profiles):
    r = subprocess.run([sys.executable, "-m", "explorer.cli", "diff", "--json", "-n", "100",
                        str(profiles["eager"]), str(profiles["compiled"])], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    c = json.loads(r.stdout)
    by_op = {row["op_path"]: row for row in c["by_op"]}
    for path in ("fc1 / aten.addmm.default", "fc2 / aten.addmm.default", "(top) / aten.relu.default",
                 "fc1 / aten.mm.default (backward)", "fc2 / aten.mm.default (backward)"):
        row = by_op[path]
        assert row["a_ns"] > 0 and row["b_ns"] > 0 and row["only_in"] == "", row
    assert not any(p.startswith("(top) / aten.addmm") for p in by_op)
    # a line's figure in each profile is its own ops' time: the sum of the op table's rows for that line,
    # over every execution (a diff counts warm-ups, on both sides)
    by_line = {row["line"]: row for row in c["by_line"]}
    for side, mode in (("a_ns", "eager"), ("b_ns", "compiled")):
        ops = _ops(profiles[mode], include_warmup=True)
        for line in (FC1, RELU, FC2, BACKWARD):
            assert by_line[f"train.py:{line}"][side] == sum(o["device_ns"] for o in ops if o["line"] == line) > 0
    # the backward time split by the forward line it came from, present in both
    by_fwd = {row["line"]: row for row in c["by_fwd_line"]}
    for line in (FC1, RELU, FC2):
        assert by_fwd[f"train.py:{line}"]["a_ns"] > 0 and by_fwd[f"train.py:{line}"]["b_ns"] > 0
    text = subprocess.run([sys.executable, "-m", "explorer.cli", "diff", str(profiles["eager"]),
                           str(profiles["compiled"])], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, COLUMNS="200")).stdout
    assert "Backward ops by the forward line they came from" in text and "fc1 / aten.mm.default (backward)" in text


def test_compare_page_shows_the_backward_ops_by_forward_line(profiles):
    from explorer import data
    from explorer.app import create_app
    from explorer.pages import compare
    create_app([str(profiles["eager"]), str(profiles["compiled"])])
    try:
        a, b = data.registry().keys()
        out = str(compare.layout(a=a, b=b))
        assert "error-box" not in out and "compare-backward" in out and f"train.py:{FC1}" in out
        assert "fc1 / aten.mm.default (backward)" in out
    finally:
        data.registry().close()


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_op_totals_over_chosen_executions_is_op_summary_formula(profiles, mode):
    """``op_totals(include_warmup=False)`` computes live what finalise stored in ``op_summary``."""
    import traces
    with traces.open(profiles[mode]) as p:
        stored = sorted(p.op_totals().to_pylist(), key=lambda r: r["op_id"])
        live = sorted(p.op_totals(include_warmup=False).to_pylist(), key=lambda r: r["op_id"])
        everything = {r["op_id"]: r for r in p.op_totals(include_warmup=True).to_pylist()}
    keep = ("op_id", "device_ns", "instruction_count", "instruction_flops", "bytes", "host_calls", "host_ns")
    assert [{k: r[k] for k in keep} for r in live if r["device_ns"] or r["host_ns"]] == \
        [{k: r[k] for k in keep} for r in stored if r["device_ns"] or r["host_ns"]]
    assert all(everything[r["op_id"]]["device_ns"] >= r["device_ns"] for r in stored if r["op_id"] in everything)
