"""Every query the Explorer runs, over profiles opened with ``traces.open`` (values always as parameters).

The pages never touch DuckDB or the filesystem: they name a profile by the *key* the server gave it
(``?profile=mlp``), and this module maps that key to a file given on the command line. Anything a
request carries (time range, selection, file name, row limit) is validated here before it reaches
SQL, and every result that could grow with the profile is capped.

Times in the Explorer are nanoseconds since the profile's first recorded moment (``t0``) on the
projected clock, so URLs and axes stay short.

>>> reg = Registry([])          # the server builds one from the command line
>>> reg.keys()
[]
"""
from __future__ import annotations

import json
import math
import re
import threading
from decimal import Decimal
from dataclasses import dataclass, field
from pathlib import Path

from explorer import sqlguard

#: Instructions drawn one by one only when the visible window holds at most this many.
RAW_CAP = 4000
#: Spans (executions, host and compile events) drawn one by one up to this many per window.
SPAN_CAP = 3000
#: Time buckets per lane in level-of-detail mode: about one per two screen pixels.
MAX_BUCKETS = 800
#: Rows a SQL console query may return.
CONSOLE_LIMIT = sqlguard.DEFAULT_ROW_LIMIT
#: A console query is interrupted after this long: it holds the profile's lock, so one endless
#: query (an aggregate over a huge generate_series) would otherwise stall every page of that profile.
CONSOLE_TIMEOUT_S = 10.0

ENGINE_LABELS = {"tensor": "Tensor", "vector": "Vector", "scalar": "Scalar", "gpsimd": "GpSimd",
                 "sync": "Sync", "dma": "DMA", "cc": "CC", "cpu": "CPU"}
# Lane order inside one core, top to bottom, as the real Explorer draws it: DMA queues first.
ENGINE_ORDER = ("dma", "sync", "tensor", "vector", "scalar", "gpsimd", "cc", "cpu")
FALLBACK_PLACEMENT = "cpu_fallback"
# Executions the summaries count, as the trace store's Summary does: warm-ups out unless all are warm-ups.
MEASURED = ("NOT coalesce(warmup, FALSE) OR NOT EXISTS "
            "(SELECT 1 FROM executions WHERE NOT coalesce(warmup, FALSE))")


class ExplorerError(Exception):
    """A request the Explorer cannot serve; the message is one line for the page to show."""


# ----------------------------------------------------------------------------------------- profiles
@dataclass
class Entry:
    key: str
    path: Path
    error: str = ""


class Loaded:
    """One open profile: the ``traces`` Profile, a lock (Dash serves requests on threads) and a cache.

    Profiles never change after finalising, so derived answers are cached for the server's life.
    Example: ``Loaded("mlp", Path("output/s/profile.duckdb")).rows("SELECT 1 AS x")``.
    """

    def __init__(self, key: str, path: Path):
        import traces

        self.key, self.path = key, path
        # external_access=False: no query can read or write any other file, whatever it calls
        self.profile = traces.open(path, external_access=False)
        self.lock = threading.RLock()
        self._cache: dict = {}
        self.harden()

    def harden(self) -> None:
        """No file access from any query, and no way to turn it back on (idempotent per database)."""
        for setting, stmt in sqlguard.HARDEN_STATEMENTS:
            value = self.scalar("SELECT current_setting($s)", {"s": setting})
            if str(value).lower() != str(stmt.split("=")[1].strip()).lower():
                self.profile.sql(stmt)

    def sql(self, query: str, params=None):
        with self.lock:
            return self.profile.sql(query, params)

    def rows(self, query: str, params=None) -> list[dict]:
        return [{k: _plain(v) for k, v in r.items()} for r in self.sql(query, params).to_pylist()]

    def scalar(self, query: str, params=None):
        rows = self.sql(query, params)
        return _plain(rows.column(0)[0].as_py()) if rows.num_rows else None

    def cached(self, name, fn):
        with self.lock:
            if name not in self._cache:
                self._cache[name] = fn()
            return self._cache[name]

    def close(self):
        with self.lock:
            self.profile.close()


class Registry:
    """The profiles this server may read: exactly the files named on the command line.

    Keys are short names derived from the session directory (``20251121-101500_mlp``) or the file
    stem; requests use only keys, so no request can name a path.
    >>> Registry([]).get("x")
    Traceback (most recent call last):
    ...
    explorer.data.ExplorerError: unknown profile 'x'; open one of: (none given)
    """

    def __init__(self, paths):
        self.entries: dict[str, Entry] = {}
        self._loaded: dict[str, Loaded] = {}
        self._lock = threading.Lock()
        for p in paths:
            path = Path(p).resolve()
            base = path.parent.name if path.name == "profile.duckdb" else path.stem
            base = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.") or "profile"
            key, n = base, 2
            while key in self.entries:
                key, n = f"{base}-{n}", n + 1
            self.entries[key] = Entry(key, path)

    def keys(self) -> list[str]:
        return list(self.entries)

    def default_key(self) -> str | None:
        return next(iter(self.entries), None)

    def get(self, key) -> Loaded:
        if not isinstance(key, str) or key not in self.entries:
            known = ", ".join(self.entries) or "(none given)"
            raise ExplorerError(f"unknown profile {str(key)[:60]!r}; open one of: {known}")
        with self._lock:
            if key not in self._loaded:
                entry = self.entries[key]
                try:
                    self._loaded[key] = Loaded(key, entry.path)
                except Exception as exc:  # a bad profile must not take the server down
                    entry.error = _one_line(exc)
                    raise ExplorerError(f"profile {key!r} ({entry.path.name}) cannot be opened: {entry.error}") from None
            return self._loaded[key]

    def close(self):
        with self._lock:
            for loaded in self._loaded.values():
                loaded.close()
            self._loaded.clear()


_REGISTRY = Registry([])


def set_registry(registry: Registry) -> None:
    """Install the profiles the server serves (called by ``create_app``)."""
    global _REGISTRY
    if _REGISTRY is not registry:
        _REGISTRY.close()
    _REGISTRY = registry


def registry() -> Registry:
    return _REGISTRY


def resolve(key) -> Loaded:
    """The open profile for a URL's ``profile`` key; :class:`ExplorerError` if unknown or broken."""
    return _REGISTRY.get(key)


def _plain(v):
    # DuckDB's sum(BIGINT) is a HUGEINT, which Arrow hands over as Decimal: make it a Python number.
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    return v


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ------------------------------------------------------------------------------------ validation
_SEL = re.compile(r"^(line|op|module|graph|path):([A-Za-z0-9_.\-/:]{1,200})$")


def parse_int(value, name: str, lo: int = 0, hi: int = 2**63 - 1) -> int | None:
    """A URL/form integer within bounds, or None when absent; anything else is refused.

    >>> parse_int("42", "start")
    42
    """
    if value in (None, ""):
        return None
    number = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value.strip()):
        number = int(value.strip())   # exact: ids are 63-bit, a float would round them
    if number is None or not lo <= number <= hi:
        raise ExplorerError(f"{name} must be an integer between {lo} and {hi}")
    return number


def parse_selection(sel) -> tuple[str, str] | None:
    """``"line:123"`` → ``("line", "123")``; kinds: line (source_id), op (op_id), module (path), graph,
    path (``module/aten_op``: one op of the model across all its graphs).

    >>> parse_selection("op:17")
    ('op', '17')
    """
    if sel in (None, ""):
        return None
    m = _SEL.match(str(sel))
    if not m:
        raise ExplorerError("selection must look like line:<source_id>, op:<op_id>, module:<path>, "
                            "path:<module>/<aten op> or graph:<graph_id>")
    return m.group(1), m.group(2)


# ------------------------------------------------------------------------------- basic facts
def tables(L: Loaded) -> set[str]:
    return L.cached("tables", lambda: {r["table_name"] for r in L.rows(
        "SELECT table_name FROM information_schema.tables")})


def metadata(L: Loaded) -> dict[str, str]:
    """The profile's metadata table as a dict (``target``, ``is_simulation``, hardware rates...)."""
    return L.cached("metadata", lambda: {r["key"]: r["value"] for r in L.rows("SELECT key, value FROM metadata")})


def bounds(L: Loaded) -> dict:
    """``t0``/``t1`` (absolute projected ns) covering executions, instructions' executions and events."""
    def compute():
        row = L.rows("""
            SELECT min(s) AS t0, max(e) AS t1 FROM (
              SELECT min(start_ns) s, max(end_ns) e FROM executions
              UNION ALL SELECT min(ts_ns), max(ts_ns + greatest(coalesce(dur_ns, 0), 0)) FROM events
              UNION ALL SELECT min(start_ns), max(start_ns + dur_ns) FROM instructions)""")[0]
        t0 = row["t0"] if row["t0"] is not None else 0
        t1 = row["t1"] if row["t1"] is not None else t0
        stats = L.rows("SELECT count(*) AS n, coalesce(max(dur_ns), 0) AS maxdur FROM instructions")[0]
        return {"t0": t0, "t1": max(t1, t0 + 1), "span": max(t1 - t0, 1),
                "instructions": stats["n"], "max_dur": stats["maxdur"]}
    return L.cached("bounds", compute)


def clamp_window(L: Loaded, start=None, end=None) -> tuple[int, int]:
    """A validated [start, end) window in ns since t0, defaulting to the whole profile."""
    span = bounds(L)["span"]
    a = parse_int(start, "start", 0, span) if start is not None else 0
    b = parse_int(end, "end", 0, span) if end is not None else span
    a = 0 if a is None else a
    b = span if b is None else b
    if b <= a:
        a, b = 0, span
    return a, b


def ops(L: Loaded) -> dict[int, dict]:
    """Every op with its source line and graph name, keyed by op_id (small: one row per graph node)."""
    def compute():
        rows = L.rows("""
            SELECT o.op_id, o.graph_id, o.name, o.aten_op, o.op_class, o.placement, o.fallback_reason,
                   o.fused_into, coalesce(o.module_path, '') AS module_path, o.source_id, o.shape, o.dtype,
                   o.flops, o.bytes, s.file, s.line, s.function, s.code, g.name AS graph
            FROM ops o LEFT JOIN sources s USING (source_id) LEFT JOIN graphs g USING (graph_id)""")
        return {r["op_id"]: r for r in rows}
    return L.cached("ops", compute)


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


def op_totals(L: Loaded) -> dict[int, dict]:
    """Device time, instruction count, FLOPs and bytes per op, with per-engine busy time (cached).

    Read from the finalised ``op_summary`` table (warm-up executions excluded, as in the Summary);
    computed from the instructions when a profile lacks it.
    """
    def compute():
        out: dict[int, dict] = {}
        if "op_summary" in tables(L):
            engines = [e for e in data_engines() if e != "cpu"]
            cols = ", ".join(f"{e}_ns" for e in engines)
            for r in L.rows(f"""SELECT op_id, device_ns, instruction_count, instruction_flops, bytes_read,
                                       bytes_written, cpu_calls, cpu_ns, {cols}
                                FROM op_summary WHERE op_id IS NOT NULL"""):
                out[r["op_id"]] = {"op_id": r["op_id"], "device_ns": r["device_ns"] or 0,
                                   "instructions": r["instruction_count"] or 0, "flops": r["instruction_flops"] or 0,
                                   "bytes": (r["bytes_read"] or 0) + (r["bytes_written"] or 0),
                                   "engines": {e: r[f"{e}_ns"] for e in engines if r[f"{e}_ns"]},
                                   "host_ns": r["cpu_ns"] or 0, "fallback_calls": r["cpu_calls"] or 0}
            return out
        for r in L.rows("""SELECT op_id, engine, sum(dur_ns) AS t, count(*) AS n, sum(flops) AS flops,
                                  sum(bytes_read + bytes_written) AS bytes
                           FROM instructions GROUP BY ALL"""):
            d = out.setdefault(r["op_id"], {"op_id": r["op_id"], "device_ns": 0, "instructions": 0,
                                            "flops": 0, "bytes": 0, "engines": {}})
            d["device_ns"] += r["t"] or 0
            d["instructions"] += r["n"]
            d["flops"] += r["flops"] or 0
            d["bytes"] += r["bytes"] or 0
            d["engines"][r["engine"]] = r["t"] or 0
        for r in L.rows("""SELECT op_id, sum(dur_ns) AS t, count(*) AS n FROM events
                           WHERE kind = 'cpu_fallback' AND op_id IS NOT NULL GROUP BY ALL"""):
            d = out.setdefault(r["op_id"], {"op_id": r["op_id"], "device_ns": 0, "instructions": 0,
                                            "flops": 0, "bytes": 0, "engines": {}})
            d["host_ns"], d["fallback_calls"] = r["t"] or 0, r["n"]
        return out
    return L.cached("op_totals", compute)


def data_engines() -> tuple[str, ...]:
    from traces.schema import ENGINES
    return ENGINES


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
                                    "instructions": 0, "engines": {}, "graphs": 0})
        g["device_ns"] += t["device_ns"]
        g["instructions"] += t["instructions"]
        g["graphs"] += 1
        for e, ns in t["engines"].items():
            g["engines"][e] = g["engines"].get(e, 0) + ns
    rows = sorted(groups.values(), key=lambda r: -r["device_ns"])
    return rows[:n]


def line_totals(L: Loaded) -> dict[int, dict]:
    """Device time and instruction count per source line (source_id), summed over the line's ops."""
    def compute():
        info, totals = ops(L), op_totals(L)
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
    return L.cached("line_totals", compute)


def top_lines(L: Loaded, n: int = 10) -> list[dict]:
    """Source lines by device time (the user's own code), most expensive first."""
    rows = [dict(r, where=f"{Path(r['file']).name}:{r['line']}" if r.get("file") else "")
            for r in line_totals(L).values() if r["device_ns"]]
    rows.sort(key=lambda r: -r["device_ns"])
    return rows[:n]


# ------------------------------------------------------------------------------------ summary
def summary(L: Loaded) -> dict:
    """The Summary page's numbers, under the real profiler's names where one exists (reference §3.6).

    Taken from the finalised ``summary`` table (warm-up executions excluded, the same numbers as
    ``neuron-explorer summary``); counts, spans and the fallback/recompile totals come from the
    raw tables. Engine active % is busy time over device time; MFU is model FLOPs over the Tensor
    Engine's BF16 peak for that time.
    """
    def compute():
        md = metadata(L)
        e = L.rows("""
            SELECT count(*) AS executions, count(*) FILTER (WHERE warmup) AS warmup,
                   count(DISTINCT core) AS cores, coalesce(sum(device_ns), 0) AS device_ns,
                   coalesce(sum(flops), 0) AS flops, coalesce(sum(hbm_read_bytes), 0) AS hbm_read_bytes,
                   coalesce(sum(hbm_write_bytes), 0) AS hbm_write_bytes,
                   coalesce(sum(cpu_fallback_ns), 0) AS cpu_fallback_ns,
                   coalesce(min(start_ns), 0) AS first, coalesce(max(end_ns), 0) AS last,
                   coalesce(sum(tensor_busy_ns), 0) AS tensor, coalesce(sum(vector_busy_ns), 0) AS vector,
                   coalesce(sum(scalar_busy_ns), 0) AS scalar, coalesce(sum(gpsimd_busy_ns), 0) AS gpsimd,
                   coalesce(sum(sync_busy_ns), 0) AS sync, coalesce(sum(dma_busy_ns), 0) AS dma,
                   coalesce(sum(cc_busy_ns), 0) AS cc
            FROM executions""")[0]
        device_ns, flops = e["device_ns"], e["flops"]
        hbm_read, hbm_write = e["hbm_read_bytes"], e["hbm_write_bytes"]
        engines = {k: (100.0 * e[k] / device_ns if device_ns else 0.0)
                   for k in ("tensor", "vector", "scalar", "gpsimd", "sync", "dma", "cc")}
        peak = _float(md.get("tensor_engine_peak_bf16_flops"))
        mfu = (100.0 * flops / (peak * device_ns / 1e9)) if peak and device_ns else 0.0
        row = (L.rows("SELECT * FROM summary") or [{}])[0] if "summary" in tables(L) else {}
        if row.get("total_time") is not None:
            device_ns = int(round(row["total_time"] * 1e9))
            flops = row.get("model_flops") or 0
            hbm_read, hbm_write = row.get("hbm_read_bytes") or 0, row.get("hbm_write_bytes") or 0
            engines = {k: row.get(f"{k}_engine_active_time_percent") or 0.0
                       for k in ("tensor", "vector", "scalar", "gpsimd", "sync")}
            engines["dma"] = row.get("dma_active_time_percent") or 0.0
            engines["cc"] = row.get("cc_op_active_time_percent") or 0.0
            mfu = row.get("mfu_estimated_percent") or 0.0
        graphs = L.rows("""SELECT count(*) AS graphs, count(*) FILTER (WHERE recompile_of IS NOT NULL) AS recompiles,
                                  count(*) FILTER (WHERE cache_hit) AS cache_hits,
                                  coalesce(sum(compile_wall_ns), 0) AS compile_wall_ns FROM graphs""")[0]
        fb = L.rows(f"SELECT count(*) AS ops FROM ops WHERE placement = '{FALLBACK_PLACEMENT}'")[0]
        fb_ev = L.rows("""SELECT count(*) AS calls, coalesce(sum(dur_ns), 0) AS ns FROM events
                          WHERE kind = 'cpu_fallback'""")[0]
        wall = max(e["last"] - e["first"], 0)
        return {
            "target": md.get("target") or md.get("device_profile", "?"),
            "device_profile": md.get("device_profile") or md.get("target", "?"),
            "instance_type": md.get("instance_type", ""),
            "is_simulation": md.get("is_simulation", "true"),
            "timing_model": md.get("timing_model", ""), "auto_cast": md.get("auto_cast", ""),
            "executions": e["executions"], "warmup_executions": e["warmup"], "cores": e["cores"],
            "total_time": device_ns / 1e9, "device_ns": device_ns, "span_ns": wall,
            "device_busy_percent": 100.0 * e["device_ns"] / (wall * max(e["cores"], 1)) if wall else 0.0,
            "engines": engines, "model_flops": flops, "mfu_estimated_percent": mfu,
            "hbm_read_bytes": hbm_read, "hbm_write_bytes": hbm_write,
            "cpu_fallback_ns": max(e["cpu_fallback_ns"], fb_ev["ns"]),
            "fallback_ops": fb["ops"], "fallback_calls": fb_ev["calls"],
            "graphs": graphs["graphs"], "recompiles": graphs["recompiles"], "cache_hits": graphs["cache_hits"],
            "compile_wall_ns": graphs["compile_wall_ns"],
            "instructions": bounds(L)["instructions"],
        }
    return L.cached("summary", compute)


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


# ----------------------------------------------------------------------------------- timeline
@dataclass
class Lane:
    key: str           # stable id used by the figure: "host", "compile", "exec:0", "eng:0:tensor", "dma:0:qSyncIO0"
    label: str         # as the real tool names it: Tensor(nc0), qSyncIO0(nc0)
    kind: str          # host | compile | exec | engine | dma
    core: int | None = None
    engine: str | None = None
    queue: str | None = None


def lanes(L: Loaded) -> list[Lane]:
    """Timeline lanes top to bottom: compile, host, then per core its executions, DMA queues and engines."""
    def compute():
        out = [Lane("compile", "Compile", "compile"), Lane("host", "Host (CPU)", "host")]
        per_core: dict[int, list] = {r["core"]: [] for r in L.rows(
            "SELECT DISTINCT core FROM executions WHERE core IS NOT NULL")}
        found = L.rows("""SELECT core, engine, CASE WHEN engine = 'dma' THEN queue END AS queue
                          FROM instructions GROUP BY ALL""")
        for r in found:
            per_core.setdefault(r["core"], [])
        for core in sorted(per_core):
            out.append(Lane(f"exec:{core}", f"Executions(nc{core})", "exec", core))
            mine = [r for r in found if r["core"] == core]
            dma = sorted({r["queue"] or "qDMA" for r in mine if r["engine"] == "dma"}, key=_natural)
            out += [Lane(f"dma:{core}:{q}", f"{q}(nc{core})", "dma", core, "dma", q) for q in dma]
            engines = {r["engine"] for r in mine if r["engine"] != "dma"}
            for eng in ENGINE_ORDER:
                if eng in engines:
                    out.append(Lane(f"eng:{core}:{eng}", f"{ENGINE_LABELS[eng]}(nc{core})", "engine", core, eng))
            for eng in sorted(engines - set(ENGINE_ORDER)):
                out.append(Lane(f"eng:{core}:{eng}", f"{eng}(nc{core})", "engine", core, eng))
        return out
    return L.cached("lanes", compute)


def _natural(text: str):
    """Sort key so qSyncIO2 comes before qSyncIO10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def _lane_key(core, engine, queue) -> str:
    return f"dma:{core}:{queue or 'qDMA'}" if engine == "dma" else f"eng:{core}:{engine}"


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
    return f"{kind} {value} ({n} ops)"


def timeline(L: Loaded, start=None, end=None, sel=None, buckets: int = MAX_BUCKETS) -> dict:
    """What the timeline draws for a window: raw instructions when few, else level-of-detail buckets.

    Returns ``{"start", "end", "mode": "raw"|"lod", "lanes": [...], "instructions": [...] (raw),
    "buckets": {lane_key: [(bucket, busy_fraction, count, top_op_id)]} (lod), "bucket_ns",
    "spans": [...], "highlight": ...}``. Never more than ``RAW_CAP`` instructions or
    ``lanes × buckets`` cells, whatever the profile's size.
    """
    a, b = clamp_window(L, start, end)
    buckets = max(10, min(int(buckets), MAX_BUCKETS))
    bd = bounds(L)
    t0, maxdur = bd["t0"], bd["max_dur"]
    A, B = t0 + a, t0 + b
    chosen = selection_ops(L, sel)
    win = "start_ns < $B AND start_ns >= $A - $maxdur AND start_ns + dur_ns > $A"
    params = {"A": A, "B": B, "maxdur": maxdur}
    n_in = L.scalar(f"SELECT count(*) FROM instructions WHERE {win}", params) or 0
    out = {"start": a, "end": b, "t0": t0, "lanes": lanes(L), "count": n_in, "selection": sorted(chosen),
           "selection_text": describe_selection(L, sel) if sel else ""}
    if n_in <= RAW_CAP:
        out["mode"] = "raw"
        out["instructions"] = L.rows(f"""
            SELECT start_ns - $t0 AS start, dur_ns AS dur, core, engine, queue, opcode, op_id, pc,
                   flops, bytes_read, bytes_written, sem_wait_ns
            FROM instructions WHERE {win} ORDER BY start_ns LIMIT {RAW_CAP}""", dict(params, t0=t0))
    else:
        out["mode"] = "lod"
        out.update(_lod(L, A, B, buckets, params, win, chosen))
    out["spans"] = _spans(L, A, B, t0, buckets)
    return out


def _lod(L, A, B, buckets, params, win, chosen) -> dict:
    """Busy fraction per lane per bucket, plus where the selected ops ran.

    Wide windows read the finalised ``lod_busy`` pyramid at the level whose power-of-two buckets
    are just wider than one screen bucket (so at most ``buckets`` columns, each an exact sum);
    windows finer than the pyramid's base level aggregate the instructions directly (a range scan).
    """
    md = metadata(L)
    t0 = bounds(L)["t0"]
    width = max((B - A) / buckets, 1.0)
    level = max(0, math.ceil(math.log2(width)))
    base, top = _int(md.get("lod_base_level")), _int(md.get("lod_top_level"))
    cells: dict[str, list] = {}
    if "lod_busy" in tables(L) and base is not None and top is not None and level >= base:
        level = min(level, top)
        w = 1 << level
        first = A >> level
        p = {"k": level, "lo": first, "hi": (B - 1) >> level}
        for r in L.rows("""
                SELECT core, engine, CASE WHEN engine = 'dma' THEN queue END AS queue, bucket,
                       sum(busy_ns) AS busy, sum(instructions) AS n
                FROM lod_busy WHERE level = $k AND bucket BETWEEN $lo AND $hi GROUP BY ALL""", p):
            cells.setdefault(_lane_key(r["core"], r["engine"], r["queue"]), []).append(
                (r["bucket"] - first, min(r["busy"] / w, 1.0), r["n"], None))
        origin, width, source = (first << level) - t0, float(w), f"lod_busy level {level}"
    else:
        p = dict(params, w=width, nb=buckets - 1)
        bucket = "least(greatest(CAST(floor((start_ns - $A) / $w) AS BIGINT), 0), $nb)"
        for r in L.rows(f"""
                SELECT core, engine, CASE WHEN engine = 'dma' THEN queue END AS queue, {bucket} AS bucket,
                       sum(least(start_ns + dur_ns, $B) - greatest(start_ns, $A)) AS busy, count(*) AS n,
                       arg_max(op_id, dur_ns) AS top_op
                FROM instructions WHERE {win} GROUP BY ALL""", p):
            cells.setdefault(_lane_key(r["core"], r["engine"], r["queue"]), []).append(
                (r["bucket"], min(r["busy"] / width, 1.0), r["n"], r["top_op"]))
        origin, source = A - t0, "instructions"
    hl: dict[str, list] = {}
    if chosen:
        hp = dict(params, w=width, origin=origin + t0, ids=sorted(chosen))
        for r in L.rows(f"""
                SELECT core, engine, CASE WHEN engine = 'dma' THEN queue END AS queue,
                       greatest(CAST(floor((start_ns - $origin) / $w) AS BIGINT), 0) AS bucket, count(*) AS n
                FROM instructions WHERE {win} AND list_contains($ids, op_id) GROUP BY ALL""", hp):
            hl.setdefault(_lane_key(r["core"], r["engine"], r["queue"]), []).append((r["bucket"], r["n"]))
    return {"bucket_ns": width, "bucket_origin": origin, "buckets": cells, "highlight": hl,
            "lod_source": source}


def _int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _spans(L, A, B, t0, buckets) -> list[dict]:
    """Executions, CPU-fallback/host and compile spans in the window (capped; biggest kept)."""
    p = {"A": A, "B": B, "t0": t0}
    ex = L.rows(f"""
        SELECT 'exec:' || core AS lane, start_ns - $t0 AS start, end_ns - start_ns AS dur,
               coalesce(g.name, 'graph') AS name, exec_id AS id, e.status, e.warmup, e.iteration,
               e.device_ns, e.graph_id
        FROM executions e LEFT JOIN graphs g USING (graph_id)
        WHERE start_ns < $B AND end_ns > $A ORDER BY end_ns - start_ns DESC LIMIT {SPAN_CAP}""", p)
    ev = L.rows(f"""
        SELECT CASE WHEN kind IN ('compile', 'recompile', 'cache_hit') THEN 'compile' ELSE 'host' END AS lane,
               ts_ns - $t0 AS start, greatest(coalesce(dur_ns, 0), 0) AS dur, kind AS name, kind,
               op_id, graph_id, source_id, detail
        FROM events
        WHERE kind IN ('compile', 'recompile', 'cache_hit', 'cpu_fallback', 'host_transfer')
          AND ts_ns < $B AND ts_ns + greatest(coalesce(dur_ns, 0), 0) >= $A
        ORDER BY dur_ns DESC LIMIT {SPAN_CAP}""", p)
    for r in ex:
        r["kind"] = "exec"
    return ex + ev


def instruction_at(L: Loaded, core: int, engine: str, start: int, pc: int | None = None) -> dict | None:
    """One instruction by lane and start time (ns since t0), with its op and source line."""
    t0 = bounds(L)["t0"]
    rows = L.rows("""SELECT start_ns - $t0 AS start, dur_ns AS dur, core, engine, queue, opcode, op_id, pc,
                            flops, bytes_read, bytes_written, sem_wait_ns
                     FROM instructions WHERE core = $core AND engine = $engine AND start_ns = $s
                     ORDER BY (pc = $pc) DESC LIMIT 1""",
                  {"t0": t0, "core": int(core), "engine": str(engine), "s": t0 + int(start), "pc": pc})
    if not rows:
        return None
    r = rows[0]
    o = ops(L).get(r["op_id"])
    r.update(op=op_label(o), module=(o or {}).get("module_path", ""), where=where(o),
             source_id=(o or {}).get("source_id"), file=(o or {}).get("file"), line=(o or {}).get("line"))
    return r


def range_aggregates(L: Loaded, start=None, end=None, limit: int = 12) -> dict:
    """What a brushed range holds: busy time by lane, by op and by source line (time clipped to the range)."""
    a, b = clamp_window(L, start, end)
    bd = bounds(L)
    p = {"A": bd["t0"] + a, "B": bd["t0"] + b, "maxdur": bd["max_dur"]}
    clip = "least(start_ns + dur_ns, $B) - greatest(start_ns, $A)"
    win = "start_ns < $B AND start_ns >= $A - $maxdur AND start_ns + dur_ns > $A"
    by_engine = L.rows(f"""SELECT core, engine, CASE WHEN engine = 'dma' THEN queue END AS queue,
                                  sum({clip}) AS busy_ns, count(*) AS instructions
                           FROM instructions WHERE {win} GROUP BY ALL ORDER BY busy_ns DESC""", p)
    for r in by_engine:
        r["lane"] = (f"{r['queue'] or 'qDMA'}(nc{r['core']})" if r["engine"] == "dma"
                     else f"{ENGINE_LABELS.get(r['engine'], r['engine'])}(nc{r['core']})")
        r["busy_percent"] = 100.0 * r["busy_ns"] / max(b - a, 1)
    per_op = L.rows(f"""SELECT op_id, sum({clip}) AS busy_ns, count(*) AS instructions
                        FROM instructions WHERE {win} GROUP BY ALL ORDER BY busy_ns DESC""", p)
    info = ops(L)
    by_line: dict[str, dict] = {}
    paths: dict[str, dict] = {}
    for r in per_op:
        o = info.get(r["op_id"]) or {}
        key = op_path_key(o)
        d = paths.setdefault(key, {"sel": f"path:{key}", "op": op_label(o), "module": o.get("module_path", ""),
                                   "where": where(o), "busy_ns": 0, "instructions": 0})
        d["busy_ns"] += r["busy_ns"]
        d["instructions"] += r["instructions"]
        key = where(o) or "(no source)"
        d = by_line.setdefault(key, {"where": key, "source_id": o.get("source_id"), "busy_ns": 0, "instructions": 0})
        d["busy_ns"] += r["busy_ns"]
        d["instructions"] += r["instructions"]
    lines = sorted(by_line.values(), key=lambda r: -r["busy_ns"])
    by_op = sorted(paths.values(), key=lambda r: -r["busy_ns"])
    return {"start": a, "end": b, "by_engine": by_engine, "by_op": by_op[:limit], "by_line": lines[:limit]}


# ---------------------------------------------------------------------------------- hierarchy
def hierarchy(L: Loaded) -> list[dict]:
    """Icicle nodes module path → ATen op → opcode, weighted by device time.

    Each node: ``{"id", "parent", "label", "value" (device ns), "instructions", "sel"}`` where
    ``sel`` is the timeline selection it stands for.
    """
    def compute():
        info = ops(L)
        rows = L.rows(f"""SELECT op_id, opcode, sum(dur_ns) AS t, count(*) AS n FROM instructions
                           WHERE exec_id IN (SELECT exec_id FROM executions WHERE {MEASURED}) GROUP BY ALL""")
        nodes: dict[str, dict] = {"root": {"id": "root", "parent": "", "label": "model", "value": 0,
                                           "instructions": 0, "sel": ""}}

        def add(node_id, parent, label, t, n, sel):
            d = nodes.setdefault(node_id, {"id": node_id, "parent": parent, "label": label, "value": 0,
                                           "instructions": 0, "sel": sel})
            d["value"] += t
            d["instructions"] += n

        for r in rows:
            o = info.get(r["op_id"]) or {}
            t, n = r["t"] or 0, r["n"]
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
    """Files whose text the profile embeds, most device time first."""
    def compute():
        embedded = [r["file"] for r in L.rows("SELECT file FROM source_files ORDER BY file")]
        per_file: dict[str, int] = {}
        for t in line_totals(L).values():
            if t.get("file"):
                per_file[t["file"]] = per_file.get(t["file"], 0) + t["device_ns"]
        return sorted(embedded, key=lambda f: (-per_file.get(f, 0), f))
    return L.cached("source_files", compute)


def source_view(L: Loaded, file: str) -> list[dict]:
    """Every line of one embedded file with its device time, instruction count and source_id.

    ``file`` must be one of :func:`source_files` (a name from the profile, never opened on disk).
    """
    if file not in source_files(L):
        raise ExplorerError(f"the profile embeds no file named {str(file)[:120]!r}; pick one from the list")
    text = L.scalar("SELECT text FROM source_files WHERE file = $f LIMIT 1", {"f": file}) or ""
    per_line = {t["line"]: t for t in line_totals(L).values() if t.get("file") == file}
    out = []
    for i, code in enumerate(text.splitlines(), start=1):
        t = per_line.get(i, {})
        out.append({"line": i, "code": code, "device_ns": t.get("device_ns", 0), "instructions": t.get("instructions", 0),
                    "host_ns": t.get("host_ns", 0), "source_id": t.get("source_id"), "ops": len(t.get("ops", []))})
    return out


# ----------------------------------------------------------------------------- fallbacks, recompiles
def fallbacks(L: Loaded) -> list[dict]:
    """Ops placed on the CPU: reason, call site, calls and host time, costliest first."""
    totals = op_totals(L)
    rows = []
    for op_id, o in ops(L).items():
        if o.get("placement") != FALLBACK_PLACEMENT:
            continue
        t = totals.get(op_id, {})
        rows.append({"op_id": op_id, "op": op_label(o), "name": o.get("name"), "reason": o.get("fallback_reason") or "",
                     "where": where(o), "source_id": o.get("source_id"), "code": (o.get("code") or "").strip(),
                     "module": o.get("module_path", ""), "graph": o.get("graph") or "", "shape": o.get("shape") or "",
                     "calls": t.get("fallback_calls", 0), "host_ns": t.get("host_ns", 0)})
    rows.sort(key=lambda r: (-r["host_ns"], -r["calls"], r["op"]))
    return rows


_SIG_POSITIONAL = re.compile(r"\(([\d,\s]*)\)\s*([A-Za-z][\w]*)")
_SIG_ITEM = re.compile(r"([A-Za-z_][\w.]*)\s*[:=]\s*([A-Za-z0-9_]*)\s*[\[(]([\d,\s]*)[\])]")


def parse_signature(sig) -> list[dict]:
    """An input signature as ``[{"name", "dtype", "shape"}]``, from JSON or ``x: f32[4, 57]`` text.

    >>> parse_signature("x: float32[4, 57], mask: bool[4, 57]")[0]
    {'name': 'x', 'dtype': 'float32', 'shape': [4, 57]}
    >>> parse_signature('[{"name": "x", "dtype": "float32", "shape": [2, 3]}]')[0]["shape"]
    [2, 3]
    >>> parse_signature("(2, 12) int64, (32,) float32")[1]
    {'name': 'input1', 'dtype': 'float32', 'shape': [32]}
    """
    if not sig:
        return []
    try:
        data = json.loads(sig)
    except (TypeError, ValueError):
        data = None
    out = []
    if isinstance(data, dict):
        data = [dict(v, name=k) if isinstance(v, dict) else {"name": k, "shape": v} for k, v in data.items()]
    if isinstance(data, list):
        for i, item in enumerate(data):
            if isinstance(item, dict):
                out.append({"name": str(item.get("name", f"arg{i}")), "dtype": str(item.get("dtype", "")),
                            "shape": [int(d) for d in (item.get("shape") or []) if _is_int(d)]})
            elif isinstance(item, list):
                out.append({"name": f"arg{i}", "dtype": "", "shape": [int(d) for d in item if _is_int(d)]})
        return out
    for m in _SIG_ITEM.finditer(str(sig)):
        out.append({"name": m.group(1), "dtype": m.group(2),
                    "shape": [int(d) for d in m.group(3).replace(" ", "").split(",") if d]})
    if not out:   # the runtime's positional form: "(2, 12) int64, (100, 32) float32"
        for i, m in enumerate(_SIG_POSITIONAL.finditer(str(sig))):
            out.append({"name": f"input{i}", "dtype": m.group(2),
                        "shape": [int(d) for d in m.group(1).replace(" ", "").split(",") if d]})
    return out


def _is_int(v) -> bool:
    try:
        int(v)
        return True
    except (TypeError, ValueError):
        return False


def signature_diff(old, new) -> list[dict]:
    """Per input: both shapes and the indices of the dimensions that changed (for highlighting)."""
    a = {s["name"]: s for s in parse_signature(old)}
    out = []
    for s in parse_signature(new):
        prev = a.get(s["name"])
        changed = []
        if prev is None:
            changed = list(range(len(s["shape"])))
        else:
            if len(prev["shape"]) != len(s["shape"]):
                changed = list(range(len(s["shape"])))
            else:
                changed = [i for i, (x, y) in enumerate(zip(prev["shape"], s["shape"])) if x != y]
        out.append({"name": s["name"], "dtype": s["dtype"], "old": prev["shape"] if prev else None,
                    "new": s["shape"], "changed": changed,
                    "dtype_changed": bool(prev and prev["dtype"] != s["dtype"])})
    return out


def recompiles(L: Loaded) -> dict:
    """Every graph, its recompiles (signature diff, reason, compile time) and a bucketing suggestion per family."""
    def compute():
        graphs = L.rows("""
            SELECT g.graph_id, g.name, g.kind, g.input_signature, g.compile_wall_ns, g.compile_ns, g.cache_hit,
                   g.recompile_of, g.recompile_reason, g.source_id, s.file, s.line, s.code,
                   (SELECT count(*) FROM executions e WHERE e.graph_id = g.graph_id) AS executions
            FROM graphs g LEFT JOIN sources s USING (source_id)
            ORDER BY g.compile_wall_ns IS NULL, g.graph_id""")
        by_id = {g["graph_id"]: g for g in graphs}
        order = L.rows("""SELECT graph_id, min(ts_ns) AS ts FROM events
                          WHERE kind IN ('compile', 'recompile') GROUP BY ALL""")
        first_ts = {r["graph_id"]: r["ts"] for r in order}

        def root(g):
            seen = set()
            while g.get("recompile_of") in by_id and g["graph_id"] not in seen:
                seen.add(g["graph_id"])
                g = by_id[g["recompile_of"]]
            return g["graph_id"]

        events = []
        for g in graphs:
            g["where"] = f"{Path(g['file']).name}:{g['line']}" if g.get("file") else ""
            if g.get("recompile_of") is None:
                continue
            parent = by_id.get(g["recompile_of"], {})
            events.append({"graph_id": g["graph_id"], "name": g["name"], "reason": g.get("recompile_reason") or "",
                           "where": g["where"], "source_id": g.get("source_id"),
                           "compile_wall_ns": g.get("compile_wall_ns") or 0, "cache_hit": bool(g.get("cache_hit")),
                           "old_signature": parent.get("input_signature") or "",
                           "new_signature": g.get("input_signature") or "",
                           "diff": signature_diff(parent.get("input_signature"), g.get("input_signature")),
                           "ts": first_ts.get(g["graph_id"])})
        families: dict[int, list] = {}
        for g in graphs:
            families.setdefault(root(g), []).append(g)
        suggestions = [s for fam in families.values() if len(fam) > 1 for s in [bucketing(fam)] if s]
        return {"graphs": graphs, "recompiles": events, "suggestions": suggestions,
                "compile_wall_ns": sum(g.get("compile_wall_ns") or 0 for g in graphs)}
    return L.cached("recompiles", compute)


def bucketing(family: list[dict]) -> dict | None:
    """Suggest padding one varying dimension to power-of-two buckets: compiles saved and padding cost.

    ``family``: graphs that are recompiles of one another (with ``input_signature``, ``executions``,
    ``compile_wall_ns``). The padding cost is the extra elements along that dimension, weighted by
    how often each shape ran.
    >>> fam = [{"input_signature": f"x: float32[1, {n}]", "executions": 1, "compile_wall_ns": 10} for n in (5, 7, 9, 16)]
    >>> s = bucketing(fam); (s["input"], s["dim"], s["buckets"], s["compiles_saved"])
    ('x', 1, [8, 16], 2)
    """
    sigs = [(parse_signature(g.get("input_signature")), g) for g in family]
    sigs = [(s, g) for s, g in sigs if s]
    if len(sigs) < 2:
        return None
    best = None
    names = [s["name"] for s in sigs[0][0]]
    for name in names:
        shapes = []
        for s, g in sigs:
            match = next((x for x in s if x["name"] == name), None)
            if match is None:
                break
            shapes.append((match["shape"], max(int(g.get("executions") or 0), 1)))
        else:
            rank = {len(sh) for sh, _ in shapes}
            if len(rank) != 1:
                continue
            for dim in range(rank.pop()):
                values = [(sh[dim], w) for sh, w in shapes]
                distinct = sorted({v for v, _ in values})
                if len(distinct) < 2:
                    continue
                pad = {v: 1 << max(v - 1, 0).bit_length() for v in distinct}
                buckets = sorted(set(pad.values()))
                used = sum(v * w for v, w in values)
                padded = sum(pad[v] * w for v, w in values)
                cand = {"input": name, "dim": dim, "values": distinct, "buckets": buckets,
                        "compiles_before": len(distinct), "compiles_after": len(buckets),
                        "compiles_saved": len(distinct) - len(buckets),
                        "padding_percent": 100.0 * (padded - used) / used if used else 0.0}
                if best is None or cand["compiles_saved"] > best["compiles_saved"]:
                    best = cand
    if best is None:
        return None
    times = [g.get("compile_wall_ns") or 0 for g in family]
    best["mean_compile_ns"] = sum(times) / len(times) if times else 0
    best["compile_ns_saved"] = best["mean_compile_ns"] * best["compiles_saved"]
    best["graph"] = family[0].get("name")
    return best


# -------------------------------------------------------------------------------------- console
def run_console(L: Loaded, sql: str, limit: int = CONSOLE_LIMIT) -> dict:
    """Run one checked read-only SELECT; ``{"columns", "rows", "truncated"}`` (at most ``limit`` rows).

    Raises :class:`sqlguard.RefusedQuery` for anything but a single SELECT, and
    :class:`ExplorerError` when DuckDB rejects the query.
    """
    limit = max(1, min(int(limit), CONSOLE_LIMIT))
    query = sqlguard.check_select(sql)
    sqlguard.check_tree(L.scalar("SELECT json_serialize_sql($q)", {"q": query}))
    with L.lock:   # the cursor below is this thread's; the timer interrupts only this query
        timer = threading.Timer(CONSOLE_TIMEOUT_S, L.profile._cursor().interrupt)
        timer.start()
        try:
            table = L.profile.sql(sqlguard.limited(query, limit))
        except Exception as exc:
            if not timer.is_alive():
                raise ExplorerError(f"query stopped after {CONSOLE_TIMEOUT_S:.0f} s: narrow it (a WHERE on start_ns, "
                                    "a smaller range) or run it with neuron-explorer sql") from None
            raise ExplorerError(_one_line(exc)) from None
        finally:
            timer.cancel()
    rows = table.slice(0, limit).to_pylist()
    return {"columns": table.column_names, "rows": [{k: _jsonable(v) for k, v in r.items()} for r in rows],
            "truncated": table.num_rows > limit}


def _jsonable(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)
    return str(v)


# -------------------------------------------------------------------------------------- compare
@dataclass
class Side:
    key: str
    lines: dict = field(default_factory=dict)
    ops: dict = field(default_factory=dict)


def _line_key(t: dict) -> str:
    # Basename + line: the same model run from two checkouts still aligns.
    return f"{Path(t['file']).name}:{t['line']}" if t.get("file") else "(no source)"


def _op_path(o: dict) -> str:
    return f"{o.get('module_path') or '(top)'} / {op_label(o)}"


def compare(A: Loaded, B: Loaded, limit: int = 50) -> dict:
    """Two profiles aligned by source line (``file.py:line``) and op path (``module / aten op``).

    Deltas are B − A in device ns, biggest absolute change first.
    """
    def side(L):
        s = Side(L.key)
        for t in line_totals(L).values():
            d = s.lines.setdefault(_line_key(t), {"device_ns": 0, "instructions": 0, "code": (t.get("code") or "").strip()})
            d["device_ns"] += t["device_ns"]
            d["instructions"] += t["instructions"]
        totals = op_totals(L)
        for op_id, o in ops(L).items():
            t = totals.get(op_id, {})
            d = s.ops.setdefault(_op_path(o), {"device_ns": 0, "instructions": 0})
            d["device_ns"] += t.get("device_ns", 0)
            d["instructions"] += t.get("instructions", 0)
        return s

    sa, sb = side(A), side(B)

    def align(x: dict, y: dict, name: str):
        out = []
        for k in sorted(set(x) | set(y)):
            a, b = x.get(k, {}), y.get(k, {})
            da, db = a.get("device_ns", 0), b.get("device_ns", 0)
            if not da and not db:
                continue
            row = {name: k, "a_ns": da, "b_ns": db, "delta_ns": db - da,
                   "delta_percent": (100.0 * (db - da) / da) if da else None,
                   "a_instructions": a.get("instructions", 0), "b_instructions": b.get("instructions", 0),
                   "only_in": "a" if k not in y else "b" if k not in x else ""}
            if "code" in a or "code" in b:
                row["code"] = a.get("code") or b.get("code") or ""
            out.append(row)
        out.sort(key=lambda r: -abs(r["delta_ns"]))
        return out[:limit]

    ma, mb = summary(A), summary(B)
    keys = ("total_time", "device_ns", "mfu_estimated_percent", "hbm_read_bytes", "hbm_write_bytes",
            "fallback_ops", "recompiles", "executions", "instructions")
    return {"a": A.key, "b": B.key, "a_path": A.path.name, "b_path": B.path.name,
            "totals": {k: {"a": ma[k], "b": mb[k], "delta": mb[k] - ma[k]} for k in keys},
            "by_line": align(sa.lines, sb.lines, "line"), "by_op": align(sa.ops, sb.ops, "op_path")}
