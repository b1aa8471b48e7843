"""Pure text rendering of neuron-top's panels: snapshot (+ view state) and a width in, Rich Text out.

Everything is readable without colour: bars are block characters, every value is also printed
(``[56.81%]``), and the selected tab is marked ``>[1]:all<``. Colours only add load levels.

>>> from top.snapshot import build_snapshot
>>> snap = build_snapshot({"neuron_hardware_info": {"neuron_device_count": 1,
...                                                "neuroncore_per_device_count": 2}})
>>> print(tab_bar(snap, 0).plain)
Neuron Apps  >[1]:all<
>>> bar(50.0, 4).plain
'██··'
"""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from top.snapshot import (
    DEVICE_CATEGORIES,
    ENGINES,
    HOST_CATEGORIES,
    AppView,
    MemoryNode,
    ProcessView,
    Snapshot,
    human_bytes,
)

NO_PROCESS_MESSAGE = "No Neuron processes found — waiting…"
_PARTIAL = " ▏▎▍▌▋▊▉"
_SPARK = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class ViewState:
    """What the user chose: the tab, the grid mode, the selected core, whether the extras show."""

    tab: int = 0
    flops: bool = False
    engines: bool = True
    core: int | None = None   # the core selected in the memory tree (None: the tab's first core)
    compact: bool = False     # short terminal: thinner panels
    grid_rows: int | None = None   # most device rows the grid may take before idle ones fold


def load_style(pct: float) -> str:
    """nvitop's light / moderate / heavy load colours."""
    return "green" if pct < 33 else "yellow" if pct < 66 else "red"


def bar(pct: float, width: int, style: str | None = None) -> Text:
    """A horizontal bar of ``width`` cells filled to ``pct`` percent (eighth-cell resolution)."""
    width = max(width, 1)
    pct = max(0.0, min(100.0, pct))
    eighths = round(pct / 100 * width * 8)
    full, part = divmod(eighths, 8)
    filled = "█" * full + (_PARTIAL[part] if part and full < width else "")
    text = Text(filled, style=style or load_style(pct))
    text.append("·" * (width - len(filled)), style="dim")
    return text


def two_part_bar(user: float, system: float, width: int) -> Text:
    """A bar with the user share as ``█`` and the system share as ``▒`` (distinct without colour)."""
    width = max(width, 1)
    u = round(max(0.0, min(100.0, user)) / 100 * width)
    s = min(width - u, round(max(0.0, min(100.0, system)) / 100 * width))
    text = Text("█" * u, style="green")
    text.append("▒" * s, style="red")
    text.append("·" * (width - u - s), style="dim")
    return text


def sparkline(values: tuple[float, ...], width: int) -> str:
    """The last ``width`` percentages as block characters (0-100 scale)."""
    tail = values[-width:] if width > 0 else ()
    return "".join(_SPARK[min(7, int(max(0.0, v) / 100 * 8))] if v > 0 else " " for v in tail)


def title(snap: Snapshot, version: str, suffix: str = "") -> Text:
    """``neuron-top <version> running on <instance-id> (<instance-type>)`` as the real title bar."""
    text = Text(f"neuron-top {version} running on {snap.instance_id} ({snap.instance_type})",
                style="bold")
    if suffix:
        text.append(f"  {suffix}", style="italic")
    return text


_FLOP_SCALES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"))


def scale_flops(value: float) -> tuple[float, str]:
    """``value`` FLOP/s as (number, prefix) with the number at least 1 (T when zero): a simulated small
    model runs at GFLOP/s, which "0.00TF" would hide.

    >>> scale_flops(2.5e12), scale_flops(3.2e8), scale_flops(0)
    ((2.5, 'T'), (320.0, 'M'), (0.0, 'T'))
    """
    for factor, prefix in _FLOP_SCALES:
        if value >= factor:
            return value / factor, prefix
    return (value, "") if value > 0 else (0.0, "T")


def utilization_title(snap: Snapshot, app: AppView, flops: bool) -> str:
    """``NeuronCore v2 Utilization (Avg: 56.86%)``, or the FLOP/s total (T/G/M) in FLOPS mode."""
    if flops:
        number, prefix = scale_flops(app.total_flops())
        return f"NeuronCore {snap.neuroncore_version} Utilization (Total: {number:.2f} {prefix}FLOPS)"
    avg = app.average_utilization()
    return f"NeuronCore {snap.neuroncore_version} Utilization (Avg: {avg or 0.0:.2f}%)"


def _cell_value(app: AppView, core: int, flops: bool) -> tuple[str, float]:
    pct = app.utilization.get(core, 0.0)
    if flops:
        number, prefix = scale_flops(app.flops.get(core, 0.0))
        return f"[{number:6.2f}{prefix or ' '}F]", pct   # same width at every scale
    return f"[{pct:6.2f}%]", pct


def utilization_grid(snap: Snapshot, app: AppView, width: int, flops: bool = False,
                     max_rows: int | None = None) -> Text:
    """The ND × NC grid: one bar and value per core; devices wrap side by side when wide.

    When the grid would take more than ``max_rows`` lines, the devices with no core in use fold
    into one line (small terminals, big instances).
    """
    per = snap.cores_per_device
    valw = 10 if flops else 9
    label_w = max(len(f"ND{snap.device_count - 1}"), 3) + 1
    one_device_bar = (width - label_w) // per - valw - 2
    if one_device_bar >= 36:   # room for several devices per line
        bar_w = 12
        block_w = label_w + per * (bar_w + valw + 2) + 2
        devices_per_line, cores_per_line = max(1, width // block_w), per
    elif one_device_bar >= 3:
        bar_w, devices_per_line, cores_per_line = min(one_device_bar, 30), 1, per
    else:                       # very narrow: a device's cores wrap onto several lines
        bar_w = 3
        cores_per_line = max(1, (width - label_w) // (bar_w + valw + 2))
        devices_per_line = 1

    devices = list(range(snap.device_count))
    idle = [d for d in devices if not any(d * per + c in app.utilization for c in range(per))]
    lines_per_device = -(-per // cores_per_line)
    needed = -(-len(devices) // devices_per_line) * lines_per_device
    compact = max_rows is not None and needed > max_rows and bool(idle)
    shown = [d for d in devices if d not in idle] if compact else devices
    out = Text(no_wrap=True, overflow="crop")
    header = " " * label_w
    for i in range(min(per, cores_per_line)):
        header += f"NC{i}".ljust(bar_w + valw + 2)
    if devices_per_line > 1:
        header = (header + "  ") * min(devices_per_line, len(shown) or 1)
    out.append(header.rstrip(), style="bold")
    for start in range(0, len(shown), devices_per_line):
        out.append("\n")
        for k, d in enumerate(shown[start:start + devices_per_line]):
            if k:
                out.append("  ")
            for c in range(per):
                if c % cores_per_line == 0:
                    if c:
                        out.append("\n")
                    out.append((f"ND{d}" if c == 0 else "").ljust(label_w), style="bold")
                core = d * per + c
                value, pct = _cell_value(app, core, flops)
                in_use = core in app.utilization
                out.append_text(bar(pct, bar_w) if in_use else Text("·" * bar_w, style="dim"))
                out.append(" ")
                out.append(value, style="" if in_use else "dim")
                out.append(" ")
    if compact and idle:
        out.append("\n")
        out.append(f"{_ranges('ND', idle)}: no cores in use", style="dim")
    return out


def _ranges(prefix: str, numbers: list[int]) -> str:
    """``ND2-ND5, ND8`` for [2, 3, 4, 5, 8]."""
    parts, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            parts.append(f"{prefix}{start}" if start == n else f"{prefix}{start}-{prefix}{n}")
            start = None
    return ", ".join(parts)


def vcpu_panel(snap: Snapshot, app: AppView, width: int) -> Text:
    """``System vCPU Usage`` and ``Runtime vCPU Usage`` rows, each a bar and ``[user%, system%]``."""
    rows = (("System vCPU Usage", snap.system_vcpu), ("Runtime vCPU Usage", app.runtime_vcpu))
    bar_w = max(4, min(40, width - 20 - 18))
    out = Text(no_wrap=True, overflow="crop")
    for i, (label, pair) in enumerate(rows):
        if i:
            out.append("\n")
        out.append(label.ljust(20), style="bold")
        if pair is None:
            out.append("n/a", style="dim")
            continue
        out.append_text(two_part_bar(pair[0], pair[1], bar_w))
        out.append(f" [{pair[0]:5.2f}%, {pair[1]:5.2f}%]")
    return out


def memory_summary(app: AppView, width: int, compact: bool = False) -> Text:
    """``Host Used Memory`` and ``Device Used Memory`` with their categories, auto-scaled.

    ``compact`` (short terminals) writes each Total on its heading line to save a row.
    """
    def column(head: str, cats, values: dict[str, int] | None) -> list[tuple[str, str]]:
        total = "n/a" if values is None else human_bytes(sum(values.get(k, 0) for k, _ in cats))
        rows = [(f"{head} (Total)", total)] if compact else [(head, ""), ("Total", total)]
        if values is None:
            return rows
        return rows + [(word, human_bytes(values.get(key, 0))) for key, word in cats]

    host = column("Host Used Memory", HOST_CATEGORIES, app.host_memory)
    device = column("Device Used Memory", DEVICE_CATEGORIES, app.device_memory)
    out = Text(no_wrap=True, overflow="crop")
    if width >= 72:   # side by side, as the real tool
        col = 35
        for i in range(max(len(host), len(device))):
            if i:
                out.append("\n")
            for j, rows in enumerate((host, device)):
                name, value = rows[i] if i < len(rows) else ("", "")
                cell = Text(name[:26].ljust(26), style="bold" if i == 0 else "")
                cell.append(value.rjust(9))
                cell.truncate(col, pad=j == 0)
                out.append_text(cell)
                if j == 0:
                    out.append("  ")
    else:
        for i, (name, value) in enumerate(host + device):
            if i:
                out.append("\n")
            out.append(name[:26].ljust(26), style="bold" if "Memory" in name else "")
            out.append(value.rjust(9))
    return out


TREE_COLUMNS = (("Model ID", 10), ("Device Memory", 14), ("Host Memory", 12))


def tree_header(width: int) -> Text:
    """The ``Model ID | Device Memory | Host Memory`` header over the memory tree."""
    cols_w = sum(w for _, w in TREE_COLUMNS) + 3 * len(TREE_COLUMNS)
    text = Text("Name".ljust(max(4, width - cols_w)), style="bold", no_wrap=True)
    for name, w in TREE_COLUMNS:
        text.append(" | " + name.rjust(w), style="bold")
    return text


TREE_ICON_WIDTH = 4
"""Width of the tree's ``[+] ``/``[-] `` toggle, which only expandable rows have."""


def tree_label(node: MemoryNode, width: int, depth: int, indent: int) -> Text:
    """A tree row: the name, then the columns aligned across depths (the tree indents the name
    by ``depth * indent`` and puts a toggle before expandable rows)."""
    cols_w = sum(w for _, w in TREE_COLUMNS) + 3 * len(TREE_COLUMNS)
    name_w = max(4, width - cols_w - depth * indent - (TREE_ICON_WIDTH if node.children else 0))
    text = Text(no_wrap=True)
    text.append(node.label[:name_w].ljust(name_w), style="bold" if node.children else "")
    for value, (_, w) in zip((node.model_id, human_bytes(node.device_bytes),
                              human_bytes(node.host_bytes)), TREE_COLUMNS):
        text.append(" | " + value.rjust(w))
    return text


def tab_bar(snap: Snapshot, selected: int, width: int = 10_000) -> Text:
    """``Neuron Apps  >[1]:all<  [2]:257726 …``; the selected tab between ``>`` and ``<``.

    When the tabs do not fit ``width``, a window of them around the selected one is shown, with
    ``…`` where tabs are left out, so the selected tab is always visible.
    """
    cells = [(f" >[{i + 1}]:{app.tag}<" if i == selected else f"  [{i + 1}]:{app.tag} ", i == selected)
             for i, app in enumerate(snap.apps)]
    head = "Neuron Apps "
    lo = hi = max(0, min(selected, len(cells) - 1))
    room = width - len(head) - 4   # room for the two "…" markers

    def size(a, b):
        return sum(len(c) for c, _ in cells[a:b + 1])
    while True:   # grow the window right, then left, while it fits
        grown = False
        if hi + 1 < len(cells) and size(lo, hi + 1) <= room:
            hi, grown = hi + 1, True
        if lo > 0 and size(lo - 1, hi) <= room:
            lo, grown = lo - 1, True
        if not grown:
            break
    text = Text(head, style="bold", no_wrap=True, overflow="ellipsis")
    if lo > 0:
        text.append(" …")
    for cell, chosen in cells[lo:hi + 1]:
        text.append(cell, style="bold reverse green" if chosen else "")
    if hi + 1 < len(cells):
        text.append(" …")
    return text


def selected_core(app: AppView, state: ViewState) -> int | None:
    """The core the extras panels describe: the tree's selection, else the tab's first core."""
    if state.core is not None and (state.core in app.utilization or state.core in app.engines):
        return state.core
    cores = sorted(set(app.utilization) | set(app.engines))
    return cores[0] if cores else state.core


def engine_panel(snap: Snapshot, app: AppView, state: ViewState, width: int) -> tuple[str, Text]:
    """(title, body) of the per-engine breakdown of the selected core."""
    core = selected_core(app, state)
    if core is None:
        return "Engines", Text("no core in use", style="dim")
    nd, nc = divmod(core, snap.cores_per_device)
    engines = app.engines.get(core)
    out = Text(no_wrap=True, overflow="crop")
    if engines is None:
        out.append("no engine data (monitor's neuron_stack group is off)", style="dim")
    else:
        # At 80x24 the full-width panel has four rows: one column cut DMA and Sync off, two fit.
        cols = 2 if width >= 76 else 1   # the full-width panel of a small terminal; the side panel has rows
        col_w = width // cols - 2
        bar_w = max(4, min(30, col_w - 8 - 10))
        rows = -(-len(ENGINES) // cols)
        for r in range(rows):
            if r:
                out.append("\n")
            for c, (key, word) in enumerate(ENGINES[r::rows]):
                pct = engines.get(key, 0.0)
                if c:
                    out.append("  ")
                out.append(word.ljust(8), style="bold")
                out.append_text(bar(pct, bar_w))
                out.append(f" {pct:6.2f}%")
    return f"Engines of ND{nd} NC{nc} (core {core})", out


def history_panel(snap: Snapshot, app: AppView, width: int) -> Text:
    """One sparkline per core in use: utilization over the last refreshes."""
    out = Text(no_wrap=True, overflow="crop")
    cores = app.cores
    if not cores:
        out.append("no core in use", style="dim")
        return out
    spark_w = max(4, width - 8 - 9)
    for i, core in enumerate(cores):
        if i:
            out.append("\n")
        nd, nc = divmod(core, snap.cores_per_device)
        series = snap.history.get((app.tag, core), ())
        out.append(f"ND{nd}NC{nc}".ljust(8), style="bold")
        out.append(sparkline(series, spark_w).rjust(spark_w), style=load_style(app.utilization[core]))
        out.append(f" {app.utilization[core]:6.2f}%")
    return out


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.2f}ms"


def counters_panel(app: AppView, width: int) -> Text:
    """Per process: executions, latency, compiles, recompiles and CPU fallbacks with their last cause.

    Counts are totals since neuron-top started; ``(+n)`` is the part from the last period.
    """
    out = Text(no_wrap=True, overflow="ellipsis")
    if not app.processes:
        out.append(NO_PROCESS_MESSAGE, style="dim")
        return out
    for i, p in enumerate(app.processes):
        if i:
            out.append("\n")
        _process_lines(out, p)
    return out


def _recent(n: int) -> str:
    return f" (+{n})" if n else ""


def _counter_lines(out: Text, name: str, counter, cause: str, style: str) -> None:
    """``Recompiles 3 (+1)  at model.py:88`` and, below it, the last cause."""
    out.append(f"\n  {name} ")
    out.append(f"{counter.count}{_recent(counter.recent)}", style=style if counter.count else "")
    if counter.count:
        if counter.last_source:
            out.append("  last at ")
            out.append(counter.last_source, style="cyan")
        out.append(f"\n    {cause or 'no reason recorded'}")


def _process_lines(out: Text, p: ProcessView) -> None:
    rate = "n/a" if p.executions_per_s is None else f"{p.executions_per_s:.1f}/s"
    out.append(f"{p.tag} (pid {p.pid})", style="bold")
    out.append(f"  executions {p.completed} ({rate})  errors {p.errors}  p50 {_ms(p.latency_p50)}"
               f"  p99 {_ms(p.latency_p99)}")
    out.append(f"\n  compiles {p.compiles}  cache hits {p.cache_hits}")
    if p.command:
        out.append(f"  $ {p.command}", style="dim")
    if len(p.targets) > 1:   # one line per simulated instance the process uses
        for t in p.targets:
            out.append(f"\n  {t.target} on {t.instance_type or 'unknown'}: cores "
                       f"{','.join(map(str, t.cores)) or '-'}  runtime {human_bytes(t.runtime_memory)}"
                       f"  MFU {t.mfu_percent:.2f}%")
    if p.profile is not None:
        _profile_line(out, p.profile)
    if p.serving is not None:
        sv = p.serving
        out.append(f"\n  serving {sv.model}: {sv.tokens_per_s:.1f} tokens/s  running {sv.running}  waiting "
                   f"{sv.waiting}  KV cache {100 * sv.kv_cache_usage:.0f}% of {sv.kv_cache_bytes / 2**20:.1f} MiB",
                   style="green")
    if p.attach is not None:
        a = p.attach
        by = f" by trigger {a.trigger}" if a.trigger else ""
        out.append(f"\n  attach{by}: {a.state} → {a.profile}" + (f" ({a.reason})" if a.reason else ""),
                   style="bold magenta" if a.state == "recording" else "magenta")
    if p.counted:
        _counter_lines(out, "Recompiles", p.recompiles, p.recompiles.last_reason, "bold yellow")
        cause = ": ".join(filter(None, [p.fallbacks.last_op, p.fallbacks.last_reason]))
        _counter_lines(out, "CPU fallbacks", p.fallbacks, cause, "bold red")
    else:
        out.append("\n  recompiles, CPU fallbacks: not reported (add the neuron_stack metric group "
                   "to the monitor config)", style="dim")
    if p.error:
        out.append(f"\n  error: {p.error}", style="bold red")


def _duration(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.2f}{unit}"
    return f"{ns:.0f}ns"


def _profile_line(out: Text, f) -> None:
    """A replay's whole-profile figures (the same numbers as ``neuron-explorer summary``)."""
    out.append("\n  profile: ", style="dim")
    out.append(f"device {_duration(f.device_ns)}  busy {f.device_busy_percent:.1f}%  MFU {f.mfu_percent:.2f}%"
               f"  fallback host {_duration(f.fallback_host_ns)}  compiles {f.compiles}")
    if f.before_window:
        out.append(f"\n  {f.before_window}", style="dim")


# Panel bodies: (snapshot, state, width) -> (border title, text), the shape widgets.Panel renders.

def utilization_body(snap: Snapshot, state: ViewState, width: int) -> tuple[str, Text]:
    """The utilization panel; the no-process message sits on top of the (idle) grid."""
    app = snap.app(state.tab)
    text = utilization_grid(snap, app, width, state.flops, max_rows=state.grid_rows)
    if not snap.has_processes:
        text = Text(NO_PROCESS_MESSAGE + "\n", style="bold").append_text(text)
    return utilization_title(snap, app, state.flops), text


def vcpu_body(snap: Snapshot, state: ViewState, width: int) -> tuple[str, Text]:
    return "vCPU Utilization", vcpu_panel(snap, snap.app(state.tab), width)


def memory_summary_body(snap: Snapshot, state: ViewState, width: int) -> tuple[str, Text]:
    return "Memory Usage Summary", memory_summary(snap.app(state.tab), width, state.compact)


def engine_body(snap: Snapshot, state: ViewState, width: int) -> tuple[str, Text]:
    return engine_panel(snap, snap.app(state.tab), state, width)


def history_body(snap: Snapshot, state: ViewState, width: int) -> tuple[str, Text]:
    return "Utilization history", history_panel(snap, snap.app(state.tab), width)


def counters_body(snap: Snapshot, state: ViewState, width: int) -> tuple[str, Text]:
    return "Recompiles and CPU fallbacks", counters_panel(snap.app(state.tab), width)
