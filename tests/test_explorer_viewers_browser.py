"""The analysis viewers in a real browser (Playwright driving Debian's chromium, launched as
tests/test_explorer_browser.py does) on the sample encoder's profile: the Summary's MBU, the timeline's
Dependencies panel (jump to a predecessor, copy as JSON), the Memory Viewer and the Tensor Viewer,
each linked to the timeline. Screenshots as in test_explorer_browser.py (NEURON_STACK_SCREENSHOT_DIR).
"""
from __future__ import annotations

import json

import pytest
from test_explorer_browser import IMG, _shot, pytestmark  # noqa: F401  (the same skip)

from explorer import data, timeline
from explorer.figures import fmt_ns


@pytest.fixture(scope="module")
def encoder(recorded_samples):
    return recorded_samples.get("bert_encoder")["bert_encoder"]


@pytest.fixture(scope="module")
def server(explorer_shared, encoder):
    with explorer_shared.serving([encoder]) as url:
        yield url, data.registry().default_key()


def test_summary_shows_the_mbu_of_the_summary_table(server, page, encoder):
    url, key = server
    page.goto(f"{url}/?profile={key}")
    page.wait_for_selector("#summary-mbu")
    mbu = _profile().sql("SELECT mbu_estimated_percent FROM summary").column(0)[0].as_py()
    assert f"{mbu:.2f}%" in page.inner_text("#summary-mbu")
    page.wait_for_selector("#summary-flops .js-plotly-plot")
    _shot(page, "summary-mbu")


def _wait_text(page, selector: str, text: str) -> None:
    """Wait until ``selector`` exists and shows ``text`` (a page re-render may replace it meanwhile)."""
    page.wait_for_function("([s, t]) => (document.querySelector(s) || {innerText: ''}).innerText.includes(t)",
                           arg=[selector, text])


def _profile():
    """The served profile's own connection (a second one with another configuration is refused)."""
    return data.resolve(data.registry().default_key()).profile


def _a_matmul(encoder):
    """A MATMUL with both predecessors and successors, in ns since the Explorer's t0."""
    L = data.resolve(data.registry().default_key())
    t0 = data.bounds(L)["t0"]
    p = _profile()
    for r in p.sql("""SELECT core, queue, pc, start_ns FROM instructions WHERE opcode = 'MATMUL'
                      ORDER BY start_ns LIMIT 20""").to_pylist():
        d = p.dependencies(r["core"], r["queue"], r["pc"], r["start_ns"])
        if d["predecessors"] and d["successors"]:
            return r, d, t0
    raise AssertionError("no MATMUL with dependencies")


def test_dependencies_panel_jumps_and_copies_json(server, page, encoder):
    url, key = server
    r, d, t0 = _a_matmul(encoder)
    start = r["start_ns"] - t0
    page.goto(f"{url}/timeline?profile={key}&start={max(start - 3000, 0)}&end={start + 3000}")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    _wait_text(page, "#timeline-status", "one by one")
    # click the MATMUL's bar: Plotly's click event with that bar's point, as a mouse click raises it
    clicked = page.evaluate("""([start, pc]) => {
        const el = document.querySelector('#timeline-graph .js-plotly-plot');
        for (let c = 0; c < el.data.length; c++) {
            const cd = el.data[c].customdata || [];
            for (let i = 0; i < cd.length; i++) {
                if (cd[i] && cd[i][1] === 'tensor' && cd[i][2] === start && cd[i][3] === pc) {
                    el.emit('plotly_click', {points: [{curveNumber: c, pointNumber: i, customdata: cd[i]}]});
                    return true;
                }
            }
        }
        return false;
    }""", [start, r["pc"]])
    assert clicked
    page.wait_for_selector("#timeline-deps-pred")
    text = page.inner_text("#timeline-deps")
    assert f"{len(d['predecessors'])} predecessors" in text and f"{len(d['successors'])} successors" in text
    assert d["predecessors"][0]["dependency_type"].replace("_DEPENDENCE", "").lower() in text
    _shot(page, "dependencies")
    # the copy button copies the panel's JSON (the hidden <pre> it targets)
    page.click("#timeline-deps-copy")
    copied = json.loads(page.eval_on_selector("#timeline-deps-json", "e => e.textContent"))
    assert copied["instruction"]["pc"] == r["pc"] and len(copied["predecessors"]) == len(d["predecessors"])
    page.wait_for_function("() => navigator.clipboard.readText().then(t => t.length > 0)", timeout=5000)
    assert json.loads(page.evaluate("() => navigator.clipboard.readText()")) == copied
    # jump to the first predecessor: the timeline centres on it
    pred = d["predecessors"][0]
    page.click("#timeline-deps-pred a >> nth=0")
    page.wait_for_url(lambda u: f"start={max(pred['start_ns'] - t0 - 3000, 0)}" in u)
    # and on to the Memory Viewer at this instant
    page.goto(f"{url}/timeline?profile={key}&start={max(start - 3000, 0)}&end={start + 3000}")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")


def test_memory_viewer_shows_allocations_and_links_the_timeline(server, page, encoder):
    url, key = server
    page.goto(f"{url}/memory?profile={key}")
    page.wait_for_selector("#memory-graph .js-plotly-plot")
    _wait_text(page, "#memory-status", "SBUF allocations")
    x = _profile().allocation_executions().to_pylist()[0]["exec_id"]
    n = _profile().allocations(x).num_rows
    assert page.inner_text("#memory-status").startswith(f"{n} SBUF allocations")
    _shot(page, "memory")
    # a block's details and its link to the timeline
    page.evaluate("""() => {
        const el = document.querySelector('#memory-graph .js-plotly-plot');
        const c = el.data.findIndex(t => t.name === 'allocations');
        el.emit('plotly_click', {points: [{curveNumber: c, pointNumber: 0, customdata: el.data[c].customdata[0]}]});
    }""")
    page.wait_for_selector("#memory-open-timeline")
    assert "opcode" in page.inner_text("#memory-details")
    page.click("#memory-open-timeline")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    assert "/timeline" in page.url and "start=" in page.url
    # PSUM
    page.goto(f"{url}/memory?profile={key}&memory=PSUM")
    _wait_text(page, "#memory-status", "PSUM allocations")


def test_tensor_viewer_lists_tensors_and_links_their_first_load(server, page, encoder):
    url, key = server
    page.goto(f"{url}/tensors?profile={key}")
    page.wait_for_selector("#tensors-table")
    n = _profile().tensors().num_rows
    assert page.inner_text("#tensors-count").startswith(f"{n} tensors")
    head = page.inner_text("#tensors-table thead")
    for col in ("variable_name", "type", "format", "shape", "size", "node", "load_to_sbuf_repeat_factor"):
        assert col in head
    _shot(page, "tensors")
    page.click("#tensors-table a[href*='/timeline'] >> nth=0")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    assert "start=" in page.url


def test_timeline_exports_the_visible_window_as_csv(server, page):
    import csv
    import io
    import zipfile

    url, key = server
    L = data.resolve(key)
    a, b = data.bounds(L)["fit"]
    b = a + (b - a) // 3
    page.goto(f"{url}/timeline?profile={key}&start={a}&end={b}")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    def download():
        with page.expect_download() as got:
            page.click("#timeline-csv")
        z = zipfile.ZipFile(got.value.path())
        return {n[:-4]: list(csv.DictReader(io.StringIO(z.read(n).decode()))) for n in z.namelist()}

    sampled = download()            # the real tool's default: sampled at the timeline's resolution
    assert sorted(sampled) == ["CcInstruction", "DmaPacket", "Instruction", "SbufAllocation", "SemaphoreUpdate"]
    page.click("#timeline-csv-sampled input")       # cleared: every event of the window
    full = download()
    t0 = data.bounds(L)["t0"]
    count = "SELECT count(*) FROM instructions WHERE start_ns >= $a AND start_ns < $b AND engine "
    n = _profile().sql(count + "NOT IN ('dma', 'cc')", {"a": t0 + a, "b": t0 + b}).column(0)[0].as_py()
    n_dma = _profile().sql(count + "= 'dma'", {"a": t0 + a, "b": t0 + b}).column(0)[0].as_py()
    rows = full["Instruction"]
    assert len(rows) == n > 0 and len(full["DmaPacket"]) == n_dma > 0
    assert {"timeline_track", "opcode", "start_ns"} <= set(rows[0]) and rows[0]["timeline_track"].endswith("(nc0)")
    assert full["DmaPacket"][0]["timeline_track"].startswith("q") and "transfer_bytes" in full["DmaPacket"][0]
    # sampled: the first event of each track in each of the timeline's buckets, no more
    def bucket(r):
        return r["timeline_track"], (int(r["start_ns"]) - t0 - a) * timeline.MAX_BUCKETS // (b - a)
    firsts = {}
    for r in sorted(full["Instruction"], key=lambda r: int(r["start_ns"])):
        firsts.setdefault(bucket(r), r["start_ns"])
    assert sorted(r["start_ns"] for r in sampled["Instruction"]) == sorted(firsts.values())


def test_sql_schema_inspector_and_csv_download(server, page):
    import csv
    import io

    url, key = server
    page.goto(f"{url}/sql?profile={key}")
    page.wait_for_selector("#sql-schema")
    page.click("#sql-schema summary")
    assert "dependency_type" in page.inner_text("#sql-schema")
    # opened, a table's columns with what SchemaFields says of each: required, unit, example, meaning
    page.click("#sql-schema-Instruction summary")
    cells = page.eval_on_selector_all("#sql-schema-Instruction table tbody tr",
                                      "rows => rows.map(r => [...r.cells].map(c => c.innerText.trim()))")
    got = {c[0]: c for c in cells}
    want = {r["field_name"]: r for r in _profile().sql(
        "SELECT field_name, field_required, field_unit, field_example FROM SchemaFields "
        "WHERE table_name = 'Instruction'").to_pylist()}
    assert got["start_ts"][2:5] == ["yes", "nanoseconds", ""] and want["start_ts"]["field_unit"] == "nanoseconds"
    assert got["opcode"][4] == want["opcode"]["field_example"] == "MATMUL"
    assert all(got[f][2] == ("yes" if w["field_required"] else "no") for f, w in want.items() if f in got)
    IMG.mkdir(parents=True, exist_ok=True)
    page.locator("#sql-schema-Instruction").screenshot(path=str(IMG / "explorer-sql-schema-fields.png"))
    page.click("#sql-schema button:text-is('Flow')")
    page.wait_for_function("() => document.querySelector('#sql-query').value.includes('\"Flow\"')")
    page.click("#sql-run")
    _wait_text(page, "#sql-count", "100 rows")
    _shot(page, "sql-schema")
    with page.expect_download() as got:
        page.click("#sql-csv")
    rows = list(csv.DictReader(io.StringIO(open(got.value.path()).read())))
    cols = [c for c, _ in data.schema(data.resolve(key))["Flow"]]
    assert len(rows) == 100 and list(rows[0]) == cols


def test_regions_page_lists_layers_and_links_their_windows(server, page):
    url, key = server
    page.goto(f"{url}/regions?profile={key}")
    page.wait_for_selector("#regions-table")
    rows = _profile().regions().to_pylist()
    first = [r for r in rows if r["exec_id"] == rows[0]["exec_id"]]
    text = page.inner_text("#regions-table")
    assert "layers.0" in text and "layers.1" in text
    assert len(page.locator("#regions-table tbody tr").all()) == len(first)
    assert "layers.1" in page.inner_text("#regions-durations")
    _shot(page, "regions")
    page.click("#regions-table a:text-is('layers.1')")
    page.wait_for_selector("#timeline-graph .js-plotly-plot")
    t0 = data.bounds(data.resolve(key))["t0"]
    r = next(r for r in first if r["region"] == "layers.1")
    # the region with the fitted window's margin, shaded (tests/test_explorer_regions_browser.py)
    from traces.q_timeline import fit_window

    a, b = fit_window(r["start_ns"] - t0, r["end_ns"] - t0, (0, data.bounds(data.resolve(key))["span"]))
    assert f"start={a}" in page.url and f"end={b}" in page.url and "region=layer%3A" in page.url


def test_source_range_select_sums_the_lines(server, page):
    url, key = server
    page.goto(f"{url}/source?profile={key}")
    page.wait_for_selector("#source-lines .src-line.hot")
    hot = page.locator("#source-lines .src-line.hot")
    first, last = hot.nth(0), hot.nth(min(2, hot.count() - 1))
    first.click()
    page.wait_for_selector("#source-timeline")
    page.click("#source-range-mode input")                  # range: the next click extends the selection
    last.click()
    page.wait_for_selector("#source-range")
    sel = page.evaluate("new URL(location.href).searchParams.get('lines')")
    r = data.line_range(data.resolve(key), f"lines:{sel}")
    text = page.inner_text("#source-range")
    assert f":{r['first']}-{r['last']}" in text and f"{fmt_ns(r['device_ns'])} device time" in text
    assert page.locator("#source-lines .src-line.selected").count() >= 2
    page.wait_for_selector("#source-timeline .js-plotly-plot")
    _shot(page, "source-range")
