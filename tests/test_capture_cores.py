"""Complete captures (issue 36): core filters count the process's own cores, as the real runtime does, and a
capture that used the device but recorded no device rows says so in one line (stderr once, the profile's
metadata, the Summary of `neuron-explorer summary` and of the Explorer). Another real process holds machine
core 0 throughout, as on a shared instance, so this process's `neuron:0` is machine core 1."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import traces

HOLD = textwrap.dedent("""
    import sys, torch
    x = torch.ones(4, device="neuron"); (x + 1).cpu()
    from neuron_stack.eager.memory import session
    print(session().cores[0], flush=True)
    sys.stdin.read()   # hold the core until the test closes stdin
""")

TRAIN = textwrap.dedent("""
    import json, sys, torch
    from torch.profiler import profile, ProfilerActivity, schedule, record_function
    from neuron_stack.profiling import NeuronConfig, ProfileMode, NeuronProfiler
    from neuron_stack.eager.memory import session

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out, paths = sys.argv[1], {}
    runs = {"own_core": dict(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], capture_enabled_for_nc="0"),
            "other_core": dict(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], capture_enabled_for_nc="1"),
            "device_off": dict(modes=[ProfileMode.RUNTIME])}
    for name, kw in runs.items():
        cfg = NeuronConfig(profile_output_dir=f"{out}/{name}", **kw)
        neuron = NeuronProfiler(cfg)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=cfg,
                     schedule=schedule(wait=1, warmup=0, active=1, repeat=1), on_trace_ready=neuron.export_trace) as p:
            for step in range(2):
                x, y = torch.randn(8, 16).to("neuron"), torch.randint(0, 4, (8,)).to("neuron")
                with record_function("step"):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    opt.step(); opt.zero_grad()
                p.step()
        paths[name] = [str(t) for t in neuron.traces]
    print(json.dumps({"paths": paths, "cores": session().cores}))
""")


def _env(tmp):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_")}
    env.update(NEURON_COMPILE_CACHE_URL=str(tmp / "cache"), NEURON_STACK_LIVE_DIR=str(tmp / "live"),
               NEURON_STACK_RUNTIME_DIR=str(tmp / "cores"), NEURON_STACK_TARGET="trn1")
    return env


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """A second real process holding machine core 0 (as /work/wt/repro_scripts/hold.py does)."""
    tmp = tmp_path_factory.mktemp("cores")
    holder = subprocess.Popen([sys.executable, "-c", HOLD],
                              env=_env(tmp), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "0", "the holder did not get core 0"
        yield tmp
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


@pytest.fixture(scope="module")
def trained(held):
    r = subprocess.run([sys.executable, "-c", TRAIN, str(held / "out")], env=_env(held), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def _one(result, name):
    [path] = result["paths"][name]
    return traces.open(path)


def test_capture_enabled_for_nc_counts_the_process_cores_with_core_0_held(trained):
    result, stderr = trained
    assert result["cores"] == [1]   # neuron:0 is machine core 1: another process holds core 0
    with _one(result, "own_core") as p:
        [row] = p.sql("SELECT count(*) FILTER (WHERE engine <> 'cpu') AS n, list(DISTINCT core) AS cores "
                      "FROM instructions").to_pylist()
        assert row["n"] > 0 and row["cores"] == [1]
        assert p.metadata()["device_rows"] == "recorded"
        assert p.capture_verdict().status == "complete" and p.capture_verdict().lines == ()
        names = {r["name"] for r in p.sql("SELECT DISTINCT name FROM SystemProfileEvents").to_pylist()}
        assert {"nrt_execute", "nc_exec_running", "nrt_tensor_write"} <= names   # the step's .to("neuron") copies


EXCLUDED = ("no device rows: capture_enabled_for_nc='1' excludes every NeuronCore this process ran on (its core "
            "0 = machine core 1, ")


def test_a_filter_excluding_the_used_core_says_so_in_one_line_everywhere(trained):
    result, stderr = trained
    # the run's output: one warning line, once, with the reason and the fix
    warnings = [line for line in stderr.splitlines() if line.startswith("neuron_stack: warning: no device rows")]
    assert len(warnings) == 1 and EXCLUDED in warnings[0], stderr[-2000:]
    assert "use capture_enabled_for_nc='0' or leave it unset" in warnings[0]
    [path] = result["paths"]["other_core"]
    with traces.open(path) as p:
        # the profile's metadata, a key a reader can query
        md = p.metadata()
        assert md["device_rows"] == "missing" and md["device_rows_note"].startswith(EXCLUDED)
        assert p.sql("SELECT count(*) AS n FROM instructions").to_pylist() == [{"n": 0}]
        verdict = p.capture_verdict()
        assert verdict.status == "incomplete" and verdict.lines == (md["device_rows_note"],)
        assert verdict.device_executions > 0
    # neuron-explorer summary, as a user types it, text and JSON
    cli = [sys.executable, "-c", "from explorer.cli import main; main()", "summary"]
    text = subprocess.run(cli + [path], capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert f"incomplete: {md['device_rows_note']}" in text.stdout.splitlines()
    js = subprocess.run(cli + ["--json", path], capture_output=True, text=True, timeout=120)
    assert json.loads(js.stdout)["capture"] == verdict.as_dict()
    # the Explorer's Summary page, from the same verdict
    from explorer import data
    from explorer.app import create_app
    from explorer.pages import summary
    create_app([path])
    try:
        [key] = data.registry().keys()
        page = str(summary.layout(profile=key))
        assert "summary-capture" in page and md["device_rows_note"] in page and "error-box" in page
    finally:
        data.registry().close()


def test_device_mode_off_is_said_as_information(trained):
    result, stderr = trained
    with _one(result, "device_off") as p:
        verdict = p.capture_verdict()
        assert verdict.status == "info"
        assert verdict.lines == ("no device rows: ProfileMode.DEVICE is not in NeuronConfig(modes); "
                                 f"{verdict.device_executions} device executions are in the system profile only: "
                                 "add ProfileMode.DEVICE",)
    assert "ProfileMode.DEVICE" not in stderr   # information, not a warning


def test_env_filter_counts_the_process_cores_too(held):
    script = "import torch\nx = torch.ones(8, device='neuron')\nfor _ in range(3): (x * 2).cpu()\n"
    env = dict(_env(held), NEURON_RT_INSPECT_ENABLE="1", NEURON_RT_INSPECT_OUTPUT_DIR=str(held / "env"),
               NEURON_RT_INSPECT_DEVICE_PROFILE="session", NEURON_RT_INSPECT_EVENT_FILTER_NC="0")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no device rows" not in r.stderr
    with traces.open(traces.finalize(held / "env")) as p:
        [row] = p.sql("SELECT count(*) FILTER (WHERE engine <> 'cpu') AS n, list(DISTINCT core) AS cores "
                      "FROM instructions").to_pylist()
        assert row["n"] > 0 and row["cores"] == [1]
        assert p.capture_verdict().status == "complete"
