"""A small profiled workload for the reliability battery: compile a tiny MLP, then execute it.

It prints one line per event the battery checks against the trace, flushed at once, so a parent
that SIGKILLs it still knows exactly what was produced:

    ready <core> <instructions per execution> <pid>
    exec <i> <wall ns after the execution returned>
    done <executions>

    python tests/reliability/workload.py --execs 20          # a fixed number of executions
    python tests/reliability/workload.py --seconds 30        # execute until the time is up
"""
import argparse
import os
import sys
import time

import torch

import neuron_stack


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--execs", type=int, default=0, help="run this many executions (0: use --seconds)")
    ap.add_argument("--seconds", type=float, default=5.0, help="execute for this long when --execs is 0")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--interval", type=float, default=0.0,
                    help="sleep this long between executions (a paced workload writes a bounded amount)")
    ap.add_argument("--linger", type=float, default=0.0,
                    help="stay alive this long after the executions (so a monitor's period can catch it)")
    args = ap.parse_args()
    torch.manual_seed(0)
    w = args.width
    model = torch.nn.Sequential(torch.nn.Linear(w, 2 * w), torch.nn.ReLU(), torch.nn.Linear(2 * w, w)).eval()
    x = torch.randn(4, w)
    nm = neuron_stack.trace(model, x)
    per_exec = sum(s.table.num_rows for s in nm.neff.schedules.values())
    out = sys.stdout
    out.write(f"ready {nm.model.core} {per_exec} {os.getpid()}\n")
    out.flush()
    deadline = time.monotonic() + args.seconds
    i = 0
    while (i < args.execs) if args.execs else (time.monotonic() < deadline):
        nm(x)
        out.write(f"exec {i} {time.time_ns()}\n")
        out.flush()
        i += 1
        time.sleep(args.interval)
    out.write(f"done {i}\n")
    out.flush()
    time.sleep(args.linger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
