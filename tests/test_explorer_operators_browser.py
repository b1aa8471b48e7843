"""The Operators page (the real Operator Table) in a real browser, Playwright driving Debian's chromium as
tests/test_explorer_browser.py does: the tree of layers, ops and opcodes with the traces figures, sorted by a
header, filtered by typing, each row's links landing on the timeline window and the source line.
Screenshots as in test_explorer_browser.py (NEURON_STACK_SCREENSHOT_DIR)."""
from __future__ import annotations

import pytest
from test_explorer_browser import _shot, pytestmark  # noqa: F401  (the same skip)
from test_explorer_profiles import make_profile

from explorer import data


@pytest.fixture(scope="module")
def server(explorer_shared, tmp_path_factory):
    path = make_profile(tmp_path_factory.mktemp("ops") / "20260101-120000_mlp", iterations=3, tiles=2)
    with explorer_shared.serving([path]) as url:
        yield url, data.registry().default_key()


def _column(page, col: str) -> list[str]:
    return page.eval_on_selector_all(f"#operators-table td[data-dash-column='{col}']",
                                     "cells => cells.map(c => c.innerText.trim())")


def _table(key):
    return data.resolve(key).profile.operator_table().to_pylist()


def test_operator_table_shows_the_tree_sorts_and_filters(server, page):
    url, key = server
    rows = _table(key)
    page.goto(f"{url}/operators?profile={key}")
    page.wait_for_selector("#operators-table td[data-dash-column='name']")
    assert page.evaluate("document.querySelector('main').scrollWidth") <= 1400   # the table scrolls in its card
    levels = _column(page, "level")
    assert len(levels) == min(50, len(rows)) and levels == [r["level"] for r in rows][:50]   # paginated, in order
    assert _column(page, "device_us")[0] == f"{rows[0]['device_ns'] / 1e3:g}"
    _shot(page, "operators")

    # sort by device time, largest first (a native sort: ascending, then descending)
    header = "#operators-table th[data-dash-column='device_us'] .column-header--sort"
    page.click(header)
    page.click(header)
    page.wait_for_function("() => document.querySelector(\"#operators-table td[data-dash-column='device_us']\")"
                           f".innerText.trim() === '{max(r['device_ns'] for r in rows) / 1e3:g}'")
    shown = [float(v) for v in _column(page, "device_us")]
    assert shown == sorted(shown, reverse=True)

    # filter: only the ops
    page.fill("#operators-table th.dash-filter[data-dash-column='level'] input", 'eq "op"')
    page.keyboard.press("Enter")
    ops = sum(r["level"] == "op" for r in rows)
    page.wait_for_function(f"() => document.querySelectorAll(\"#operators-table td[data-dash-column='level']\")"
                           f".length === {min(ops, 50)}")
    assert set(_column(page, "level")) == {"op"}


def test_a_row_links_to_its_timeline_window_and_its_source_line(server, page):
    url, key = server
    rows = _table(key)
    t0 = data.bounds(data.resolve(key))["t0"]
    first_op = next(r for r in rows if r["level"] == "op")
    page.goto(f"{url}/operators?profile={key}")
    page.wait_for_selector("#operators-table td[data-dash-column='timeline'] a")
    row = [lv for lv in _column(page, "level")].index("op")
    page.locator("#operators-table td[data-dash-column='timeline'] a").nth(row).click()
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    assert f"start={first_op['first_start_ns'] - t0}" in page.url and f"sel=op%3A{first_op['op_id']}" in page.url
    page.go_back()
    page.wait_for_selector("#operators-table td[data-dash-column='source'] a")
    page.locator("#operators-table td[data-dash-column='source'] a").nth(row).click()
    page.wait_for_url(f"**/source?**line={first_op['source_id']}**")
    page.wait_for_selector("main")
    assert "Cannot show this page" not in page.inner_text("main")
