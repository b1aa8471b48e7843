"""The Explorer's data: the ``traces`` answers cached and shaped for the pages.

Every number comes from the ``traces`` query API (``traces.open`` → ``Profile``); nothing here
writes SQL. Profiles are named by key and request parameters validated in :mod:`explorer.profiles`.

Every result that could grow with the profile is capped. The timeline's answers are shaped in
:mod:`explorer.timeline`.
Times in the Explorer are nanoseconds since the profile's first recorded moment (``t0``) on the
projected clock, so URLs and axes stay short.

>>> reg = Registry([])          # the server builds one from the command line
>>> reg.keys()
[]
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from explorer import sources
from explorer.profiles import (  # noqa: F401  (the pages reach them through here)
    Entry,
    ExplorerError,
    Loaded,
    Registry,
    _one_line,
    _plain,
    parse_int,
    parse_selection,
    registry,
    resolve,
    set_registry,
)
from explorer.signatures import (  # noqa: F401  (pages use them here)
    bucketing,
    name_inputs,
    parse_signature,
    reason_names,
    signature_diff,
)
from traces import q_compare, q_host, q_timeline
from traces.console import DEFAULT_ROW_LIMIT, MAX_RESULT_BYTES
from traces.errors import TraceError
from traces.timefmt import fmt_ns
from traces.vocab import DEVICE_ENGINES

#: Rows a SQL console query may return.
CONSOLE_LIMIT = DEFAULT_ROW_LIMIT
#: A console query is interrupted after this long: one endless query (an aggregate over a huge
#: generate_series) would otherwise hold a server thread for good.
CONSOLE_TIMEOUT_S = 10.0

# ------------------------------------------------------------------------------- basic facts
def rows(table) -> list[dict]:
    """An Arrow table as plain dicts (HUGEINT sums arrive as Decimal: made Python numbers)."""
    return [{k: _plain(v) for k, v in r.items()} for r in table.to_pylist()]


def tables(L: Loaded) -> set[str]:
    return L.cached("tables", lambda: set(L.profile.tables()))


def metadata(L: Loaded) -> dict[str, str]:
    """The profile's metadata table as a dict (``target``, ``is_simulation``, hardware rates...)."""
    return L.cached("metadata", L.profile.metadata)


def bounds(L: Loaded) -> dict:
    """``t0``/``t1`` (absolute projected ns) covering executions, instructions and events; ``fit``:
    the window the timeline opens on, ``(start, end)`` in ns since ``t0`` (``Profile.timeline_bounds``)."""
    def compute():
        b = L.profile.timeline_bounds()
        return {"t0": b.t0, "t1": b.t1, "span": b.span, "instructions": b.instructions, "max_dur": b.max_dur,
                "fit": (b.fit_t0 - b.t0, b.fit_t1 - b.t0)}
    return L.cached("bounds", compute)


def ops(L: Loaded) -> dict[int, dict]:
    """Every op with its source line and graph name, keyed by op_id (small: one row per graph node)."""
    return L.cached("ops", lambda: {r["op_id"]: r for r in rows(L.profile.ops())})


def execution_labels(L: Loaded) -> dict[int, str]:
    """What each execution was, by exec_id (``Profile.execution_labels``): its graph, its inputs' shapes (the
    shape bucket it ran), a warm-up or not, its device time and core, e.g.
    ``Block.forward · x f32[4, 64] · 12.3 µs · core 0``, for the execution pickers."""

    def compute():
        out = {}
        for e in rows(L.profile.execution_labels()):
            shapes = (", ".join(f"{a['name']} {a['dtype']}[{', '.join(map(str, a['shape']))}]"
                                for a in parse_signature(e["input_signature"]))
                      or (e["input_signature"] or "")[:80])      # a collective's "1024 x float32" as recorded
            out[e["exec_id"]] = " · ".join(x for x in (
                e["graph"] or f"graph {e['graph_id']}", shapes, "warm-up" if e["warmup"] else "",
                fmt_ns(e["device_ns"] or 0), f"core {e['core']}") if x)
        return out
    return L.cached("execution_labels", compute)


def op_path_key(op: dict) -> str:
    """``fc1/aten.addmm.default``: an op of the model, the same in every graph compiled from it."""
    return f"{op.get('module_path') or ''}/{op_label(op)}"


def op_label(op: dict | None) -> str:
    if not op:
        return "(no op)"
    return op.get("aten_op") or op.get("name") or "?"


def where(op: dict | None) -> str:
    """``model.py:88`` for an op, or an empty string."""
    if not op or not op.get("file"):
        return ""
    return f"{Path(op['file']).name}:{op['line']}"


def op_totals(L: Loaded, include_warmup: bool | None = None) -> dict[int, dict]:
    """Per op: device time (device engines only) with its per-engine split, instructions, FLOPs, bytes,
    and the host time and calls of a CPU-fallback op (``Profile.op_totals``: warm-ups excluded, as the
    Summary, unless ``include_warmup``)."""
    def compute():
        out: dict[int, dict] = {}
        for r in rows(L.profile.op_totals(include_warmup)):
            out[r["op_id"]] = {"op_id": r["op_id"], "device_ns": r["device_ns"] or 0,
                               "instructions": r["instruction_count"] or 0, "flops": r["instruction_flops"] or 0,
                               "bytes": r["bytes"] or 0,
                               "engines": {e: r[f"{e}_ns"] for e in DEVICE_ENGINES if r[f"{e}_ns"]},
                               "host_ns": r["host_ns"] or 0, "fallback_calls": r["host_calls"] or 0}
        return out
    return L.cached(f"op_totals:{include_warmup}", compute)


def top_ops(L: Loaded, n: int = 10) -> list[dict]:
    """Ops of the model by device time (summed over every graph compiled from them), costliest first.

    Each row: ``op`` (ATen op), ``module``, ``where`` (file:line), ``device_ns``, ``instructions``,
    ``engines`` and ``sel`` (the timeline selection ``path:<module>/<aten op>``).
    """
    info, totals = ops(L), op_totals(L)
    groups: dict[str, dict] = {}
    for op_id, t in totals.items():
        if not t["device_ns"]:
            continue
        o = info.get(op_id) or {}
        key = op_path_key(o)
        g = groups.setdefault(key, {"op": op_label(o), "module": o.get("module_path", ""), "where": where(o),
                                    "source_id": o.get("source_id"), "sel": f"path:{key}", "device_ns": 0,
                                    "instructions": 0, "engines": {}, "graph_ids": set()})
        g["device_ns"] += t["device_ns"]
        g["instructions"] += t["instructions"]
        g["graph_ids"].add(o.get("graph_id"))   # one op path can occur several times in one graph
        for e, ns in t["engines"].items():
            g["engines"][e] = g["engines"].get(e, 0) + ns
    for g in groups.values():
        g["graphs"] = len(g.pop("graph_ids"))
    result = sorted(groups.values(), key=lambda r: -r["device_ns"])
    return result[:n]


def line_totals(L: Loaded, include_warmup: bool | None = None) -> dict[int, dict]:
    """Device time, instruction count and CPU-fallback host time per source line (source_id), summed over
    the line's ops (:func:`op_totals`)."""
    def compute():
        info, totals = ops(L), op_totals(L, include_warmup)
        out: dict[int, dict] = {}
        for op_id, o in info.items():
            sid = o.get("source_id")
            if sid is None:
                continue
            t = totals.get(op_id, {})
            d = out.setdefault(sid, {"source_id": sid, "file": o.get("file"), "line": o.get("line"),
                                     "function": o.get("function"), "code": o.get("code") or "",
                                     "device_ns": 0, "instructions": 0, "host_ns": 0, "ops": []})
            d["device_ns"] += t.get("device_ns", 0)
            d["instructions"] += t.get("instructions", 0)
            d["host_ns"] += t.get("host_ns", 0)
            d["ops"].append(op_id)
        return out
    return L.cached(f"line_totals:{include_warmup}", compute)


def source_line(L: Loaded, sid: int) -> dict | None:
    """``{"file", "line"}`` of a recorded source line: an op's line, or a graph's call site (the line that
    compiled it: the Recompiles page links it) that no op of the graph carries; None when unknown."""
    t = line_totals(L).get(sid)
    if t is not None:
        return t
    site = next((g for g in rows(L.profile.graphs()) if g.get("source_id") == sid and g.get("file")), None)
    return {"file": site["file"], "line": site["line"], "graph_id": site["graph_id"], "graph": site["name"]} \
        if site else None


def top_lines(L: Loaded, n: int = 10) -> list[dict]:
    """Source lines by device time (the user's own code), most expensive first."""
    result = [dict(r, where=f"{Path(r['file']).name}:{r['line']}" if r.get("file") else "")
              for r in line_totals(L).values() if r["device_ns"]]
    result.sort(key=lambda r: -r["device_ns"])
    return result[:n]


# ------------------------------------------------------------------------------------ summary
def _named(f) -> dict:
    """The figures Summary and Compare both name, from one ``Profile.figures()`` result."""
    return {"total_time": f.device_ns / 1e9, "device_ns": f.device_ns, "cpu_fallback_ns": f.fallback_host_ns,
            "step_ns": f.step_ns, "mfu_estimated_percent": f.mfu_percent, "hbm_read_bytes": f.hbm_read_bytes,
            "hbm_write_bytes": f.hbm_write_bytes, "fallback_ops": f.fallback_ops, "recompiles": f.recompiles,
            "executions": f.executions, "instructions": f.instructions}
def insights(L: Loaded) -> dict:
    """The real Summary's remaining figures (``traces.q_insights``): ``nki_coverage``, ``nki_stats`` (rows),
    ``dma`` (per core and queue), ``collectives`` (every operation, outliers marked), ``collective_stats``
    and ``throttling``; a profile without instruction rows has empty ones."""
    def compute():
        p = L.profile
        return {"nki_coverage": p.nki_coverage(), "nki_stats": rows(p.nki_engine_stats()),
                "dma": rows(p.dma_utilization()), "collectives": rows(p.collective_ops()),
                "collective_stats": rows(p.collective_stats()), "throttling": p.throttling()}
    return L.cached("insights", compute)


def summary(L: Loaded) -> dict:
    """The Summary page's numbers: ``Profile.figures()`` (the same figures ``neuron-explorer summary``
    and ``neuron-top --replay`` show) and the device profile's metadata, under the page's names."""
    def compute():
        md = metadata(L)
        f = L.profile.figures()
        return {
            "target": md.get("target") or md.get("device_profile", "?"),
            "device_profile": md.get("device_profile") or md.get("target", "?"),
            "instance_type": md.get("instance_type", ""),
            "is_simulation": md.get("is_simulation", "true"),
            "timing_model": md.get("timing_model", ""), "auto_cast": md.get("auto_cast", ""),
            "figures": f, **_named(f),
            "warmup_executions": f.warmup_executions, "cores": f.cores, "span_ns": f.span_ns,
            "device_busy_percent": f.device_busy_percent, "engines": dict(f.engine_percent),
            "model_flops": f.model_flops, "fallback_calls": f.fallback_calls, "graphs": f.graphs,
            "compiles": f.compiles, "cache_hits": f.cache_hits, "compile_wall_ns": f.compile_ns,
            "before_window": f.before_window_text(),
            "mbu_estimated_percent": f.mbu_percent, "total_bandwidth_available": f.total_bandwidth_available,
            "useful_read_percent": f.useful_read_percent, "spill_save_bytes": f.spill_save_bytes,
            "spill_reload_bytes": f.spill_reload_bytes, "hardware_flops": f.hardware_flops,
            "transpose_flops": f.transpose_flops, "flops_breakdown": dict(f.flops_breakdown),
            "dma_split": dict(f.dma_split), "bandwidth_breakdown": dict(f.bandwidth_breakdown),
            # per target (a process's trn1 and inf2 sessions are two instances): Profile.targets
            "targets": L.profile.targets(),
            # an incomplete capture (device used, no device rows) or deliberate gaps, one line each
            "capture": L.profile.capture_verdict(),
        }
    return L.cached("summary", compute)


# ----------------------------------------------------------------------------------- timeline
# ---------------------------------------------------------------------------------- selections
def selection_ops(L: Loaded, sel) -> set[int]:
    """The op_ids a selection stands for (a source line's ops, a module's ops, one op, a graph's ops)."""
    parsed = parse_selection(sel)
    if not parsed:
        return set()
    kind, value = parsed
    info = ops(L)
    if kind == "op":
        return {parse_int(value, "op id")} & set(info)
    if kind == "line":
        sid = parse_int(value, "source id")
        return {k for k, o in info.items() if o.get("source_id") == sid}
    if kind == "graph":
        gid = parse_int(value, "graph id")
        return {k for k, o in info.items() if o.get("graph_id") == gid}
    if kind == "path":
        return {k for k, o in info.items() if op_path_key(o) == value}
    if kind == "lines":
        file, lo, hi = _lines_selection(L, sel)
        return {k for k, o in info.items() if o.get("file") == file and lo <= (o.get("line") or 0) <= hi}
    return {k for k, o in info.items()
            if (o.get("module_path") or "") == value or (o.get("module_path") or "").startswith(value + ".")}


def describe_selection(L: Loaded, sel) -> str:
    """Words for a selection, e.g. ``line model.py:12 (3 ops)``."""
    parsed = parse_selection(sel)
    if not parsed:
        return ""
    kind, value = parsed
    n = len(selection_ops(L, sel))
    if kind == "line":
        t = line_totals(L).get(int(value))
        name = f"{Path(t['file']).name}:{t['line']}" if t and t.get("file") else f"source {value}"
        return f"line {name} ({n} ops)"
    if kind == "op":
        o = ops(L).get(int(value))
        return f"op {op_label(o)} {where(o)}".strip()
    if kind == "lines":
        file, lo, hi = _lines_selection(L, sel)
        return f"lines {Path(file).name}:{lo}-{hi} ({n} ops)"
    return f"{kind} {value} ({n} ops)"


# ---------------------------------------------------------------------------------- hierarchy
def hierarchy(L: Loaded) -> list[dict]:
    """Icicle nodes module path → ATen op → opcode, weighted by device time.

    Each node: ``{"id", "parent", "label", "value" (device ns), "instructions", "sel"}`` where
    ``sel`` is the timeline selection it stands for.
    """
    def compute():
        info = ops(L)
        nodes: dict[str, dict] = {"root": {"id": "root", "parent": "", "label": "model", "value": 0,
                                           "instructions": 0, "sel": ""}}

        def add(node_id, parent, label, t, n, sel):
            d = nodes.setdefault(node_id, {"id": node_id, "parent": parent, "label": label, "value": 0,
                                           "instructions": 0, "sel": sel})
            d["value"] += t
            d["instructions"] += n

        for r in rows(L.profile.hierarchy()):
            o = info.get(r["op_id"]) or {}
            t, n = r["device_ns"] or 0, r["instructions"]
            nodes["root"]["value"] += t
            nodes["root"]["instructions"] += n
            parent = "root"
            path = [p for p in (o.get("module_path") or "").split(".") if p]
            for i in range(len(path)):
                prefix = ".".join(path[: i + 1])
                add(f"m:{prefix}", parent, path[i], t, n, f"module:{prefix}")
                parent = f"m:{prefix}"
            key = op_path_key(o)
            op_node = f"o:{key}"
            add(op_node, parent, f"{op_label(o)} {where(o)}".strip(), t, n, f"path:{key}")
            add(f"{op_node}|{r['opcode']}", op_node, r["opcode"], t, n, f"path:{key}")
        return list(nodes.values())
    return L.cached("hierarchy", compute)


# ------------------------------------------------------------------------------------- source
def source_files(L: Loaded) -> list[str]:
    """Files whose text the profile embeds and, with ``--framework-source-root``, the files its lines name
    that resolve under the root (:mod:`explorer.sources`); most device time first."""
    root = sources.root()

    def compute():
        per_file: dict[str, int] = {}
        for t in line_totals(L).values():
            if t.get("file"):
                per_file[t["file"]] = per_file.get(t["file"], 0) + t["device_ns"]
        names = set(L.profile.source_files())
        if root is not None:
            named = set(per_file) | {g["file"] for g in rows(L.profile.graphs()) if g.get("file")}
            names |= {f for f in named if sources.resolve(f) is not None}
        return sorted(names, key=lambda f: (-per_file.get(f, 0), f))
    return L.cached(f"source_files:{root}", compute)


def source_text(L: Loaded, file: str) -> tuple[str, str]:
    """``(text, origin)`` of one of :func:`source_files`: the current file under ``--framework-source-root``
    when it is there (origin: its path), else the text the profile embeds (origin ``"the profile"``)."""
    if file not in source_files(L):
        raise ExplorerError(f"the profile embeds no file named {str(file)[:120]!r}; pick one from the list")
    text = sources.read(file)
    if text is not None:
        return text, str(sources.resolve(file))
    return L.profile.source_text(file) or "", "the profile"


def source_view(L: Loaded, file: str) -> list[dict]:
    """Every line of one of :func:`source_files` with its device time, instruction count and source_id.

    ``file`` must be one of :func:`source_files` (a name from the profile; only a file under the source root
    is ever opened on disk).
    """
    text, _origin = source_text(L, file)
    per_line = {t["line"]: t for t in line_totals(L).values() if t.get("file") == file}
    out = []
    for i, code in enumerate(text.splitlines(), start=1):
        t = per_line.get(i, {})
        out.append({"line": i, "code": code, "device_ns": t.get("device_ns", 0),
                    "instructions": t.get("instructions", 0),
                    "host_ns": t.get("host_ns", 0), "source_id": t.get("source_id"), "ops": len(t.get("ops", []))})
    return out


def line_range(L: Loaded, sel) -> dict:
    """A ``lines:<source_id>..<source_id>`` selection (lines ``first``..``last`` of one file): its lines' device
    and host time and instructions, each the sum of the per-line figures the Source page shows
    (:func:`line_totals`), and the window its instructions cover in the measured executions
    (``traces.q_timeline.ops_extent``), ns since t0, or None when none ran."""
    file, lo, hi = _lines_selection(L, sel)
    picked = [t for t in line_totals(L).values() if t.get("file") == file and lo <= t["line"] <= hi]
    extent = q_timeline.ops_extent(L.profile, sorted(selection_ops(L, sel)))
    t0 = bounds(L)["t0"]
    return {"file": file, "first": lo, "last": hi, "lines": len(picked),
            "device_ns": sum(t["device_ns"] for t in picked), "host_ns": sum(t["host_ns"] for t in picked),
            "instructions": sum(t["instructions"] for t in picked),
            "window": (extent[0] - t0, extent[1] - t0) if extent else None}


def _lines_selection(L: Loaded, sel) -> tuple[str, int, int]:
    """``lines:a..b`` → (file, first line, last line); both source ids must be lines of one file."""
    parsed = parse_selection(sel)
    if not parsed or parsed[0] != "lines" or not re.fullmatch(r"\d{1,19}\.\.\d{1,19}", parsed[1]):
        raise ExplorerError("a range of lines looks like lines:<source_id>..<source_id>")
    a, b = (line_totals(L).get(int(v)) for v in parsed[1].split(".."))
    if a is None or b is None or a.get("file") != b.get("file") or not a.get("file"):
        raise ExplorerError(f"{sel}: both ends must be recorded lines of one file; click two lines of this file")
    return a["file"], min(a["line"], b["line"]), max(a["line"], b["line"])


# ----------------------------------------------------------------------------- fallbacks, recompiles
def fallbacks(L: Loaded) -> list[dict]:
    """Ops placed on the CPU: reason, call site, calls and host time (``Profile.fallbacks``), costliest first."""
    out = []
    for r in rows(L.profile.fallbacks()):
        o = ops(L).get(r["op_id"]) or {}
        out.append({"op_id": r["op_id"], "op": op_label(o or r), "name": r.get("name"),
                    "reason": r.get("fallback_reason") or "", "where": where(o or r), "source_id": r.get("source_id"),
                    "code": (r.get("code") or "").strip(), "module": r.get("module_path") or "",
                    "graph": r.get("graph_name") or "", "shape": r.get("shape") or "",
                    "calls": r["cpu_calls"], "host_ns": r["cpu_ns"]})
    out.sort(key=lambda r: (-r["host_ns"], -r["calls"], r["op"]))
    return out


def recompiles(L: Loaded) -> dict:
    """Every graph, its recompiles (signature diff, reason, compile time, ``before_window``) and a bucketing
    suggestion per family; the counts (``figures``) are the Summary's, inside the recording window, and
    ``before_window`` labels what happened before it (``Figures.before_window_text``)."""
    def compute():
        graphs = rows(L.profile.graphs())
        by_id = {g["graph_id"]: g for g in graphs}

        def root(g):
            seen = set()
            while g.get("recompile_of") in by_id and g["graph_id"] not in seen:
                seen.add(g["graph_id"])
                g = by_id[g["recompile_of"]]
            return g["graph_id"]

        events = []
        for g in graphs:
            g["where"] = f"{Path(g['file']).name}:{g['line']}" if g.get("file") else ""
            if not g.get("recompiled"):
                continue
            parent = by_id.get(g["recompile_of"], {})
            events.append({"graph_id": g["graph_id"], "name": g["name"], "reason": g.get("recompile_reason") or "",
                           "where": g["where"], "source_id": g.get("source_id"),
                           "compile_wall_ns": g.get("compile_wall_ns") or 0, "cache_hit": bool(g.get("cache_hit")),
                           "old_signature": parent.get("input_signature") or "",
                           "new_signature": g.get("input_signature") or "",
                           "diff": name_inputs(signature_diff(parent.get("input_signature"),
                                                              g.get("input_signature")),
                                               [g.get("recompile_reason") or ""]),
                           "ts": g.get("compile_ts"), "before_window": bool(g.get("before_window"))})
        families: dict[int, list] = {}
        for g in graphs:
            families.setdefault(root(g), []).append(g)
        suggestions = [s for fam in families.values() if len(fam) > 1 for s in [bucketing(fam)] if s]
        for s in suggestions:   # the runtime records inputs by position: name them as the user did
            names = reason_names([g.get("recompile_reason") for g in graphs], s["dim"]) \
                if re.fullmatch(r"input\d+", s["input"]) else []
            s["input_names"] = names or [s["input"]]
            s["input"] = ", ".join(s["input_names"])
        f = L.profile.figures()
        return {"graphs": graphs, "recompiles": events, "suggestions": suggestions, "figures": f,
                "before_window": f.before_window_text()}
    return L.cached("recompiles", compute)


# -------------------------------------------------------------------------------------- console
def run_console(L: Loaded, sql: str, limit: int = CONSOLE_LIMIT) -> dict:
    """Run one checked, read-only user query; ``{"columns", "rows", "truncated"}`` (at most ``limit`` rows).

    The query runs in the profile's console worker (``traces.console.ConsoleWorker``: a child process
    whose address space is capped, killed and restarted on breach): one read-only statement, capped
    rows, interrupted after ``CONSOLE_TIMEOUT_S``. Raises ``traces.console.RefusedQuery`` for anything
    else and :class:`ExplorerError` when DuckDB rejects the query or it breaks a bound.
    """
    from traces.console import ConsoleWorker, RefusedQuery

    limit = max(1, min(int(limit), CONSOLE_LIMIT))
    worker = L.cached("console_worker", lambda: ConsoleWorker(L.profile.path))
    try:
        res = worker.run(sql, max_rows=limit, timeout_s=CONSOLE_TIMEOUT_S, max_bytes=MAX_RESULT_BYTES)
    except RefusedQuery:
        raise
    except TraceError as exc:
        raise ExplorerError(str(exc).removeprefix("SQL error: ")) from None
    return {"columns": res.table.column_names,
            "rows": [{k: _jsonable(v) for k, v in r.items()} for r in res.table.to_pylist()],
            "truncated": res.truncated}


def schema_fields(L: Loaded) -> dict[str, list[dict]]:
    """``{table: [{"column", "type", "required", "unit", "example", "description"}]}`` of every table, what
    ``SchemaFields`` says of each column beside its type (``Profile.columns``), for the SQL page's inspector.
    Example: ``schema_fields(L)["Instruction"][0]["unit"] == "nanoseconds"``."""
    def compute():
        out: dict[str, list[dict]] = {}
        for r in rows(L.profile.columns()):
            out.setdefault(r["table_name"], []).append(
                {"column": r["column_name"], "type": r["data_type"], "required": r["required"], "unit": r["unit"],
                 "example": r["example"], "description": r["description"]})
        return out
    return L.cached("schema", compute)


def schema(L: Loaded) -> dict[str, list[tuple[str, str]]]:
    """``{table: [(column, type)]}`` of every table (:func:`schema_fields` without the descriptions)."""
    return {t: [(c["column"], c["type"]) for c in cols] for t, cols in schema_fields(L).items()}


def console_csv(L: Loaded, sql: str) -> str:
    """The console query's result (the same checks and row cap as :func:`run_console`) as CSV text."""
    import csv
    import io

    res = run_console(L, sql)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=res["columns"])
    w.writeheader()
    w.writerows(res["rows"])
    return buf.getvalue()


def _jsonable(v):
    from decimal import Decimal

    if isinstance(v, Decimal):      # a HUGEINT sum: a number, so the quick chart can draw it
        v = int(v) if v == v.to_integral_value() else float(v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)
    return str(v)


# -------------------------------------------------------------------------------------- compare
def compare_n(Ls: list[Loaded], base: int = 0, limit: int = 50) -> dict:
    """N profiles aligned by source line, op path and forward line against ``Ls[base]``
    (``traces.q_compare.compare``: the one computation), with each profile's key and display name."""
    if len(Ls) < 2:
        raise ExplorerError("Compare needs at least two profiles")
    if not 0 <= base < len(Ls):
        raise ExplorerError(f"base {base} is not one of the {len(Ls)} profiles")
    c = q_compare.compare([L.profile for L in Ls], base, limit)
    c["keys"] = [L.key for L in Ls]
    c["labels"] = [registry().label(L.key) if L.key in registry().keys() else L.name for L in Ls]
    return c


def why(A: Loaded, B: Loaded, letters: tuple[str, str] = ("A", "B")) -> list[str]:
    """The gap between two profiles in words (``traces.q_host.why``), each side by its kind (eager /
    compiled) or, when both are the same kind, by its letter in the comparison."""
    ha, hb = q_host.host_figures(A.profile), q_host.host_figures(B.profile)
    names = q_host.names(ha, hb)
    return q_host.why(ha, hb, *(letters if names == ("A", "B") else names))


def compare(A: Loaded, B: Loaded, limit: int = 50) -> dict:
    """Two profiles (A the base) aligned by source line (``file.py:line``), op path (``module / aten op``,
    backward ops marked ``(backward)``) and, for backward ops, the forward line they differentiate
    (:func:`compare_n` with two; ``traces.q_compare`` explains each key). Each row: ``a_ns``, ``b_ns``,
    ``delta_ns`` (B − A), ``delta_percent``, ``a_instructions``, ``b_instructions``, ``only_in`` (``a``,
    ``b`` or ''); with a "Why" in words (``traces.q_host.why``)."""
    c = q_compare.compare([A.profile, B.profile], 0, limit)

    def two(rows):
        return [{k: v for k, v in {
            **{n: r[n] for n in ("line", "op_path", "code") if n in r},
            "a_ns": r["ns"][0], "b_ns": r["ns"][1], "delta_ns": r["delta_ns"][1],
            "delta_percent": r["delta_percent"][1],
            "a_instructions": r["instructions"][0], "b_instructions": r["instructions"][1],
            "only_in": "a" if not r["present"][1] else "b" if not r["present"][0] else ""}.items()}
            for r in rows]

    ha, hb = q_host.host_figures(A.profile), q_host.host_figures(B.profile)
    na, nb = q_host.names(ha, hb)
    return {"a": A.key, "b": B.key, "a_path": A.path.name, "b_path": B.path.name,
            "why": {"a_name": na, "b_name": nb, "a": ha.as_dict(), "b": hb.as_dict(),
                    "lines": q_host.why(ha, hb, na, nb)},
            "totals": {k: {"a": v["values"][0], "b": v["values"][1], "delta": v["delta"][1]}
                       for k, v in c["totals"].items()},
            "by_line": two(c["by_line"]), "by_op": two(c["by_op"]), "by_fwd_line": two(c["by_fwd_line"])}
