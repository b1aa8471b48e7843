"""The Regions page in a real browser (Playwright driving Debian's chromium, as tests/test_explorer_browser.py
does) on the recorded tensor-parallel sample: regions between collectives, by layer, by NKI kernel (none here,
said so), up to three regions compared side by side, a region opened on the timeline shaded and named, and the
execution picker saying what each execution was. Screenshots as in test_explorer_browser.py."""
from __future__ import annotations

import pytest
from test_explorer_browser import _shot, pytestmark  # noqa: F401  (the same skip)

from explorer import data, records
from explorer.figures import fmt_ns
from traces.q_timeline import fit_window


@pytest.fixture(scope="module")
def server(explorer_shared, recorded_samples):
    with explorer_shared.serving([recorded_samples.get("tensor_parallel")["tensor_parallel"]]) as url:
        yield url, data.registry().default_key()


def _regions(key, by):
    return data.resolve(key).profile.regions(by).to_pylist()


def test_regions_between_collectives_and_by_kernel(server, page):
    url, key = server
    rows = _regions(key, "collective")
    assert rows and all(r["region"].startswith("before ") or r["region"] == "after the last collective"
                        for r in rows)
    page.goto(f"{url}/regions?profile={key}")
    page.wait_for_selector("#regions-table")
    page.click("#regions-by-collective")
    page.wait_for_function("() => (document.querySelector('#regions-table') || {innerText: ''})"
                           ".innerText.includes('before AllReduce')")
    assert len(page.locator("#regions-table tbody tr").all()) == len(rows)
    assert "before AllReduce" in page.inner_text("#regions-table")
    assert "before AllReduce" in page.inner_text("#regions-durations")
    _shot(page, "regions-collective")
    page.click("#regions-by-kernel")
    page.wait_for_selector(".error-box")
    assert "no NKI kernel" in page.inner_text(".error-box")


def test_compare_up_to_three_regions(server, page):
    url, key = server
    rows = _regions(key, "collective")     # eight regions; an execution holds one or two layers here
    page.goto(f"{url}/regions?profile={key}&by=collective")
    page.wait_for_selector("#regions-table")
    for want in ("0", "0%2C1", "0%2C1%2C2", "1%2C2%2C3"):   # the fourth pick drops the first: three at most
        page.locator("#regions-table a:text-is('compare')").first.click()
        page.wait_for_url(f"**cmp={want}")
        heads = "|".join("#" + i for i in want.split("%2C"))
        page.wait_for_function("(want) => [...document.querySelectorAll('#regions-compare-table thead th')]"
                               ".slice(1).map(h => h.innerText.split(' ')[0]).join('|') === want", arg=heads)
    heads = page.eval_on_selector_all("#regions-compare-table thead th", "e => e.map(x => x.innerText)")[1:]
    picked = [int(h.split()[0][1:]) for h in heads]
    assert picked == [1, 2, 3] and "cmp=1%2C2%2C3" in page.url   # the fourth pick dropped the first
    durations = page.eval_on_selector_all("#regions-compare-table tbody tr:first-child td",
                                          "e => e.map(x => x.innerText)")
    assert durations == [fmt_ns(max(rows[i]["end_ns"] - rows[i]["start_ns"], 1)) for i in picked]
    page.wait_for_selector("#regions-compare-graph .js-plotly-plot")
    _shot(page, "regions-compare")
    page.click("#regions-compare a:text-is('clear')")
    page.wait_for_selector("#regions-compare", state="detached")
    assert "cmp=" not in page.url


def _region_shape(page):
    """The shaded region on the timeline (x0, x1 in µs since t0) and its label, or None."""
    return page.evaluate("""() => {
        const gd = document.querySelector('#timeline-graph .js-plotly-plot');
        const s = ((gd && gd.layout.shapes) || []).find(x => x.name === 'region');
        const a = ((gd && gd.layout.annotations) || []).find(x => x.name === 'region');
        return s ? [s.x0, s.x1, a ? a.text : ''] : null;
    }""")


def test_a_region_opens_on_the_timeline_shaded_and_named(server, page):
    url, key = server
    L = data.resolve(key)
    regions = records.regions(L, None, "layer")
    r = regions["rows"][0]                                   # the first execution's first layer
    page.goto(f"{url}/regions?profile={key}&by=layer")
    page.wait_for_selector("#regions-table")
    page.locator("#regions-table tbody tr").first.locator("a").first.click()
    page.wait_for_url(f"**region=layer%3A{r['index']}**")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    page.wait_for_function("() => document.querySelector('#timeline-region').innerText.length > 0")
    # zoomed to the region with the fitted window's margin, the span shaded and named
    a, b = fit_window(r["start_ns"], r["end_ns"], (0, data.bounds(L)["span"]))
    assert page.evaluate("() => document.querySelector('#timeline-graph .js-plotly-plot')"
                         "._fullLayout.xaxis.range.map(Number)") == pytest.approx([a / 1e3, b / 1e3], abs=1e-3)
    x0, x1, label = _region_shape(page)
    assert (x0, x1) == pytest.approx((r["start_ns"] / 1e3, r["end_ns"] / 1e3), abs=1e-3)
    assert r["region"] in label and f"core {r['core']}" in label
    assert r["region"] in page.inner_text("#timeline-region") and fmt_ns(r["end_ns"] - r["start_ns"]) in \
        page.inner_text("#timeline-region")
    # the link lands on data: the region's instructions are in the window
    t0 = data.bounds(L)["t0"]
    assert L.profile.window_count(t0 + r["start_ns"], t0 + r["end_ns"]) >= r["instructions"] > 0
    _shot(page, "regions-highlight")
    # the highlight stays through a zoom, and clears
    before = page.inner_text("#timeline-window")
    page.click("#timeline-graph .js-plotly-plot")
    page.keyboard.press("s")
    page.wait_for_function("b => document.querySelector('#timeline-window').innerText !== b", arg=before)
    assert _region_shape(page)[:2] == pytest.approx([x0, x1], abs=1e-3)
    page.click("#timeline-region-clear")
    page.wait_for_function("() => !(document.querySelector('#timeline-graph .js-plotly-plot').layout.shapes || [])"
                           ".some(s => s.name === 'region')")
    assert page.locator("#timeline-region-pill").is_hidden()
    page.wait_for_function("() => !location.search.includes('region=')")


def test_the_execution_picker_says_what_each_execution_was(server, page):
    url, key = server
    L = data.resolve(key)
    execs = {e["exec_id"]: e for e in L.profile.execution_labels().to_pylist()}
    shown = records.regions(L, None, "layer")["executions"]
    page.goto(f"{url}/regions?profile={key}&by=layer")
    page.wait_for_selector("#regions-exec")
    first = execs[shown[0]]
    picked = page.inner_text("#regions-exec")
    # the graph, its inputs' shapes, a warm-up or not, the Summary's device time of it, the core
    assert picked.startswith(f"#1 · {first['graph']} · ") and fmt_ns(first["device_ns"]) in picked
    assert f"core {first['core']}" in picked and ("warm-up" in picked) == first["warmup"]
    shapes = [f"{s['name']} {s['dtype']}[{', '.join(map(str, s['shape']))}]"
              for s in data.parse_signature(first["input_signature"])] or [first["input_signature"]]
    assert first["input_signature"] and all(s in picked for s in shapes)
    # picking another execution opens its regions
    page.click("#regions-exec")
    option = page.get_by_text(f"#2 · {execs[shown[1]]['graph']}", exact=False).first
    option.click()
    page.wait_for_url(f"**exec={shown[1]}**")
    page.wait_for_function("want => document.querySelector('#regions-exec').innerText.startsWith(want)",
                           arg=f"#2 · {execs[shown[1]]['graph']}")
    want = records.regions(L, shown[1], "layer")["rows"]
    assert len(page.locator("#regions-table tbody tr").all()) == len(want)
    _shot(page, "regions-execution-picker")
