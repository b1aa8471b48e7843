"""Logical NeuronCores (LNC): a trn2 logical core at LNC=2 schedules on two physical cores' engines and
DMA queues (logical-neuroncore-config.rst); trn1/inf2 (LNC=1) schedule exactly as before; the degree
comes from ``-lnc``/``--logical-nc-config`` or ``NEURON_LOGICAL_NC_CONFIG``, a bad one is one line."""
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from test_schedule_invariants import Block

import traces
from neuron_stack.compiler.fuse import fuse
from neuron_stack.compiler.legalize import legalize
from neuron_stack.compiler.partition import partition
from neuron_stack.compiler.schedule import build_schedule
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import capture
from neuron_stack.frontend.flags import FlagError, command_line, parse_flags
from traces.export import export


class Chain(torch.nn.Module):
    """Four dependent 1024^3 bf16 matmuls: Tensor Engine bound on one physical core."""

    def forward(self, a, b):
        for _ in range(4):
            a = a @ b
        return a


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    return fuse(partition(legalize(capture(Block().eval(), (torch.randn(2, 96, 64),)))))


def _digest(s) -> str:
    h = hashlib.sha256()
    for c in ("queue", "pc", "rel_start_ns", "dur_ns", "sem_wait_ns"):
        h.update(repr(s.table[c].to_pylist()).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("target", ["trn1", "inf2"])
def test_lnc1_targets_schedule_as_before(block, target):
    s = build_schedule(block, 0, get_profile(target), {"auto_cast": "matmult"})
    # pinned from the scheduler before LNC was modelled (with the DMA spread of branch `dma`, 5799680), re-pinned
    # for the lowering changes since (wave 3: KV read in place, large-M weight sweep): one physical core per
    # logical core, identical schedule
    assert (_digest(s), s.device_ns) == ("835ac33d6c381e50", 43197)
    assert set(s.table["pcore"].to_pylist()) == {0}


def test_trn2_lnc1_is_one_physical_core(block):
    s = build_schedule(block, 0, get_profile("trn2", lnc=1), {"auto_cast": "matmult"})
    assert s.device_ns == 39871 and set(s.table["pcore"].to_pylist()) == {0}   # trn2's schedule before LNC


def test_trn2_schedules_on_two_physical_cores(block):
    s = build_schedule(block, 0, get_profile("trn2"), {"auto_cast": "matmult"})
    rows = s.table.select(["engine", "queue", "pcore", "pc", "rel_start_ns", "dur_ns"]).to_pylist()
    used = {(r["engine"], r["pcore"]) for r in rows}
    assert {("tensor", 0), ("tensor", 1), ("dma", 0), ("dma", 1)} <= used
    # physical core 1's tracks are its own: suffixed, in-order, never overlapping
    for r in rows:
        assert r["queue"].endswith(".pc1") == (r["pcore"] == 1)
    assert {r["queue"] for r in rows if r["engine"] == "tensor"} == {"Tensor", "Tensor.pc1"}
    assert {r["queue"].split(".")[0] for r in rows if r["engine"] == "dma"} <= {f"qSyncIO{i}" for i in range(16)}
    for q in {r["queue"] for r in rows}:
        mine = sorted((r for r in rows if r["queue"] == q), key=lambda r: r["pc"])
        assert all(a["rel_start_ns"] + a["dur_ns"] <= b["rel_start_ns"] for a, b in zip(mine, mine[1:])), q
    # an LDWEIGHTS and the MATMULs using its stationary run on one PE array
    last_ldw = {}
    for i, r in enumerate(s.table.select(["opcode", "pcore", "engine"]).to_pylist()):
        if r["opcode"] == "LDWEIGHTS":
            last_ldw = r["pcore"]
        elif r["opcode"] == "MATMUL":
            assert r["pcore"] == last_ldw, i


def test_compute_bound_graph_gains_at_most_two_times():
    a, b = torch.randn(1024, 1024, dtype=torch.bfloat16), torch.randn(1024, 1024, dtype=torch.bfloat16)
    prog = fuse(partition(legalize(capture(Chain(), (a, b)))))
    one = build_schedule(prog, 0, get_profile("trn2", lnc=1), {})
    two = build_schedule(prog, 0, get_profile("trn2", lnc=2), {})
    assert one.active_ns["tensor"] > 0.7 * one.device_ns          # Tensor bound on one physical core
    assert 1.3 < one.device_ns / two.device_ns <= 2.0             # two PE arrays, never more than 2x
    assert one.tensor_flops == two.tensor_flops and one.hbm_read_bytes == two.hbm_read_bytes


def test_flag_and_env_choose_the_degree(monkeypatch):
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    assert parse_flags("--target trn2", env="")["lnc"] == 2                       # trn2's default
    assert parse_flags("--target trn2 -lnc 1", env="")["lnc"] == 1
    assert parse_flags("--target trn2", env="--logical-nc-config=1")["lnc"] == 1
    assert command_line(parse_flags("--target trn2 --lnc 1", env="")).endswith("--logical-nc-config=1")
    assert "logical-nc-config" not in command_line(parse_flags("", env=""))        # trn1 keys unchanged
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert parse_flags("--target trn2", env="")["lnc"] == 1
    assert get_profile("trn2").cores_per_instance == 128 and get_profile("trn1").lnc == 1
    with pytest.raises(FlagError, match="config 2 is not supported on trn1: use 1"):
        parse_flags("--target trn1 -lnc 2", env="")
    with pytest.raises(FlagError, match="invalid choice: 3"):
        parse_flags("--target trn2 -lnc 3", env="")
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "two")
    with pytest.raises(ValueError, match="NEURON_LOGICAL_NC_CONFIG='two' is not a logical NeuronCore config"):
        get_profile("trn2")


SCRIPT = textwrap.dedent("""
    import json, sys, torch, neuron_stack
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).eval()
    x = torch.randn(256, 256)
    nm = neuron_stack.trace(m, x, compiler_args=sys.argv[1])
    out = nm(x)
    print(json.dumps(float((out - m(x)).abs().max() / m(x).abs().max())))
""")


def _run(tmp_path, degrees):
    """Run SCRIPT once per LNC degree, the processes side by side; per degree its error and finalized profile."""
    procs = {}
    for lnc in degrees:
        out = tmp_path / f"lnc{lnc}"
        # each its own cache and cores (the two degrees compile different NEFFs): as if each ran alone, on core 0
        env = {**os.environ, "NEURON_RT_INSPECT_ENABLE": "1", "NEURON_RT_INSPECT_OUTPUT_DIR": str(out),
               "NEURON_RT_INSPECT_DEVICE_PROFILE": "session", "NEURON_LOGICAL_NC_CONFIG": str(lnc),
               "NEURON_STACK_TARGET": "trn2", "NEURON_COMPILE_CACHE_URL": str(tmp_path / f"cache{lnc}"),
               "NEURON_STACK_LIVE_DIR": str(tmp_path / f"live{lnc}"),
               "NEURON_STACK_RUNTIME_DIR": str(tmp_path / f"cores{lnc}")}
        procs[lnc] = out, subprocess.Popen([sys.executable, "-c", SCRIPT, "--target trn2"], env=env,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    try:
        for lnc, (out, proc) in procs.items():
            stdout, stderr = proc.communicate(timeout=600)
            assert proc.returncode == 0, stderr
            results[lnc] = float(stdout.strip().splitlines()[-1]), traces.finalize(out)
    finally:
        for _, proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_profile_shows_the_physical_core_and_numbers_do_not_change(tmp_path):
    runs = _run(tmp_path, (1, 2))
    (err1, path1), (err2, path2) = runs[1], runs[2]
    assert err1 == err2 < 1e-4                   # fp32 against eager, whatever the degree
    with traces.open(path2) as p:
        per = {r["pcore_idx"]: r["n"] for r in p.sql(
            "SELECT pcore_idx, count(*) AS n FROM Instruction GROUP BY 1").to_pylist()}
        [md] = p.sql("SELECT value FROM metadata WHERE key = 'logical_neuroncore_config'").column(0).to_pylist()
    assert set(per) == {0, 1} and md == "2"
    # the Perfetto export gives physical core 1's engines their own tracks (slices never overlap in one)
    with traces.open(path2) as p:
        doc = json.loads(export(p, "perfetto", tmp_path / "t.json").read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert {"Tensor(nc0)", "Tensor.pc1(nc0)", "TensorMatrix(nc0)", "TensorMatrix.pc1(nc0)"} <= names
    with traces.open(path1) as p:
        assert p.sql("SELECT DISTINCT pcore_idx FROM Instruction").column(0).to_pylist() == [0]
    assert np.isfinite(err1)
