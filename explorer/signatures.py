"""Input signatures of recompiled graphs: parsing, the per-input diff, and a bucketing suggestion.

Plain Python over the strings a profile stores (``graphs.input_signature``): no queries here.

>>> signature_diff("x: f32[4, 57]", "x: f32[4, 64]")[0]["changed"]
[1]
"""
from __future__ import annotations

import json
import re

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


_REASON_DIM = re.compile(r"tensor '([^']+)' dim (\d+)")
_POSITIONAL = re.compile(r"input\d+")


def reason_names(reasons, dim: int | None = None) -> list[str]:
    """The user's argument names a recompile's reasons give (``tensor 'ids' dim 1: 5 -> 9``), along ``dim``
    when given, in order of first mention.

    >>> reason_names(["tensor 'ids' dim 1: 5 -> 9", "tensor 'mask' dim 0: 2 -> 4"], dim=1)
    ['ids']
    """
    names: list[str] = []
    for reason in reasons:
        for name, d in _REASON_DIM.findall(reason or ""):
            if (dim is None or int(d) == dim) and name not in names:
                names.append(name)
    return names


def name_inputs(diff: list[dict], reasons) -> list[dict]:
    """``diff`` (:func:`signature_diff`) with positional names (``input0``: the runtime records shapes by
    position) replaced by the user's argument names from the reasons, when the changed inputs and the
    names the reasons give for their dimensions match one to one.

    >>> d = signature_diff("(2, 5) int64, (4,) float32", "(2, 9) int64, (4,) float32")
    >>> [x["name"] for x in name_inputs(d, ["tensor 'ids' dim 1: 5 -> 9"])]
    ['ids', 'input1']
    """
    changed = [x for x in diff if x["changed"] and _POSITIONAL.fullmatch(x["name"])]
    names = [n for x in changed for n in reason_names(reasons, x["changed"][0])]
    if not changed or len(names) != len(changed) or len(set(names)) != len(names):
        return diff
    rename = {id(x): n for x, n in zip(changed, names)}
    return [dict(x, name=rename.get(id(x), x["name"])) for x in diff]


def bucketing(family: list[dict]) -> dict | None:
    """Suggest padding one varying dimension to power-of-two buckets: compiles saved and padding cost.

    ``family``: graphs that are recompiles of one another (with ``input_signature``, ``executions``,
    ``compile_wall_ns``). The padding cost is the extra elements along that dimension, weighted by
    how often each shape ran.
    >>> fam = [{"input_signature": f"x: float32[1, {n}]", "executions": 1, "compile_wall_ns": 10}
    ...        for n in (5, 7, 9, 16)]
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
