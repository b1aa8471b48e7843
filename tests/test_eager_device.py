"""The ``neuron`` torch device: placement, eager ops as cached NEFFs, training, torch.compile, memory,
and a profile of the eager sample with one execution per op and its source line."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import neuron_stack  # noqa: F401
from neuron_stack.eager import dispatch
from neuron_stack.runtime.errors import OutOfDeviceMemory

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _cache(compile_cache):
    yield


def test_import_torch_alone_makes_the_device_and_cpu_tensors_are_untouched():
    code = ("import torch\nx = torch.ones(2)\n"
            "print(torch._C._get_privateuse1_backend_name(), hasattr(torch, 'neuron'), type(x).__name__, "
            "x.device, 'neuron_stack.eager.dispatch' in __import__('sys').modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["neuron", "True", "Tensor", "cpu", "False"], r.stderr[-1000:]


def test_device_module_and_placement_equal_cpu():
    assert torch.neuron.is_available() and torch.neuron.device_count() >= 1
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(0)
    torch.neuron.synchronize()
    torch.manual_seed(3)
    a = torch.randn(4, 4, device="neuron")
    torch.manual_seed(3)
    assert a.device == torch.device("neuron:0") and torch.equal(a.cpu(), torch.randn(4, 4))
    c = torch.randn(3, 5)
    assert torch.equal(c.to("neuron").cpu(), c) and torch.equal(c.neuron().cpu(), c)
    assert torch.zeros(2, 3, device="neuron").cpu().sum().item() == 0
    assert torch.arange(5, device="neuron").cpu().tolist() == [0, 1, 2, 3, 4]


def test_model_on_device_equals_cpu_and_each_op_compiles_once():
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4), torch.nn.Softmax(-1))
    x = torch.randn(5, 8)
    with torch.no_grad():
        ref = m(x)
    md = copy.deepcopy(m).to("neuron")
    seen, outs = [dispatch.stats()], []
    for _ in range(2):            # one call site: the key is op, shapes, dtypes, scalars, source line, core
        outs.append(md(x.to("neuron")).cpu())
        seen.append(dispatch.stats())
    before, mid, after = seen
    assert torch.allclose(outs[0], ref, rtol=1e-4, atol=1e-6) and torch.equal(outs[0], outs[1])
    assert mid["compiled_ops"] > before["compiled_ops"]
    assert after["compiled_ops"] == mid["compiled_ops"]                 # the second call hits the per-op cache
    assert after["executions"] - mid["executions"] == mid["executions"] - before["executions"] > 0
    assert after["transfers"] - mid["transfers"] == 2                  # x down, the result up
    assert after["transfer_ns"] > mid["transfer_ns"] and after["device_ns"] > mid["device_ns"]


def test_training_step_eager_and_compiled_equal_cpu():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 1))
    ref = copy.deepcopy(m)
    X, Y = torch.randn(8, 6), torch.randn(8, 1)
    m.to("neuron")
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    compiled = torch.compile(m)          # no backend named: neuron tensors go to the neuron backend
    for step in (m, m, compiled, compiled):
        loss = torch.nn.functional.mse_loss(step(X.to("neuron")), Y.to("neuron"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        rloss = torch.nn.functional.mse_loss(ref(X), Y)
        rloss.backward()
        ropt.step()
        ropt.zero_grad()
        assert abs(loss.item() - rloss.item()) < 1e-5
    assert isinstance(m[0].weight, torch.nn.Parameter) and m[0].weight.device.type == "neuron"
    for a, b in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-6)
    from neuron_stack.dynamo import compile_events
    assert {"forward", "backward"} <= {c["kind"] for c in compile_events()}


def test_device_memory_is_tracked_and_an_oversized_tensor_is_a_clear_oom():
    base = torch.neuron.memory_allocated()
    t = torch.empty(1024, 256, device="neuron")
    assert torch.neuron.memory_allocated() == base + 1024 * 256 * 4
    assert torch.neuron.max_memory_allocated() >= base + 1024 * 256 * 4
    del t
    assert torch.neuron.memory_allocated() == base
    hbm = torch.neuron.memory_stats()["hbm_bytes"]
    with pytest.raises(OutOfDeviceMemory, match=r"out of device memory on neuron:0 .*tensor.*test_eager_device.py"):
        torch.empty(hbm // 2 + 1, dtype=torch.int16, device="neuron")
    assert torch.neuron.memory_allocated() == base


def test_a_tensor_dying_while_the_live_publisher_holds_its_lock_does_not_deadlock():
    """A finalizer runs wherever the garbage collector does: once inside the live publisher's snapshot (its
    lock held) a dying tensor's memory release waited on that lock forever. It only queues now."""
    from neuron_stack.eager.memory import session
    base = torch.neuron.memory_allocated()
    t = torch.empty(1024, device="neuron")
    done = threading.Event()

    def die_under_the_lock():
        nonlocal t
        with session().live._lock:   # what the flusher thread holds mid-snapshot
            del t                    # the tensor's finalizer runs here, on this thread
        done.set()

    threading.Thread(target=die_under_the_lock, daemon=True).start()
    assert done.wait(30), "a dying tensor's finalizer blocked on the live publisher's lock"
    assert torch.neuron.memory_allocated() == base


@pytest.fixture(scope="module")
def sample_profiles(tmp_path_factory):
    """The eager sample profiled both ways (``--mode eager``, ``--mode compile``): ``{mode: profile.duckdb}``."""
    import traces
    procs, dirs = {}, {}
    for mode in ("eager", "compile"):   # side by side, each on its own simulated instance
        d = dirs[mode] = tmp_path_factory.mktemp(mode)
        env = dict(os.environ, NEURON_RT_INSPECT_ENABLE="1", NEURON_RT_INSPECT_OUTPUT_DIR=str(d / "prof"),
                   NEURON_STACK_RUNTIME_DIR=str(d / "rt"))
        procs[mode] = subprocess.Popen([sys.executable, str(ROOT / "sample_workloads/eager_device.py"), "--small",
                                        "--mode", mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env=env)
    out = {}
    for mode, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "weights match CPU PyTorch" in stdout, stderr[-2000:]
        out[mode] = traces.finalize(str(dirs[mode] / "prof"))
    return out


def test_eager_sample_profile_has_one_execution_per_op_with_source_lines(sample_profiles):
    import traces
    p = traces.open(sample_profiles["eager"])
    rows = p.sql("SELECT g.name, g.kind, s.line FROM executions e JOIN graphs g USING (graph_id) "
                 "LEFT JOIN sources s ON s.source_id = g.source_id").to_pylist()
    assert {r["kind"] for r in rows} == {"eager"}
    assert {"eager_addmm_default", "eager_gelu_default", "eager_mse_loss_default"} <= {r["name"] for r in rows}
    assert all(r["line"] is not None for r in rows)          # backward ops: the line of loss.backward()
    transfers = p.sql("SELECT count(*) AS n FROM events WHERE kind = 'host_transfer'").to_pylist()[0]["n"]
    assert transfers >= 6


def _cli(*args) -> str:
    r = subprocess.run([sys.executable, "-m", "explorer.cli", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_diff_eager_vs_compiled_names_fusion_dispatch_and_transfers(sample_profiles):
    import json
    eager, compiled = sample_profiles["eager"], sample_profiles["compile"]
    he, hc = (json.loads(_cli("summary", "--json", str(p)))["host"] for p in (eager, compiled))
    why = json.loads(_cli("diff", "--json", str(eager), str(compiled)))["why"]
    assert (why["a_name"], why["b_name"], why["a"], why["b"]) == ("eager", "compiled", he, hc)
    # eager: one dispatched execution per op, each a one-op graph; compiled: the forward and backward fused
    assert he["executions"] == he["eager_executions"] == he["dispatches"] and he["ops_per_execution"] == 1.0
    assert hc["executions"] == hc["dispatches"] < he["executions"] and hc["graphs"] < he["graphs"]
    assert hc["ops_per_execution"] > 2 and hc["eager_executions"] < hc["executions"]   # the optimizer stays eager
    assert he["dispatch_ns"] > 0 and hc["dispatch_ns"] > 0
    # Module.to's 4 parameters, x and y, 3 × loss.item(), the 4 parameters back with .cpu()
    assert he["transfers"] == hc["transfers"] == 4 + 2 + 3 + 4 and he["transfer_bytes"] == hc["transfer_bytes"] > 0
    runs, device, dispatch, transfers = why["lines"]
    assert runs.startswith(f"eager ran {he['executions']} executions of {he['graphs']} one-op graphs; "
                           f"compiled ran {hc['executions']} executions of {hc['graphs']} graphs, "
                           f"{hc['ops_per_execution']:.1f} ops per execution (fusion: compiled runs ")
    assert f"{he['executions'] - hc['executions']} fewer executions" in runs
    assert device.startswith("device time ")
    assert dispatch.startswith(f"host dispatch {he['dispatches']} × ") and f"→ {hc['dispatches']} × " in dispatch
    assert transfers.startswith(f"transfers unchanged: {he['transfers']} (")
    text = _cli("diff", str(eager), str(compiled))
    text = " ".join(text.split())          # rich wraps at the terminal width
    assert "Why (A = eager, B = compiled" in text and "fusion: compiled runs" in text


def test_ddp_on_neuron_tensors_two_ranks_under_torchrun_with_the_neuron_backend(tmp_path):
    # the sample calls init_process_group("neuron") and DistributedDataParallel(model) with no process_group
    env = {**os.environ, "NEURON_STACK_RUNTIME_DIR": str(tmp_path / "rt"), "NEURON_RT_INSPECT_ENABLE": "1",
           "NEURON_RT_INSPECT_OUTPUT_DIR": str(tmp_path / "prof"), "OMP_NUM_THREADS": "1"}
    for var in ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_STACK_INSTANCE_TYPE"):
        env.pop(var, None)
    r = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", "--standalone",
                        str(ROOT / "sample_workloads/ddp_train.py"), "--small", "--device", "neuron"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "weights match eager PyTorch" in r.stdout, r.stderr[-3000:]
    import traces
    p = traces.open(traces.finalize(str(tmp_path / "prof")))
    cc = p.sql("SELECT r.rank, count(*) AS n FROM instructions i JOIN executions e USING (exec_id) "
               "JOIN runs r USING (run_id) WHERE i.engine = 'cc' GROUP BY r.rank ORDER BY r.rank").to_pylist()
    assert [c["rank"] for c in cc] == [0, 1] and all(c["n"] > 0 for c in cc)     # costed all-reduces
    kinds = {r["kind"] for r in p.sql("SELECT DISTINCT g.kind FROM graphs g").to_pylist()}
    assert {"eager", "collective"} <= kinds
