"""``neuron-monitor-prometheus``: read neuron-monitor's JSON stream on stdin, serve ``/metrics``.

    neuron-monitor | neuron-monitor-prometheus --port 8000      # then scrape http://127.0.0.1:8000/metrics

Metric names, types, help texts and labels are the real exporter's (reference §1.6). Gauges follow
the latest document; counters are incremented by each document's per-period deltas; every series of
a runtime that is gone is removed (all runtime series when none runs). Our ``neuron_stack`` group,
when present in the stream, adds three ``neuron_stack_*`` families.

>>> exp = Exporter()
>>> exp.update({"neuron_runtime_data": [], "system_data": {"memory_info": {"period": 1.0,
...     "memory_total_bytes": 8, "memory_used_bytes": 2, "swap_total_bytes": 0, "swap_used_bytes": 0, "error": ""}},
...     "instance_info": {}, "neuron_hardware_info": {}})
>>> [m.samples[0].value for m in exp.collect() if m.name == "system_memory_used_bytes"]
[2.0]
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from traces.errors import run_guarded

BASE_LABELS = ("instance_name", "instance_id", "instance_type", "availability_zone", "region", "subnet_id")
_INSTANCE_FIELDS = {"instance_name": "instance_name", "instance_id": "instance_id",
                    "instance_type": "instance_type", "availability_zone": "instance_availability_zone",
                    "region": "instance_region", "subnet_id": "subnet_id"}
CORE_MEMORY = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")

# name -> (type, help, extra labels). Names and help texts as the real exporter exposes them.
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "neuroncore_utilization_ratio": ("gauge", "NeuronCore utilization ratio", ("runtime_tag", "neuroncore")),
    "neuron_runtime_vcpu_usage_ratio": ("gauge", "Runtime vCPU utilization ratio", ("runtime_tag", "usage_type")),
    "neuron_runtime_memory_used_bytes": ("gauge", "Runtime memory used bytes", ("runtime_tag", "memory_location")),
    **{f"neuroncore_memory_usage_{k}": ("gauge", f"NeuronCore memory utilization for {k}",
                                        ("runtime_tag", "neuroncore", "memory_location")) for k in CORE_MEMORY},
    "execution_errors": ("counter", "Execution errors total", ("runtime_tag", "error_type")),
    "execution_status": ("counter", "Execution status total", ("runtime_tag", "status_type")),
    "execution_latency_seconds": ("gauge", "Execution latency in seconds", ("runtime_tag", "percentile")),
    "neuron_stack_engine_utilization_ratio": ("gauge", "Engine busy time on the projected clock, ratio",
                                              ("runtime_tag", "neuroncore", "engine")),
    "neuron_stack_recompiles": ("counter", "Graph recompilations total", ("runtime_tag",)),
    "neuron_stack_cpu_fallbacks": ("counter", "Operators run on the CPU instead of the NeuronCore, total",
                                   ("runtime_tag",)),
    "neuron_stack_attach_capture": ("gauge", "This runtime's last attach on demand (1 while recording, 0 after); "
                                    "profile_path is the capture's profile", ("runtime_tag", "trigger", "state",
                                                                             "profile_path")),
    "hardware_ecc_events": ("counter", "Hardware ECC events total", ("event_type", "neuron_device_index")),
    "system_vcpu_count": ("gauge", "System vCPU count", ()),
    "system_vcpu_usage_ratio": ("gauge", "System CPU utilization ratio", ("usage_type",)),
    **{f"system_{kind}_{field}": ("gauge", f"System {kind} {field} bytes", ())
       for kind in ("memory", "swap") for field in ("total_bytes", "used_bytes")},
    "instance": ("info", "EC2 instance information", ()),
    "neuron_hardware": ("info", "Neuron hardware information", ("neuron_device_count", "neuroncore_per_device_count")),
}
RUNTIME_METRICS = tuple(n for n, (_, _, labels) in METRICS.items() if labels[:1] == ("runtime_tag",))


def _own_instance(base: tuple, report: dict) -> tuple:
    """``base`` with the runtime's own ``instance_type`` when it runs on one simulated instance (its
    ``neuron_stack.targets``): a machine with processes of several targets reports each under its own."""
    targets = (report.get("neuron_stack") or {}).get("targets") or {}
    types = {str(t.get("instance_type") or "") for t in targets.values() if isinstance(t, dict)} - {""}
    if len(types) != 1:
        return base
    i = BASE_LABELS.index("instance_type")
    return base[:i] + (types.pop(),) + base[i + 1:]


class Exporter:
    """Holds the metric values from the stream; a prometheus_client custom collector.

    ``update(doc)`` applies one neuron-monitor document; ``collect()`` yields the metric families.
    Both may run concurrently (the HTTP server thread scrapes while the main thread reads stdin).
    """

    def __init__(self):
        self._lock = threading.Lock()
        # name -> {label values tuple (base labels first, then extra labels): value}
        self._values: dict[str, dict[tuple, float]] = {name: {} for name in METRICS}
        self._created: dict[tuple, float] = {}  # (name, labels) -> first increment time, for *_created

    # -- applying documents ------------------------------------------------------------------
    def update(self, doc: dict) -> None:
        """Apply one document (raises ValueError naming the problem if it is not one)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("neuron_runtime_data"), list):
            raise ValueError("not a neuron-monitor document (no neuron_runtime_data list)")
        inst = doc.get("instance_info") or {}
        base = tuple(str(inst.get(_INSTANCE_FIELDS[k], "")) for k in BASE_LABELS)
        with self._lock:
            tags = set()
            for rt in doc["neuron_runtime_data"]:
                tag = str(rt.get("neuron_runtime_tag", rt.get("pid", "")))
                tags.add(tag)
                self._runtime(_own_instance(base, rt.get("report") or {}), tag, rt.get("report") or {})
            # Series of runtimes that are gone disappear (all of them when none runs).
            for name in RUNTIME_METRICS:
                series = self._values[name]
                for key in [k for k in series if k[len(BASE_LABELS)] not in tags]:
                    del series[key]
                    self._created.pop((name, key), None)
            self._system(base, doc.get("system_data") or {})
            self._set_only("instance", {base: 1.0})
            hw = doc.get("neuron_hardware_info") or {}
            if hw:
                self._set_only("neuron_hardware", {base + (str(hw.get("neuron_device_count", 0)),
                                                           str(hw.get("neuroncore_per_device_count", 0))): 1.0})

    def _set_only(self, name: str, series: dict) -> None:
        self._values[name] = dict(series)

    def _replace(self, name: str, prefix: tuple, series: dict) -> None:
        """Replace every series of ``name`` whose labels start with ``prefix`` by ``series``."""
        values = self._values[name]
        for key in [k for k in values if k[:len(prefix)] == prefix]:
            del values[key]
        values.update(series)

    def _inc(self, name: str, key: tuple, amount) -> None:
        values = self._values[name]
        if key not in values:
            values[key] = 0.0
            self._created[(name, key)] = time.time()
        values[key] += max(0.0, float(amount or 0))  # counters never go down

    def _runtime(self, base: tuple, tag: str, report: dict) -> None:
        rt = base + (tag,)
        if "neuroncore_counters" in report:
            cores = report["neuroncore_counters"].get("neuroncores_in_use") or {}
            self._replace("neuroncore_utilization_ratio", rt,
                          {rt + (str(c),): float(v.get("neuroncore_utilization", 0)) / 100 for c, v in cores.items()})
        if "neuron_runtime_vcpu_usage" in report:
            usage = report["neuron_runtime_vcpu_usage"].get("vcpu_usage") or {}
            self._replace("neuron_runtime_vcpu_usage_ratio", rt,
                          {rt + (k,): float(usage.get(k, 0)) / 100 for k in ("user", "system")})
        if "memory_used" in report:
            used = report["memory_used"].get("neuron_runtime_used_bytes") or {}
            self._replace("neuron_runtime_memory_used_bytes", rt,
                          {rt + (k,): float(used.get(k, 0)) for k in ("host", "neuron_device")})
            per_core = (used.get("usage_breakdown") or {}).get("neuroncore_memory_usage") or {}
            for k in CORE_MEMORY:
                # The real exporter labels these memory_location="None".
                self._replace(f"neuroncore_memory_usage_{k}", rt,
                              {rt + (str(c), "None"): float(m.get(k, 0)) for c, m in per_core.items()})
        if "execution_stats" in report:
            stats = report["execution_stats"]
            for k, v in (stats.get("error_summary") or {}).items():
                self._inc("execution_errors", rt + (k,), v)
            for k, v in (stats.get("execution_summary") or {}).items():
                self._inc("execution_status", rt + (k,), v)
            total = (stats.get("latency_stats") or {}).get("total_latency")
            # No execution in the period: no latency, rather than a stale one.
            self._replace("execution_latency_seconds", rt,
                          {rt + (p,): float(v) for p, v in (total or {}).items()})
        if "neuron_stack" in report:
            ns = report["neuron_stack"]
            self._replace("neuron_stack_engine_utilization_ratio", rt,
                          {rt + (str(c), e): float(pct) / 100
                           for c, engines in (ns.get("engines") or {}).items() for e, pct in engines.items()})
            self._inc("neuron_stack_recompiles", rt, (ns.get("recompiles") or {}).get("count", 0))
            self._inc("neuron_stack_cpu_fallbacks", rt, (ns.get("cpu_fallbacks") or {}).get("count", 0))
            att = ns.get("attach")
            self._replace("neuron_stack_attach_capture", rt, {} if not att else {
                rt + (att["trigger"], att["state"], att["profile"]): float(att["state"] == "recording")})

    def _system(self, base: tuple, system: dict) -> None:
        if "vcpu_usage" in system:
            vcpu = system["vcpu_usage"]
            avg = vcpu.get("average_usage") or {}
            user = avg.get("user", 0) + avg.get("nice", 0)
            sys_ = sum(avg.get(k, 0) for k in ("system", "io_wait", "irq", "soft_irq"))
            self._set_only("system_vcpu_count", {base: float(len(vcpu.get("usage_data") or {}))})
            self._set_only("system_vcpu_usage_ratio", {base + ("user",): min(user, 100.0) / 100,
                                                       base + ("system",): min(sys_, 100.0) / 100})
        if "memory_info" in system:
            mem = system["memory_info"]
            for kind, prefix in (("memory", "memory"), ("swap", "swap")):
                for field in ("total_bytes", "used_bytes"):
                    self._set_only(f"system_{kind}_{field}", {base: float(mem.get(f"{prefix}_{field}", 0))})
        if "neuron_hw_counters" in system:
            for dev in system["neuron_hw_counters"].get("neuron_devices") or []:
                idx = str(dev.get("neuron_device_index", 0))
                for event, n in dev.items():
                    if event != "neuron_device_index":
                        self._inc("hardware_ecc_events", base + (event, idx), n)

    # -- prometheus_client collector protocol ------------------------------------------------
    def collect(self):
        """Yield the metric families (called by prometheus_client on every scrape)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        with self._lock:
            snapshot = {name: dict(series) for name, series in self._values.items()}
            created = dict(self._created)
        for name, (kind, help_text, extra) in METRICS.items():
            series = snapshot[name]
            if not series:
                continue
            labels = list(BASE_LABELS) + list(extra)
            if kind == "gauge":
                fam = GaugeMetricFamily(name, help_text, labels=labels)
                for key, value in series.items():
                    fam.add_metric(list(key), value)
            elif kind == "counter":
                fam = CounterMetricFamily(name, help_text, labels=labels)
                for key, value in series.items():
                    fam.add_metric(list(key), value, created=created.get((name, key)))
            else:
                fam = InfoMetricFamily(name, help_text, labels=[])
                for key in series:
                    fam.add_metric([], dict(zip(labels, key)))
            yield fam


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + error
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="neuron-monitor-prometheus",
                description="Serve neuron-monitor's JSON stream (read on stdin) as Prometheus metrics.")
    p.add_argument("-p", "--port", type=int, default=8000,
                   help="port to serve /metrics on (default 8000; 0 = any free)")
    p.add_argument("--address", "--host", dest="address", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network)")
    p.add_argument("--cert-file", help="TLS certificate (serve HTTPS; needs --key-file)")
    p.add_argument("--key-file", help="TLS private key")
    p.add_argument("--exit-on-eof", action="store_true",
                   help="stop when the input ends (default: keep serving the last values until interrupted)")
    return p


#: A report is a few KiB per process; a longer "line" (``< /dev/zero``) is not one and is dropped
#: as it streams, so the exporter's memory stays bounded whatever is piped in.
MAX_LINE_BYTES = 16 << 20


def input_lines(stream, limit: int = MAX_LINE_BYTES):
    r"""Yield ``(line number, bytes)`` for each line of a binary stream; ``None`` for a line over ``limit``.

    >>> import io
    >>> list(input_lines(io.BytesIO(b"{}\n" + b"x" * 10 + b"\n[]"), limit=5))
    [(1, b'{}\n'), (2, None), (3, b'[]')]
    """
    lineno = 0
    while line := stream.readline(limit + 1):
        lineno += 1
        if len(line) > limit and not line.endswith(b"\n"):
            yield lineno, None   # said at once: the rest of ``< /dev/zero`` never ends
            while line and not line.endswith(b"\n"):   # drop the rest of it, a chunk at a time
                line = stream.readline(limit)
        else:
            yield lineno, line


def run(argv=None) -> int:
    """The command body: serve, then apply each stdin line until EOF (or forever)."""
    args = _parser().parse_args(argv)
    if bool(args.cert_file) != bool(args.key_file):
        raise ValueError("HTTPS needs both --cert-file and --key-file")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"port {args.port} is out of range: use 0..65535")
    from prometheus_client import (
        CollectorRegistry,
        gc_collector,
        platform_collector,
        process_collector,
        start_http_server,
    )

    registry = CollectorRegistry()
    # Like the real script (default registry): the exporter's own process/python metrics too.
    process_collector.ProcessCollector(registry=registry)
    platform_collector.PlatformCollector(registry=registry)
    gc_collector.GCCollector(registry=registry)
    exporter = Exporter()
    registry.register(exporter)
    try:
        server, _ = start_http_server(args.port, args.address, registry,
                                      certfile=args.cert_file, keyfile=args.key_file)
    except OSError as exc:
        raise OSError(f"cannot serve on {args.address}:{args.port} ({exc.strerror}): "
                      f"pick another --port or stop what uses it") from None
    host, port = server.server_address[:2]
    scheme = "https" if args.cert_file else "http"
    print(f"neuron-monitor-prometheus: serving {scheme}://{host}:{port}/metrics", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        for lineno, line in input_lines(sys.stdin.buffer):
            if line is None:
                print(f"neuron-monitor-prometheus: skipped input line {lineno}: longer than "
                      f"{MAX_LINE_BYTES >> 20} MiB, not a neuron-monitor report", file=sys.stderr, flush=True)
                continue
            if not line.strip():
                continue
            try:
                exporter.update(json.loads(line))
            except json.JSONDecodeError as exc:
                print(f"neuron-monitor-prometheus: skipped input line {lineno}: not JSON ({exc.msg})",
                      file=sys.stderr, flush=True)
            except (ValueError, TypeError, AttributeError) as exc:
                msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                print(f"neuron-monitor-prometheus: skipped input line {lineno}: {msg}", file=sys.stderr, flush=True)
        if args.exit_on_eof:
            return 0
        print("neuron-monitor-prometheus: input ended; still serving the last values (Ctrl-C to stop)",
              file=sys.stderr, flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.shutdown()
    return 0


def main(argv=None) -> int:
    """Entry point of the ``neuron-monitor-prometheus`` script."""
    return run_guarded("neuron-monitor-prometheus", lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
