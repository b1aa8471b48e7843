"""Issue 15's bad inputs, each driven as a user types it: one clear line, a non-zero exit, bounded memory.

Memory is bounded with RLIMIT_AS on the child (the monitor and top do not import torch, so 2 GiB of
address space is plenty; /dev/zero used to grow past 4 GB). Hangs are caught by a generous timeout,
not by asserting a duration.
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODELS = str(ROOT / "sample_workloads" / "models.py")
AS_LIMIT = 2 << 30


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def run(cmd, env=None, limit=True, timeout=120, cwd=None):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd,
                          preexec_fn=_limit_memory if limit else None, stdin=subprocess.DEVNULL)


def one_error_line(r, prog: str, needle: str) -> None:
    assert r.returncode != 0, r.stdout[-500:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:") and needle in lines[0], r.stderr[-2000:]


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "config.fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("prog,extra", [("neuron-monitor", ["--once"]), ("neuron-top", [])])
def test_special_files_as_config(prog, extra, fifo, tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (2 << 20))
    for path, needle in [("/dev/zero", "is a character device"), (fifo, "is a FIFO"),
                         (tmp_path, "is a directory"), (big, "is larger than")]:
        r = run([str(BIN / prog), "-c", str(path), *extra])
        one_error_line(r, prog, needle)
        assert "-c" in r.stderr   # names the argument to fix


@pytest.mark.parametrize("value,needle", [
    ("0-100000000", "names core 32 but this instance has cores 0-31"),
    ("0-99999999999999999999", "names core 32"),
    ("٣", "malformed"),            # Arabic-Indic three: str.isdigit() says yes, a core list says no
    ("1,²", "malformed"),
    ("0x16", "malformed"),
])
def test_visible_cores_bad_values(value, needle, tmp_path):
    code = ("import sys\nfrom neuron_stack.runtime.cores import acquire, CoreAllocationError\n"
            "try:\n    acquire('trn1')\nexcept CoreAllocationError as e:\n    sys.exit(f'error: {e}')\n")
    r = run([sys.executable, "-c", code], env={"NEURON_RT_VISIBLE_CORES": value,
                                               "NEURON_STACK_RUNTIME_DIR": str(tmp_path)})
    assert r.returncode == 1 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr[-1000:]


def test_parse_core_list_never_expands_a_huge_range():
    from neuron_stack.runtime.cores import CoreAllocationError, parse_core_list
    assert parse_core_list("0-2,5", 32) == [0, 1, 2, 5]
    with pytest.raises(CoreAllocationError, match="names core 32"):
        parse_core_list("0-" + "9" * 4000, 32)
    with pytest.raises(CoreAllocationError, match="characters long"):
        parse_core_list("1," * 5000, 32)


def test_neuron_cc_flags_unbalanced_quote(tmp_path):
    r = run([str(BIN / "neuron-cc"), "compile", f"{MODELS}:MLP", "--input-shapes", "2x64",
             "-o", str(tmp_path / "m.neff")], env={"NEURON_CC_FLAGS": '"unbalanced'}, limit=False, cwd=tmp_path)
    one_error_line(r, "neuron-cc", "NEURON_CC_FLAGS")
    assert "balance its quotes" in r.stderr


@pytest.mark.parametrize("shape,needle", [
    ("2x3", "could not capture MLP"),          # wrong features: torch's fake-tensor log stays quiet
    ("0x16", "every dimension must be 1 or more"),
    ("2x", "bad input shape '2x'"),
    ("２x64", "bad input shape"),               # full-width digit
])
def test_neuron_cc_bad_input_shapes(shape, needle, tmp_path):
    r = run([str(BIN / "neuron-cc"), "compile", f"{MODELS}:MLP", "--input-shapes", shape,
             "-o", str(tmp_path / "m.neff")], limit=False, cwd=tmp_path)
    one_error_line(r, "neuron-cc", needle)


def test_inspect_of_a_killed_workload_exits_137(tmp_path):
    r = run([str(BIN / "neuron-explorer"), "inspect", "-o", str(tmp_path), "--", "/bin/sh", "-c", "kill -9 $$"])
    assert r.returncode == 137, r.stderr
    assert "killed by SIGKILL" in r.stderr and "Traceback" not in r.stderr


def _short_period(tmp_path) -> str:
    """A monitor config with a 100 ms period: ``--once`` waits one period (5 s by default) for its document,
    and the instance info these tests compare does not depend on the period."""
    cfg = tmp_path / "monitor.json"
    cfg.write_text('{"period": "100ms", "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"}, '
                   '{"type": "neuron_hw_counters"}]}')
    return str(cfg)


def test_one_instance_id_for_ls_and_monitor(tmp_path):
    import json
    env = {"NEURON_STACK_RUNTIME_DIR": str(tmp_path)}
    ls = run([str(BIN / "neuron-ls")], env=env)
    mon = run([str(BIN / "neuron-monitor"), "--once", "-c", _short_period(tmp_path)], env=env)
    assert ls.returncode == 0 and mon.returncode == 0, ls.stderr + mon.stderr
    ls_id = next(line.split(": ", 1)[1] for line in ls.stdout.splitlines() if line.startswith("instance-id:"))
    doc = json.loads(mon.stdout.strip().splitlines()[-1])
    assert ls_id == doc["instance_info"]["instance_id"]
    assert ls_id.startswith("i-") and len(ls_id) == 19


def test_sql_table_cuts_a_huge_cell(tmp_path):
    # found re-checking issue 15 by hand: `neuron-explorer sql P "SELECT string_agg(repeat('x',1000),',')
    # FROM range(500000)"` had rich fold a 500 MB cell into millions of lines (5 GB, still printing at 60 s)
    import traces
    from traces import synthetic
    synthetic.write_run(tmp_path / "s", executions=1, instructions=50)
    traces.finalize(tmp_path / "s")
    r = run([str(BIN / "neuron-explorer"), "sql", str(tmp_path / "s"), "SELECT repeat('x', 300000) AS s, 7 AS n"])
    assert r.returncode == 0, r.stderr[-1000:]
    assert "(300,000 characters; --format csv for all)" in r.stdout and len(r.stdout) < 20_000, len(r.stdout)
    csv = run([str(BIN / "neuron-explorer"), "sql", str(tmp_path / "s"), "SELECT repeat('x', 300000) AS s",
               "--format", "csv"])
    assert csv.returncode == 0 and "x" * 300_000 in csv.stdout   # the other formats write the value whole


def test_inspect_of_a_workload_failing_before_its_first_execution(tmp_path):
    # found re-checking issue 15 by hand: NEURON_RT_VISIBLE_CORES=0-100000000 under inspect ended with
    # "does the script run a model through neuron_stack.trace?", sending the user the wrong way
    r = run([str(BIN / "neuron-explorer"), "inspect", "-o", str(tmp_path), "--", sys.executable, "-c",
             "import sys; sys.exit('error: NEURON_RT_VISIBLE_CORES is malformed')"])
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "ended with exit status 1 before recording any Neuron execution" in last, r.stderr
    assert "neuron_stack.trace" not in r.stderr


def _run_stdin(cmd, stdin_path, timeout=60):
    with open(stdin_path, "rb") as f:
        return subprocess.run(cmd, stdin=f, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=_limit_memory)


def test_sql_from_stdin_is_read_bounded(tmp_path):
    # found re-checking issue 15's classes by hand: `neuron-explorer sql P - < /dev/zero` grew ~350 MB/s
    import traces
    from traces import synthetic
    synthetic.write_run(tmp_path / "s", executions=1, instructions=50)
    traces.finalize(tmp_path / "s")
    r = _run_stdin([str(BIN / "neuron-explorer"), "sql", str(tmp_path / "s"), "-"], "/dev/zero")
    one_error_line(r, "neuron-explorer", "the SQL read from stdin is longer than 1,048,576 characters")


def test_prometheus_drops_an_endless_line_in_bounded_memory(tmp_path):
    # found re-checking issue 15's classes by hand: `neuron-monitor-prometheus < /dev/zero` grew ~200 MB/s
    # (one endless line); now the line is dropped as it streams and the next report still applies
    import json
    report = {"neuron_runtime_data": [], "system_data": {}, "instance_info": {}, "neuron_hardware_info": {}}
    src = tmp_path / "stream"
    with open(src, "wb") as f:
        f.write(b"\0" * (40 << 20) + b"\n" + json.dumps(report).encode() + b"\n")
    r = _run_stdin([str(BIN / "neuron-monitor-prometheus"), "-p", "0", "--exit-on-eof"], src)
    assert r.returncode == 0, r.stderr[-1000:]
    lines = r.stderr.strip().splitlines()
    assert lines[1:] == ["neuron-monitor-prometheus: skipped input line 1: longer than 16 MiB, "
                         "not a neuron-monitor report"], r.stderr[-1000:]


@pytest.mark.parametrize("what", ["/dev/zero", "fifo", "directory"])
def test_capture_of_a_special_file_says_what_it_is(what, fifo, tmp_path):
    path = {"/dev/zero": "/dev/zero", "fifo": str(fifo), "directory": str(tmp_path)}[what]
    r = run([str(BIN / "neuron-explorer"), "capture", "-n", path, "-s", str(tmp_path / "s")])
    one_error_line(r, "neuron-explorer", "not a file; pass the compiled model with -n model.neff")


@pytest.mark.parametrize("name,value", [("RANK", "abc"), ("GROUP_RANK", "٣")])
def test_profiled_run_with_a_bad_rank_variable(name, value, tmp_path):
    # found re-checking issue 15's env classes: the recorder read RANK/GROUP_RANK with int() (bare ValueError
    # for 'abc', and '٣' silently taken as rank 3); now torchrun's integers are checked in one place
    code = ("import torch, neuron_stack\nm = neuron_stack.trace(torch.nn.Linear(4, 4), torch.ones(2, 4))\n"
            "m(torch.ones(2, 4))\n")
    r = run([sys.executable, "-c", code], limit=False, cwd=tmp_path,
            env={name: value, "NEURON_RT_INSPECT_ENABLE": "1", "NEURON_RT_INSPECT_OUTPUT_DIR": str(tmp_path / "o"),
                 "NEURON_STACK_RUNTIME_DIR": str(tmp_path / "rt"), "NEURON_COMPILE_CACHE_URL": str(tmp_path / "c")})
    assert r.returncode == 1, r.stderr[-1000:]
    assert r.stderr.strip().splitlines()[-1].endswith(f"{name}={value!r} is not an integer: launch with torchrun, "
                                                      "which sets it"), r.stderr[-1000:]


@pytest.mark.real_python   # it checks what the process imports: a warm one has torch
def test_neuron_cc_refuses_bad_shapes_and_flags_before_importing_torch():
    # issue 15 wants these answered within a second: torch's import alone takes seconds on a loaded machine
    code = ("import os, sys\nfrom neuron_stack.tools.neuron_cc import main\n"
            f"codes = [main(['compile', {MODELS!r} + ':MLP', '--input-shapes', s]) for s in ('0x16', '２x64', '2x')]\n"
            "os.environ['NEURON_CC_FLAGS'] = '\"unbalanced'\n"
            f"codes.append(main(['compile', {MODELS!r} + ':MLP', '--input-shapes', '2x64']))\n"
            "print(codes, 'torch' in sys.modules)\n")
    r = run([sys.executable, "-c", code])
    assert r.stdout.strip() == "[1, 1, 1, 1] False", (r.stdout, r.stderr[-1000:])
    assert len(r.stderr.strip().splitlines()) == 4 and "Traceback" not in r.stderr, r.stderr


def test_ls_and_monitor_name_one_instance_after_an_inf2_workload(tmp_path):
    # issue 31: neuron-ls said trn1.32xlarge while neuron-monitor said inf2.48xlarge on the same machine; since
    # issue 42 a workload that has exited leaves nothing behind (no "last workload" file): with no variable set
    # and no process running both name the default, the same one (tests/test_identity.py: every setting)
    import json
    live = tmp_path / "live"
    env = {"NEURON_STACK_RUNTIME_DIR": str(tmp_path / "rt"), "NEURON_STACK_LIVE_DIR": str(live),
           "NEURON_STACK_INSTANCE_TYPE": "", "NEURON_STACK_TARGET": ""}
    code = ("from traces.live import LivePublisher\n"
            "from neuron_stack.device.profiles import get_profile\n"
            "p = get_profile('inf2')\n"
            "LivePublisher(target='inf2', instance_type=p.instance_type, hardware=p.hardware_info()).close()\n")
    r = run([sys.executable, "-c", code], env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    ls = run([str(BIN / "neuron-ls")], env=env)
    mon = run([str(BIN / "neuron-monitor"), "--once", "-c", _short_period(tmp_path)], env=env)
    assert ls.returncode == 0 and mon.returncode == 0, ls.stderr + mon.stderr
    doc = json.loads(mon.stdout.strip().splitlines()[-1])
    assert "instance-type: trn1.32xlarge" in ls.stdout and doc["instance_info"]["instance_type"] == "trn1.32xlarge"
