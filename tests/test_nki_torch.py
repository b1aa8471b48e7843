"""NKI kernels inside PyTorch models: one graph op whose lowering is the kernel's instructions, in
neuron_stack.trace and torch.compile(backend="neuron"), in profiles and in neuron-explorer diff."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

import neuron_stack
from neuron_stack.compiler.schedule import build_schedules
from neuron_stack.isa.interp import run_program

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_workloads" / "nki" / "rmsnorm_in_model.py"
sys.path.insert(0, str(SAMPLE.parent))
from rmsnorm_in_model import Block  # noqa: E402  (the sample is a script beside its kernels, not a package)


def _reference(model, x):
    h = model.proj(x)
    return x + h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * model.weight


def _kernel_block(seed: int, dim: int, rows: int):
    """The sample's Block with its norm as the NKI kernel, a seeded input, and eager PyTorch's output."""
    torch.manual_seed(seed)
    model = Block(dim, use_kernel=True).eval()
    x = torch.randn(rows, dim)
    with torch.no_grad():
        return model, x, model(x)


def test_kernel_in_traced_model_matches_eager_and_is_lowered_to_its_instructions():
    model, x, eager = _kernel_block(0, 256, 200)
    with torch.no_grad():
        torch.testing.assert_close(eager, _reference(model, x), rtol=1e-4, atol=1e-5)
        traced = neuron_stack.trace(model, x)
        out = traced(x)
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)
    prog = traced.neff.program
    (k,) = [n for n in prog.nodes if n.target.startswith("nki.")]
    assert (k.op_class, k.placement) == ("nki", "device")
    table = traced.neff.schedules[0].table
    mine = [(op, json.loads(o).get("nki_loc")) for o, op, node in zip(
        table.column("operands").to_pylist(), table.column("opcode").to_pylist(), table.column("node").to_pylist())
        if node == k.name]
    locs = {loc for _, loc in mine if loc}
    assert {loc.split(":")[0] for loc in locs} == {"rmsnorm.py"} and len(locs) >= 5
    # only the compiler's own waits (releasing the resident input) carry no kernel line
    assert {op for op, loc in mine if loc is None} <= {"EVENT_SEMAPHORE"}
    # the ISA interpreter running the compiled schedule (kernel instructions included) gives eager's numbers
    got = run_program(prog, {prog.input_names[0]: x.numpy()}, build_schedules(prog))[0]
    np.testing.assert_allclose(got, eager.numpy(), rtol=1e-4, atol=1e-5)


def test_kernel_in_torch_compile_model():
    model, x, eager = _kernel_block(1, 128, 130)
    with torch.no_grad():
        out = torch.compile(model, backend="neuron")(x)
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)


def _inspect(out: Path, *args):
    subprocess.run([sys.executable, "-m", "explorer.cli", "inspect", "-o", str(out), "--", sys.executable,
                    str(SAMPLE), "--small", *args], cwd=ROOT, check=True, capture_output=True, text=True,
                   timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return next(out.rglob("profile.duckdb"))


def test_replacing_an_op_with_a_kernel_shows_in_profile_and_diff(tmp_path):
    import traces
    a = _inspect(tmp_path / "torch_norm")
    b = _inspect(tmp_path / "nki_norm", "--kernel")
    with traces.open(b) as p:
        rows = p.sql("""SELECT o.op_class, i.opcode, i.nki_source_location AS loc FROM instructions i
                        JOIN ops o USING (op_id) JOIN graphs g USING (graph_id)
                        WHERE g.kind <> 'nki' AND i.opcode <> 'EVENT_SEMAPHORE'""").to_pylist()
    kernel_rows = [r for r in rows if r["op_class"] == "nki"]
    assert len(kernel_rows) >= 10 and all(r["loc"] and r["loc"].startswith("rmsnorm.py:") for r in kernel_rows)
    assert all(r["loc"] is None for r in rows if r["op_class"] != "nki")
    out = subprocess.run([sys.executable, "-m", "explorer.cli", "diff", "--json", str(a), str(b)], cwd=ROOT,
                         check=False, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "rmsnorm_in_model.py" in out.stdout and "nki." in out.stdout
