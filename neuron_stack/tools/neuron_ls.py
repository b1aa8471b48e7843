"""``neuron-ls``: the simulated instance's Neuron devices, their cores, and who holds them.

Output follows the real tool (reference §2.2): header lines, the boxed table with the real
column names, ``-w/--wide`` and ``-a/--show-all-procs`` process rows, ``-j/--json-output``
with the real keys, ``-t/--topology`` with the 2D-torus map. Which cores a process holds come
from the core reservation records of :mod:`neuron_stack.runtime.cores`.

Example::

    $ NEURON_RT_VISIBLE_CORES=0-1 python train.py &
    $ neuron-ls --wide
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import psutil

from neuron_stack.runtime import cores as _cores
from traces.errors import run_guarded

# Tools that open the device without the runtime: listed by -a with RUNTIME VERSION "NA".
NON_RUNTIME_TOOLS = ("neuron-ls", "neuron-monitor", "neuron-monitor-prometheus", "neuron-top", "neuron-explorer")
WIDE_COMMAND_WIDTH, COMMAND_WIDTH = 80, 40


def compact_ids(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (how neuron-ls prints core id lists)."""
    parts, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ", ".join(parts)


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _tool_processes() -> list[dict]:
    """Running neuron tools that are not runtime users (for ``-a``), this neuron-ls included."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        argv = p.info["cmdline"] or []
        names = [os.path.basename(a) for a in argv[:2]]
        if any(n in NON_RUNTIME_TOOLS for n in names):
            start = max(i for i, n in enumerate(names) if n in NON_RUNTIME_TOOLS)
            found.append({"pid": p.info["pid"], "command": " ".join(argv[start:]).replace(argv[start], names[start], 1),
                          "neuron_runtime_version": "NA", "neuroncore_ids": []})
    return sorted(found, key=lambda r: r["pid"])


def device_report(instance: _cores.Instance, show_all_procs: bool = False) -> list[dict]:
    """One dict per device under neuron-ls's JSON keys, with the processes holding its cores.

    >>> rows = device_report(_cores.get_instance("trn1"))
    >>> rows[0]["neuroncore_ids"], rows[0]["connected_to"]
    ([0, 1], [12, 3, 4, 1])
    """
    holders = _cores.core_holders(instance)
    tools = _tool_processes() if show_all_procs else []
    lnc = instance.profile.lnc
    report = []
    for chip in range(instance.chips):
        ids = instance.cores_of(chip)
        procs: dict[int, dict] = {}
        for core in ids:
            h = holders.get(core)
            if h:
                p = procs.setdefault(h["pid"], {"pid": h["pid"], "command": h["command"],
                                                "neuron_runtime_version": h.get("runtime_version", "NA"),
                                                "neuroncore_ids": []})
                p["neuroncore_ids"].append(core)
        report.append({
            "neuron_device": chip, "bdf": instance.bdf(chip), "cpu_affinity": instance.cpu_affinity(chip),
            "numa_node": str(instance.numa_node(chip)), "connected_to": instance.neighbors(chip) or None,
            "nc_count": len(ids), "logical_neuroncore_config": lnc,
            "memory_size": instance.profile.hbm_bytes_per_chip, "neuroncore_ids": ids,
            "neuron_processes": sorted(procs.values(), key=lambda p: p["pid"]) + tools,
        })
    return report


def render_table(headers: list[str], groups: list[list[list[str]]], separate_groups: bool) -> str:
    """A neuron-ls box table: two-line centred headers, left-aligned cells, ``+---+`` rules."""
    heads = [(h.split(" ", 1) + [""])[:2] for h in headers]
    widths = [max([len(a), len(b)] + [len(r[i]) for g in groups for r in g]) for i, (a, b) in enumerate(heads)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    line = lambda cells, center=False: "| " + " | ".join(  # noqa: E731
        (c.center(w) if center else c.ljust(w)) for c, w in zip(cells, widths)) + " |"
    out = [rule, line([a for a, _ in heads], True), line([b for _, b in heads], True), rule]
    for g in groups:
        out.extend(line(r) for r in g)
        if separate_groups:
            out.append(rule)
    if not separate_groups:
        out.append(rule)
    return "\n".join(out)


def render_topology(instance: _cores.Instance) -> str:
    """The device map: a 2D torus with wrap-around legend, a ring, or a single device."""
    box = lambda i: f"[{i:^3}]"  # noqa: E731
    row = lambda ids: "*––►" + "◄––►".join(box(i) for i in ids) + "◄––*"  # noqa: E731
    legend = ["", "Legend:", "", "        *––► = Wrap-around link"]
    if instance.topology == "torus":
        side = int(round(instance.chips ** 0.5))
        # a vertical marker under each box centre (column 6, then every 9 characters)
        col = lambda ch: "      " + "        ".join(ch for _ in range(side)) + "      "  # noqa: E731
        lines = [col("*"), col("│"), col("▼")]
        for r in range(side):
            lines.append(row(range(r * side, (r + 1) * side)))
            lines += [col("▲"), col("│"), col("▼" if r < side - 1 else "*")]
        return "\n".join(["", "Neuron Device Topology"] + lines + legend)
    if instance.topology == "ring":
        return "\n".join(["", "Neuron Device Topology", row(range(instance.chips))] + legend)
    return "\n".join(["", "Neuron Device Topology", box(0)])


def render(instance: _cores.Instance, wide: bool = False, show_all_procs: bool = False,
           topology: bool = False) -> str:
    """The text neuron-ls prints. Example: ``print(render(get_instance("trn1"), wide=True))``."""
    report = device_report(instance, show_all_procs)
    head = [f"instance-type: {instance.instance_type}", f"instance-id: {instance.instance_id}"]
    if instance.profile.name == "trn2":
        head.append("logical-neuroncore-config: 2")
    mem = f"{instance.profile.hbm_bytes_per_chip // 2**30} GB"
    base = lambda d: [str(d["neuron_device"]), str(d["nc_count"]), compact_ids(d["neuroncore_ids"]), mem,  # noqa: E731
                      ", ".join(map(str, d["connected_to"] or [])), d["bdf"]]
    headers = ["NEURON DEVICE", "NEURON CORES", "NEURON CORE IDS", "NEURON MEMORY", "CONNECTED DEVICES", "PCI BDF"]
    if wide or show_all_procs:
        width = COMMAND_WIDTH if show_all_procs else WIDE_COMMAND_WIDTH
        groups = []
        for d in report:
            first, rows = base(d), []
            for i, p in enumerate(d["neuron_processes"] or [None]):
                cells = first if i == 0 else [""] * len(first)
                if p is None:
                    rows.append(cells + ["", "", ""])
                    continue
                if p["neuroncore_ids"]:  # on a process row, the cores that process holds
                    cells = cells[:2] + [compact_ids(p["neuroncore_ids"])] + cells[3:]
                rows.append(cells + [str(p["pid"]), _truncate(p["command"], width), p["neuron_runtime_version"]])
            groups.append(rows)
        table = render_table(headers + ["PID", "COMMAND", "RUNTIME VERSION"], groups, separate_groups=show_all_procs)
    else:
        groups = [[base(d) + [d["cpu_affinity"], d["numa_node"]]] for d in report]
        table = render_table(headers + ["CPU AFFINITY", "NUMA NODE"], groups, separate_groups=False)
    text = "\n".join(head + [table])
    return text + ("\n" + render_topology(instance) if topology else "")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neuron-ls", description=(
        "List the simulated instance's Neuron devices and the processes using them. The instance "
        "is NEURON_STACK_INSTANCE_TYPE (default trn1.32xlarge)."))
    p.add_argument("-w", "--wide", action="store_true", help="wider table with the processes using each device")
    p.add_argument("-a", "--show-all-procs", action="store_true",
                   help="also list non-runtime users such as neuron-monitor and neuron-ls itself")
    p.add_argument("-t", "--topology", action="store_true", help="show the device interconnect map")
    p.add_argument("-j", "--json-output", action="store_true", help="print JSON instead of a table")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``neuron-ls``."""
    args = _parser().parse_args(argv)

    def body() -> int:
        instance = _cores.get_instance(None)
        if args.json_output:
            print(json.dumps(device_report(instance, args.show_all_procs), indent=4))
        else:
            print(render(instance, args.wide, args.show_all_procs, args.topology))
        return 0

    return run_guarded("neuron-ls", body)


if __name__ == "__main__":
    sys.exit(main())
