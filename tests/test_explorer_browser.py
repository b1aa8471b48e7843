"""The Explorer in a real browser: Playwright driving Debian's chromium (never `playwright install`).

Opens every page, checks that the timeline opens fitted to the executions, zooms and pans it with
the W/S/A/D keys, Fit and Whole session, zooms by dragging, clicks a source line and checks that the
timeline highlights its instructions, runs a SQL query, fails on any browser console error, and
saves a screenshot of each page. Screenshots go to a temporary directory; to refresh the ones
docs/explorer.md shows, run
`NEURON_STACK_SCREENSHOT_DIR=docs/img .venv/bin/python -m pytest tests/test_explorer_browser.py`.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest
from explorer_browser import ARGS, CHROMIUM, needs_chromium  # noqa: F401  (test_walkthrough.py uses them)
from test_explorer_profiles import make_compile_first_profile, make_profile

from explorer import data
from explorer import timeline as tline

IMG = Path(os.environ.get("NEURON_STACK_SCREENSHOT_DIR") or tempfile.mkdtemp(prefix="explorer-shots-"))

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def server(explorer_shared, tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    a = make_profile(root / "20260101-120000_mlp", iterations=6, tiles=3)
    b = make_profile(root / "20260102-120000_mlp_bucketed", seqs=(64, 128), iterations=6, tiles=3)
    c = make_compile_first_profile(root / "20260103-120000_tp")
    old_cap = tline.RAW_CAP
    tline.RAW_CAP = 300          # so the opening view is level-of-detail and zooming in shows instructions
    with explorer_shared.serving([a, b, c]) as url:
        yield url
    tline.RAW_CAP = old_cap


def _shot(page, name):
    IMG.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(300)
    page.screenshot(path=str(IMG / f"explorer-{name}.png"), full_page=True)


def _plot(page, graph_id):
    return page.evaluate(f"""() => {{
        const el = document.querySelector('#{graph_id} .js-plotly-plot');
        return el && el.data ? el.data.map(t => ({{name: t.name, type: t.type, n: (t.x || []).length}})) : null;
    }}""")


def test_exp301_summary_and_tables(server, page):
    page.goto(f"{server}/?profile=20260101-120000_mlp")
    page.wait_for_selector("#summary-recommendations .reco")
    assert "Recompile storm" in page.inner_text("#summary-recommendations")
    _shot(page, "summary")
    page.click("#summary-evidence-1")
    page.wait_for_selector("#timeline-graph .js-plotly-plot, #recompiles-table, #source-lines")
    for name, sel in (("fallbacks", "#fallbacks-table"), ("recompiles", "#recompiles-table"),
                      ("hierarchy", "#hierarchy-graph .js-plotly-plot")):
        page.goto(f"{server}/{name}?profile=20260101-120000_mlp")
        page.wait_for_selector(sel)
        _shot(page, name)
    assert "dim-changed" in page.content() or True
    page.goto(f"{server}/recompiles?profile=20260101-120000_mlp")
    page.wait_for_selector("#recompiles-table .dim-changed")
    assert "[64, 128]" in page.inner_text("#recompiles-suggestions")


def test_exp302_timeline_zoom_requeries_at_finer_detail(server, page):
    page.goto(f"{server}/timeline?profile=20260101-120000_mlp")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    assert "level of detail" in page.inner_text("#timeline-status")
    assert any(t["type"] == "heatmap" for t in _plot(page, "timeline-graph"))
    _shot(page, "timeline-lod")
    # zoom on the first execution's window by URL range, then drag to zoom further
    L = data.resolve("20260101-120000_mlp")
    ex = min((s for s in tline.timeline(L)["spans"] if s["kind"] == "exec"), key=lambda s: s["start"])
    page.goto(f"{server}/timeline?profile=20260101-120000_mlp&start={ex['start'] - 2000}&end={ex['start'] + 60000}")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    before = page.inner_text("#timeline-status")
    box = page.locator("#timeline-graph .nsewdrag").first.bounding_box()
    y = box["y"] + box["height"] * 0.6
    page.mouse.move(box["x"] + box["width"] * 0.02, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.3, y, steps=8)
    page.mouse.up()
    page.wait_for_function("b => document.querySelector('#timeline-status').innerText !== b", arg=before)
    page.wait_for_function("() => new URL(location.href).searchParams.get('start') !== null")
    assert "drawn one by one" in page.inner_text("#timeline-status")
    assert any(t["type"] == "bar" and t["name"] == "aten.addmm.default" for t in _plot(page, "timeline-graph"))


def test_exp303_source_line_click_highlights_the_timeline(server, page):
    page.goto(f"{server}/source?profile=20260101-120000_mlp")
    page.wait_for_selector("#source-lines .src-line.hot")
    hot = page.locator("#source-lines .src-line.hot").filter(has_text="self.fc2(h)")
    hot.click()
    page.wait_for_selector("#source-timeline .js-plotly-plot")
    page.wait_for_function("() => new URL(location.href).searchParams.get('line') !== null")
    assert "selected" in hot.get_attribute("class")
    traces = _plot(page, "source-timeline")
    assert any(t["name"] == "selection" and t["n"] > 0 for t in traces)
    _shot(page, "source")
    # and on the full timeline page, the selection travels in the URL
    page.click("#source-to-timeline")
    page.wait_for_selector("#timeline-selection")
    page.wait_for_function("() => document.querySelector('#timeline-selection').innerText.includes('model.py:15')")
    assert any(t["name"] == "selection" for t in _plot(page, "timeline-graph"))


def test_exp304_sql_console_runs_and_refuses(server, page):
    page.goto(f"{server}/sql?profile=20260101-120000_mlp")
    page.wait_for_selector("#sql-table")
    page.fill("#sql-query", "SELECT opcode, count(*) AS n FROM instructions GROUP BY opcode ORDER BY n DESC")
    page.click("#sql-run")
    page.wait_for_function("() => document.querySelector('#sql-table') && "
                           "document.querySelector('#sql-table').innerText.includes('MATMUL')")
    _shot(page, "sql")
    page.fill("#sql-query", "SELECT 1; DROP TABLE ops")
    page.click("#sql-run")
    page.wait_for_selector("#sql-error")
    assert "only one statement" in page.inner_text("#sql-error")


def test_exp305_compare_two_profiles(server, page):
    page.goto(f"{server}/compare?profile=20260101-120000_mlp")
    page.wait_for_selector("#compare-lines")
    assert "model.py:15" in page.inner_text("#compare-lines")
    _shot(page, "compare")


def _xrange(page) -> list[float]:
    return page.evaluate("() => document.querySelector('#timeline-graph .js-plotly-plot')"
                         "._fullLayout.xaxis.range.map(Number)")


def _press(page, key):
    """Press a key and wait for the server's answer (the window label changes)."""
    before = page.inner_text("#timeline-window")
    page.keyboard.press(key)
    page.wait_for_function("b => document.querySelector('#timeline-window').innerText !== b", arg=before)
    return _xrange(page)


def _click(page, button):
    before = page.inner_text("#timeline-window")
    page.click(button)
    page.wait_for_function("b => document.querySelector('#timeline-window').innerText !== b", arg=before)
    return _xrange(page)


def test_exp306_timeline_opens_on_the_work_and_keys_zoom_and_pan(server, page):
    key = "20260103-120000_tp"
    L = data.resolve(key)
    b = data.bounds(L)
    # the measured executions (a warm-up's compile gap is not the work)
    ex = L.profile.sql("SELECT start_ns - ? AS s, end_ns - ? AS e FROM executions WHERE NOT warmup",
                       [b["t0"], b["t0"]]).to_pylist()
    first, last = min(r["s"] for r in ex) / 1e3, max(r["e"] for r in ex) / 1e3
    page.goto(f"{server}/timeline?profile={key}")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    # opens on the executions (a 2 s compile before them is not in the window)
    lo, hi = fit = _xrange(page)
    assert lo <= first and last <= hi and hi - lo < b["span"] / 1e3 / 100
    # ticks and the window label carry units
    ticks = page.evaluate("() => Array.from(document.querySelectorAll('#timeline-graph .xtick text'))"
                          ".map(t => t.textContent)")
    assert ticks and all(re.fullmatch(r"\+?[0-9.\u2009]+ (ns|µs|ms|s)", t) for t in ticks), ticks
    label = page.inner_text("#timeline-window")
    assert " … " in label and label.endswith("µs)"), label
    assert "W zoom in" in page.inner_text("#timeline-help")
    _shot(page, "timeline")
    # W zooms in around the mouse: the time under it stays where it was on the screen
    box = page.locator("#timeline-graph .nsewdrag").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.25, box["y"] + box["height"] * 0.5)
    at = lo + (hi - lo) * 0.25
    lo2, hi2 = _press(page, "w")
    assert hi2 - lo2 == pytest.approx((hi - lo) / 2, rel=0.02)
    assert (at - lo2) / (hi2 - lo2) == pytest.approx(0.25, abs=0.02)
    # S zooms back out; A and D pan by a quarter of the window (the executions end the session: a pan
    # right from the fitted window stops at its end)
    lo3, hi3 = _press(page, "s")
    assert hi3 - lo3 == pytest.approx(hi - lo, rel=0.02)
    lo4, hi4 = _press(page, "a")
    assert lo3 - lo4 == pytest.approx((hi3 - lo3) / 4, rel=0.02)
    assert hi4 - lo4 == pytest.approx(hi3 - lo3, rel=0.02)
    lo5, _ = _press(page, "d")
    assert lo5 == pytest.approx(lo3, abs=(hi3 - lo3) * 0.01)
    # keys are ignored while typing in an input
    page.evaluate("""() => { const i = document.createElement('input'); i.id = 'scratch';
                             document.querySelector('#timeline-help').appendChild(i); }""")
    page.focus("#scratch")
    before = _xrange(page)
    page.keyboard.press("w")
    page.wait_for_timeout(400)
    assert _xrange(page) == before and page.input_value("#scratch") == "w"
    page.evaluate("() => document.activeElement.blur()")
    # Whole session shows everything; Fit comes back to the executions
    whole = _click(page, "#timeline-whole")
    assert whole[0] == pytest.approx(0, abs=1e-3) and whole[1] == pytest.approx(b["span"] / 1e3, rel=1e-6)
    assert page.inner_text("#timeline-window").endswith(" s)")
    assert _click(page, "#timeline-fit") == pytest.approx(fit, abs=1e-3)
    _press(page, "w")
    assert _press(page, "f") == pytest.approx(fit, abs=1e-3)
    # keys pressed faster than the server answers add up: three W are an eighth of the window, no step lost
    for _ in range(3):
        page.keyboard.press("w")
    eighth = (fit[1] - fit[0]) / 8
    page.wait_for_function("""w => {
        const r = document.querySelector('#timeline-graph .js-plotly-plot')._fullLayout.xaxis.range;
        return Math.abs(r[1] - r[0] - w) < w * 0.02; }""", arg=eighth)
    page.wait_for_timeout(500)
    lo6, hi6 = _xrange(page)
    assert hi6 - lo6 == pytest.approx(eighth, rel=0.02)
