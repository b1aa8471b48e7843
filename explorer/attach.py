"""``neuron-explorer attach --pid PID --duration S [-o DIR]``: record the next S seconds of a running process that
was started without profiling (device rows, the system profile, framework events) into a profile, without a
restart (:mod:`traces.attach`). Refused in one line for a process that is not running, not ours (not using this
runtime, or another user's) or already capturing, and for a duration over :data:`traces.attach.MAX_SECONDS`.

Example::

    neuron-explorer attach --pid 4242 --duration 10 -o output/attach
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    from traces.attach import MAX_SECONDS

    p = sub.add_parser("attach", help="record the next seconds of a running process into a profile",
                       description="Ask a running process that uses this runtime (started without profiling) to "
                                   "record the next --duration seconds: device rows, system profile and framework "
                                   "events. Waits for the window, finalises and prints the profile's path.")
    p.add_argument("--pid", type=int, required=True, help="the process (neuron-top, neuron-ls -a list them)")
    p.add_argument("--duration", type=float, default=5.0, metavar="SECONDS",
                   help=f"seconds to record (default 5, at most {MAX_SECONDS:g})")
    p.add_argument("-o", "--output-dir", default="output",
                   help="where the profile directory is made (default ./output)")
    p.set_defaults(func=_attach)


def _attach(args: argparse.Namespace) -> int:
    import traces
    from traces import attach

    out = Path(args.output_dir) / f"attach_{args.pid}_{time.strftime('%Y%m%d-%H%M%S')}"
    rid = attach.request(args.pid, out, args.duration)
    print(f"attached to process {args.pid}: recording {args.duration:g}s into {out}", flush=True)
    st = attach.wait(args.pid, rid, args.duration)
    path = traces.finalize(st["output_dir"])
    print(f"{st.get('framework', '')}; profile: {path}")
    print(f"look at it: neuron-explorer summary {path}  |  neuron-explorer view {path}")
    return 0
