"""The Regions page in a real browser (Playwright driving Debian's chromium, as tests/test_explorer_browser.py
does) on the recorded tensor-parallel sample: regions between collectives, by layer, by NKI kernel (none here,
said so), and up to three regions compared side by side. Screenshots as in test_explorer_browser.py."""
from __future__ import annotations

import threading

import pytest
from test_explorer_browser import ARGS, CHROMIUM, _shot, pytestmark  # noqa: F401  (the same skip)

from explorer import data
from explorer.app import create_app
from explorer.figures import fmt_ns


@pytest.fixture(scope="module")
def server(recorded_samples):
    from werkzeug.serving import make_server

    app = create_app([recorded_samples.get("tensor_parallel")["tensor_parallel"]])
    srv = make_server("127.0.0.1", 0, app.server, threaded=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}", data.registry().default_key()
    srv.shutdown()
    data.registry().close()


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 950})
        pg.on("console", lambda m: m.type == "error" and errors.append(m.text))
        pg.on("pageerror", lambda e: errors.append(str(e)))
        yield pg
        browser.close()
    assert errors == [], errors


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
