"""Turn one neuron-monitor document into immutable view data that neuron-top's widgets render.

Widgets never read the monitor document (or anything live): the poll worker builds a
:class:`Snapshot` and posts it, so a frame is always consistent (nvitop's snapshot model).
Missing or failed metric groups become ``None`` fields that render as ``n/a``.

>>> doc = {"neuron_runtime_data": [], "system_data": {}, "instance_info": {},
...        "neuron_hardware_info": {"neuroncore_version": "v2", "neuron_device_count": 1,
...                                 "neuroncore_per_device_count": 2}}
>>> snap = build_snapshot(doc)
>>> [app.tag for app in snap.apps], snap.core_ids
(['all'], (0, 1))
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field, fields

from traces.vocab import ENGINE_LABELS, MONITOR_ENGINES

#: (monitor key, neuron-top word) for device memory, in the real tool's order.
DEVICE_CATEGORIES = (
    ("tensors", "Tensors"), ("constants", "Constants"), ("model_code", "Model Code"),
    ("runtime_memory", "Runtime Memory"), ("model_shared_scratchpad", "Model Scratchpad"),
)
#: (monitor key, neuron-top word) for host memory, in the real tool's order.
HOST_CATEGORIES = (
    ("tensors", "Tensors"), ("constants", "Constants"), ("dma_buffers", "DMA Buffers"),
    ("application_memory", "App. Memory"),
)
#: Engines of the breakdown panel: (key in the ``neuron_stack`` group, display name).
ENGINES = tuple((e, ENGINE_LABELS[e]) for e in MONITOR_ENGINES)

MAX_DEVICES = 64
MAX_CORES_PER_DEVICE = 64
"""Bounds on the grid a document can ask for (the largest instances have 16 devices of 8 cores)."""

HISTORY_LENGTH = 120
"""How many refreshes of utilization history each core keeps (two minutes at 1 s)."""


@dataclass(frozen=True)
class MemoryNode:
    """One row of the Memory Usage Details tree; a parent's bytes are the sum of its children's."""

    key: str            # stable path ("nd0/nc1/m:1234:10005/tensors") so the tree keeps its state
    label: str
    model_id: str
    device_bytes: int
    host_bytes: int
    children: tuple["MemoryNode", ...] = ()
    core: int | None = None  # the NeuronCore this row belongs to (None for device rows)


@dataclass(frozen=True)
class EventCounter:
    """A recompile or CPU-fallback counter of one process, with the last reason and source line.

    ``count`` is the total since neuron-top started watching the process, ``recent`` the part of
    it from the last period (the monitor reports per-period deltas).
    """

    count: int = 0
    last_reason: str = ""
    last_source: str = ""
    last_op: str = ""
    recent: int = 0


@dataclass(frozen=True)
class ProfileFigures:
    """A replayed profile's headline figures, as the replay document carries them (``traces``
    ``Profile.figures()``: the numbers ``neuron-explorer summary`` and the Explorer show too)."""

    device_ns: int
    device_busy_percent: float
    engine_percent: dict
    mfu_percent: float
    fallback_host_ns: int
    fallback_calls: int
    compiles: int
    recompiles: int
    executions: int
    before_window: str = ""     # what happened before the recording window, labelled (traces computes it)

    @classmethod
    def from_document(cls, raw) -> "ProfileFigures | None":
        """The figures of a ``neuron_stack.profile`` group, or None when absent (live data)."""
        if not isinstance(raw, dict):
            return None
        values = {}
        for f in fields(cls):
            v = raw.get(f.name)
            if f.name == "engine_percent":
                values[f.name] = {str(k): _num(x) for k, x in v.items()} if isinstance(v, dict) else {}
            elif f.name == "before_window":
                values[f.name] = str(raw.get("before_window_text") or "")
            elif f.type in ("int", int):
                values[f.name] = int(_num(v))
            else:
                values[f.name] = _num(v)
        return cls(**values)


@dataclass(frozen=True)
class ServingFigures:
    """An LLM serving engine's figures from the monitor's ``neuron_stack.serving`` (docs/monitor.md)."""

    model: str
    tokens_per_s: float
    running: int
    waiting: int
    kv_cache_usage: float       # 0..1 of the cache's slots
    kv_cache_bytes: int         # per core

    @classmethod
    def from_document(cls, d) -> "ServingFigures | None":
        if not isinstance(d, dict):
            return None
        return cls(str(d.get("model") or ""), _num(d.get("tokens_per_s")), int(_num(d.get("num_requests_running"))),
                   int(_num(d.get("num_requests_waiting"))), _num(d.get("kv_cache_usage_perc")),
                   int(_num(d.get("kv_cache_bytes"))))


@dataclass(frozen=True)
class AttachView:
    """A process's last attach on demand, from the monitor's ``neuron_stack.attach`` (docs/monitor.md)."""

    state: str        # recording, done or refused
    profile: str      # the capture's directory
    trigger: str      # the monitor trigger that asked, "" when a person did
    reason: str

    @classmethod
    def from_document(cls, d) -> "AttachView | None":
        if not isinstance(d, dict):
            return None
        return cls(*(str(d.get(k) or "") for k in ("state", "profile", "trigger", "reason")))


@dataclass(frozen=True)
class TargetView:
    """One target of a process (``neuron_stack.targets``: ``traces.monitor_figures.target_block``): a process with
    trn1 and inf2 sessions runs on two simulated instances, each with its own cores, runtime reservation
    and peak; ``mfu_percent`` is over the period (a replay: the window)."""

    target: str
    instance_type: str
    cores: tuple[int, ...]
    runtime_memory: int          # bytes reserved by the runtime, over the target's cores
    mfu_percent: float

    @classmethod
    def from_document(cls, raw) -> "tuple[TargetView, ...]":
        """The targets of a ``neuron_stack`` group, in the document's order (none when absent)."""
        if not isinstance(raw, dict):
            return ()
        return tuple(cls(str(t), str(b.get("instance_type") or ""), tuple(int(_num(c)) for c in b.get("cores") or ()),
                         int(sum(_num(v) for v in (b.get("runtime_memory_bytes") or {}).values())),
                         _num(b.get("mfu_percent")))
                     for t, b in raw.items() if isinstance(b, dict))


@dataclass(frozen=True)
class ProcessView:
    """The per-process extras (beyond the real tool) shown in the counters panel."""

    tag: str
    pid: int
    command: str
    recompiles: EventCounter
    fallbacks: EventCounter
    compiles: int               # totals since neuron-top started watching
    cache_hits: int
    completed: int
    errors: int
    executions_per_s: float | None   # completed executions over the last period
    latency_p50: float | None   # seconds, total latency over the period
    latency_p99: float | None
    error: str                  # the runtime entry's or a group's error, "" when fine
    counted: bool = True        # False when the monitor's neuron_stack group is not reported
    profile: ProfileFigures | None = None   # a replay's whole-profile figures
    serving: ServingFigures | None = None   # an LLM serving engine's figures (neuron_stack.inference)
    targets: tuple[TargetView, ...] = ()    # per target (instance), from neuron_stack.targets
    attach: AttachView | None = None        # the last attach on demand (neuron_stack.attach)


@dataclass(frozen=True)
class AppView:
    """Everything neuron-top shows for one tab: one process, or ``all`` of them aggregated."""

    tag: str
    pid: int | None
    utilization: dict[int, float]           # global core index -> percent
    flops: dict[int, float]                 # global core index -> FLOP/s
    engines: dict[int, dict[str, float]]    # global core index -> engine -> percent busy
    runtime_vcpu: tuple[float, float] | None  # (user %, system %)
    host_memory: dict[str, int] | None      # HOST_CATEGORIES key -> bytes
    device_memory: dict[str, int] | None    # DEVICE_CATEGORIES key -> bytes
    memory_tree: tuple[MemoryNode, ...]
    processes: tuple[ProcessView, ...]

    @property
    def cores(self) -> tuple[int, ...]:
        """The cores this app has in use, sorted."""
        return tuple(sorted(self.utilization))

    def average_utilization(self) -> float | None:
        """Mean utilization over the cores in use (``None`` when none are)."""
        return sum(self.utilization.values()) / len(self.utilization) if self.utilization else None

    def total_flops(self) -> float:
        return sum(self.flops.values())


@dataclass(frozen=True)
class Snapshot:
    """One consistent frame of neuron-top."""

    instance_id: str
    instance_type: str
    neuroncore_version: str
    device_count: int
    cores_per_device: int
    system_vcpu: tuple[float, float] | None   # (user %, system %) as the real exporter folds them
    system_memory: tuple[int, int] | None      # (used, total) bytes
    apps: tuple[AppView, ...]                  # apps[0] is "all"
    history: dict[tuple[str, int], tuple[float, ...]] = field(default_factory=dict)
    taken_at: float = 0.0
    errors: tuple[str, ...] = ()               # group/hardware errors worth showing

    @property
    def core_ids(self) -> tuple[int, ...]:
        """Every NeuronCore of the instance, in grid order."""
        return tuple(range(self.device_count * self.cores_per_device))

    @property
    def has_processes(self) -> bool:
        return len(self.apps) > 1

    def app(self, index: int) -> AppView:
        """The tab at ``index``, clamped to the tabs that exist."""
        return self.apps[max(0, min(index, len(self.apps) - 1))]


class Totals:
    """Running sums of the monitor's per-period counts, per process; owned by the poll worker. It also keeps
    each tab's last memory tree, reused while the memory it shows is unchanged (memory seldom changes from
    one refresh to the next, and building the trees was most of a snapshot's cost).

    >>> t = Totals()
    >>> t.add((1, "app"), "recompile", 2), t.add((1, "app"), "recompile", 1)
    (2, 3)
    """

    def __init__(self):
        self._sums: dict[tuple, dict[str, int]] = {}
        self._trees: dict[tuple, tuple[list, tuple[MemoryNode, ...]]] = {}
        self._last_trees: dict[tuple, tuple[list, tuple[MemoryNode, ...]]] = {}

    def memory_tree(self, entries: list[dict], per_device: int) -> tuple[MemoryNode, ...]:
        """The memory tree of these runtime ``entries``: last refresh's when their memory is the same."""
        key = (per_device, tuple(_process_key(e) for e in entries))
        shown = [_tree_input(e) for e in entries]
        kept = self._trees.get(key) or self._last_trees.get(key)
        if kept is None or kept[0] != shown:
            kept = (shown, _memory_tree(entries, per_device))
        self._trees[key] = kept
        return kept[1]

    def add(self, process: tuple, name: str, delta: int) -> int:
        """Add this period's ``delta`` of counter ``name`` for ``process``; return the total."""
        sums = self._sums.setdefault(process, {})
        sums[name] = sums.get(name, 0) + max(0, int(delta))
        return sums[name]

    def forget_except(self, alive: set[tuple]) -> None:
        """Drop processes no longer reported, so a reused pid starts from zero."""
        for process in set(self._sums) - alive:
            del self._sums[process]
        # Called once a refresh: the trees kept are those this refresh or the last one showed.
        self._last_trees, self._trees = self._trees, {}


class History:
    """Utilization history per (tab tag, core); owned by the poll worker, copied into each snapshot.

    >>> h = History(length=3)
    >>> for v in (1.0, 2.0, 3.0, 4.0): _ = h.record({("all", 0): v})
    >>> h.record({("all", 0): 5.0})[("all", 0)]
    (3.0, 4.0, 5.0)
    """

    def __init__(self, length: int = HISTORY_LENGTH):
        self.length = length
        self._series: dict[tuple[str, int], deque[float]] = {}

    def record(self, values: dict[tuple[str, int], float]) -> dict[tuple[str, int], tuple[float, ...]]:
        """Append this refresh's values; series not present this time get a 0 (the core was idle)."""
        for key in set(self._series) | set(values):
            series = self._series.setdefault(key, deque(maxlen=self.length))
            series.append(float(values.get(key, 0.0)))
        return {key: tuple(series) for key, series in self._series.items()}


def _num(value, default=0.0) -> float:
    """A finite float, or ``default`` (a hand-written or foreign document may hold anything)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return number if math.isfinite(number) else default


def _group(report: dict, name: str) -> dict | None:
    """A metric group that is present and has no error, else ``None``."""
    group = report.get(name)
    if not isinstance(group, dict) or group.get("error"):
        return None
    return group


def _global_core(nc: int, nd: int, per_device: int) -> int:
    # Loaded-model subgraphs may give the core index per device or instance-wide; accept both.
    if per_device and nd * per_device <= nc < (nd + 1) * per_device:
        return nc
    return nd * per_device + nc


def _category_nodes(prefix: str, device: dict[str, int], host: dict[str, int], core) -> list[MemoryNode]:
    nodes = []
    words = dict(DEVICE_CATEGORIES)
    for key, word in HOST_CATEGORIES:
        words.setdefault(key, word)
    for key, word in words.items():
        d, h = int(device.get(key, 0)), int(host.get(key, 0))
        if d or h or key in dict(DEVICE_CATEGORIES):
            nodes.append(MemoryNode(f"{prefix}/{key}", word, "", d, h, (), core))
    return nodes


def _parent(key: str, label: str, model_id: str, children: list[MemoryNode], core=None) -> MemoryNode:
    return MemoryNode(key, label, model_id, sum(c.device_bytes for c in children),
                      sum(c.host_bytes for c in children), tuple(children), core)


def _memory_rows(entry: dict, per_device: int) -> list[tuple[int, str, str, str, dict, dict]]:
    """Flatten one process's memory into (core, row key, label, model id, device cats, host cats)."""
    memory = _group(entry.get("report", {}), "memory_used")
    if memory is None:
        return []
    pid = entry.get("pid", 0)
    rows = []
    attributed: dict[int, dict[str, int]] = {}
    for model in memory.get("loaded_models") or []:
        for sg_name, sg in sorted((model.get("subgraphs") or {}).items()):
            nd = int(sg.get("neuron_device_index", 0))
            core = _global_core(int(sg.get("neuroncore_index", 0)), nd, per_device)
            breakdown = (sg.get("memory_used_bytes") or {}).get("usage_breakdown") or {}
            dev = {k: int(v) for k, v in (breakdown.get("neuron_device") or {}).items()}
            host = {k: int(v) for k, v in (breakdown.get("host") or {}).items()}
            acc = attributed.setdefault(core, {})
            for k, v in dev.items():
                acc[k] = acc.get(k, 0) + v
            label = model.get("name") or "model"
            if len(model.get("subgraphs") or {}) > 1:
                label = f"{label}:{sg_name}"
            key = f"m:{pid}:{model.get('model_id')}:{sg_name}"
            rows.append((core, key, label, str(model.get("model_id", "")), dev, host))
    per_core = ((memory.get("neuron_runtime_used_bytes") or {}).get("usage_breakdown") or {}) \
        .get("neuroncore_memory_usage") or {}
    for nc, cats in per_core.items():
        core = int(nc)
        acc = attributed.get(core, {})
        # What no model claims stays on the NeuronCore, as the real tool shows it.
        rest = {k: max(0, int(v) - acc.get(k, 0)) for k, v in cats.items()}
        rows.append((core, f"core:{pid}", "", "", rest, {}))
    return rows


def _tree_input(entry: dict) -> tuple:
    """What :func:`_memory_rows` reads of a runtime entry (not its period, nor its host memory)."""
    memory = _group(entry.get("report", {}), "memory_used")
    if memory is None:
        return (None,)
    per_core = ((memory.get("neuron_runtime_used_bytes") or {}).get("usage_breakdown") or {}) \
        .get("neuroncore_memory_usage")
    return entry.get("pid", 0), memory.get("loaded_models"), per_core


def _memory_tree(entries: list[dict], per_device: int) -> tuple[MemoryNode, ...]:
    by_core: dict[int, list[MemoryNode]] = {}
    unattached: dict[int, dict[str, int]] = {}
    for entry in entries:
        for core, key, label, model_id, dev, host in _memory_rows(entry, per_device):
            nd, nc = divmod(core, per_device) if per_device else (0, core)
            prefix = f"nd{nd}/nc{core}"
            if label:
                cats = _category_nodes(f"{prefix}/{key}", dev, host, core)
                by_core.setdefault(core, []).append(_parent(f"{prefix}/{key}", label, model_id, cats, core))
            else:
                acc = unattached.setdefault(core, {})
                for k, v in dev.items():
                    acc[k] = acc.get(k, 0) + v
    devices: dict[int, list[MemoryNode]] = {}
    for core in sorted(set(by_core) | set(unattached)):
        nd = core // per_device if per_device else 0
        prefix = f"nd{nd}/nc{core}"
        children = list(by_core.get(core, []))
        if core in unattached and any(unattached[core].values()):
            children += _category_nodes(prefix, unattached[core], {}, core)
        local = core - nd * per_device
        devices.setdefault(nd, []).append(_parent(prefix, f"NC {local}", "", children, core))
    return tuple(_parent(f"nd{nd}", f"ND {nd}", "", cores) for nd, cores in sorted(devices.items()))


def _counter(group: dict, name: str, total) -> EventCounter:
    raw = group.get(name) or {}
    recent = int(_num(raw.get("count")))
    return EventCounter(total(name, recent), str(raw.get("last_reason") or ""),
                        str(raw.get("last_source") or ""), str(raw.get("last_op") or ""), recent)


def _percentile(stats: dict | None, which: str, p: str) -> float | None:
    values = (stats or {}).get("latency_stats", {}).get(which) if stats else None
    return _num(values.get(p)) if isinstance(values, dict) and values.get(p) is not None else None


def _process_key(entry: dict) -> tuple:
    return (int(_num(entry.get("pid"))), str(entry.get("neuron_runtime_tag") or ""))


def _process_view(entry: dict, totals: Totals) -> ProcessView:
    report = entry.get("report") or {}
    extra = _group(report, "neuron_stack") or {}
    stats = _group(report, "execution_stats")
    summary = (stats or {}).get("execution_summary") or {}
    errors = (stats or {}).get("error_summary") or {}
    group_errors = [f"{name}: {g['error']}" for name, g in report.items()
                    if isinstance(g, dict) and g.get("error")]
    key = _process_key(entry)

    def total(name: str, delta) -> int:
        return totals.add(key, name, int(_num(delta)))

    completed = int(_num(summary.get("completed")))
    period = _num((stats or {}).get("period"), 0.0)
    return ProcessView(
        tag=str(entry.get("neuron_runtime_tag") or entry.get("pid", "")),
        pid=key[0],
        command=str(extra.get("command") or ""),
        recompiles=_counter(extra, "recompiles", total), fallbacks=_counter(extra, "cpu_fallbacks", total),
        compiles=total("compiles", extra.get("compiles")),
        cache_hits=total("cache_hits", extra.get("cache_hits")),
        completed=total("completed", completed),
        errors=total("errors", sum(_num(v) for v in errors.values())),
        executions_per_s=completed / period if stats is not None and period > 0 else None,
        latency_p50=_percentile(stats, "total_latency", "p50"),
        latency_p99=_percentile(stats, "total_latency", "p99"),
        counted=_group(report, "neuron_stack") is not None,
        profile=ProfileFigures.from_document(extra.get("profile")),
        serving=ServingFigures.from_document(extra.get("serving")),
        targets=TargetView.from_document(extra.get("targets")),
        attach=AttachView.from_document(extra.get("attach")),
        error="; ".join(filter(None, [str(entry.get("error") or "")] + group_errors)),
    )


def _app_view(tag: str, pid: int | None, entries: list[dict], per_device: int,
              processes: tuple[ProcessView, ...], totals: Totals) -> AppView:
    util: dict[int, float] = {}
    flops: dict[int, float] = {}
    engines: dict[int, dict[str, float]] = {}
    # With no runtime at all, the runtime's usage is truly zero rather than unknown.
    vcpu: list[float] | None = None if entries else [0.0, 0.0]
    host: dict[str, int] | None = None if entries else {k: 0 for k, _ in HOST_CATEGORIES}
    device: dict[str, int] | None = None if entries else {k: 0 for k, _ in DEVICE_CATEGORIES}
    for entry in entries:
        report = entry.get("report") or {}
        counters = _group(report, "neuroncore_counters")
        for nc, values in ((counters or {}).get("neuroncores_in_use") or {}).items():
            core = int(nc)
            # Cores are exclusive to one process; summing (capped) is right if two ever report one.
            util[core] = min(100.0, util.get(core, 0.0) + _num(values.get("neuroncore_utilization")))
            flops[core] = flops.get(core, 0.0) + _num(values.get("flops"))
        extra = _group(report, "neuron_stack") or {}
        for nc, per_engine in (extra.get("engines") or {}).items():
            acc = engines.setdefault(int(nc), {})
            for engine, pct in per_engine.items():
                acc[engine] = min(100.0, acc.get(engine, 0.0) + _num(pct))
        cpu = _group(report, "neuron_runtime_vcpu_usage")
        if cpu is not None:
            usage = cpu.get("vcpu_usage") or {}
            vcpu = vcpu or [0.0, 0.0]
            vcpu[0] += _num(usage.get("user"))
            vcpu[1] += _num(usage.get("system"))
        memory = _group(report, "memory_used")
        if memory is not None:
            breakdown = (memory.get("neuron_runtime_used_bytes") or {}).get("usage_breakdown") or {}
            host = host if host is not None else {k: 0 for k, _ in HOST_CATEGORIES}
            for k, v in (breakdown.get("host") or {}).items():
                host[k] = host.get(k, 0) + int(v)
            device = device if device is not None else {k: 0 for k, _ in DEVICE_CATEGORIES}
            for cats in (breakdown.get("neuroncore_memory_usage") or {}).values():
                for k, v in cats.items():
                    device[k] = device.get(k, 0) + int(v)
    return AppView(
        tag=tag, pid=pid, utilization=util, flops=flops, engines=engines,
        runtime_vcpu=tuple(vcpu) if vcpu is not None else None,
        host_memory=host, device_memory=device,
        memory_tree=totals.memory_tree(entries, per_device),
        processes=processes,
    )


def _system_vcpu(system: dict) -> tuple[float, float] | None:
    group = _group(system, "vcpu_usage")
    if group is None:
        return None
    avg = group.get("average_usage") or {}
    # The real exporter folds nice into user and io_wait/irq/soft_irq into system (reference §1.6).
    user = _num(avg.get("user")) + _num(avg.get("nice"))
    sys_ = sum(_num(avg.get(k)) for k in ("system", "io_wait", "irq", "soft_irq"))
    return (min(user, 100.0), min(sys_, 100.0))


def build_snapshot(document: dict, history: History | None = None, totals: Totals | None = None,
                   now: float | None = None) -> Snapshot:
    """Build the frame for one neuron-monitor ``document`` (the dict ``Collector.collect()`` returns).

    ``history``, when given, gets this document's utilization appended and the snapshot carries a
    copy of every series; ``totals`` sums the per-period counters across calls (pass the same
    objects every period). Example: ``build_snapshot(collector.collect(), History(), Totals())``.
    """
    if not isinstance(document, dict):
        raise ValueError("neuron-top: the monitor document is not a JSON object")
    hw = document.get("neuron_hardware_info") or {}
    inst = document.get("instance_info") or {}
    system = document.get("system_data") or {}
    entries = [e for e in document.get("neuron_runtime_data") or [] if isinstance(e, dict)]
    # Clamped to what an instance can hold, so a corrupt document cannot ask for a billion rows.
    per_device = min(max(int(_num(hw.get("neuroncore_per_device_count"), 0)), 0), MAX_CORES_PER_DEVICE) or 2
    device_count = min(max(int(_num(hw.get("neuron_device_count"), 0)), 0), MAX_DEVICES)

    totals = totals if totals is not None else Totals()
    processes = [_process_view(e, totals) for e in entries]
    totals.forget_except({_process_key(e) for e in entries})
    apps = [_app_view("all", None, entries, per_device, tuple(processes), totals)]
    for entry, process in zip(entries, processes):
        apps.append(_app_view(process.tag, process.pid, [entry], per_device, (process,), totals))

    # A driver-less host (or a replay without hardware info) still gets a grid covering every
    # core that reports anything.
    used = [c for app in apps for c in app.utilization] + \
           [n.core for app in apps for nd in app.memory_tree for n in nd.children]
    if used:
        device_count = min(max(device_count, max(used) // per_device + 1), MAX_DEVICES)
    device_count = max(device_count, 1)

    memory_info = _group(system, "memory_info")
    values = {(app.tag, core): pct for app in apps for core, pct in app.utilization.items()}
    errors = tuple(filter(None, [f"neuron_hardware_info: {hw['error']}" if hw.get("error") else ""]))
    return Snapshot(
        instance_id=str(inst.get("instance_id") or "unknown-instance"),
        instance_type=str(inst.get("instance_type") or "unknown"),
        neuroncore_version=str(hw.get("neuroncore_version") or "v2"),
        device_count=device_count, cores_per_device=per_device,
        system_vcpu=_system_vcpu(system),
        system_memory=(int(_num(memory_info.get("memory_used_bytes"))),
                       int(_num(memory_info.get("memory_total_bytes")))) if memory_info else None,
        apps=tuple(apps),
        history=history.record(values) if history is not None else {},
        taken_at=time.time() if now is None else now,
        errors=errors,
    )


def human_bytes(n: int | float) -> str:
    """Auto-scaled bytes as neuron-top writes them.

    >>> human_bytes(17.5 * 2**30), human_bytes(256 * 1024), human_bytes(0)
    ('17.5GB', '256.0KB', '0.0B')
    """
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1024 or unit == "TB":
            return f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}TB"
