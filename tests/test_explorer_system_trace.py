"""The System Trace page in a real browser (Playwright driving Debian's chromium, as
test_explorer_browser.py): tracks by source, a grouping mode, an event-type filter, hover, and a click
on an execution that opens its device timeline window; on an eager with_stack profile whose framework
frames outnumber everything else, the runtime and device tracks drawn, and zoom and pan."""
from __future__ import annotations

import pyarrow as pa
import pytest
from explorer_browser import choose, needs_chromium
from test_explorer_browser import _plot, _shot
from test_explorer_profiles import build_tables, write_profile

from traces import Writer, finalize
from traces.schema import TABLES
from traces.synthetic import write_system

pytestmark = needs_chromium


def system_tables(execs: pa.Table) -> dict[str, pa.Table]:
    """What the runtime and neuron_stack.profiling record around each execution: a framework step
    enclosing nrt_execute (neuron_rt) enclosing nc_exec_running (neuron_hw), plus host samples."""
    rows, cpu, mem = [], [], []
    for i, e in enumerate(sorted(execs.to_pylist(), key=lambda e: e["start_ns"])):
        s, t = e["start_ns"], e["end_ns"]
        rows += [dict(ts_ns=s - 4000, dur_ns=t - s + 8000, name=f"step{i}", source="framework", thread_id=1),
                 dict(ts_ns=s - 2000, dur_ns=t - s + 4000, name="nrt_execute", source="neuron_rt", thread_id=1234,
                      core=e["core"], exec_id=e["exec_id"], flow_id=i),
                 dict(ts_ns=s, dur_ns=t - s, name="nc_exec_running", source="neuron_hw", thread_id=1234,
                      core=e["core"], exec_id=e["exec_id"], flow_id=i, detail='{"model": "mlp"}')]
        cpu += [dict(ts_ns=s, cpu_id="average", util_percent=20.0 + i)]
        mem += [dict(ts_ns=s, used_bytes=(4 + i) << 30, used_percent=25.0)]
    run = {"run_id": "run-1"}
    return {"system_events": pa.Table.from_pylist([{**run, **r} for r in rows], schema=TABLES["system_events"]),
            "cpu_usage": pa.Table.from_pylist([{**run, **r} for r in cpu], schema=TABLES["cpu_usage"]),
            "host_memory": pa.Table.from_pylist([{**run, **r} for r in mem], schema=TABLES["host_memory"])}


@pytest.fixture(scope="module")
def server(explorer_shared, tmp_path_factory):
    tables = build_tables(seqs=(64,), iterations=3, tiles=2)
    tables.update(system_tables(tables["executions"]))
    path = write_profile(tmp_path_factory.mktemp("system") / "20260104-120000_system", tables)
    eager = tmp_path_factory.mktemp("eager") / "20260104-130000_eager"
    eager.mkdir()
    write_system(eager, 60_000)        # 60,000 events over 63 ms, 85 % of them framework frames
    with Writer(eager, run={"run_id": "capture", "host": "i-synthetic", "pid": 4242},
                metadata={"framework_events_dropped": "1234"}):    # what a window over its bound records
        pass
    with explorer_shared.serving([path, finalize(eager)]) as url:
        yield url


def _tracks(page) -> set[str]:
    return set(page.evaluate("""() => [].concat(...document.querySelector('#system-graph .js-plotly-plot').data
                                       .filter(t => t.type === 'bar').map(t => t.y))"""))


def test_system_trace_tracks_grouping_filter_hover_and_drill_down(server, page):
    page.goto(f"{server}/system?profile=20260104-120000_system")
    page.wait_for_selector("#system-graph .js-plotly-plot")
    page.wait_for_function("() => document.querySelector('#system-status').innerText.includes('events')")
    names = {t["name"] for t in _plot(page, "system-graph")}
    assert {"framework", "neuron_rt", "neuron_hw", "host CPU %", "host memory GB"} <= names
    assert "test/PID:1234/neuron_rt/NC:0" in _tracks(page) and "test/PID:1234/framework/TID:1" in _tracks(page)
    _shot(page, "system")

    page.get_by_text("NeuronCore", exact=True).click()   # grouping mode
    page.wait_for_function("() => [].concat(...document.querySelector('#system-graph .js-plotly-plot').data"
                           ".filter(t => t.type === 'bar').map(t => t.y)).includes('NC:1')")
    assert _tracks(page) == {"NC:0", "NC:1", "host"}

    choose(page, "#system-names", "nc_exec_running")     # event-type filter: executions only
    page.wait_for_function("() => document.querySelector('#system-status').innerText.startsWith('6 events')")
    assert [t["name"] for t in _plot(page, "system-graph") if t["type"] == "bar"] == ["neuron_hw"]

    box = page.locator("#system-graph .barlayer .point path").first.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)                                 # hover names the event and its ids (plotly's drag layer
    page.wait_for_selector("#system-graph .hovertext")    # sits on top, so the mouse, not the element)
    assert "nc_exec_running" in page.text_content("#system-graph .hoverlayer")
    page.mouse.click(x, y)                                # click an execution: its details and device timeline
    page.wait_for_selector("#system-drill")
    assert "neuron_hw" in page.inner_text("#system-details")
    page.click("#system-drill")
    page.wait_for_selector("#timeline-window")
    page.wait_for_function("() => new URL(location.href).searchParams.get('start') !== null")
    assert "/timeline" in page.url and "end=" in page.url


def _bars(page) -> list[dict]:
    """The top subplot's bar traces: source, tracks, and whether they are events or cells."""
    return page.evaluate("""() => document.querySelector('#system-graph .js-plotly-plot').data
        .filter(t => t.type === 'bar')
        .map(t => ({name: t.name, tracks: [...new Set(t.y)], kind: t.customdata[0][6], n: t.y.length}))""")


def _window(page) -> list[float]:
    return page.evaluate("() => document.querySelector('#system-graph .js-plotly-plot')._fullLayout.xaxis.range")


def _status_changed(page, before: str) -> str:
    page.wait_for_function("(b) => { const s = document.querySelector('#system-status').innerText; "
                           "return s && s !== b; }", arg=before)
    return page.inner_text("#system-status")


def test_system_trace_at_size_keeps_runtime_and_device_tracks_and_zooms_and_pans(server, page):
    page.goto(f"{server}/system?profile=20260104-130000_eager")
    page.wait_for_selector("#system-graph .js-plotly-plot")
    page.wait_for_function("() => document.querySelector('#system-status').innerText.includes('events')")
    status = page.inner_text("#system-status")
    assert status.startswith("60,0") and "summarised" in status and "zoom in to see each" in status
    assert "1,234 framework events not recorded" in status
    bars = _bars(page)
    drawn = {b["name"] for b in bars}
    assert drawn == {"framework", "neuron_rt", "neuron_hw"}    # the frames never crowd out the other tracks
    assert {"i-synthetic/PID:4242/neuron_rt/NC:0", "i-synthetic/PID:4242/neuron_hw/NC:0"} <= \
        {t for b in bars for t in b["tracks"]}
    assert all(b["kind"] == "cell" for b in bars)
    _shot(page, "system-lod")

    gd = page.evaluate("""() => { const l = document.querySelector('#system-graph .js-plotly-plot')._fullLayout;
        return {x: l.xaxis._offset, w: l.xaxis._length, y: l.yaxis._offset, h: l.yaxis._length}; }""")
    box = page.locator("#system-graph .js-plotly-plot").bounding_box()
    lo, hi = _window(page)
    x0 = box["x"] + gd["x"] + gd["w"] * 0.50
    y = box["y"] + gd["y"] + gd["h"] * 0.5
    page.mouse.move(x0, y)                                   # drag a box over 1 % of the trace: zoom in
    page.mouse.down()
    page.mouse.move(x0 + gd["w"] * 0.005, y, steps=4)
    page.mouse.move(x0 + gd["w"] * 0.01, y, steps=4)
    page.mouse.up()
    status = _status_changed(page, status)
    a, b = _window(page)
    assert lo < a < b < hi and (b - a) < 0.05 * (hi - lo)
    assert "summarised" not in status and "drawn one by one" in status
    bars = _bars(page)
    assert {b["name"] for b in bars if b["kind"] == "event"} == {"framework", "neuron_rt", "neuron_hw"}
    _shot(page, "system-zoomed")

    page.evaluate("""([a, b]) => Plotly.relayout(document.querySelector('#system-graph .js-plotly-plot'),
                                                  {'xaxis.range': [a + (b - a) / 2, b + (b - a) / 2]})""", [a, b])
    status = _status_changed(page, status)                   # pan right by half a window
    a2, b2 = _window(page)
    assert abs((a2 - a) - (b - a) / 2) < 1e-3 * (b - a) and "drawn one by one" in status
    assert {b["name"] for b in _bars(page) if b["kind"] == "event"} == {"framework", "neuron_rt", "neuron_hw"}

    bar = page.locator("#system-graph .barlayer .trace").last.locator(".point path").first.bounding_box()
    page.mouse.click(bar["x"] + bar["width"] / 2, bar["y"] + bar["height"] / 2)   # an event's details
    page.wait_for_function("() => document.querySelector('#system-details').innerText.includes('PID 4242')")

    page.click("#system-whole")                              # back to every event: summarised again
    status = _status_changed(page, status)
    assert status.startswith("60,0") and "summarised" in status

