"""The real tool's JSON output, as ``view --output-format json`` writes it: ``system_profile.json`` (the system
profile's tables) and one ``device_profile_model_<graph_id>.json`` per compiled graph executed (the device
tables' rows of that graph), beside the profile (SDK ``tools/neuron-explorer/get-started.rst``, "Export to
JSON"; the Profiler 2.0 guide's "Generating JSON Output From Profiles").

Each file is ``{"format", ..., "tables": {name: [row, ...]}, "truncated": [names]}``, every real table under
its real name (:mod:`traces.profile_schema`), at most :data:`MAX_ROWS` rows each (those cut are listed). A
device table with an ``exec_id`` or ``graph_id`` column keeps that graph's rows; one without (the profile's
aggregates and dictionaries: ``Summary``, ``OpcodeSummary``, ``Metadata``, ``StackFrame``, ...) is the whole
profile's and is named in the file's ``profile_wide``. The graphs are the ``.pftrace`` files' split
(:func:`traces.export.executed_graphs`).

>>> import json, tempfile, traces, traces.synthetic
>>> d = Path(tempfile.mkdtemp())
>>> _ = traces.synthetic.write_run(d, executions=1, instructions=40)
>>> with traces.open(d) as p:
...     files = write(p, d)
>>> [f.path.name.split("_")[0] for f in files]
['system', 'device']
>>> doc = json.load(open(files[1].path))
>>> len(doc["tables"]["Instruction"]) == files[1].rows["Instruction"], "Summary" in doc["profile_wide"]
(True, True)
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from traces import export, profile_schema
from traces.errors import TraceError

#: rows per table at most (JSON is many times the size of the profile's columns)
MAX_ROWS = export.JSON_MAX_ROWS

#: the real schema's system-profile tables (events, host samples, the device profiles it lists) and
#: ``SchemaFields``, which describes every table rather than one model's
SYSTEM_TABLES = ("SystemProfileEvents", "SystemProfileHbmUsage", "SystemProfileMetadata", "CpuUsage",
                 "HostMemUsage", "DeviceProfileList", "SchemaFields")


@dataclass(frozen=True)
class Written:
    """One file written: its path, the rows of each table in it, and the tables cut at the bound."""
    path: Path
    rows: dict = field(default_factory=dict)
    truncated: tuple = ()


def write(profile, out_dir: str | os.PathLike, max_rows: int = MAX_ROWS, system: bool = True,
          device: bool = True) -> list[Written]:
    """Write ``system_profile.json`` and one ``device_profile_model_<graph_id>.json`` per graph executed into
    the directory ``out_dir``, each under a temporary name renamed into place; ``system=False`` /
    ``device=False`` leave that side out (the real ``--ignore-system-profile`` / ``--ignore-device-profile``).
    Example: ``write(p, "output/session")``.
    """
    out_dir = Path(out_dir)
    if max_rows < 1:
        raise TraceError(f"max_rows {max_rows}: give at least 1")
    tables = profile.real_tables()
    files = []
    if system:
        head = {"format": "neuron-explorer system profile json"}
        files.append(_file(profile, out_dir / "system_profile.json", head,
                           [(t, "", {}) for t in tables if t in SYSTEM_TABLES], max_rows))
    if not device:
        return files
    keys = _graph_keys(profile)
    wide = [t for t in tables if t not in SYSTEM_TABLES and t not in keys]
    names = {r["graph_id"]: r["name"] for r in profile.sql("SELECT graph_id, name FROM graphs").to_pylist()}
    for g in export.executed_graphs(profile):
        head = {"format": "neuron-explorer device profile json", "model_id": g, "model_name": names.get(g),
                "profile_wide": wide}
        chosen = [(t, keys.get(t, ""), {"graph": g} if t in keys else {}) for t in tables if t not in SYSTEM_TABLES]
        files.append(_file(profile, out_dir / f"device_profile_model_{g}.json", head, chosen, max_rows))
    return files


def _graph_keys(profile) -> dict[str, str]:
    """Per real table that can be split by graph, the condition keeping graph ``$graph``'s rows: by its
    ``exec_id`` (the execution's graph) or its ``graph_id``."""
    cols = profile.sql("SELECT table_name, list(column_name) AS cols FROM information_schema.columns "
                       "WHERE table_schema = $s GROUP BY table_name", {"s": profile_schema.SCHEMA}).to_pylist()
    keys = {}
    for r in cols:
        if "exec_id" in r["cols"]:
            keys[r["table_name"]] = "exec_id IN (SELECT exec_id FROM main.executions WHERE graph_id = $graph)"
        elif "graph_id" in r["cols"]:
            keys[r["table_name"]] = "graph_id = $graph"
    return keys


def _file(profile, path: Path, head: dict, tables: list, max_rows: int) -> Written:
    """Write one file (:func:`traces.export.json_tables`)."""
    rows, cut = export.json_tables(profile, path, head, tables, max_rows)
    return Written(path, rows, tuple(cut))
