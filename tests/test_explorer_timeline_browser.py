"""The timeline's navigation, Current Selection and annotations in a real browser (Playwright driving Debian's
chromium, as tests/test_explorer_browser.py does): a click on an execution zooms to it, empty lanes fold and
come back, a box-selected range gets the Summary's figures and a note stored in the profile, a delete asks
first, and the Recompiles page's links land on data. Screenshots as in test_explorer_browser.py
(``NEURON_STACK_SCREENSHOT_DIR=docs/img``)."""
from __future__ import annotations

import pytest
from test_explorer_browser import _shot, _xrange, pytestmark  # noqa: F401  (skip without chromium)
from test_explorer_profiles import make_profile

from explorer import data

KEY = "20260101-120000_mlp"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("tlbrowser")


@pytest.fixture(scope="module")
def server(explorer_shared, root):
    with explorer_shared.serving([
            make_profile(root / KEY, iterations=6, tiles=3),
            make_profile(root / "20260102-120000_mlp_bucketed", seqs=(64, 128), iterations=6, tiles=3),
            make_profile(root / "20260103-120000_mlp_one", seqs=(64,), iterations=4, tiles=3)]) as url:
        yield url


def _point(page, trace_name: str, i: int = 0) -> tuple[float, float, float, float]:
    """Screen position of the middle of bar ``i`` of a trace, and its (base, width) in µs."""
    return tuple(page.evaluate("""([name, i]) => {
        const gd = document.querySelector('#timeline-graph .js-plotly-plot');
        const t = gd.data.find(d => d.name === name);
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
        const x = t.base[i] + t.x[i] / 2;
        return [box.left + xa._offset + xa.l2p(x), box.top + ya._offset + ya.l2p(t.y[i]), t.base[i], t.x[i]];
    }""", [trace_name, i]))


def _changed(page, before: str):
    page.wait_for_function("b => document.querySelector('#timeline-window').innerText !== b", arg=before)


def test_opens_on_the_busy_executions_and_a_click_zooms_to_one(server, page):
    page.goto(f"{server}/timeline?profile={KEY}")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    lo, hi = _xrange(page)
    fit = data.bounds(data.resolve(KEY))["fit"]
    assert (lo, hi) == pytest.approx((fit[0] / 1e3, fit[1] / 1e3), abs=1e-3)
    # the second execution lane bar: a click zooms to it (the fit margin on each side)
    x, y, base, width = _point(page, "executions", 1)
    before = page.inner_text("#timeline-window")
    page.mouse.click(x, y)
    _changed(page, before)
    lo2, hi2 = _xrange(page)
    assert lo2 < base < base + width < hi2 and hi2 - lo2 == pytest.approx(width * 1.04, rel=0.05)
    _shot(page, "timeline-execution")


def test_empty_lanes_fold_and_come_back(server, page):
    from explorer import timeline as tline

    L = data.resolve(KEY)
    ex = next(s for s in tline.timeline(L)["spans"] if s["kind"] == "exec")
    start, end = ex["start"], ex["start"] + ex["dur"] // 4       # a quarter of one execution: idle queues
    assert tline.timeline(L, start, end)["folded"] > 0
    page.goto(f"{server}/timeline?profile={KEY}&start={start}&end={end}")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    assert "empty lane" in page.inner_text("#timeline-status")
    lanes = page.evaluate("() => document.querySelector('#timeline-graph .js-plotly-plot')"
                          "._fullLayout.yaxis.ticktext.length")
    page.click("#timeline-fold")
    page.wait_for_function("() => document.querySelector('#timeline-fold').innerText === 'Fold empty lanes'")
    more = page.evaluate("() => document.querySelector('#timeline-graph .js-plotly-plot')"
                         "._fullLayout.yaxis.ticktext.length")
    assert more > lanes and "lanes=all" in page.url
    page.click("#timeline-fold")
    page.wait_for_function("() => document.querySelector('#timeline-fold').innerText === 'Show empty lanes'")


def test_a_range_gets_the_summarys_figures_and_a_note_that_is_stored(server, page):
    page.goto(f"{server}/timeline?profile={KEY}")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    page.click("#timeline-graph .modebar-btn[data-attr='dragmode'][data-val='select']")
    box = page.locator("#timeline-graph .nsewdrag").first.bounding_box()
    y = box["y"] + box["height"] * 0.5
    page.mouse.move(box["x"] + box["width"] * 0.1, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, y + 20, steps=8)
    page.mouse.up()
    page.wait_for_function("() => document.querySelector('#timeline-agg-title').innerText"
                           ".includes('box-selected range')")
    panel = page.inner_text("#timeline-aggregates").lower()
    assert "mfu (estimated)" in panel and "mbu (estimated)" in panel and "top source lines" in panel
    page.fill("#timeline-note-text", "second step is slower")
    page.click("#timeline-note-add")
    page.wait_for_function("() => document.querySelector('#timeline-notes').innerText"
                           ".includes('second step is slower')")
    labels = page.evaluate("() => (document.querySelector('#timeline-graph .js-plotly-plot')"
                           "._fullLayout.annotations || []).map(a => a.text)")
    assert "✎ second step is slower" in labels
    notes = data.resolve(KEY).profile.annotations()
    assert [(n["kind"], n["text"]) for n in notes] == [("range", "second step is slower")]
    _shot(page, "timeline-annotations")
    # delete asks first (a confirm dialog), then the note leaves the profile
    page.once("dialog", lambda d: d.accept())
    page.click("#timeline-notes button")
    page.wait_for_function("() => document.querySelector('#timeline-note-status').innerText === 'deleted'")
    assert data.resolve(KEY).profile.annotations() == []


def test_recompile_links_land_on_data(server, page):
    page.goto(f"{server}/recompiles?profile={KEY}")
    page.wait_for_selector("#recompiles-table")
    page.locator("#recompiles-table a", has_text="model.py:23").first.click()
    page.wait_for_selector("#source-lines")
    assert "Cannot show this page" not in page.content()
    assert "compiled graph" in page.inner_text("#source-selection")
    page.click("#source-to-timeline")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    assert "sel=graph" in page.url and "graph" in page.inner_text("#timeline-selection")
    lo, hi = _xrange(page)
    assert (lo, hi) != pytest.approx([x / 1e3 for x in data.bounds(data.resolve(KEY))["fit"]], abs=1e-3)


def _ranges(page):
    return page.evaluate("() => Array.from(document.querySelectorAll('#compare-timelines .js-plotly-plot'))"
                         ".map(g => g._fullLayout.xaxis.range.map(Number))")


def test_compare_three_profiles_with_synchronised_timelines(server, page):
    keys = ",".join(data.registry().keys())
    page.goto(f"{server}/compare?profile={KEY}&keys={keys}")
    page.wait_for_selector("#compare-lines")
    page.wait_for_function("() => document.querySelectorAll('#compare-timelines .js-plotly-plot').length === 3")
    assert "Compare 3 profiles" in page.inner_text("#compare-title")
    before = _ranges(page)
    assert len({tuple(r) for r in before}) == 1
    # drag-zoom on the first timeline: the other two follow
    drag = page.locator("#compare-timelines .nsewdrag").first
    drag.scroll_into_view_if_needed()
    box = drag.bounding_box()
    y = box["y"] + min(box["height"] * 0.5, 40)
    page.mouse.move(box["x"] + box["width"] * 0.2, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=8)
    page.mouse.up()
    page.wait_for_function("""b => {
        const r = Array.from(document.querySelectorAll('#compare-timelines .js-plotly-plot'))
            .map(g => g._fullLayout.xaxis.range.map(Number));
        return r.every(x => Math.abs(x[0] - r[0][0]) < 1e-6 && Math.abs(x[1] - r[0][1]) < 1e-6)
            && Math.abs(r[2][1] - r[2][0] - (b[1] - b[0])) > 1e-6; }""", arg=before[0])
    # choose another base: deltas are against it
    page.click("#compare-base-2")
    page.wait_for_function("() => document.querySelector('#compare-title').innerText.endsWith('base C')")
    assert "(base)" in page.inner_text("#compare-totals")
    _shot(page, "compare-n")


def test_search_and_counter_tracks(server, page):
    page.goto(f"{server}/timeline?profile={KEY}")
    page.wait_for_selector("#timeline-counters .js-plotly-plot")
    names = page.evaluate("() => document.querySelector('#timeline-counters .js-plotly-plot').data.map(t => t.name)")
    assert names == ["HFU", "device memory"]
    assert "No throttling track" in page.inner_text("#timeline-throttle")
    before = page.inner_text("#timeline-window")
    page.fill("#timeline-search-text", "MATMUL")
    page.click("#timeline-search-go")
    page.wait_for_function("() => document.querySelector('#timeline-search-status').innerText.includes('match')")
    _changed(page, before)
    assert "instructions match 'MATMUL'" in page.inner_text("#timeline-search-status")
    assert page.locator("#timeline-search-list li").count() > 0
    lo, hi = _xrange(page)
    before = page.inner_text("#timeline-window")
    page.click("#timeline-search-next")
    _changed(page, before)
    assert _xrange(page)[0] > lo
    # the counter tracks follow the window
    page.wait_for_function("""r => {
        const g = document.querySelector('#timeline-counters .js-plotly-plot');
        return Math.abs(g._fullLayout.xaxis.range[0] - r[0]) > 1e-9; }""", arg=[lo, hi])
    _shot(page, "timeline-search")


def test_profile_manager_star_upload_and_delete(server, page, root):
    from explorer import manager

    manager.SETTINGS["directory"] = root
    try:
        page.goto(f"{server}/profiles?profile={KEY}")
        page.wait_for_selector("#profiles-table")
        star = page.locator("#profiles-table button.star").nth(2)
        star.click()
        page.wait_for_function("() => document.querySelector('#profiles-status').innerText.includes('saved')")
        assert page.locator("#profiles-table button.star").first.inner_text() == "★"   # favourites first
        page.set_input_files("#profiles-upload input[type=file]", str(root / KEY / "profile.duckdb"))
        page.wait_for_function("() => document.querySelector('#profiles-status').innerText.includes('uploaded')")
        assert (root / "uploaded_profile" / "profile.duckdb").is_file()
        _shot(page, "profiles")
        rows = page.locator("#profiles-table tbody tr")
        up = next(i for i in range(rows.count()) if "uploaded_profile" in rows.nth(i).inner_text())
        page.once("dialog", lambda d: d.accept())
        rows.nth(up).locator("button", has_text="delete").click()
        page.wait_for_function("() => document.querySelector('#profiles-status').innerText.includes('deleted')")
        assert not (root / "uploaded_profile").exists()
    finally:
        manager.SETTINGS["directory"] = None
