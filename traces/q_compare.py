"""Profiles compared: each profile's time by source line, op path and forward line (the structural diff),
aligned over any number of profiles against a chosen base.

A profile's structure (:func:`structure`) sums, per key, each op's device time plus its CPU-fallback host
time (so moving an op from the host to the device shows as the saving it is; ``Profile.op_totals``
over every execution, warm-ups included: the Summary's rule, warm-ups excluded unless a profile has nothing
else, would set all five executions of a run whose every graph ran once against three of the other's).
Keys travel between profiles: a line is ``file.py:line`` (basename, so two
checkouts align), an op path ``module / aten op`` (``(top)`` for no module; a backward op marked
``(backward)``), and a backward op is also counted under the forward line autograd recorded for it
(``by_fwd_line``: a backward op's own line is the ``backward()`` call in both eager and compiled modes).
:func:`align` puts N structures side by side with each key's time per profile and its delta against the
base, biggest absolute change first. The Explorer's Compare page and ``neuron-explorer diff`` show these.

>>> s = [{"lines": {"m.py:3": {"ns": 10, "instructions": 2}}}, {"lines": {"m.py:3": {"ns": 4, "instructions": 1}}}]
>>> r = align(s, "lines", "line")[0]
>>> r["line"], r["ns"], r["delta_ns"], r["delta_percent"]
('m.py:3', [10, 4], [0, -6], [0.0, -60.0])
"""
from __future__ import annotations

import os

#: The three structural tables: (key of :func:`structure`, name of the row's key).
TABLES = (("lines", "line"), ("ops", "op_path"), ("backward", "line"))


def line_key(file, line) -> str:
    """``model.py:12`` (basename: the same model run from two checkouts aligns). Example: ``line_key("/a/m.py", 3)``."""
    return f"{os.path.basename(file)}:{line}" if file else "(no source)"


def op_path(o: dict) -> str:
    """``fc1 / aten.mm.default``, ``(backward)`` appended for a backward op (a 3-D linear's forward and backward
    ``aten.mm`` are different work). Example: ``op_path({"module_path": "", "aten_op": "aten.relu"})``."""
    label = o.get("aten_op") or o.get("name") or "?"
    return f"{o.get('module_path') or '(top)'} / {label}{' (backward)' if o.get('fwd_source_id') else ''}"


def structure(p) -> dict:
    """One profile's time by source line, op path and forward line (see the module docstring):
    ``{"lines": {key: {"ns", "instructions", "code"}}, "ops": {...}, "backward": {...}}``."""
    totals = {r["op_id"]: r for r in p.op_totals(include_warmup=True).to_pylist()}
    out: dict[str, dict] = {"lines": {}, "ops": {}, "backward": {}}
    for o in p.ops().to_pylist():
        t = totals.get(o["op_id"]) or {}
        ns = int(t.get("device_ns") or 0) + int(t.get("host_ns") or 0)
        n = int(t.get("instruction_count") or 0)
        keys = [("lines", line_key(o.get("file"), o.get("line")) if o.get("source_id") is not None else None),
                ("ops", op_path(o)),
                ("backward", line_key(o["fwd_file"], o["fwd_line"]) if o.get("fwd_file") else None)]
        for table, key in keys:
            if key is None:
                continue
            d = out[table].setdefault(key, {"ns": 0, "instructions": 0})
            d["ns"] += ns
            d["instructions"] += n
            if table == "lines" and "code" not in d:
                d["code"] = (o.get("code") or "").strip()
    return out


def align(structures: list[dict], table: str, name: str, base: int = 0, limit: int = 50) -> list[dict]:
    """Rows of ``table`` (``lines`` / ``ops`` / ``backward``) over N structures: ``{name, "ns": [...],
    "instructions": [...], "delta_ns": [...] (minus the base's), "delta_percent": [...] (None where the base
    has none), "present": [bool, ...], "code"}``; keys with no time anywhere left out; biggest absolute
    change against the base first, at most ``limit``."""
    keys = sorted(set().union(*(s.get(table, {}) for s in structures)))
    rows = []
    for k in keys:
        cells = [s.get(table, {}).get(k) for s in structures]
        ns = [c["ns"] if c else 0 for c in cells]
        if not any(ns):
            continue
        b = ns[base]
        row = {name: k, "ns": ns, "instructions": [c["instructions"] if c else 0 for c in cells],
               "delta_ns": [x - b for x in ns],
               "delta_percent": [(100.0 * (x - b) / b) if b else None for x in ns],
               "present": [c is not None for c in cells]}
        code = next((c["code"] for c in cells if c and c.get("code")), None)
        if code is not None or table == "lines":
            row["code"] = code or ""
        rows.append(row)
    rows.sort(key=lambda r: (-max(abs(d) for d in r["delta_ns"]), r[name]))
    return rows[:limit]


def compare(profiles: list, base: int = 0, limit: int = 50) -> dict:
    """N profiles (``traces.Profile``) aligned against ``profiles[base]``: ``by_line``, ``by_op``,
    ``by_fwd_line`` (:func:`align`) and ``totals`` (each headline figure per profile, ``Profile.figures`` over
    every execution).
    Example: ``compare([p, q, r], base=0)["by_line"][0]["delta_ns"]``."""
    if not 0 <= base < len(profiles):
        raise ValueError(f"base {base} is not one of the {len(profiles)} profiles")
    s = [structure(p) for p in profiles]
    figs = [p.figures(include_warmup=True) for p in profiles]
    totals = {}
    for k, value in TOTALS:
        vals = [value(f) for f in figs]
        totals[k] = {"values": vals, "delta": [v - vals[base] for v in vals]}
    return {"base": base, "totals": totals,
            "by_line": align(s, "lines", "line", base, limit), "by_op": align(s, "ops", "op_path", base, limit),
            "by_fwd_line": align(s, "backward", "line", base, limit)}


#: The headline figures compared: (name shown, its value from ``Figures``); ``total_time`` in seconds as
#: the real Summary's.
TOTALS = (("total_time", lambda f: f.device_ns / 1e9), ("device_ns", lambda f: f.device_ns),
          ("cpu_fallback_ns", lambda f: f.fallback_host_ns), ("step_ns", lambda f: f.step_ns),
          ("mfu_estimated_percent", lambda f: f.mfu_percent), ("hbm_read_bytes", lambda f: f.hbm_read_bytes),
          ("hbm_write_bytes", lambda f: f.hbm_write_bytes), ("fallback_ops", lambda f: f.fallback_ops),
          ("recompiles", lambda f: f.recompiles), ("executions", lambda f: f.executions),
          ("instructions", lambda f: f.instructions))
