"""The Explorer app: page layouts and callbacks as plain functions, the Flask server, and the
``neuron-explorer view`` / ``diff`` commands as a user types them."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from contextvars import copy_context
from pathlib import Path

import pytest
from dash._callback_context import context_value
from dash._utils import AttributeDict
from test_explorer_profiles import make_profile

from explorer import data
from explorer import profiles as profile_registry
from explorer import timeline as tline
from explorer.app import create_app
from explorer.figures import fmt_ns

EXE = Path(sys.executable).parent / "neuron-explorer"


def triggered(prop_id: str, fn, *args, outputs_list=None):
    """Call a callback as Dash would after ``prop_id`` changed (ctx.triggered_id works)."""
    def run():
        context_value.set(AttributeDict(triggered_inputs=[{"prop_id": prop_id, "value": 1}],
                                        outputs_list=outputs_list or [], inputs_list=[], states_list=[]))
        return fn(*args)
    return copy_context().run(run)


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    root = tmp_path_factory.mktemp("app")
    return make_profile(root / "20260101_mlp"), make_profile(root / "20260102_mlp", seqs=(64, 128), iterations=4)


@pytest.fixture(scope="module")
def app(profiles):
    app = create_app(list(profiles))
    yield app
    data.registry().close()


def test_exp201_server_serves_the_shell_and_layout(app):
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    layout = client.get("/_dash-layout")
    assert layout.status_code == 200 and b"app-nav" in layout.data
    assert client.get("/_dash-dependencies").status_code == 200


@pytest.mark.parametrize("page", ["summary", "timeline", "hierarchy", "source", "fallbacks", "recompiles", "sql",
                                  "compare"])
def test_exp202_every_page_renders_for_a_profile(app, page):
    import importlib

    module = importlib.import_module(f"explorer.pages.{page}")
    out = str(module.layout(profile="20260101_mlp"))
    assert "error-box" not in out, out[:400]


def test_exp203_summary_lists_recommendations_with_evidence_links(app):
    from explorer.pages import summary

    out = str(summary.layout(profile="20260101_mlp"))
    assert "Recompile storm" in out and "CPU fallback" in out and "/recompiles?profile=20260101_mlp" in out
    assert "is_simulation = true" in out
    # two profiles and none chosen: the list of profiles
    assert "summary-profiles" in str(summary.layout())


def test_exp204_timeline_zoom_requeries_and_updates_the_url(app, monkeypatch):
    from explorer.pages import timeline

    monkeypatch.setattr(tline, "RAW_CAP", 50)
    fig, state, status, *_ = timeline.render("20260101_mlp")
    assert "level of detail" in status and any(t["type"] == "heatmap" for t in fig["data"])
    span = data.bounds(data.resolve("20260101_mlp"))["span"]
    ex = min((s for s in tline.timeline(data.resolve("20260101_mlp"))["spans"] if s["kind"] == "exec"),
             key=lambda s: s["start"])
    relayout = {"xaxis.range[0]": ex["start"] / 1e3, "xaxis.range[1]": (ex["start"] + ex["dur"] // 3) / 1e3}
    fig2, state2, status2, _sel, _hidden, url, label, _fold = triggered("timeline-request.data", timeline.zoom,
                                                                 relayout, None, None, None, None, None, state)
    assert "drawn one by one" in status2 and any(t["type"] == "bar" for t in fig2["data"])
    assert url["start"] == state2["start"] < url["end"] < span
    assert label.endswith(f"({fmt_ns(url['end'] - url['start'])})")
    # the hover text names the instruction, its op and its source line
    bar = next(t for t in fig2["data"] if t["type"] == "bar" and t.get("customdata"))
    assert "model.py:1" in bar["hovertext"][0] and "op aten." in bar["hovertext"][0]
    # double-click (autorange) and Fit go back to the executions; Whole session shows everything
    fit = data.bounds(data.resolve("20260101_mlp"))["fit"]
    *_, url3, _, _ = triggered("timeline-request.data", timeline.zoom, {"xaxis.autorange": True}, None, None,
                            None, None, None, state2)
    assert (url3["start"], url3["end"]) == fit
    *_, url4, _, _ = triggered("timeline-fit.n_clicks", timeline.zoom, None, 1, None, None, None, None, state2)
    assert (url4["start"], url4["end"]) == fit
    *_, url5, _, _ = triggered("timeline-whole.n_clicks", timeline.zoom, None, None, 1, None, None, None, state2)
    assert (url5["start"], url5["end"]) == (0, span)
    # a pan past the end of the session stops there, keeping the width
    past = {"xaxis.range[0]": (span - 1000) / 1e3, "xaxis.range[1]": (span + 9000) / 1e3}
    *_, url6, _, _ = triggered("timeline-request.data", timeline.zoom, past, None, None, None, None, None, state2)
    assert (url6["start"], url6["end"]) == (span - 10_000, span)
    # a key's request (assets/timeline_keys.js)
    keyed = {"xaxis.range": [ex["start"] / 1e3, (ex["start"] + 5000) / 1e3], "n": 3}
    *_, url7, _, _ = triggered("timeline-request.data", timeline.zoom, keyed, None, None, None, None, None, state2)
    assert (url7["start"], url7["end"]) == (ex["start"], ex["start"] + 5000)
    # a request that is not two finite numbers is one line, not a traceback
    bad = triggered("timeline-request.data", timeline.zoom, {"xaxis.range": ["nan", "x"]}, None, None, None,
                    None, None, state2)
    assert bad[2] == "the x range must be two finite numbers of µs"
    # a relayout that is not an x-range change does nothing
    assert triggered("timeline-request.data", timeline.zoom, {"autosize": True}, None, None, None,
                     None, None, state)[0] is __import__("dash").no_update


def test_exp205_timeline_click_opens_the_source_line(app):
    from explorer.pages import timeline

    fig, state, *_ = timeline.render("20260101_mlp")
    bar = next(t for t in fig["data"] if t["type"] == "bar" and t.get("customdata"))
    out = str(timeline.details({"points": [{"customdata": list(bar["customdata"][0])}]}, state))
    assert "/source?profile=20260101_mlp&amp;line=" in out or "/source?profile=20260101_mlp&line=" in out
    bad = str(timeline.details({"points": [{"customdata": [0, "rm -rf", 0, 0, 0]}]}, state))
    assert "unknown engine" in bad


def test_exp206_brushed_range_aggregates(app):
    from explorer.pages import timeline

    _fig, state, *_ = timeline.render("20260101_mlp")
    ex = min((s for s in tline.timeline(data.resolve("20260101_mlp"))["spans"] if s["kind"] == "exec"),
             key=lambda s: s["start"])
    sel = {"points": [], "range": {"x": [ex["start"] / 1e3, (ex["start"] + ex["dur"]) / 1e3], "y": [0, 5]}}
    body, title = triggered("timeline-graph.selectedData", timeline.aggregates, sel, state)
    assert title.endswith("(box-selected range)") and "Tensor(nc" in str(body) and "model.py:" in str(body)


def test_exp207_source_line_click_highlights_its_instructions(app):
    from explorer.pages import source

    L = data.resolve("20260101_mlp")
    sid = str(next(t["source_id"] for t in data.line_totals(L).values() if t["line"] == 15))
    outputs = [{"id": {"type": "source-line", "sid": s}, "property": "className"}
               for s in sorted(str(t["source_id"]) for t in data.line_totals(L).values())]
    prop = json.dumps({"sid": sid, "type": "source-line"}, separators=(",", ":")) + ".n_clicks"
    panel, classes, state, url = triggered(prop, source.pick_line, [0, 1, 0, 0], {"profile": "20260101_mlp"},
                                           outputs_list=[{}, outputs, {}, {}])
    assert url == {"line": sid, "file": None, "lines": None}
    assert classes.count("src-line hot selected") == 1
    graph = next(c for c in panel.children if getattr(c, "id", None) == "source-timeline")
    picked = [t for t in graph.figure["data"] if t["name"] == "selection"]
    assert picked and len(picked[0]["x"]) == sum(1 for r in tline.timeline(L)["instructions"]
                                              if data.ops(L)[r["op_id"]]["line"] == 15)


def test_exp208_hierarchy_click_links_a_filtered_timeline(app):
    from explorer.pages import hierarchy

    out = str(hierarchy.pick({"points": [{"id": "m:fc1", "customdata": "module:fc1"}]}, "20260101_mlp"))
    assert "sel=module%3Afc1" in out and "Show on the timeline" in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_exp209_view_serves_until_interrupted(profiles, tmp_path):
    port = _free_port()
    bad = tmp_path / "bad" / "profile.duckdb"
    bad.parent.mkdir()
    bad.write_text("not a database")
    proc = subprocess.Popen([str(EXE), "view", str(profiles[0]), str(bad.parent), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == f"View a list of profiles at http://127.0.0.1:{port}/"
        for _ in range(50):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_dash-layout", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the server did not answer")
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=10)
    assert "warning: profile 'bad'" in err and "Traceback" not in err
    assert proc.returncode == 0   # SIGTERM stops the server cleanly, as ctrl-c does


@pytest.mark.parametrize("argv, message", [
    (["view", "/no/such/profile.duckdb"], "no such file"),
    (["view", "{good}", "--port", "70000"], "is not a port number"),
    (["diff", "{good}", "/no/such.duckdb"], "no such file"),
    (["diff", "{good}", "{good}", "--top", "0"], "--top must be at least 1"),
])
def test_exp210_bad_input_is_one_line(profiles, argv, message):
    argv = [a.replace("{good}", str(profiles[0])) for a in argv]
    out = subprocess.run([str(EXE), *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert out.stderr.startswith("neuron-explorer: error: ") and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_exp211_diff_prints_the_comparison(profiles):
    out = subprocess.run([str(EXE), "diff", str(profiles[0]), str(profiles[1]), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["totals"]["recompiles"] == {"a": 3, "b": 1, "delta": -2}
    assert {r["line"] for r in result["by_line"]} >= {"model.py:13", "model.py:15"}
    text = subprocess.run([str(EXE), "diff", str(profiles[0]), str(profiles[1])], capture_output=True, text=True,
                          timeout=60)
    assert text.returncode == 0 and "By source line" in text.stdout and "model.py:15" in text.stdout


def test_exp212_real_inspect_run_finds_the_recompile_reason(tmp_path):
    """From `neuron-explorer inspect` on a sample workload to the recompile reason and a bucketing fix."""
    import importlib

    root = Path(__file__).resolve().parents[1]
    workload = root / "sample_workloads" / "dynamic_shapes.py"
    out = subprocess.run([str(EXE), "inspect", "-o", str(tmp_path), "--", sys.executable, str(workload), "--small"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    (profile,) = tmp_path.glob("*/profile.duckdb")
    reg = data.Registry([profile])
    old = data.registry()
    create_app([], registry=reg)
    try:
        key = reg.default_key()
        L = data.resolve(key)
        r = data.recompiles(L)
        assert r["recompiles"] and all(e["reason"] for e in r["recompiles"])
        assert any(d["changed"] for e in r["recompiles"] for d in e["diff"])
        assert r["suggestions"] and r["suggestions"][0]["compiles_saved"] >= 1
        assert data.top_lines(L, 1)[0]["file"].endswith(".py")
        for page in ("summary", "timeline", "hierarchy", "source", "fallbacks", "recompiles", "sql"):
            text = str(importlib.import_module(f"explorer.pages.{page}").layout(profile=key))
            assert "error-box" not in text, (page, text[:300])
    finally:
        profile_registry._REGISTRY = old
        reg.close()


def test_recompiles_page_shows_only_the_inputs_that_changed():
    from explorer.pages import recompiles
    from explorer.signatures import signature_diff
    diff = signature_diff("x: float32[4, 57, 512], w: float32[512, 512], mask: int64[4, 57]",
                          "x: float32[4, 64, 512], w: float32[512, 512], mask: int64[4, 64]")
    new = str(recompiles._signature(diff, "new"))
    assert "x: float32" in new and "mask: int64" in new and "w: float32" not in new
    assert "+ 1 unchanged input(s)" in new


def test_source_page_opens_at_the_hottest_line(app):
    from explorer.pages import source
    L = data.resolve("20260101_mlp")
    name = data.source_files(L)[0]
    rows = [r for r in data.source_view(L, name) if r["source_id"] is not None]
    hottest = max(rows, key=lambda r: (r["device_ns"] + r["host_ns"], -r["line"]))
    out = str(source.layout(profile="20260101_mlp"))
    assert out.count("src-line hot selected") == 1
    assert f"'line': '{hottest['source_id']}'" in out   # the page state: that line selected
    js = (Path(__file__).resolve().parents[1] / "explorer" / "assets" / "explorer.js").read_text()
    assert "scrollIntoView" in js


def _find(component, cid):
    """The component with id ``cid`` in a Dash layout tree."""
    if getattr(component, "id", None) == cid:
        return component
    kids = getattr(component, "children", None)
    for kid in kids if isinstance(kids, list) else [kids] if kids is not None else []:
        found = _find(kid, cid)
        if found is not None:
            return found
    return None


def test_source_page_heat_shows_host_and_device_time_on_one_scale(app):
    """A CPU-fallback line is as hot as its host time (issue 37: the heat was device-only, so the evidence of
    a fallback finding looked cold); device and host strips share one scale and are never added."""
    from explorer.pages import source
    L = data.resolve("20260101_mlp")
    name = next(f for f in data.source_files(L) if any(r["host_ns"] for r in data.source_view(L, f)))
    rows = data.source_view(L, name)
    peak = max(max(r["device_ns"], r["host_ns"]) for r in rows)
    fb = next(r for r in rows if r["host_ns"])
    page = source.layout(profile="20260101_mlp", line=str(fb["source_id"]))
    for r in rows:
        if r["source_id"] is None:
            continue
        row = _find(page, {"type": "source-line", "sid": str(r["source_id"])})
        no, heat, device, host = row.children[:4]
        bars = {b.className: b.style["width"] for b in heat.children}
        assert bars == {"heat-device": f"{100.0 * r['device_ns'] / peak:.1f}%" if r["device_ns"] else "0%",
                        "heat-host": f"{100.0 * r['host_ns'] / peak:.1f}%" if r["host_ns"] else "0%"}
        assert host.children == (fmt_ns(r["host_ns"]) if r["host_ns"] else "")
        assert device.children == (fmt_ns(r["device_ns"]) if r["device_ns"] else "")
    assert f"{fmt_ns(fb['host_ns'])} host time (CPU fallback)" in str(page)


def test_timeline_says_how_many_spans_the_cap_left_out(app, monkeypatch):
    from explorer.pages import timeline
    L = data.resolve("20260102_mlp")
    full = tline.timeline(L)
    assert full["spans_hidden"] == 0 and len(full["spans"]) > 2
    monkeypatch.setattr(tline, "SPAN_CAP", 1)   # each of the two span queries keeps its longest one
    capped = tline.timeline(L)
    assert len(capped["spans"]) <= 2 and capped["spans_hidden"] == len(full["spans"]) - len(capped["spans"])
    assert f"{capped['spans_hidden']:,} more spans not drawn — zoom in" in timeline._status(capped)


def test_timeline_keys_are_one_table_shown_in_the_help_and_the_docs(app):
    from explorer.pages import timeline
    docs = (Path(__file__).resolve().parents[1] / "docs" / "explorer.md").read_text(encoding="utf-8")
    page = str(timeline.layout(profile="20260101_mlp"))
    assert [k for k, *_ in timeline.KEYS] == ["W", "S", "A", "D", "F"]
    for key, what, action, _amount in timeline.KEYS:
        assert f"| `{key}` | {what} |" in docs and f"{key} {what}" in page
        assert action in ("zoom", "pan", "fit")
    # the page hands the same table to assets/timeline_keys.js
    assert '"key": "w", "action": "zoom", "amount": 0.5' in page.replace("\\", "")
