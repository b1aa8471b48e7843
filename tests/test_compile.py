"""Compile and run through neuron_stack.trace: eager-equal numbers, fallbacks, NEFF round trip and
its failure modes, flags, memory, analyze."""
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_workloads"))

import neuron_stack  # noqa: E402
from neuron_stack.frontend.flags import FlagError, parse_flags  # noqa: E402
from neuron_stack.isa.neff import NeffError  # noqa: E402
from neuron_stack.runtime.errors import InputMismatch, OutOfDeviceMemory  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def cache_dir(compile_cache):
    os.environ.pop("NEURON_RT_INSPECT_ENABLE", None)
    return compile_cache


@pytest.fixture(scope="module")
def mlp():
    from models import MLP
    torch.manual_seed(0)
    model = MLP(16, 32, 4).eval()
    x = torch.randn(3, 16)
    return model, x, neuron_stack.trace(model, x)


@pytest.fixture(scope="module")
def ranker():
    from models import Ranker
    torch.manual_seed(0)
    model = Ranker(16, 8).eval()
    x = torch.randn(2, 16)
    cfg = neuron_stack.PartitionerConfig(ops_to_partition={"aten::sort"})
    return model, x, neuron_stack.trace(model, x, partitioner_config=cfg)


def test_trace_matches_eager(mlp):
    model, x, nm = mlp
    with torch.no_grad():
        torch.testing.assert_close(nm(x), model(x), rtol=1e-4, atol=1e-5)


def test_compile_log_explains_every_op(mlp):
    log = mlp[2].compile_log
    assert "decomposed from aten.linear.default" in log
    assert "-> matmul" in log and "fused into" in log and "Compiler status PASS" in log


def test_save_load_round_trip(mlp, tmp_path):
    model, x, nm = mlp
    path = nm.save(tmp_path / "mlp.neff")
    loaded = neuron_stack.load(path)
    assert loaded.neff.header["hash"] == nm.neff.header["hash"]
    torch.testing.assert_close(loaded(x), nm(x), rtol=0, atol=0)


def test_new_shape_is_refused_with_expected_and_actual(mlp):
    with pytest.raises(InputMismatch, match=r"compiled for shape \(3, 16\) float32 but got \(5, 16\)"):
        mlp[2](torch.randn(5, 16))


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def _rewrite_member(path, name: str, edit) -> None:
    """Rewrite NEFF member ``name`` as ``edit(bytes)`` returns it, keeping the other members as they are."""
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members[name] = edit(members[name])
    with zipfile.ZipFile(path, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)


def test_truncated_neff(mlp, tmp_path):
    path = mlp[2].save(tmp_path / "m.neff")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(NeffError) as e:
        neuron_stack.load(path)
    assert "truncated" in _one_line(e)


def test_corrupt_member(mlp, tmp_path):
    path = mlp[2].save(tmp_path / "m.neff")
    _rewrite_member(path, "program.json", lambda b: b[:10] + bytes([b[10] ^ 0x01]) + b[11:])  # one bit flipped
    with pytest.raises(NeffError) as e:
        neuron_stack.load(path)
    assert "checksum mismatch in member program.json" in _one_line(e)


def test_wrong_version_and_target(mlp, tmp_path):
    path = mlp[2].save(tmp_path / "m.neff")
    with pytest.raises(NeffError) as e:
        neuron_stack.load(path, target="trn2")
    assert "compiled for target trn1 but loaded on trn2" in _one_line(e)
    _rewrite_member(path, "neff.json", lambda b: json.dumps({**json.loads(b), "format_version": 99}).encode())
    with pytest.raises(NeffError) as e:
        neuron_stack.load(path)
    assert "format version 99" in _one_line(e)
    with pytest.raises(NeffError, match="no such NEFF file"):
        neuron_stack.load(tmp_path / "missing.neff")


def test_bad_flags():
    with pytest.raises(FlagError, match="unrecognized compiler flag '--bogus'"):
        parse_flags("--bogus", env="")
    with pytest.raises(FlagError, match="invalid choice: 'fp64'"):
        parse_flags("--auto-cast-type fp64", env="")
    with pytest.raises(FlagError, match="unrecognized compiler flag '--frobnicate'"):
        parse_flags(None, env="--frobnicate")
    f = parse_flags("-O3 --target inf2", env="--cache_dir=/tmp/x --no_cache")
    assert (f["optlevel"], f["target"], f["cache_dir"], f["no_cache"]) == (3, "inf2", "/tmp/x", True)


def test_auto_cast_matmult_bf16_within_tolerance(mlp):
    model, x, _ = mlp
    nm = neuron_stack.trace(model, x, compiler_args="--auto-cast matmult", target="inf2")
    with torch.no_grad():
        ref = model(x)
    y = nm(x)
    err = ((y - ref).norm() / ref.norm()).item()
    assert 0 < err < 1e-2          # bf16 rounding happened, and stays within tolerance
    assert nm.neff.target == "inf2"


def test_fallbacks_recorded_with_reasons_and_source(ranker):
    model, x, nm = ranker
    with torch.no_grad():
        torch.testing.assert_close(nm(x), model(x), rtol=1e-4, atol=1e-5)
    nodes = {n.target: n for n in nm.neff.program.nodes if n.placement == "cpu_fallback"}
    sort = nodes["aten.sort.default"]
    assert "ops_to_partition" in sort.fallback_reason
    assert os.path.basename(sort.source.file) == "models.py" and "sort" in sort.source.code
    idx = nodes["aten.index.Tensor"]
    assert "data-dependent" in idx.fallback_reason and "s > 0" in idx.source.code
    kinds = [p.kind for p in nm.neff.program.partitions]
    assert kinds[0] == "device" and "cpu" in kinds
    transfers = [t for p in nm.neff.program.partitions for t in p.transfers]
    assert {t.direction for t in transfers} == {"to_host", "to_device"}


def test_helper_function_lines_are_kept():
    from models import BertEncoder
    m = BertEncoder(vocab=20, hidden=16, layers=1, heads=2, seq=8).eval()
    from neuron_stack.frontend.export import capture
    prog = capture(m, (torch.randint(0, 20, (1, 8)),))
    fns = {(os.path.basename(n.source.file), n.source.function) for n in prog.nodes if n.source}
    assert ("models.py", "attention") in fns      # helper function, not named forward
    softmax = next(n for n in prog.nodes if n.target == "aten._softmax.default")
    assert softmax.source.function == "attention" and softmax.module_path == "layers.0.attn"


def test_out_of_device_memory(mlp, monkeypatch):
    import dataclasses

    from neuron_stack.device import profiles as device
    from neuron_stack.runtime.session import Session
    model, x, _ = mlp
    monkeypatch.setattr(Session, "_instances", {})   # a fresh session sees the shrunken profile
    small = dataclasses.replace(device.PROFILES["trn2"], hbm_bytes_per_chip=4 * 64 * 2**20 + 4096)
    monkeypatch.setitem(device.PROFILES, "trn2", small)
    with pytest.raises(OutOfDeviceMemory) as e:
        neuron_stack.trace(model, x, target="trn2", compiler_args="--no_cache")
    msg = _one_line(e)
    assert "out of device memory loading MLP" in msg and "HBM per core" in msg


def test_analyze_report():
    from models import Ranker
    r = neuron_stack.analyze(Ranker(16, 8).eval(), torch.randn(2, 16))
    assert r["supported_operators"]["aten::addmm"] == 2
    kinds = {u["kind"]: u for u in r["unsupported_operators"]}
    assert kinds["aten::index"]["failureAt"] == "Lowering to HLO"
    assert "models.py(" in kinds["aten::index"]["call"]
    pct = float(r["support_percentage"].rstrip("%"))
    assert 0 < pct < 100


def test_compiler_workdir(mlp, tmp_path):
    model, x, _ = mlp
    nm = neuron_stack.trace(model, x, compiler_workdir=tmp_path / "wd")
    assert (tmp_path / "wd" / "model.neff").exists()
    assert "Compiler status PASS" in (tmp_path / "wd" / "log-neuron-cc.txt").read_text()
    assert nm.cache_hit      # same graph and flags as the fixture's compile
