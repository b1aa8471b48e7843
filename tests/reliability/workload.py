"""A small profiled workload for the reliability battery: compile a tiny MLP, then execute it.

It prints one line per event the battery checks against the trace, flushed at once, so a parent
that SIGKILLs it still knows exactly what was produced:

    ready <core> <instructions per execution> <pid>
    exec <i> <wall ns after the execution returned>
    done <executions>

    python tests/reliability/workload.py --execs 20          # a fixed number of executions
    python tests/reliability/workload.py --seconds 30        # execute until the time is up
    python tests/reliability/workload.py --seconds 30 --stop-file stop   # ... or until ./stop exists
    python tests/reliability/workload.py --neff m.neff       # load m.neff (traced and saved there first if absent)

``--neff`` spares each later process the capture (torch.export) a cache hit still pays: the battery
starts dozens of workloads, and what it checks is the runtime and the trace, not the compile.
"""
import argparse
import os
import sys
import time
from pathlib import Path

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
    ap.add_argument("--stop-file", type=Path,
                    help="end (cleanly) once this file exists: the parent says when it has seen enough")
    ap.add_argument("--neff", type=Path, help="load this saved NEFF; when absent, trace and save it there first")
    args = ap.parse_args()
    torch.manual_seed(0)
    w = args.width
    x = torch.randn(4, w)
    if args.neff is not None and args.neff.exists():
        nm = neuron_stack.load(args.neff)
    else:
        model = torch.nn.Sequential(torch.nn.Linear(w, 2 * w), torch.nn.ReLU(), torch.nn.Linear(2 * w, w)).eval()
        nm = neuron_stack.trace(model, x)
        if args.neff is not None:
            nm.neff.save(args.neff)   # atomic: a concurrent reader sees all of it or nothing
    per_exec = sum(s.table.num_rows for s in nm.neff.schedules.values())
    out = sys.stdout
    out.write(f"ready {nm.model.core} {per_exec} {os.getpid()}\n")
    out.flush()
    deadline = time.monotonic() + args.seconds
    i = 0
    while ((i < args.execs) if args.execs else (time.monotonic() < deadline)) and \
            not (args.stop_file and args.stop_file.exists()):
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
