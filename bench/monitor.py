"""Benchmark neuron-monitor: 16 live workload processes, a 1 s period.

Prints the monitor's CPU time per report, its CPU share of one core (target <= 2%), the
workloads' cost per ``record_execution``, and the time from an execution finishing to its
appearance in a report (one probe execution per round with a marker latency).

    .venv/bin/python bench/monitor.py [--workloads 16] [--seconds 10] [--rate 100]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

WORKLOAD = r'''
import sys, time
from traces.live import LivePublisher
rate = float(sys.argv[1])
pub = LivePublisher(target="trn1", instance_type="trn1.32xlarge", hardware={"neuron_device_count": 16,
      "neuroncore_per_device_count": 2, "neuron_device_type": "trainium"})
pub.cores = [int(sys.argv[2])]
pub.set_device_memory(pub.cores[0], "tensors", 1 << 20)
proj = time.time_ns()
n, cost = 0, 0.0
while True:
    time.sleep(1.0 / rate)
    proj += 2_000_000
    t0 = time.perf_counter()
    pub.record_execution(pub.cores[0], time.time(), proj, 0.002, 0.0015, {"tensor": 1_000_000, "dma": 300_000}, 10**9)
    cost += time.perf_counter() - t0
    n += 1
    if n % 200 == 0:
        print(cost / n * 1e6, flush=True)
'''

PROBE = r'''
import sys, time
from traces.live import LivePublisher
pub = LivePublisher(tag="probe", target="trn1")
for line in sys.stdin:            # one marker execution per request; prints its wall end
    marker = float(line)
    end = time.time()
    pub.record_execution(0, end, time.time_ns(), marker, marker / 2, {}, 0)
    print(end, flush=True)
'''


def _scratch() -> str:
    # Where the default live directory would be: memory when /dev/shm exists.
    shm = Path("/dev/shm")
    return tempfile.mkdtemp(prefix="nsbench-", dir=shm if shm.is_dir() else None)


def publisher_costs() -> tuple[float, float]:
    """In this process: record_execution's own cost (us) and one snapshot write (us)."""
    sys.path.insert(0, str(ROOT))
    from traces.live import LivePublisher

    pub = LivePublisher(tag="cost", directory=_scratch())
    pub._last_flush = time.monotonic() + 3600  # measure the hot path alone
    n = 100_000
    t0 = time.perf_counter()
    for i in range(n):
        pub.record_execution(0, 1.0, i, 0.002, 0.0015, {"tensor": 1_000_000, "dma": 300_000}, 10**9)
    record = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for _ in range(200):
        pub.flush()
    flush = (time.perf_counter() - t0) / 200 * 1e6
    pub.close()
    import shutil

    shutil.rmtree(pub.directory, ignore_errors=True)
    return record, flush


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0, help="measurement window for the CPU share")
    ap.add_argument("--rate", type=float, default=100.0, help="executions per second per workload")
    ap.add_argument("--rounds", type=int, default=5, help="probe executions for the publish-to-report delay")
    args = ap.parse_args()

    live = _scratch()
    env = dict(os.environ, NEURON_STACK_LIVE_DIR=live, PYTHONPATH=str(ROOT))
    env.pop("NEURON_PROCESS_TAG", None)
    procs = [subprocess.Popen([sys.executable, "-c", WORKLOAD, str(args.rate), str(i)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, text=True) for i in range(args.workloads)]
    probe = subprocess.Popen([sys.executable, "-c", PROBE], env=env, cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    cfg = Path(live) / "bench.json"
    cfg.write_text(json.dumps({"period": "1s", "neuron_runtimes": [{"tag_filter": ".*", "metrics": [
        {"type": t} for t in ("neuroncore_counters", "execution_stats", "memory_used", "neuron_runtime_vcpu_usage",
                              "neuron_stack")]}], "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"}]}))
    mon = subprocess.Popen([str(BIN / "neuron-monitor"), "-c", str(cfg)], stdout=subprocess.PIPE, text=True,
                           env=env, cwd=ROOT)
    lines: list[tuple[float, dict]] = []
    done = threading.Event()

    def pump():
        for line in mon.stdout:
            lines.append((time.time(), json.loads(line)))
        done.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        time.sleep(3.0)  # every workload publishing, the monitor past its first reports
        mp = psutil.Process(mon.pid)
        c0, n0, t0 = sum(mp.cpu_times()[:2]), len(lines), time.monotonic()
        time.sleep(args.seconds)
        c1, n1, t1 = sum(mp.cpu_times()[:2]), len(lines), time.monotonic()
        seen = max((len(doc["neuron_runtime_data"]) for _, doc in lines[n0:n1]), default=0)
        reports = max(1, n1 - n0)

        delays = []
        for i in range(args.rounds):
            marker = 0.5 + i * 0.01 + 0.000123
            start = len(lines)
            probe.stdin.write(f"{marker}\n")
            probe.stdin.flush()
            end = float(probe.stdout.readline())
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                hit = [ts for ts, doc in lines[start:] for r in doc["neuron_runtime_data"]
                       if r["neuron_runtime_tag"] == "probe"
                       and ((r["report"].get("execution_stats") or {}).get("latency_stats") or {}).get("total_latency")
                       and abs(r["report"]["execution_stats"]["latency_stats"]["total_latency"]["p100"]
                               - marker) < 1e-6]
                if hit:
                    delays.append(hit[0] - end)
                    break
                time.sleep(0.01)
            time.sleep(0.37)  # land the next probe at a different phase of the period
    finally:
        mon.terminate()
        mon.wait()
        probe.kill()
        rec_costs = []
        for p in procs:
            p.kill()
        for p in procs:
            out = p.stdout.read().split()
            if out:
                rec_costs.append(float(out[-1]))
            p.wait()
        probe.wait()
        import shutil

        shutil.rmtree(live, ignore_errors=True)  # after every publisher is gone (they recreate it)

    cpu = c1 - c0
    record_us, flush_us = publisher_costs()
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} during the run")
    print(f"record_execution: {record_us:.2f} us per call; snapshot write: {flush_us:.0f} us "
          f"(at most 4 per second per process = {4 * flush_us / 1e4:.3f}% of a core)")
    print(f"workloads: {args.workloads} live processes at {args.rate:g} executions/s each "
          f"({seen} runtimes in the fullest report), period 1 s")
    print(f"monitor CPU per report: {cpu / reports * 1000:.1f} ms ({reports} reports in {t1 - t0:.1f} s)")
    print(f"monitor CPU share: {100 * cpu / (t1 - t0):.2f}% of one core (target <= 2%)")
    if rec_costs:
        print(f"record_execution wall time inside the {args.workloads} busy workloads (includes preemption): "
              f"{statistics.median(rec_costs):.1f} us median")
    if delays:
        print(f"execution end -> in a report: median {statistics.median(delays):.2f} s, max {max(delays):.2f} s "
              f"over {len(delays)} probes (bound: period + publish delay {0.6:.1f} s)")
    else:
        print("execution end -> in a report: no probe seen (monitor too slow?)")


if __name__ == "__main__":
    main()
