"""The Explorer's read-only HTTP JSON API: what the pages show, for scripts (the real tool serves one beside
its UI). GET only; profiles by key; every parameter validated as the pages validate it; errors are
``{"error": "..."}`` with status 400 (404 for an unknown profile).

    GET /api/profiles                                  the profile manager's list
    GET /api/profiles/<key>/summary                    Profile.figures() and the Summary metrics
    GET /api/profiles/<key>/timeline?start=&end=&sel=  what the timeline draws for a window
    GET /api/profiles/<key>/selection?start=&end=      the Current Selection's figures and aggregates
    GET /api/profiles/<key>/annotations                the profile's annotations
    GET /api/profiles/<key>/search?q=                  instructions found by opcode, op, line or tensor
    GET /api/compare?keys=a,b,c&base=a                 N profiles against a base

>>> _clean({"mfu": float("nan"), "lanes": ("Tensor(nc0)",)})
{'mfu': 'nan', 'lanes': ['Tensor(nc0)']}
"""
from __future__ import annotations

import json
import math

from explorer import data, manager, selection, system, timeline, tracks

PREFIX = "/api"


def _clean(v):
    """JSON-able: non-finite floats as strings, anything else unknown as its text."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _timeline(key, args) -> dict:
    L = data.resolve(key)
    tl = timeline.timeline(L, args.get("start"), args.get("end"), args.get("sel") or None)
    tl["lanes"] = [lane.label for lane in tl["lanes"]]
    return tl


def _selection(key, args) -> dict:
    L = data.resolve(key)
    a, b = timeline.clamp_window(L, args.get("start"), args.get("end"))
    return {"start": a, "end": b, "figures": selection.figures(L, a, b).as_dict(),
            "aggregates": timeline.range_aggregates(L, a, b)}


def _summary(key, _args) -> dict:
    L = data.resolve(key)
    return {"key": key, "name": data.registry().label(key), "figures": L.profile.figures().as_dict(),
            "summary": L.profile.summary()}


def _system_chain(key, args) -> dict:
    L = data.resolve(key)
    found = system.chain(L, args.get("track"), args.get("start"), (args.get("name") or "")[:500])
    if found is None:
        raise data.ExplorerError("no such system event: pass its track, start (ns since the profile's t0) and name, "
                                 "as the System Trace's events carry them")
    return found


ROUTES = {
    "summary": _summary, "timeline": _timeline, "selection": _selection,
    "annotations": lambda key, _a: timeline.annotations(data.resolve(key)),
    "search": lambda key, a: tracks.search(data.resolve(key), a.get("q", ""), limit=50),
    "system_chain": _system_chain,
}


def blueprint():
    """A Flask blueprint of the API (registered on the Explorer's server, and alone by ``view --api-port``)."""
    from flask import Blueprint, Response, request

    bp = Blueprint("explorer_api", __name__, url_prefix=PREFIX)

    def answer(fn, *args):
        try:
            body, status = fn(*args), 200
        except data.ExplorerError as exc:
            body, status = {"error": str(exc)}, 404 if str(exc).startswith("unknown profile") else 400
        return Response(json.dumps(_clean(body)), status=status, mimetype="application/json")

    @bp.get("/profiles")
    def profiles():
        return answer(manager.listing)

    @bp.get("/profiles/<key>/<what>")
    def profile(key, what):
        def run():
            data.resolve(key)                   # an unknown profile first: 404
            if what not in ROUTES:
                raise data.ExplorerError(f"no API {what[:40]!r}; use one of: {', '.join(ROUTES)}")
            return ROUTES[what](key, request.args)
        return answer(run)

    @bp.get("/compare")
    def compare():
        from explorer.pages.compare import chosen

        def run():
            keys, base = chosen(request.args.get("keys"), request.args.get("base"))
            return data.compare_n([data.resolve(k) for k in keys], keys.index(base))
        return answer(run)

    return bp
