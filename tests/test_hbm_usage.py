"""The real ``HbmUsage`` and ``SystemProfileHbmUsage`` tables over recorded samples (issue 39): HBM throughput as a
time series within each execution, and device memory by the real tool's usage types."""
from __future__ import annotations

import pytest

import traces
from traces import profile_samples

SAMPLES = ("fallback", "tensor_parallel", "train_mlp")   # a CPU fallback between partitions, collectives, training


@pytest.fixture(scope="module")
def profiles(recorded_samples):
    paths = recorded_samples.get(*SAMPLES)
    opened = {name: traces.open(paths[name]) for name in SAMPLES}
    yield opened
    for p in opened.values():
        p.close()


def _rows(p, sql):
    return p._cursor().execute(sql).fetchall()


@pytest.mark.parametrize("name", SAMPLES)
def test_hbm_usage_buckets_add_up_to_each_executions_hbm_bytes(profiles, name):
    p = profiles[name]
    rows = _rows(p, """
        SELECT x.exec_id, x.hbm_read_bytes + x.hbm_write_bytes, x.end_ns - x.start_ns, h.b, h.n, h.res, h.lo, h.hi
        FROM executions AS x LEFT JOIN (SELECT exec_id, sum(bucket_bytes) AS b, count(*) AS n,
            min(bucket_resolution_ns) AS res, min(timestamp) AS lo, max(timestamp) AS hi FROM HbmUsage GROUP BY 1) AS h
            USING (exec_id)
        WHERE x.exec_id IN (SELECT exec_id FROM instructions)""")
    assert rows
    for exec_id, hbm, span, total, n, res, lo, hi in rows:
        assert total == hbm, (exec_id, total, hbm)
        if not hbm:
            continue
        # the smallest power of two of ns giving at most 1,000 buckets over the execution's span
        assert res & (res - 1) == 0 and span <= 1000 * res and (res == 1 or span > 1000 * (res // 2)), (span, res)
        assert n <= 1001 and (hi - lo) // res < 1001
    # one number: the Instruction view's per-instruction HBM bytes add up to the same
    per_exec = dict(_rows(p, "SELECT exec_id, sum(hbm_read_bytes + hbm_write_bytes) FROM Instruction GROUP BY 1"))
    assert all(per_exec.get(exec_id, 0) == hbm for exec_id, hbm, *_ in rows)


@pytest.mark.parametrize("name", SAMPLES)
def test_hbm_usage_throughput_is_bytes_over_the_bucket_and_the_total_accumulates(profiles, name):
    p = profiles[name]
    [(bad_rate, bad_total, rows)] = _rows(p, """
        SELECT count(*) FILTER (WHERE abs(current_throughput - bucket_bytes * 1e9 / bucket_resolution_ns)
                                > 1e-6 * current_throughput),
               count(*) FILTER (WHERE total_transfer_bytes <> so_far), count(*)
        FROM (SELECT *, sum(bucket_bytes) OVER (PARTITION BY run_id, nc_idx, pcore_idx ORDER BY timestamp, exec_id
                                                ROWS UNBOUNDED PRECEDING) AS so_far FROM HbmUsage)""")
    assert rows > 0 and bad_rate == 0 and bad_total == 0
    # a user's query in the real tool's words: each core's HBM bytes are its executions'
    per_core = dict(_rows(p, "SELECT nc_idx, max(total_transfer_bytes) FROM HbmUsage GROUP BY 1"))
    want = dict(_rows(p, "SELECT core, sum(hbm_read_bytes + hbm_write_bytes) AS b FROM executions WHERE exec_id IN "
                         "(SELECT exec_id FROM instructions) GROUP BY 1 HAVING b > 0"))
    assert per_core == want


def _hbm_usage_rows(p) -> list[dict]:
    cur = p._cursor().execute("SELECT * FROM SystemProfileHbmUsage ORDER BY timestamp")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


@pytest.mark.parametrize("name", SAMPLES)
def test_system_profile_hbm_usage_types_add_up_to_the_total(profiles, name):
    rows = _hbm_usage_rows(profiles[name])
    assert rows
    for r in rows:
        assert sum(r[c] for c in profile_samples._HBM_COLUMNS[1:]) == r["total_bytes"], r
        assert r["unknown_bytes"] == 0    # the NEFF splits all of model_code
    last = rows[-1]
    code = sum(last[c] for c in profile_samples.MONITOR_CATEGORIES["model_code"])
    assert code > 0 and last["tensor_instructions_bytes"] > 0 and last["dma_rings_io_bytes"] > 0
    assert last["io_bytes"] > 0 and last["generic_bytes"] > 0


@pytest.mark.parametrize("name", SAMPLES)
def test_monitor_and_system_profile_hbm_usage_agree(profiles, recorded_samples, name):
    """What neuron-monitor showed for each core as the workload ended (its live snapshot) is the profile's last
    SystemProfileHbmUsage sample of that core, category by category."""
    import json

    p = profiles[name]
    pids = dict(_rows(p, "SELECT run_id, pid FROM runs"))
    last = {(pids[r["run_id"]], r["nc_idx"]): r for r in _hbm_usage_rows(p)}   # in time order: the last stays
    shown = {(s["pid"], int(core)): memory for s in json.loads(recorded_samples.live_file(name).read_text())
             for core, memory in (s.get("device_memory") or {}).items() if any(memory.values())}
    assert shown and set(shown) == set(last)
    for key, monitor in shown.items():
        for cats, cols in profile_samples.MONITOR_CATEGORIES.items():
            cats = (cats,) if isinstance(cats, str) else cats
            assert sum(monitor.get(c, 0) for c in cats) == sum(last[key][c] for c in cols), (key, cats, monitor)


def test_a_models_usage_types_split_its_categories_and_count_its_spills():
    """A loaded model's device bytes by usage type add up to its neuron-monitor categories, category by category,
    and the value the compiler spills to HBM (saved once for the GpSimd sort) is dram_spill."""
    import torch

    import neuron_stack

    class Sorted(torch.nn.Module):
        def forward(self, x):
            return torch.sort(torch.relu(x @ x.t()), -1).values * 2

    model = neuron_stack.trace(Sorted().eval(), torch.randn(128, 64), target="trn1").model
    usage = {f"{k}_bytes": v for k, v in model.hbm_usage.items()}
    assert usage["dram_spill_bytes"] == 128 * 128 * 4
    for cats, cols in profile_samples.MONITOR_CATEGORIES.items():
        if cats != "runtime_memory":   # the core's reservation, not the model's
            cats = (cats,) if isinstance(cats, str) else cats
            assert sum(model.memory[c] for c in cats) == sum(usage.get(c, 0) for c in cols), cats
    assert usage["gpsimd_instructions_bytes"] > 0 and usage["unknown_bytes"] == 0


def test_hbm_usage_splits_long_large_transfers_exactly(tmp_path):
    """A transfer whose bytes × duration passes 2**63 (5 TB over 4 ms), a zero-length one and one in a bucket of its
    own: each execution's buckets still add up to its bytes, and none is lost at a bucket edge."""
    t, span = 10**12, 4_000_000
    w = traces.Writer(tmp_path, run={"run_id": "r", "target": "trn1", "start_ns": t})
    w.append("executions", {"exec_id": [1], "run_id": "r", "graph_id": 1, "core": 0, "iteration": 0,
                            "start_ns": t, "end_ns": t + span, "device_ns": span, "status": "completed",
                            "warmup": False, "hbm_read_bytes": 5 * 10**12 + 7, "hbm_write_bytes": 3 + 1000})
    w.append("instructions", {"exec_id": [1, 1, 1], "core": 0, "engine": ["dma", "dma", "gpsimd"],
                              "queue": ["qSyncIO0", "qSyncIO1", "GpSimd"], "opcode": ["DMA_DIRECT2D"] * 2 + ["X"],
                              "start_ns": [t, t + 1234, t + span - 1], "dur_ns": [span, 0, 1],
                              "bytes_read": [5 * 10**12 + 7, 3, 10], "bytes_written": [5 * 10**12 + 7, 3, 10],
                              "hbm_read_bytes": [5 * 10**12 + 7, 0, 0], "hbm_write_bytes": [0, 3, 1000]})
    w.close(status="ok", end_ns=t + span)
    with traces.open(traces.finalize(tmp_path)) as p:
        [(rows, total, res, last)] = _rows(p, "SELECT count(*), sum(bucket_bytes), min(bucket_resolution_ns), "
                                              "max(total_transfer_bytes) FROM HbmUsage")
    assert total == last == 5 * 10**12 + 7 + 3 + 1000
    assert res == 4096 and rows <= 1001     # 4 ms in at most 1,000 buckets: 2**12 ns each
