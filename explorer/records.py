"""The compiler's records shaped for the pages: an instruction's dependencies (the timeline's
Dependencies panel), one execution's SBUF/PSUM allocations (Memory Viewer) and the tensors (Tensor
Viewer). Times are ns since the profile's ``t0``, as everywhere in the Explorer; the queries are
:mod:`traces.q_records`'.
"""
from __future__ import annotations

from explorer import data
from explorer.data import Loaded

MEMORIES = ("SBUF", "PSUM")
PARTITIONS = 128


def _rel(r: dict, t0: int, *cols: str) -> dict:
    r = {k: data._plain(v) for k, v in r.items()}
    for c in cols:
        if r.get(c) is not None:
            r[c] -= t0
    return r


def dependencies(L: Loaded, core: int, queue: str, pc: int, start: int) -> dict:
    """``{"instruction", "predecessors", "successors"}`` of the instruction at ``start`` (ns since t0),
    each end with its op's label; ``{}`` when the profile has no Flow rows for it."""
    t0 = data.bounds(L)["t0"]
    d = L.profile.dependencies(int(core), str(queue), int(pc), t0 + int(start))
    if not d:
        return {}
    ops = data.ops(L)
    out = {"instruction": _rel(d["instruction"], t0, "start_ns")}
    for side in ("predecessors", "successors"):
        out[side] = [dict(_rel(r, t0, "start_ns"), op=data.op_label(ops.get(r["op_id"]))) for r in d[side]]
    return out


def executions(L: Loaded) -> list[dict]:
    """Executions with allocation rows (time order), ``start_ns`` since t0."""
    t0 = data.bounds(L)["t0"]
    return [_rel(r, t0, "start_ns") for r in data.rows(L.profile.allocation_executions())]


def memory(L: Loaded, exec_id: int | None = None, memory: str = "SBUF", partition: int | None = None) -> dict:
    """One execution's allocations in ``memory`` (the first execution by default), optionally only
    those spanning ``partition``: ``{"executions", "exec_id", "memory", "partition", "rows"}``."""
    if memory not in MEMORIES:
        raise data.ExplorerError(f"memory must be one of {', '.join(MEMORIES)}")
    if partition is not None and not 0 <= partition < PARTITIONS:
        raise data.ExplorerError(f"partition must be between 0 and {PARTITIONS - 1}")
    execs = executions(L)
    ids = [e["exec_id"] for e in execs]
    if exec_id is None and ids:
        exec_id = ids[0]
    if exec_id is not None and exec_id not in ids:
        raise data.ExplorerError("that execution has no allocation rows in this profile")
    t0 = data.bounds(L)["t0"]
    rows = [] if exec_id is None else [
        _rel(r, t0, "start_ts", "end_ts") for r in data.rows(L.profile.allocations(exec_id, memory, partition))]
    ops = data.ops(L)
    for r in rows:
        r["op"] = data.op_label(ops.get(r["op_id"]))
    return {"executions": execs, "exec_id": exec_id, "memory": memory, "partition": partition, "rows": rows}


def tensors(L: Loaded, node: str | None = None) -> list[dict]:
    """Every tensor of the profile's graphs (of graph node ``node`` when given), ``first_load_ns`` since t0."""
    t0 = data.bounds(L)["t0"]
    rows = [_rel(r, t0, "first_load_ns") for r in data.rows(L.profile.tensors())]
    return [r for r in rows if node in (None, "", r.get("node"))]


def regions(L: Loaded, exec_id: int | None = None, by: str = "layer") -> dict:
    """Automatic regions by layer, NKI kernel or collective (``Profile.regions``) of one execution (the first by
    default; regions between collectives span executions, so all of them), times since t0, with the regions'
    durations over their occurrences: ``{"executions", "exec_id", "rows", "durations", "by"}``. Each row has
    ``index``, its place among all the regions of that kind (what ``cmp`` links name)."""
    if by not in ("layer", "kernel", "collective"):
        raise data.ExplorerError("regions can be cut by layer, kernel or collective")
    t0 = data.bounds(L)["t0"]
    allrows = L.cached(f"regions:{by}", lambda: [
        {**_rel(r, t0, "start_ns", "end_ns"), "index": i} for i, r in enumerate(data.rows(L.profile.regions(by)))])
    execs = list(dict.fromkeys(r["exec_id"] for r in allrows))
    if by == "collective":
        return {"executions": [], "exec_id": None, "rows": allrows, "by": by, "all": allrows,
                "durations": data.rows(L.profile.region_durations(by))}
    if exec_id is None and execs:
        exec_id = execs[0]
    if exec_id is not None and exec_id not in execs:
        raise data.ExplorerError("that execution has no instruction rows in this profile")
    return {"executions": execs, "exec_id": exec_id, "rows": [r for r in allrows if r["exec_id"] == exec_id],
            "durations": data.rows(L.profile.region_durations(by)), "by": by, "all": allrows}


def operators(L: Loaded) -> list[dict]:
    """The operator table (``Profile.operator_table``), times since t0, each row with ``name`` (the tree:
    layer, then its ops, then their opcodes, indented) and ``depth`` (0, 1, 2)."""
    def compute():
        t0 = data.bounds(L)["t0"]
        out = []
        for r in data.rows(L.profile.operator_table()):
            r = _rel(r, t0, "first_start_ns", "first_end_ns")
            r["depth"] = {"layer": 0, "op": 1, "opcode": 2}[r["level"]]
            label = {"layer": r["layer"] or "(top level)", "op": r["op"] or "(no op)", "opcode": r["opcode"]}
            r["name"] = "\u2003" * r["depth"] + (label[r["level"]] or "")
            out.append(r)
        return out
    return L.cached("operators", compute)
