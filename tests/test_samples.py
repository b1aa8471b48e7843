"""Every sample workload's outputs against eager PyTorch (the scripts exit non-zero on a mismatch).

Most run in-process through their ``main()`` (torch.export warm-up paid once per worker); ``mlp.py``
and ``dynamic_shapes.py`` run as the user types them.
"""
import contextlib
import importlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_workloads"


@pytest.fixture(scope="module", autouse=True)
def env(tmp_path_factory):
    saved = dict(os.environ)
    os.environ["NEURON_COMPILE_CACHE_URL"] = str(tmp_path_factory.mktemp("cache"))
    os.environ.pop("NEURON_RT_INSPECT_ENABLE", None)
    sys.path.insert(0, str(SAMPLES))
    yield
    os.environ.clear()
    os.environ.update(saved)


def run_main(name, *argv, capsys=None):
    mod = importlib.import_module(name)
    old = sys.argv
    sys.argv = [f"{name}.py", "--small", *argv]
    try:
        mod.main()        # finish() raises SystemExit(1) on a mismatch
    finally:
        sys.argv = old


@pytest.fixture(scope="module")
def printed(env):
    """``printed(name, *argv)``: what the sample printed, run in-process once per module (the tests that read
    one run share it)."""
    runs = {}

    def get(name, *argv):
        if (name, argv) not in runs:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                run_main(name, *argv)
            runs[(name, argv)] = out.getvalue()
        return runs[(name, argv)]
    return get


@pytest.mark.parametrize("name,argv", [
    ("cnn", []), ("bert_encoder", []), ("bert_encoder", ["--auto-cast", "matmult"]), ("gpt_decoder", []),
    ("fallback", []), ("train_mlp", []),
])
def test_sample_matches_eager(name, argv, printed):
    out = printed(name, *argv)
    assert "MISMATCH" not in out and "OK vs eager PyTorch" in out
    assert len(out.split("\n\n")[0]) > 200          # the explanation paragraph


def test_check_names_its_comparison():
    import doctest

    import common
    assert doctest.testmod(common).failed == 0


def test_train_mlp_checks_gradients_and_weights_by_norm(printed):
    out = printed("train_mlp")
    assert "losses: OK vs eager PyTorch (fp32, element-wise rtol 1e-4" in out
    assert "gradients: OK vs eager PyTorch (fp32, element-wise rtol 1e-4" in out
    assert "weights: OK vs eager PyTorch (fp32, relative norm error < 1e-4" in out


def test_fallback_sample_reports_reasons_and_lines(printed):
    out = printed("fallback")
    assert "CPU fallback aten.sort.default at models.py:" in out
    assert "CPU fallback aten.index.Tensor at models.py:" in out and "data-dependent" in out
    assert "device -> cpu -> device" in out


def _script(name, *argv, env=None):
    return subprocess.run([sys.executable, str(SAMPLES / f"{name}.py"), "--small", *argv], capture_output=True,
                          text=True, env=env or dict(os.environ), timeout=300)


def _scripts(*runs: tuple) -> list[subprocess.CompletedProcess]:
    """``python SAMPLE.py --small ARGS`` for each ``(SAMPLE, *ARGS)``, run side by side."""
    procs = []
    for name, *argv in runs:
        cmd = [sys.executable, str(SAMPLES / f"{name}.py"), "--small", *argv]
        procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    done = []
    for cmd, proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr))
    return done


def test_mlp_script_and_cache_hit_in_new_process(tmp_path):
    env = dict(os.environ, NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"))
    first = _script("mlp", env=env)
    assert first.returncode == 0, first.stderr
    assert "mlp: OK vs eager PyTorch" in first.stdout and "cache hit: False" in first.stdout
    second = _script("mlp", env=env)
    assert second.returncode == 0, second.stderr
    assert "cache hit: True" in second.stdout
    entries = list((tmp_path / "cache").glob("neuronxcc-*/MODULE_*+*"))
    entries = [e for e in entries if e.is_dir()]
    assert len(entries) == 1
    assert {p.name for p in entries[0].iterdir()} == {"model.neff", "compile_flags.json", "model.done", "model.log"}


def test_dynamic_shapes_recompiles_and_bucketing():
    plain, bucketed = _scripts(("dynamic_shapes",), ("dynamic_shapes", "--bucket"))
    assert plain.returncode == 0, plain.stderr
    assert "5 graphs compiled, 4 recompiles" in plain.stdout
    assert "tensor 'ids' dim 1: 5 -> 9" in plain.stdout and "at dynamic_shapes.py:" in plain.stdout
    assert bucketed.returncode == 0, bucketed.stderr
    assert "2 graphs compiled, 1 recompiles" in bucketed.stdout


TARGETS = ("trn1", "inf2", "trn2")
#: Every sample at its default size, as the README runs it, on every target it offers (``--full`` only):
#: (script, extra arguments, launcher). The suite runs them at ``--small`` above and in their own tests.
FULL = ([(s, ["--target", t], None) for s in ("mlp", "cnn", "bert_encoder", "gpt_decoder", "fallback",
                                               "train_mlp", "dynamic_shapes", "data_parallel", "tensor_parallel")
         for t in TARGETS]
        + [("fallback", ["--fixed"], None), ("train_mlp", ["--auto-cast", "matmult"], None),
           ("bert_encoder", ["--auto-cast", "matmult"], None),
           ("llama_generate_trace", [], None), ("llama_generate_compile", [], None), ("llama3_projection", [], None),
           ("eager_device", ["--mode", "eager"], None), ("eager_device", ["--mode", "compile"], None)]
        + [("ddp_train", ["--device", d], "torchrun") for d in ("cpu", "neuron")]
        + [(f"nki/{n}", [], None) for n in ("tensor_add", "matmul", "matmul_optimized", "softmax", "rmsnorm",
                                             "rmsnorm_in_model", "layernorm", "flash_attention", "sd_attention",
                                             "attention_tutorial")])


@pytest.mark.full
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name,argv,launcher", FULL, ids=[f"{n}{''.join(a)}" for n, a, _ in FULL])
def test_sample_full_size(name, argv, launcher, tmp_path):
    """``pytest tests/test_samples.py --full``: what a new user runs first, at the size they run it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_")}
    env["NEURON_COMPILE_CACHE_URL"] = str(tmp_path / "cache")
    cmd = [sys.executable, str(SAMPLES / f"{name}.py"), *argv]
    if launcher == "torchrun":
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", "--standalone", *cmd[1:]]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3500, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert "MISMATCH" not in r.stdout
