"""The idle cost of being attachable (attach on demand, docs/runtime.md): steady-state executions of a traced
model in one process, in interleaved rounds, attachable (the default: the live thread polls for a request every
0.25 s, the hot path reads one flag) against not attachable (no poll, no flag), in CPU time of the whole process
(the live thread's polls included; wall time on a shared machine is mostly other people's). Prints the median of
the per-pair ratios attachable / not (target: under 1.01) with their quartiles and the machine's load average,
then one attached window's cost for context. ``--write`` puts the result into docs/runtime.md between its
``attach-idle-cost`` markers.

Usage: ``.venv/bin/python bench/attach.py [--rounds 15] [--executions 400] [--write]``.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_workloads"))
from models import MLP  # noqa: E402

import neuron_stack  # noqa: E402
from neuron_stack.runtime.session import Session  # noqa: E402

DOC = ROOT / "docs" / "runtime.md"
BEGIN, END = "<!-- attach-idle-cost:begin -->", "<!-- attach-idle-cost:end -->"


def _not_attachable(self) -> None:
    """Session.poll_capture as it was before attach: the torch.profiler hooks only."""
    for hook in Session.capture_hooks:
        hook(self)


def rounds(nm, x, n_rounds: int, executions: int) -> tuple[list[float], float]:
    """Per-pair ratios (attachable / not) of ``n_rounds`` interleaved rounds of ``executions`` calls each, and the
    median CPU seconds of one execution not attachable."""
    session = next(iter(Session._instances.values()))
    attachable, hook = Session.poll_capture, session.live.poll_hook
    ratios, off = [], []
    for r in range(n_rounds):
        times = {}
        for mode in (("on", "off") if r % 2 else ("off", "on")):   # alternate the order: no drift bias
            Session.poll_capture = attachable if mode == "on" else _not_attachable
            session.live.poll_hook = hook if mode == "on" else None
            t0 = time.process_time()   # CPU time of the whole process: the live thread's polls count too
            for _ in range(executions):
                nm(x)
            times[mode] = time.process_time() - t0
        ratios.append(times["on"] / times["off"])
        off.append(times["off"] / executions)
    Session.poll_capture, session.live.poll_hook = attachable, hook
    return ratios, statistics.median(off)


def decomposed(session, exec_s: float, n: int = 20000) -> tuple[float, float, float]:
    """The idle cost from its two parts, each timed alone (robust on a loaded machine): one poll of the live
    thread (a failed rename; 4 a second) and the hot path's extra flag read per execution. Returns
    ``(poll_us, per_execution_ns, cost as a fraction of the process's time at one execution per exec_s)``."""
    from neuron_stack.runtime import attach

    polls = []
    for _ in range(max(n // 20, 50)):
        t0 = time.perf_counter()
        attach.poll(Session._instances.values())
        polls.append(time.perf_counter() - t0)
    calls = {}
    for mode, fn in (("on", Session.poll_capture), ("off", _not_attachable)):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn(session)
            best = min(best, (time.perf_counter() - t0) / n)
        calls[mode] = best
    poll_s, flag_s = statistics.median(polls), max(calls["on"] - calls["off"], 0.0)
    return poll_s * 1e6, flag_s * 1e9, 4 * poll_s + flag_s / exec_s


def attached_ratio(nm, x, executions: int) -> float:
    """One attached window (device rows, system profile, framework events) against the same calls idle, in
    process CPU time; the window is then run out so its framework events close."""
    from traces import attach as channel

    t0 = time.process_time()
    for _ in range(executions):
        nm(x)
    idle = time.process_time() - t0
    pid, out = os.getpid(), tempfile.mkdtemp(prefix="bench-attach-")
    rid = channel.request(pid, out, 2.0)
    while (channel.state(pid) or {}).get("id") != rid:
        nm(x)
    t0 = time.process_time()
    n = 0
    while (channel.state(pid) or {}).get("state") == "recording" and n < executions:
        nm(x)
        n += 1
    ratio = (time.process_time() - t0) / max(n, 1) / (idle / executions)
    while (channel.state(pid) or {}).get("state") == "recording":
        nm(x)
    return ratio


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--executions", type=int, default=400, help="executions per round and mode")
    p.add_argument("--write", action="store_true", help="write the result into docs/runtime.md")
    args = p.parse_args()
    os.environ["NEURON_COMPILE_CACHE_URL"] = tempfile.mkdtemp(prefix="bench-cache-")
    os.environ.setdefault("NEURON_STACK_LIVE_DIR", tempfile.mkdtemp(prefix="bench-live-"))
    torch.set_num_threads(1)   # intra-op threads spin when the CPUs are oversubscribed, and that is CPU time
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    nm = neuron_stack.trace(MLP(64, 128, 10).eval(), x)
    for _ in range(20):   # warm-up
        nm(x)
    load = os.getloadavg()[0]
    ratios, exec_s = rounds(nm, x, args.rounds, args.executions)
    poll_us, flag_ns, cost = decomposed(next(iter(Session._instances.values())), exec_s)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    attached = attached_ratio(nm, x, args.executions)
    lines = [f"attachable / not attachable, {args.rounds} interleaved rounds of {args.executions} executions "
             f"(MLP 64-128-10, process CPU time; load average {load:.1f} on {os.cpu_count()} cores):", "", "```text",
             f"idle cost of being attachable: median ratio {statistics.median(ratios):.4f} "
             f"(quartiles {q[0]:.4f} .. {q[2]:.4f}; target < 1.01)",
             f"its parts: one poll {poll_us:.1f} us (4 a second), {flag_ns:.0f} ns more per execution of "
             f"{exec_s * 1e3:.2f} ms: idle cost {100 * cost:.3f} % of the process's time",
             f"while attached (device rows, system profile, framework events): ratio {attached:.2f}", "```"]
    print("\n".join(lines))
    if args.write:
        text = DOC.read_text()
        i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
        DOC.write_text(text[:i] + "\n" + "\n".join(lines) + "\n" + text[j:])
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
