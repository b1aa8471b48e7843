"""Counter tracks under the device timeline, and search in it: HFU over time, device memory over time, and
the instructions a search text finds (by opcode, op, source line or tensor).

HFU per bucket is the Tensor Engine's hardware FLOPs in the bucket over its peak for the bucket's width
on every core that ran instructions (``hfu_estimated_percent``'s formula, per bucket): each instruction's
FLOPs spread evenly over its duration, exactly, when the window holds at most ``EXACT_MAX`` instructions
(estimated from its share of the profile's span); beyond that (a bucket then spans many instructions)
counted in the bucket where it starts.
Device memory is the HBM in use after each allocation change (``Profile.host_series()["hbm"]``).
Throttled is the share of each bucket's time the Tensor Engine ran under the cost model's power limiter (the
``Throttle`` view's events: trn2's ramp after an idle gap), averaged over the PE arrays; none on a target without it.

>>> like("MatMul")
'%MatMul%'
"""
from __future__ import annotations

import numpy as np

from traces.errors import TraceError
from traces.intervals import bucket_busy
from traces.profile_tables import _THROTTLES

#: Tensor Engine instructions a window may hold for HFU to spread each one's FLOPs over its duration.
EXACT_MAX = 200_000
#: A search text's bound, and the matches one search returns.
MAX_SEARCH_CHARS = 100
MAX_MATCHES = 200


def _cached(p, name: str, compute):
    """A per-profile answer kept on the Profile (a finalised profile never changes): small tables only."""
    if getattr(p, name, None) is None:
        setattr(p, name, compute())
    return getattr(p, name)


def like(text: str) -> str:
    """The ILIKE pattern for a search text (``%`` and ``_`` in it match themselves)."""
    t = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{t}%"


def hfu(p, t0: int, t1: int, buckets: int) -> np.ndarray:
    """HFU (%) per bucket of ``buckets`` equal buckets over ``[t0, t1)`` (absolute ns); see the module."""
    buckets = max(1, int(buckets))
    width = (t1 - t0) / buckets
    md = p.metadata()
    peak = float(md.get("tensor_engine_peak_bf16_flops") or 0.0)
    cores = _cached(p, "_counter_cores", lambda: p.sql(
        "SELECT count(DISTINCT core) AS n FROM executions").column("n")[0].as_py() or 1)
    if not peak or t1 <= t0:
        return np.zeros(buckets)
    b = p.timeline_bounds()
    lo = t0 - b.max_dur
    where = "engine = 'tensor' AND start_ns >= ? AND start_ns < ? AND start_ns + dur_ns > ?"
    # the window's share of every instruction, as an estimate of what it holds (no counting scan)
    if b.instructions * (t1 - t0) / b.span <= EXACT_MAX:
        rows = p.sql(f"SELECT start_ns, dur_ns, flops FROM instructions WHERE {where}", [lo, t1, t0])
        s = np.asarray(rows.column("start_ns").to_numpy(zero_copy_only=False), dtype=np.float64) - t0
        e = s + np.maximum(np.asarray(rows.column("dur_ns").to_numpy(zero_copy_only=False), dtype=np.float64), 1)
        f = np.asarray(rows.column("flops").fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64)
        flops = bucket_busy(np.zeros(len(s), dtype=np.int64), s, e, f, 1, t1 - t0, buckets)[0]
    else:
        flops = np.zeros(buckets)
        rows = p.sql(f"""SELECT least(floor((start_ns - ?) / ?), ?)::BIGINT AS b, sum(flops) AS f
                         FROM instructions WHERE {where} AND start_ns >= ? GROUP BY b""",
                     [t0, width, buckets - 1, lo, t1, t0, t0]).to_pylist()
        for r in rows:
            flops[int(r["b"])] = float(r["f"] or 0)
    return 100.0 * flops / (peak * cores * width / 1e9)


def throttled(p, t0: int, t1: int, buckets: int) -> np.ndarray | None:
    """Share (%) of each of ``buckets`` equal buckets over ``[t0, t1)`` that the Tensor Engine ran under the
    power limiter, averaged over the PE arrays (cores × physical cores) that ran instructions; ``None`` when the
    target has no limiter."""
    ramp = float(p.metadata().get("tensor_engine_throttle_ramp_ns") or 0)
    if not ramp:
        return None
    buckets = max(1, int(buckets))
    if t1 <= t0:
        return np.zeros(buckets)
    ev = _cached(p, "_counter_throttle", lambda: p.sql(f"SELECT t, dur FROM {_THROTTLES} ORDER BY t"))
    t = np.asarray(ev.column("t").to_numpy(zero_copy_only=False), dtype=np.int64)
    d = np.asarray(ev.column("dur").to_numpy(zero_copy_only=False), dtype=np.int64)
    lo, hi = np.searchsorted(t, t0 - int(ramp)), np.searchsorted(t, t1)   # an event lasts at most the ramp
    s = (t[lo:hi] - t0).astype(np.float64)
    e = s + d[lo:hi]
    busy = bucket_busy(np.zeros(len(s), dtype=np.int64), s, e, e - s, 1, t1 - t0, buckets)[0]
    cores = _cached(p, "_counter_cores", lambda: p.sql(
        "SELECT count(DISTINCT core) AS n FROM executions").column("n")[0].as_py() or 1)
    arrays = cores * max(1, int(p.metadata().get("num_physical_cores") or 1))   # each PE array throttles alone
    return 100.0 * busy / (arrays * (t1 - t0) / buckets)


def device_memory(p, t0: int, t1: int) -> list[tuple[int, int]]:
    """``(ts_ns, bytes)`` steps of device (HBM) memory in use over ``[t0, t1)``, starting with the value at
    ``t0`` (absolute ns); empty when the profile recorded none."""
    table = _cached(p, "_counter_hbm", lambda: p.host_series()["hbm"])
    if not table.num_rows:
        return []
    ts = table.column("ts_ns").to_pylist()
    val = table.column("hbm_bytes").to_pylist()
    before = [v for t, v in zip(ts, val) if t <= t0]
    out = [(t0, before[-1])] if before else []
    out += [(t, v) for t, v in zip(ts, val) if t0 < t < t1]
    if out:
        out.append((t1, out[-1][1]))
    return out


def search(p, text: str, after: int | None = None, before: int | None = None, limit: int = 50) -> dict:
    """Instructions whose opcode, op (ATen op or graph node), source line (``model.py:15``) or tensor
    (``TensorInfo.variable_name``, through its node) contains ``text`` (case-insensitive): ``count`` of all
    matches, ``ops`` (how many ops matched and by what) and ``matches``: up to ``limit`` (start order, after
    ``after`` / before ``before`` when given, the latest first then) with start, duration, lane and opcode.
    Example: ``search(p, "matmul", limit=5)["count"]``."""
    text = str(text or "").strip()
    if not text or len(text) > MAX_SEARCH_CHARS or not text.isprintable():
        raise TraceError(f"search for 1 to {MAX_SEARCH_CHARS} printable characters: an opcode (MATMUL), "
                         "an op (addmm), a line (model.py:15) or a tensor name")
    pat = like(text)
    tensor = ("UNION ALL SELECT o.op_id, 'tensor' FROM TensorInfo t JOIN ops o ON o.name = t.node "
              "AND o.graph_id = t.graph_id WHERE t.variable_name ILIKE $pat ESCAPE '\\'"
              if "TensorInfo" in p.tables() else "")
    matched = f"""SELECT op_id, 'op' AS why FROM ops WHERE aten_op ILIKE $pat ESCAPE '\\' OR name ILIKE $pat ESCAPE '\\'
        UNION ALL SELECT o.op_id, 'line' FROM ops o JOIN sources s USING (source_id)
                  WHERE regexp_replace(s.file, '^.*/', '') || ':' || s.line ILIKE $pat ESCAPE '\\'
        {tensor}"""
    ops = p.sql(f"SELECT why, count(DISTINCT op_id) AS n FROM ({matched}) GROUP BY why", {"pat": pat}).to_pylist()
    cond = f"(opcode ILIKE $pat ESCAPE '\\' OR op_id IN (SELECT op_id FROM ({matched})))"
    params = {"pat": pat, "lim": max(1, min(int(limit), MAX_MATCHES))}
    count = p.sql(f"SELECT count(*) AS n FROM instructions WHERE {cond}", {"pat": pat}).column("n")[0].as_py()
    where, order = cond, "start_ns"
    if after is not None:
        where, params["after"] = f"{cond} AND start_ns > $after", int(after)
    if before is not None:
        where, params["before"], order = f"{where} AND start_ns < $before", int(before), "start_ns DESC"
    matches = p.sql(f"""SELECT start_ns, dur_ns, core, engine, queue, opcode, op_id, pc FROM instructions
                        WHERE {where} ORDER BY {order} LIMIT $lim""", params).to_pylist()
    return {"text": text, "count": int(count), "ops": {r["why"]: int(r["n"]) for r in ops}, "matches": matches}
