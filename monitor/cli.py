"""``neuron-monitor``: one complete JSON document per line on stdout, each time a metric group is due.

    neuron-monitor                      # every group, every 5 s, every process using the runtime
    neuron-monitor -c monitor.json      # the real config format (docs/monitor.md)
    neuron-monitor --once | jq .        # one document after one period, then exit
    neuron-monitor | jq '.neuron_runtime_data[0].report.neuroncore_counters'

SIGINT/SIGTERM print one last document covering the partial period and exit 0; a closed stdout
(``neuron-monitor | head -1``) ends quietly.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from monitor.config import load_config
from traces.errors import run_guarded

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Stop(Exception):
    """Raised by the signal handler, only while the loop sleeps: a line is never cut in half."""


class _StopSwitch:
    """SIGINT/SIGTERM: interrupt a sleep at once, or else stop after the document being written."""

    def __init__(self):
        self.sleeping = False
        self.requested = False

    def __call__(self, signum, frame):
        self.requested = True
        if self.sleeping:
            raise _Stop()

    def sleep(self, seconds: float) -> None:
        if self.requested:
            raise _Stop()
        self.sleeping = True
        try:
            time.sleep(seconds)
        finally:
            self.sleeping = False
        if self.requested:
            raise _Stop()


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + error
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="neuron-monitor",
        description="Stream Neuron runtime and system metrics as one JSON document per line.")
    p.add_argument("-c", "--config-file", metavar="CONFIG", default=None,
                   help="JSON config (period, neuron_runtimes, system_metrics); default: every group every 5s")
    p.add_argument("--verbose", type=int, choices=range(5), default=0, metavar="0..4",
                   help="debug detail on stderr (0 = none, 4 = every snapshot read)")
    p.add_argument("--once", action="store_true",
                   help="print one document covering one period (the shortest configured), then exit")
    return p


class Scheduler:
    """When each metric group is next due (monotonic seconds); groups share a tick when they can.

    >>> from monitor.config import load_config
    >>> s = Scheduler(load_config(None), start=0.0)
    >>> len(s.due(5.0)) > 0, s.due(4.0)
    (True, set())
    """

    def __init__(self, config, start: float):
        self.periods = {key: g.period for key, g in config.groups()}
        if not self.periods:  # a config with no groups still reports instance/hardware info
            self.periods = {("root",): config.period}
        self.next = {key: start + p for key, p in self.periods.items()}

    def due(self, now: float) -> set:
        # A few ms of slack so groups with equal periods land in the same document.
        return {k for k, t in self.next.items() if t <= now + 0.005}

    def advance(self, keys, now: float) -> None:
        for k in keys:
            self.next[k] += self.periods[k]
            if self.next[k] <= now:  # fell behind (a suspended process): skip, do not burst
                self.next[k] = now + self.periods[k]

    def wait_time(self, now: float) -> float:
        return max(0.0, min(self.next.values()) - now)


def _emit(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


#: ``--once`` says on stderr how long it will wait when its period is longer than this.
ONCE_NOTICE_S = 10.0


def _debug(level: int, need: int, msg: str) -> None:
    if level >= need:
        print(f"neuron-monitor: {msg}", file=sys.stderr, flush=True)


def run(argv=None) -> int:
    """The command body: parse flags, load the config, stream documents until stopped."""
    args = _parser().parse_args(argv)
    config = load_config(args.config_file)  # refused before any output
    from monitor.collect import Collector  # psutil/numpy only once the config is good

    # Handlers first: a stop signal from now on always ends with a complete last line.
    stop = _StopSwitch()
    for sig in _STOP_SIGNALS:
        signal.signal(sig, stop)
    v = args.verbose
    collector = None
    try:
        collector = Collector(config)
        sched = Scheduler(config, time.monotonic())
        _debug(v, 1, f"config {config.path or '(default)'}: " + ", ".join(
            f"{'/'.join(map(str, k))}={p:g}s" for k, p in sched.periods.items()))
        if args.once:
            wait = min(sched.periods.values())
            if wait > ONCE_NOTICE_S:   # say so rather than look hung
                print(f"neuron-monitor: --once waits {wait:g} s (the config's shortest period) for its one document; "
                      "give a shorter \"period\" for a quicker answer", file=sys.stderr, flush=True)
            stop.sleep(wait)
            _emit(collector.collect())
            return 0
        while True:
            now = time.monotonic()
            due = sched.due(now)
            if not due:
                stop.sleep(sched.wait_time(now))
                continue
            t0 = time.process_time()
            doc = collector.collect(due)
            _emit(doc)
            sched.advance(due, now)
            _debug(v, 2, f"report: {len(doc['neuron_runtime_data'])} runtime(s), groups "
                         f"{sorted('/'.join(map(str, k)) for k in due)}, "
                         f"{1000 * (time.process_time() - t0):.1f} ms CPU")
            if v >= 4:
                for rt in doc["neuron_runtime_data"]:
                    _debug(v, 4, f"runtime pid={rt['pid']} tag={rt['neuron_runtime_tag']} "
                                 f"groups={sorted(rt['report'])}")
    except _Stop:
        for sig in _STOP_SIGNALS:  # a second signal must not interrupt the last line
            signal.signal(sig, signal.SIG_IGN)
        if collector is None:
            return 0
        # The last document covers the partial period, so no execution goes unreported.
        _emit(collector.collect())
        _debug(v, 1, "stopped by signal")
        return 0


def main(argv=None) -> int:
    """Entry point of the ``neuron-monitor`` script.

    >>> main(["--help"])  # doctest: +SKIP
    """
    return run_guarded("neuron-monitor", lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
