"""Every host<->device copy on the ``neuron`` device, as a user's training script makes them (``.to``, ``.cpu``,
``.item``, ``print``, the optimizer's state moved to the host and back), is an ``nrt_tensor_write`` /
``nrt_tensor_read`` in the system profile with its bytes and bandwidth, a span on its core's
``host_to_device_transfers`` DMA lane of the device timeline, and counted in ``diff``'s transfers section: under
torch.profiler (eager and compiled) and under ``NEURON_RT_INSPECT_ENABLE=1``."""
import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import traces
from neuron_stack.device.cost import pcie_ns
from neuron_stack.device.profiles import get_profile
from traces.vocab import HOST_TRANSFER_QUEUE

ROOT = Path(__file__).resolve().parents[1]

# aws_train.py's shape; it prints the copies its recorded steps make, computed from the tensors it moves
SCRIPT = textwrap.dedent('''
    import json, sys, torch
    from torch.profiler import profile, ProfilerActivity, schedule, record_function
    from neuron_stack.profiling import NeuronConfig, ProfileMode, NeuronProfiler

    mode, capture, out = sys.argv[1:4]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_fn = torch.compile(model) if mode == "compiled" else model
    copies = [["to_device", p.numel() * 4] for p in model.parameters()] if capture == "inspect" else []

    def step(i, recorded):
        x = torch.randn(32, 64).to("neuron")
        y = torch.randint(0, 10, (32,)).to("neuron")
        with record_function("forward"):
            loss = torch.nn.functional.cross_entropy(step_fn(x), y)
        with record_function("backward"):
            loss.backward()
        opt.step()
        opt.zero_grad()
        print(i, loss.item())
        print(loss)
        logits = step_fn(x).detach().cpu()
        moved = []
        if i == 3:   # the optimizer's state to the host and back, as a checkpoint round trip moves it
            sd = opt.state_dict()
            host = {k: {n: t.cpu() for n, t in s.items()} for k, s in sd["state"].items()}
            opt.load_state_dict({"state": host, "param_groups": sd["param_groups"]})
            moved = [t.numel() * 4 for s in host.values() for n, t in s.items() if n != "step"]
        if recorded:
            copies.extend([["to_device", x.numel() * 4], ["to_device", y.numel() * 8], ["to_host", 4],
                           ["to_host", 4], ["to_host", logits.numel() * 4]]
                          + [["to_host", b] for b in moved] + [["to_device", b] for b in moved])

    if capture == "profiler":
        cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir=out)
        neuron = NeuronProfiler(cfg)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=cfg,
                     schedule=schedule(wait=1, warmup=1, active=2), on_trace_ready=neuron.export_trace) as p:
            for i in range(4):
                step(i, recorded=i >= 2)
                p.step()
        path = str(neuron.traces[0])
    else:
        for i in range(4):
            step(i, recorded=True)
        path = None
    print(json.dumps({"copies": copies, "profile": path}))
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{name: (profile.duckdb, [[direction, bytes], ...] the script says it copied while recorded)}``."""
    tmp = tmp_path_factory.mktemp("transfers")
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    base = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_INSPECT")}
    base.update(NEURON_COMPILE_CACHE_URL=str(tmp / "cache"), NEURON_STACK_LIVE_DIR=str(tmp / "live"))
    procs = {}
    for name, mode, capture in (("eager", "eager", "profiler"), ("compiled", "compiled", "profiler"),
                                ("inspect", "eager", "inspect")):
        # the three run side by side, each on its own simulated instance (its own cores)
        env = dict(base, NEURON_STACK_RUNTIME_DIR=str(tmp / f"{name}.cores"))
        if capture == "inspect":
            env.update(NEURON_RT_INSPECT_ENABLE="1", NEURON_RT_INSPECT_OUTPUT_DIR=str(tmp / name))
        procs[name] = subprocess.Popen([sys.executable, str(script), mode, capture, str(tmp / name)], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        got = json.loads(stdout.strip().splitlines()[-1])
        path = got["profile"] or str(traces.finalize(str(tmp / name)))
        out[name] = (path, got["copies"])
    return out


NAMES = {"to_device": ("nrt_tensor_write", "dmem_buf_copyin"), "to_host": ("nrt_tensor_read", "dmem_buf_copyout")}


@pytest.mark.parametrize("name", ["eager", "compiled", "inspect"])
def test_every_copy_is_a_runtime_tensor_read_or_write_with_bytes_and_bandwidth(runs, name):
    path, copies = runs[name]
    with traces.open(path) as p:
        rows = p.sql("""SELECT name, duration_ns, trace_event_source, nc_idx, extra_attributes_json AS x
                        FROM SystemProfileEvents
                        WHERE name IN ('nrt_tensor_write', 'nrt_tensor_read', 'dmem_buf_copyin',
                                       'dmem_buf_copyout')""").to_pylist()
        cores = {r["core"] for r in p.sql("SELECT DISTINCT core FROM executions").to_pylist()}
    trn1 = get_profile("trn1")
    for direction, (api, copy) in NAMES.items():
        want = collections.Counter(b for d, b in copies if d == direction)
        assert sum(want.values()) > 0
        for event in (api, copy):
            mine = [r for r in rows if r["name"] == event]
            assert collections.Counter(json.loads(r["x"])["size"] for r in mine) == want, (name, event)
            for r in mine:
                x = json.loads(r["x"])
                assert x["direction"] == direction and r["trace_event_source"] == "neuron_rt"
                assert r["nc_idx"] in cores          # the core the tensors live on
                assert r["duration_ns"] == pcie_ns(trn1, x["size"]) > 0            # PCIe time
                assert x["bandwidth_bytes_per_sec"] == round(x["size"] * 1e9 / r["duration_ns"], 1)
                assert os.path.basename(x["source_location"]).startswith("train.py:")   # the user's line


@pytest.mark.parametrize("name", ["eager", "compiled"])
def test_under_torch_profiler_each_copy_sits_in_the_torch_op_that_made_it(runs, name):
    path, copies = runs[name]
    with traces.open(path) as p:
        rows = p.sql("""SELECT w.name, (SELECT list(f.name) FROM SystemProfileEvents f
                                        WHERE f.trace_event_source = 'framework' AND f.start_ts <= w.start_ts
                                          AND f.end_ts >= w.end_ts) AS around
                        FROM SystemProfileEvents w
                        WHERE w.name IN ('nrt_tensor_write', 'nrt_tensor_read')""").to_pylist()
    # writes: .to("neuron") and load_state_dict's copies (aten::copy_); reads: .item(), .cpu(), and print(loss),
    # which is no ATen op. A read is classed by the outermost op that made it: .cpu()'s aten::_to_copy also runs
    # the host copy (a CPU aten::copy_) a few microseconds before the read, and torch.profiler's clock (TSC,
    # fitted to the wall clock over the window) and ours may disagree by that much
    made_by = collections.Counter(
        next((op for op in (("aten::copy_",) if r["name"] == "nrt_tensor_write" else
                            ("aten::_local_scalar_dense", "aten::_to_copy")) if op in r["around"]), "print")
        for r in rows)
    writes = sum(d == "to_device" for d, _ in copies)
    assert made_by == {"aten::copy_": writes, "aten::_local_scalar_dense": 2, "print": 2,
                       "aten::_to_copy": len(copies) - writes - 4}
    assert all(any(n.startswith("ProfilerStep#") for n in r["around"]) for r in rows)


@pytest.mark.parametrize("name", ["eager", "compiled", "inspect"])
def test_every_copy_is_on_its_cores_dma_lane_of_the_device_timeline(runs, name):
    from explorer import timeline
    from explorer.data import Loaded

    path, copies = runs[name]
    with traces.open(path) as p:
        lanes = p.lanes().to_pylist()
        [core] = {r["core"] for r in lanes if r["engine"] is not None}
        assert {"core": core, "engine": "dma", "queue": HOST_TRANSFER_QUEUE} in lanes
        b = p.timeline_bounds()
        _, ev = p.spans(b.t0, b.t1 + 1, 10_000)
        spans = [r for r in ev.to_pylist() if r["kind"] == "host_transfer"]
        assert len(spans) == len(copies) and {r["core"] for r in spans} == {core}
        assert sorted(json.loads(r["detail"])["bytes"] for r in spans) == sorted(b for _, b in copies)
    L = Loaded("p", Path(path))
    try:
        drawn = timeline.lanes(L)
        dma = [ln for ln in drawn if ln.kind == "dma" and ln.core == core]
        assert dma[0].label == f"{HOST_TRANSFER_QUEUE}(nc{core})"        # first of the core's DMA lanes
        tl = timeline.timeline(L, 0, timeline.data.bounds(L)["span"])
        on_lane = [s for s in tl["spans"] if s["lane"] == dma[0].key]
        assert len(on_lane) == len(copies) and all(s["kind"] == "host_transfer" for s in on_lane)
    finally:
        L.close()


def test_diff_counts_the_same_copies_eager_and_compiled(runs):
    (eager, copies_e), (compiled, copies_c) = runs["eager"], runs["compiled"]
    assert sorted(map(tuple, copies_e)) == sorted(map(tuple, copies_c))      # the script moves the same tensors
    r = subprocess.run([sys.executable, "-m", "explorer.cli", "diff", "--json", eager, compiled], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    why = json.loads(r.stdout)["why"]
    assert (why["a_name"], why["b_name"]) == ("eager", "compiled")
    n, total = len(copies_e), sum(b for _, b in copies_e)
    writes = [b for d, b in copies_e if d == "to_device"]
    for side in (why["a"], why["b"]):
        assert (side["transfers"], side["transfer_bytes"]) == (n, total)
        assert (side["writes"], side["write_bytes"]) == (len(writes), sum(writes))
    line = why["lines"][3]
    assert line.startswith(f"transfers unchanged: {n} (") and f"PCIe; {len(writes)} writes " in line
    assert f", {n - len(writes)} reads " in line
    with traces.open(eager) as p:   # the diff's count is the system profile's
        api = p.sql("SELECT count(*) AS n FROM SystemProfileEvents "
                    "WHERE name IN ('nrt_tensor_write', 'nrt_tensor_read')").column("n")[0].as_py()
    assert api == n
