"""NEURON_RT_INSPECT_DEVICE_PROFILE as the real runtime: 0 = no instruction rows, 1/model = the first
execution of each NEFF per core, session = every execution; unset = 0, the real runtime's default."""
import os
import subprocess
import sys
import textwrap

import pytest

import traces

# The runtime is what reads the variable: each process loads one saved NEFF (as torch.jit.load does on the
# real stack) and runs it three times; compiling it in every process would only repeat torch.export.
SCRIPT = textwrap.dedent("""
    import sys, torch, neuron_stack
    torch.manual_seed(0)
    nm = neuron_stack.load(sys.argv[1])
    x = torch.randn(2, 8)
    for _ in range(3):
        nm(x)
""")


@pytest.fixture(scope="module")
def neff(tmp_path_factory):
    """The model every mode runs, compiled once for the module."""
    import torch

    import neuron_stack

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    return neuron_stack.trace(m, torch.randn(2, 8)).save(tmp_path_factory.mktemp("neff") / "model.neff")


def _profile(tmp_path, neff, mode):
    out = tmp_path / f"mode-{mode or 'unset'}"
    env = {**os.environ, "NEURON_RT_INSPECT_ENABLE": "1", "NEURON_RT_INSPECT_OUTPUT_DIR": str(out),
           "NEURON_COMPILE_CACHE_URL": str(tmp_path / "cache"), "NEURON_STACK_LIVE_DIR": str(tmp_path / "live"),
           "NEURON_STACK_RUNTIME_DIR": str(tmp_path / "cores")}
    env.pop("NEURON_RT_INSPECT_DEVICE_PROFILE", None)
    if mode is not None:
        env["NEURON_RT_INSPECT_DEVICE_PROFILE"] = mode
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(neff)], env=env, capture_output=True, text=True,
                       timeout=600)
    return r, out


@pytest.mark.parametrize("mode, profiled", [(None, 0), ("session", 3), ("model", 1), ("1", 1), ("0", 0)])
def test_device_profile_modes(tmp_path, neff, mode, profiled):
    r, out = _profile(tmp_path, neff, mode)
    assert r.returncode == 0, r.stderr
    with traces.open(traces.finalize(out)) as p:
        execs = p.sql("SELECT count(*) AS n FROM executions").column("n")[0].as_py()
        with_rows = p.sql("SELECT count(DISTINCT exec_id) AS n FROM instructions").column("n")[0].as_py()
        first = p.sql("SELECT min(iteration) AS i FROM executions WHERE exec_id IN "
                      "(SELECT exec_id FROM instructions)").column("i")[0].as_py()
    assert execs == 3 and with_rows == profiled
    if profiled == 1:
        assert first == 0          # the first execution of the NEFF on its core


def test_bad_device_profile_mode_is_one_line(tmp_path, neff):
    r, _ = _profile(tmp_path, neff, "sometimes")
    assert r.returncode != 0
    assert "NEURON_RT_INSPECT_DEVICE_PROFILE='sometimes' is not one of 0, 1, model, session" in r.stderr
