"""The System Trace's Dependency Chain Viewer in a real browser (Playwright driving Debian's chromium, as
test_explorer_browser.py): click a device execution and see what it depends on (the framework op's call
stack, the ``nrt_execute`` call, the input copy) and what depends on it (the output copy), drawn on the
timeline with arrows across tracks, each listed with a link that zooms the System Trace to it; click the
framework op and see everything its call caused."""
from __future__ import annotations

import pyarrow as pa
import pytest
from explorer_browser import choose, needs_chromium
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from test_explorer_browser import _shot
from test_explorer_profiles import build_tables, write_profile

from traces.schema import TABLES

pytestmark = needs_chromium
TID = 4321


def chain_events(execs: pa.Table) -> pa.Table:
    """What the recorder writes around each execution, on the program's one thread: a framework step, the
    module call and its Python frame enclosing ``nrt_execute``; the input copy (``nrt_tensor_write`` with the
    driver's ``dmem_buf_copyin`` beneath it), the device run (``nc_exec_running``, sharing the call's flow id)
    and the output copy, all with the execution's id."""
    rows = []
    for i, e in enumerate(sorted(execs.to_pylist(), key=lambda e: e["start_ns"])):
        s, t, x, core = e["start_ns"], e["end_ns"], e["exec_id"], e["core"]
        io = 3_000
        call = dict(thread_id=TID, core=core, exec_id=x)
        rows += [dict(ts_ns=s - 9_000, dur_ns=t - s + 2 * io + 18_000, name=f"step{i}", source="framework",
                      thread_id=TID, detail='{"category": "user_annotation"}'),
                 dict(ts_ns=s - 6_000, dur_ns=t - s + 2 * io + 12_000, name="nn.Module: NeuronModule_0",
                      source="framework", thread_id=TID, detail='{"category": "user_annotation"}'),
                 dict(ts_ns=s - 3_000, dur_ns=t - s + 2 * io + 6_000, name="torch/nn/modules/module.py(1782): "
                      "_call_impl", source="framework", thread_id=TID, detail='{"category": "python_function"}'),
                 dict(ts_ns=s, dur_ns=t - s + 2 * io, name="nrt_execute", source="neuron_rt", flow_id=i, **call),
                 dict(ts_ns=s, dur_ns=io, name="nrt_tensor_write", source="neuron_rt", **call),
                 dict(ts_ns=s, dur_ns=io, name="dmem_buf_copyin", source="neuron_rt", **call),
                 dict(ts_ns=s + io, dur_ns=t - s, name="nc_exec_running", source="neuron_hw", flow_id=i, **call),
                 dict(ts_ns=t + io, dur_ns=io, name="nrt_tensor_read", source="neuron_rt", **call),
                 dict(ts_ns=t + io, dur_ns=io, name="dmem_buf_copyout", source="neuron_rt", **call)]
    return pa.Table.from_pylist([{"run_id": "run-1", **r} for r in rows], schema=TABLES["system_events"])


@pytest.fixture(scope="module")
def server(explorer_shared, tmp_path_factory):
    tables = build_tables(seqs=(64,), iterations=3, tiles=2, cores=1)
    tables["system_events"] = chain_events(tables["executions"])
    path = write_profile(tmp_path_factory.mktemp("chain") / "20260105-120000_chain", tables)
    with explorer_shared.serving([path]) as url:
        yield url


def _chain_trace(page) -> dict:
    """The drawn chain: the outlined events' tracks and names, and the arrows (tail row -> head row)."""
    return page.evaluate("""() => { const g = document.querySelector('#system-graph .js-plotly-plot');
        const t = g.data.find(t => t.type === 'bar' && t.name === 'dependency chain');
        return {names: t ? t.customdata.map(c => c[0]) : [], tracks: t ? t.y : [],
                arrows: (g.layout.shapes || []).filter(s => (s.name || '').startsWith('chain '))
                        .map(s => s.name.slice(6).split('->').map(Number))}; }""")


_FIND = """(name) => { const g = document.querySelector('#system-graph .js-plotly-plot');
    const l = g && g._fullLayout, r = g && g.getBoundingClientRect();
    if (!l || !l.xaxis || !g.data) { return null; }
    for (const t of g.data.filter(t => t.type === 'bar' && t.name !== 'dependency chain' && t.customdata)) {
        const i = t.customdata.findIndex(c => c[0] === name && c[6] === 'event');
        if (i >= 0) { return [r.left + l.xaxis._offset + l.xaxis.l2p(t.base[i] + t.x[i] / 2),
                              r.top + l.yaxis._offset + l.yaxis.l2p(l.yaxis.categoryarray.indexOf(t.y[i]))]; }
    } return null; }"""


_DRAWN = """() => { const g = document.querySelector('#system-graph .js-plotly-plot');
    return {status: document.querySelector('#system-status').innerText,
            names: document.querySelector('#system-names').innerText,
            traces: g && g.data ? g.data.map(t => [t.type, t.name, (t.customdata || []).map(c => [c[0], c[6]])]) : null,
            cats: g && g._fullLayout && g._fullLayout.yaxis ? g._fullLayout.yaxis.categoryarray : null}; }"""


def _click(page, name: str, shows: str) -> None:
    """Click the middle of the first drawn event named ``name`` (plotly's drag layer sits on top: the mouse)
    until ``shows`` appears: under load the graph may still be drawing when it is first clicked."""
    for attempt in range(4):
        try:
            page.wait_for_function(_FIND, arg=name)
        except PlaywrightTimeout:
            raise AssertionError(f"{name} is not drawn: {page.evaluate(_DRAWN)}") from None
        page.wait_for_timeout(300)   # the figure settled
        page.mouse.click(*page.evaluate(_FIND, name))
        try:
            page.wait_for_selector(shows, timeout=8000 * (attempt + 1))
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"clicking {name} never showed {shows}")


def _only(page, name: str, shows: str) -> None:
    """Filter the System Trace to event type ``name``; wait until the status starts with ``shows``."""
    choose(page, "#system-names", name)
    page.wait_for_function("(s) => document.querySelector('#system-status').innerText.startsWith(s)", arg=shows)
    assert page.inner_text("#system-names").split() == [name]


def _rows(page, which: str) -> list[str]:
    return page.eval_on_selector_all(f"#system-chain-{which} tbody tr", "rs => rs.map(r => r.cells[1].innerText)")


def _window(page) -> list[float]:
    return page.evaluate("() => document.querySelector('#system-graph .js-plotly-plot')._fullLayout.xaxis.range")


def test_click_an_execution_shows_its_dependency_chain_and_zooms_to_each(server, page):
    page.goto(f"{server}/system?profile=20260105-120000_chain")
    page.wait_for_selector("#system-graph .js-plotly-plot")
    page.wait_for_function("() => document.querySelector('#system-status').innerText.includes('events')")
    assert "Click an event with dependencies" in page.inner_text("#system-chain-panel")

    _click(page, "nc_exec_running", "#system-chain-upstream")   # the first device run
    assert "nc_exec_running" in page.inner_text("#system-chain-selected")
    assert _rows(page, "upstream") == ["step0", "nn.Module: NeuronModule_0",
                                       "torch/nn/modules/module.py(1782): _call_impl", "nrt_execute",
                                       "nrt_tensor_write", "dmem_buf_copyin"]
    assert _rows(page, "downstream") == ["nrt_tensor_read", "dmem_buf_copyout"]

    page.wait_for_function("() => { const g = document.querySelector('#system-graph .js-plotly-plot');"   # redrawn
                           " return g.data.some(t => t.name === 'dependency chain' && t.y.length === 9); }")
    drawn = _chain_trace(page)
    assert sorted(drawn["names"]) == sorted(["step0", "nn.Module: NeuronModule_0", "torch/nn/modules/module.py"
                                             "(1782): _call_impl", "nrt_execute", "nrt_tensor_write",
                                             "dmem_buf_copyin", "nc_exec_running", "nrt_tensor_read",
                                             "dmem_buf_copyout"])
    rt, hw, fw = (f"test/PID:1234/{s}" for s in ("neuron_rt/NC:0", "neuron_hw/NC:0", f"framework/TID:{TID}"))
    assert {rt, hw, fw} <= set(drawn["tracks"])
    tracks = page.evaluate("() => document.querySelector('#system-graph .js-plotly-plot')._fullLayout.yaxis"
                           ".categoryarray")
    row = {name: i for i, name in enumerate(tracks)}
    # the arrows cross tracks: framework -> runtime call, runtime copy-in -> device run -> runtime copy-out
    assert {(row[fw], row[rt]), (row[rt], row[hw]), (row[hw], row[rt])} <= {tuple(a) for a in drawn["arrows"]}
    _shot(page, "system-chain")

    lo, hi = _window(page)
    page.locator("#system-chain-downstream button").first.click()   # zoom to the output copy
    page.wait_for_function("([lo, hi]) => { const r = document.querySelector('#system-graph .js-plotly-plot')"
                           "._fullLayout.xaxis.range; return r[1] - r[0] < (hi - lo) / 10; }", arg=[lo, hi])
    a, b = _window(page)
    assert b - a <= 10 and _rows(page, "downstream") == ["nrt_tensor_read", "dmem_buf_copyout"]
    assert "nrt_tensor_read" in _chain_trace(page)["names"]   # the chain stays drawn in the new window

    page.get_by_text("NeuronCore", exact=True).click()       # another grouping: the chain on its tracks
    page.wait_for_function("() => [...document.querySelectorAll('#system-chain-downstream tbody tr')]"
                           ".every(r => r.cells[2].innerText === 'NC:0')")
    page.wait_for_function("() => document.querySelector('#system-graph .js-plotly-plot').data"
                           ".some(t => t.name === 'dependency chain' && t.y.includes('NC:0'))")


def test_click_a_framework_op_lists_every_call_it_made(server, page):
    page.goto(f"{server}/system?profile=20260105-120000_chain")
    page.wait_for_selector("#system-graph .js-plotly-plot")
    page.wait_for_function("() => document.querySelector('#system-status').innerText.includes('events')")
    _only(page, "step1", shows="1 events")
    _click(page, "step1", "#system-chain-downstream")
    assert "step1" in page.inner_text("#system-chain-selected")
    assert "No upstream events." in page.inner_text("#system-chain-panel")
    assert _rows(page, "downstream") == ["nrt_execute", "nrt_tensor_write", "dmem_buf_copyin", "nc_exec_running",
                                         "nrt_tensor_read", "dmem_buf_copyout"]
