"""neuron-top driven as a user drives it: Textual's run_test + Pilot over monitor documents shaped
exactly as neuron-monitor's (reference §1.5), checked on the exported screen text."""
from __future__ import annotations

import asyncio
import copy
import threading

import pytest

from top.app import NeuronTop
from top.keymap import KEYMAP
from top.render import NO_PROCESS_MESSAGE
from top.snapshot import History, Totals, build_snapshot
from top.sources import DocumentSource


def runtime_entry(pid, tag, cores, util, flops=1.0e12, recompiles=0, fallbacks=0):
    """One neuron_runtime_data entry in the real schema, plus the neuron_stack group."""
    per_core_mem = {str(c): {"constants": 193986816, "model_code": 176285056, "model_shared_scratchpad": 0,
                             "runtime_memory": 1048576, "tensors": 20971520} for c in cores}
    return {
        "pid": pid, "address": "", "neuron_runtime_tag": tag, "error": "",
        "report": {
            "neuroncore_counters": {"period": 1.0, "error": "", "neuroncores_in_use": {
                str(c): {"neuroncore_utilization": u, "flops": flops} for c, u in zip(cores, util)}},
            "execution_stats": {
                "period": 1.0, "error": "",
                "error_summary": dict.fromkeys(
                    ["generic", "numerical", "transient", "model", "runtime", "hardware"], 0),
                "execution_summary": {"completed": 120, "completed_with_err": 0, "completed_with_num_err": 0,
                                      "timed_out": 0, "incorrect_input": 0, "failed_to_queue": 0},
                "latency_stats": {
                    "total_latency": {p: 0.011 for p in ("p0", "p1", "p25", "p50", "p75", "p99", "p100")},
                    "device_latency": {p: 0.010 for p in ("p0", "p1", "p25", "p50", "p75", "p99", "p100")}}},
            "memory_used": {
                "period": 1.0, "error": "",
                "neuron_runtime_used_bytes": {
                    "host": 6997643264, "neuron_device": 391290880 * len(cores),
                    "usage_breakdown": {
                        "host": {"application_memory": 6996594688, "constants": 0, "dma_buffers": 1048576,
                                 "tensors": 0},
                        "neuroncore_memory_usage": per_core_mem}},
                "loaded_models": [{
                    "name": f"{tag}_neff", "uuid": "91f2f66e83ea419dace1da07617ad39f", "model_id": 10005,
                    "is_running": True,
                    "subgraphs": {"sg_00": {
                        "memory_used_bytes": {"host": 20480, "neuron_device": 21001024, "usage_breakdown": {
                            "host": {"application_memory": 20480, "constants": 0, "dma_buffers": 0, "tensors": 0},
                            "neuron_device": {"constants": 20971520, "model_code": 29504, "runtime_memory": 0,
                                              "tensors": 0}}},
                        "neuroncore_index": cores[0], "neuron_device_index": cores[0] // 2}}}]},
            "neuron_runtime_vcpu_usage": {"period": 1.0, "vcpu_usage": {"user": 42.01, "system": 12.34}, "error": ""},
            "neuron_stack": {
                "period": 1.0, "error": "",
                "engines": {str(c): {"tensor": 12.5, "vector": 3.1, "scalar": 1.0, "gpsimd": 0.2, "sync": 0.1,
                                     "dma": 20.0} for c in cores},
                "recompiles": {"count": recompiles, "last_reason": "tensor 'x' dim 1: 57 -> 64",
                               "last_source": "model.py:88"},
                "cpu_fallbacks": {"count": fallbacks, "last_op": "aten.nonzero.default",
                                  "last_reason": "no device lowering", "last_source": "model.py:12"},
                "compiles": 1, "cache_hits": 0, "cores": list(cores), "command": f"python {tag}.py",
                "target": "trn1"},
        },
    }


def document(*entries):
    return {
        "neuron_runtime_data": list(entries),
        "system_data": {
            "vcpu_usage": {"period": 1.0, "error": "", "context_switch_count": 10, "usage_data": {},
                           "average_usage": {"user": 32.77, "nice": 0, "system": 22.87, "idle": 39.36,
                                             "io_wait": 0, "irq": 0, "soft_irq": 0}},
            "memory_info": {"period": 1.0, "error": "", "memory_total_bytes": 49345835008,
                            "memory_used_bytes": 16042344448, "swap_total_bytes": 0, "swap_used_bytes": 0}},
        "instance_info": {"instance_name": "", "instance_id": "i-0011223344556677a",
                          "instance_type": "trn1.32xlarge", "error": ""},
        "neuron_hardware_info": {"neuron_device_type": "trainium", "neuron_device_version": "v2",
                                 "neuroncore_version": "v2", "neuron_device_count": 16,
                                 "neuron_device_memory_size": 34359738368, "neuroncore_per_device_count": 2,
                                 "logical_neuroncore_config": 1, "error": ""},
    }


TWO_APPS = document(runtime_entry(257726, "my_app_1", [0, 1], [42.01, 63.5], recompiles=1, fallbacks=2),
                    runtime_entry(257999, "257999", [4], [80.0], flops=2.5e12))


def run(app, size, script):
    """Run ``script(pilot)`` against ``app`` at ``size`` and return its result."""
    async def main():
        async with app.run_test(size=size) as pilot:
            await wait_for_frame(pilot)
            return await script(pilot)
    return asyncio.run(main())


async def wait_for_frame(pilot, count=1):
    for _ in range(400):  # bounded: the worker posts a frame every period (0.02 s here)
        if pilot.app.snapshot is not None and pilot.app.frames >= count:
            await pilot.pause()
            return
        await pilot.pause(0.01)
    raise AssertionError("neuron-top never rendered a frame")


def switching(before, after):
    """A document source that shows ``before`` until the returned event is set, then ``after``."""
    gate = threading.Event()

    def docs():
        while not gate.is_set():
            yield before
        yield after
    return DocumentSource(docs()), gate


async def wait_until(pilot, condition):
    """Let the app run until ``condition()`` holds (bounded: 400 pauses of 0.01 s), then settle."""
    for _ in range(400):
        await pilot.pause(0.01)
        if condition():
            break
    await pilot.pause()


async def press(pilot, *keys):
    for key in keys:
        await pilot.press(key)
    await pilot.pause()
    return pilot.app.screen_text()


def repeating(doc, times=2):
    """A few identical refreshes: enough for history, then the source ends and the app idles,
    which keeps Pilot's waits short."""
    return DocumentSource([doc] * times)


def test_real_panels_and_words_80x24():
    async def script(pilot):
        return pilot.app.screen_text()
    text = run(NeuronTop(repeating(TWO_APPS), period=0.02), (80, 24), script)
    assert "running on i-0011223344556677a (trn1.32xlarge)" in text
    assert "neuron-top " in text.splitlines()[0]
    # Avg over the three cores in use: (42.01 + 63.5 + 80) / 3
    assert "NeuronCore v2 Utilization (Avg: 61.84%)" in text
    assert "ND0" in text and "NC0" in text and "NC1" in text
    assert "[ 42.01%]" in text and "[ 63.50%]" in text and "[ 80.00%]" in text
    assert "vCPU Utilization" in text
    assert "System vCPU Usage" in text and "[32.77%, 22.87%]" in text
    # Runtime vCPU on the 'all' tab sums both processes.
    assert "Runtime vCPU Usage" in text and "[84.02%, 24.68%]" in text
    assert "Memory Usage Summary" in text and "Host Used Memory" in text and "Device Used Memory" in text
    assert "Memory Usage Details" in text
    assert "Neuron Apps  >[1]:all<  [2]:my_app_1   [3]:257999" in text
    # Short terminal: idle devices fold into one line, so the whole screen fits 24 rows.
    assert "no cores in use" in text
    assert len(text.rstrip("\n").splitlines()) == 24


def test_memory_summary_units_and_tree_columns_200x60():
    async def script(pilot):
        return await press(pilot, "x")
    text = run(NeuronTop(repeating(TWO_APPS, times=1), period=0.02), (200, 60), script)
    for word in ("Tensors", "Constants", "DMA Buffers", "App. Memory", "Model Code", "Runtime Memory",
                 "Model Scratchpad"):
        assert word in text
    assert "13.0GB" in text      # host total: 2 × 6.5GB, auto-scaled
    assert "Model ID" in text and "Device Memory" in text and "Host Memory" in text
    tree_rows = [line for line in text.splitlines() if "my_app_1_neff" in line]
    assert tree_rows and "10005" in tree_rows[0] and "20.0MB" in tree_rows[0] and "20.0KB" in tree_rows[0]
    # Wide: the extras sit beside the real panels.
    assert "Engines of ND0 NC0 (core 0)" in text and "Utilization history" in text
    assert "Recompiles 1 (+1)  last at model.py:88" in text and "tensor 'x' dim 1: 57 -> 64" in text
    assert "CPU fallbacks 2 (+2)  last at model.py:12" in text
    assert "aten.nonzero.default: no device lowering" in text


def test_tabs_switch_with_a_d_and_digits():
    async def script(pilot):
        screens = {"start": pilot.app.screen_text()}
        screens["d"] = await press(pilot, "d")
        screens["dd"] = await press(pilot, "d")
        screens["ddd"] = await press(pilot, "d")       # wraps to 'all'
        screens["a"] = await press(pilot, "a")         # wraps back to the last tab
        screens["1"] = await press(pilot, "1")
        screens["2"] = await press(pilot, "2")
        screens["9"] = await press(pilot, "9")         # no 9th tab: nothing changes
        return screens
    s = run(NeuronTop(repeating(TWO_APPS), period=0.02), (120, 40), script)
    assert ">[1]:all<" in s["start"]
    assert ">[2]:my_app_1<" in s["d"] and "[ 80.00%]" not in s["d"]
    assert "Avg: 52.75%" in s["d"] and "[42.01%, 12.34%]" in s["d"]
    assert ">[3]:257999<" in s["dd"] and "[ 80.00%]" in s["dd"] and "[ 42.01%]" not in s["dd"]
    assert ">[1]:all<" in s["ddd"]
    assert ">[3]:257999<" in s["a"]
    assert ">[1]:all<" in s["1"]
    assert ">[2]:my_app_1<" in s["2"] and ">[2]:my_app_1<" in s["9"]


def tree_lines(text):
    return [line for line in text.splitlines() if " | " in line and "Model ID" not in line]


def test_tree_enter_and_x_expand_and_collapse():
    async def script(pilot):
        out = {"start": pilot.app.screen_text()}
        out["enter"] = await press(pilot, "enter")          # cursor starts on ND 0: collapse it
        out["enter2"] = await press(pilot, "enter")         # and expand it again
        out["down_enter"] = await press(pilot, "down", "enter")  # expand NC 0
        out["x"] = await press(pilot, "x")                  # expand everything
        out["xx"] = await press(pilot, "x")                 # collapse everything
        return out
    s = run(NeuronTop(repeating(TWO_APPS), period=0.02), (120, 60), script)
    start = tree_lines(s["start"])
    assert any("[-] ND 0" in line for line in start) and any("[+] NC 0" in line for line in start)
    assert not any("ND 0" in l and "[-]" in l for l in tree_lines(s["enter"]))
    assert any("[+] ND 0" in line for line in tree_lines(s["enter"]))
    assert tree_lines(s["enter2"]) == start
    expanded_nc0 = tree_lines(s["down_enter"])
    assert any("[-] NC 0" in line for line in expanded_nc0)
    assert any("my_app_1_neff" in line for line in expanded_nc0)
    everything = tree_lines(s["x"])
    assert sum("Model Scratchpad" in line for line in everything) >= 3
    assert all("[+]" not in line for line in everything)
    collapsed = tree_lines(s["xx"])
    assert collapsed and all("[-]" not in line for line in collapsed)


def test_tree_parents_are_the_sum_of_their_children():
    snap = build_snapshot(TWO_APPS)

    def check(node):
        if node.children:
            assert node.device_bytes == sum(c.device_bytes for c in node.children)
            assert node.host_bytes == sum(c.host_bytes for c in node.children)
            for child in node.children:
                check(child)
    tree = snap.apps[0].memory_tree
    assert [n.label for n in tree] == ["ND 0", "ND 2"]
    for node in tree:
        check(node)
    # Device total in the tree = what the process reported per core.
    assert sum(n.device_bytes for n in tree) == 3 * (193986816 + 176285056 + 1048576 + 20971520)
    nc0 = tree[0].children[0]
    model = [c for c in nc0.children if c.model_id == "10005"][0]
    assert model.device_bytes == 20971520 + 29504 and model.host_bytes == 20480


def test_memory_tree_is_kept_while_memory_is_the_same_and_follows_a_change():
    history, totals = History(), Totals()
    first = build_snapshot(TWO_APPS, history, totals)
    again = build_snapshot(copy.deepcopy(TWO_APPS), history, totals)   # a new document, the same memory
    assert [a.memory_tree for a in again.apps] == [a.memory_tree for a in first.apps]
    assert all(b.memory_tree is a.memory_tree for a, b in zip(first.apps, again.apps))
    changed = copy.deepcopy(TWO_APPS)
    usage = changed["neuron_runtime_data"][1]["report"]["memory_used"]["neuron_runtime_used_bytes"]
    usage["usage_breakdown"]["neuroncore_memory_usage"]["4"]["tensors"] += 1 << 20
    after = build_snapshot(changed, history, totals)
    assert after.apps[0].memory_tree == build_snapshot(changed).apps[0].memory_tree != first.apps[0].memory_tree
    assert after.apps[1].memory_tree is first.apps[1].memory_tree   # the other process's tree is unchanged
    assert after.apps[2].memory_tree == build_snapshot(changed).apps[2].memory_tree


def test_f_toggles_tflops():
    async def script(pilot):
        return pilot.app.screen_text(), await press(pilot, "f"), await press(pilot, "f")
    before, flops, back = run(NeuronTop(repeating(TWO_APPS), period=0.02), (100, 30), script)
    assert "Avg:" in before and "TFLOPS" not in before
    assert "NeuronCore v2 Utilization (Total: 4.50 TFLOPS)" in flops
    assert "[  1.00TF]" in flops and "[  2.50TF]" in flops and "[ 42.01%]" not in flops
    assert back == before or "Avg:" in back


def test_help_screen_lists_every_binding_of_the_keymap():
    async def script(pilot):
        shown = await press(pilot, "question_mark")
        state_before = pilot.app.state
        await press(pilot, "d", "f")             # the main screen must not change behind help
        unchanged = pilot.app.state == state_before
        closed = await press(pilot, "escape")
        again = await press(pilot, "h")
        return shown, unchanged, closed, again
    shown, unchanged, closed, again = run(NeuronTop(repeating(TWO_APPS), period=0.02), (120, 40), script)
    for row in KEYMAP:
        assert row.display in shown and row.description in shown, row
    assert unchanged
    assert "neuron-top keys" not in closed and "neuron-top keys" in again


@pytest.mark.parametrize("size", [(80, 24), (200, 60), (160, 48), (40, 12), (120, 30)])
def test_sizes_render_without_error(size):
    async def script(pilot):
        screens = [pilot.app.screen_text()]
        for keys in (("x",), ("f",), ("e",), ("d", "down", "enter"), ("e", "question_mark")):
            screens.append(await press(pilot, *keys))
        return screens
    screens = run(NeuronTop(repeating(TWO_APPS), period=0.02), size, script)
    for text in screens:
        lines = text.rstrip("\n").splitlines()
        assert len(lines) == size[1] and all(len(line) <= size[0] for line in lines)
    assert "neuron-top" in screens[0]


def test_small_terminal_swaps_extras_for_the_tree_with_e():
    async def script(pilot):
        return pilot.app.screen_text(), await press(pilot, "e")
    real, extras = run(NeuronTop(repeating(TWO_APPS), period=0.02), (80, 24), script)
    assert "Memory Usage Details" in real and "Engines of" not in real
    assert "Engines of ND0 NC0 (core 0)" in extras and "Tensor" in extras and "12.50%" in extras


def test_engine_panel_follows_the_tree_selection():
    async def script(pilot):
        await press(pilot, "3")                     # the process on core 4 (ND2 NC0)
        return await press(pilot, "down")
    text = run(NeuronTop(repeating(TWO_APPS), period=0.02), (200, 50), script)
    assert "Engines of ND2 NC0 (core 4)" in text


def test_no_color_keeps_everything_readable(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")

    async def script(pilot):
        return pilot.app.no_color, pilot.app.screen_text()
    no_color, text = run(NeuronTop(repeating(TWO_APPS), period=0.02), (100, 30), script)
    assert no_color
    assert "[ 42.01%]" in text and ">[1]:all<" in text and "█" in text and "[-] ND 0" in text


def test_no_process_message_then_keeps_watching():
    source, gate = switching(document(), TWO_APPS)

    async def script(pilot):
        first = pilot.app.screen_text()
        gate.set()
        await wait_until(pilot, lambda: pilot.app.snapshot.has_processes)
        return first, pilot.app.screen_text()
    first, later = run(NeuronTop(source, period=0.02), (80, 24), script)
    assert NO_PROCESS_MESSAGE in first and "Neuron Apps  >[1]:all<" in first
    assert NO_PROCESS_MESSAGE not in later and "[2]:my_app_1" in later


def test_selected_tab_falls_back_to_all_when_its_process_exits():
    source, gate = switching(TWO_APPS, document(runtime_entry(257726, "my_app_1", [0, 1], [42.01, 63.5])))

    async def script(pilot):
        await press(pilot, "3")
        chosen = pilot.app.screen_text()
        gate.set()
        await wait_until(pilot, lambda: len(pilot.app.snapshot.apps) == 2)
        return chosen, pilot.app.screen_text()
    chosen, after = run(NeuronTop(source, period=0.02), (100, 30), script)
    assert ">[3]:257999<" in chosen
    assert ">[1]:all<" in after and "257999" not in after


def test_screen_stays_responsive_while_data_is_slow():
    release = threading.Event()

    class SlowSource(DocumentSource):
        def next_document(self):
            release.wait(30)           # a collector stuck on a slow filesystem
            return super().next_document()

    async def main():
        app = NeuronTop(SlowSource([TWO_APPS]), period=0.02)
        async with app.run_test(size=(100, 30)) as pilot:
            waiting = await press(pilot, "f")
            flops_mode = app.state.flops
            helped = await press(pilot, "question_mark")
            await press(pilot, "escape")
            release.set()
            await wait_for_frame(pilot)
            return waiting, flops_mode, helped
    waiting, flops_mode, helped = asyncio.run(main())
    assert "waiting for the first report" in waiting
    assert flops_mode and "neuron-top keys" in helped


def test_a_failing_source_is_reported_and_retried():
    healed = threading.Event()
    calls = []

    class Flaky(DocumentSource):
        def next_document(self):
            calls.append(1)
            if not healed.is_set():
                raise OSError("live directory /tmp/x unreadable")
            return super().next_document()

    async def main():
        app = NeuronTop(Flaky([TWO_APPS]), period=0.02)
        async with app.run_test(size=(100, 30)) as pilot:
            for _ in range(400):
                if len(calls) >= 2:     # it failed, and it tried again
                    break
                await pilot.pause(0.01)
            await pilot.pause()
            failed = app.screen_text()
            healed.set()
            await wait_for_frame(pilot)
            return failed, app.screen_text()
    failed, recovered = asyncio.run(main())
    assert "error: live directory /tmp/x unreadable (retrying every 0.02s)" in failed
    assert "[ 42.01%]" in recovered


def _record_requests(monkeypatch) -> list:
    """traces.attach.request, recorded: the documents' pids are not running processes of ours."""
    import traces.attach
    calls = []
    monkeypatch.setattr(traces.attach, "request",
                        lambda pid, out, seconds, **kw: calls.append((pid, str(out), seconds)))
    return calls


def test_capture_key_attaches_to_the_selected_process(tmp_path, monkeypatch):
    calls = _record_requests(monkeypatch)
    source = repeating(TWO_APPS)
    source.live = True   # documents of running processes: capture applies

    async def script(pilot):
        await press(pilot, "3", "c")
        return pilot.app.screen_text()
    monkeypatch.chdir(tmp_path)   # the default capture directory is relative to where you are
    text = run(NeuronTop(source, period=0.02, capture_seconds=3), (200, 40), script)
    [(pid, out, seconds)] = calls
    assert pid == 257999 and seconds == 3.0
    assert out.startswith(str(tmp_path / "output" / "neuron-top-captures" / "257999_257999_"))
    assert f"capture → {out}" in text


def test_capture_key_says_why_an_attach_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_STACK_LIVE_DIR", str(tmp_path / "live"))
    source = repeating(TWO_APPS)
    source.live = True

    async def script(pilot):
        await press(pilot, "3", "c")
        await pilot.pause()
        return [n.message for n in pilot.app._notifications]
    notes = run(NeuronTop(source, period=0.02, capture_dir=tmp_path), (200, 40), script)
    assert any(m.startswith("process 257999 is not running") for m in notes), notes


def test_capture_on_all_tab_picks_the_process_of_the_selected_core(tmp_path, monkeypatch):
    calls = _record_requests(monkeypatch)
    source = repeating(TWO_APPS)
    source.live = True

    async def script(pilot):
        await press(pilot, "c")
    run(NeuronTop(source, period=0.02, capture_dir=tmp_path), (120, 40), script)
    assert [c[0] for c in calls] == [257726]


def test_history_and_totals_accumulate_over_refreshes():
    history, totals = History(), Totals()
    doc = copy.deepcopy(TWO_APPS)
    for _ in range(3):
        snap = build_snapshot(doc, history, totals)
    assert snap.history[("all", 0)] == (42.01, 42.01, 42.01)
    assert snap.history[("my_app_1", 1)] == (63.5, 63.5, 63.5)
    proc = snap.apps[1].processes[0]
    assert proc.recompiles.count == 3 and proc.recompiles.recent == 1
    assert proc.fallbacks.count == 6 and proc.completed == 360
    assert proc.executions_per_s == 120.0


def _leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, path + (i,))
    else:
        yield path


LEAVES = list(_leaves(TWO_APPS))


def test_any_snapshot_that_builds_also_renders_at_any_width():
    """Foreign or hand-edited documents: either the worker reports them as an error, or every panel
    renders them (NaN, negatives, huge numbers, wrong types), so the UI thread never fails."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from top import render
    from top.render import ViewState

    values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**20, 10**20),
                       st.text(max_size=5), st.none(), st.booleans())

    @settings(max_examples=80, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from(LEAVES), values), max_size=6),
           st.integers(10, 250), st.integers(0, 3), st.booleans())
    def check(mutations, width, tab, flops):
        doc = copy.deepcopy(TWO_APPS)
        for path, value in mutations:
            node = doc
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
        try:
            snap = build_snapshot(doc, History(), Totals())
        except Exception:
            return   # the poll worker catches every failure to build and shows it on the status line
        state = ViewState(tab=tab, flops=flops, grid_rows=5)
        for body in (render.utilization_body, render.vcpu_body, render.memory_summary_body,
                     render.engine_body, render.history_body, render.counters_body):
            body(snap, state, width)
        render.tab_bar(snap, tab)
        for node in snap.app(tab).memory_tree:
            render.tree_label(node, width, 1, 3)
    check()


def test_resizing_relayouts_without_error():
    async def script(pilot):
        screens = []
        for size in ((200, 60), (80, 24), (150, 30), (60, 20), (120, 50)):
            await pilot.resize_terminal(*size)
            await pilot.pause()
            screens.append((size, pilot.app.screen_text()))
        return screens
    for (w, h), text in run(NeuronTop(repeating(TWO_APPS), period=0.02), (100, 30), script):
        lines = text.rstrip("\n").splitlines()
        assert len(lines) == h and all(len(line) <= w for line in lines)
        assert "Neuron Apps" in text and "NeuronCore v2 Utilization" in text
        # Wide: extras beside the real panels; narrow: the real layout only.
        assert ("Engines of ND0 NC0" in text) == (w >= 150)


def test_groups_left_out_by_a_config_show_as_not_reported():
    doc = copy.deepcopy(TWO_APPS)
    for entry in doc["neuron_runtime_data"]:
        del entry["report"]["neuron_stack"], entry["report"]["neuron_runtime_vcpu_usage"]
    del doc["system_data"]["vcpu_usage"]

    async def script(pilot):
        return await press(pilot, "d")
    text = run(NeuronTop(repeating(doc), period=0.02), (200, 50), script)
    assert "System vCPU Usage   n/a" in text and "Runtime vCPU Usage  n/a" in text
    assert "no engine data (monitor's neuron_stack group is off)" in text
    assert "recompiles, CPU fallbacks: not reported" in text and "Recompiles 0" not in text
    assert "[ 42.01%]" in text   # the groups that are there still show


def test_selected_tab_follows_its_process_when_others_exit():
    later = document(runtime_entry(257999, "257999", [4], [80.0], flops=2.5e12))   # my_app_1 exited
    source, gate = switching(TWO_APPS, later)

    async def script(pilot):
        await press(pilot, "3")
        gate.set()
        await wait_until(pilot, lambda: len(pilot.app.snapshot.apps) == 2)
        return pilot.app.screen_text()
    after = run(NeuronTop(source, period=0.02), (100, 30), script)
    assert ">[2]:257999<" in after and "[ 80.00%]" in after


def test_many_processes_keep_the_selected_tab_visible_at_80_columns():
    doc = document(*[runtime_entry(3000 + i, f"worker_{i:02d}", [i], [10.0 + i]) for i in range(16)])

    async def script(pilot):
        return pilot.app.screen_text(), await press(pilot, "9"), await press(pilot, "a")
    first, ninth, eighth = run(NeuronTop(repeating(doc), period=0.02), (80, 24), script)
    tabs = [line for line in (first + ninth + eighth).splitlines() if "Neuron Apps" in line]
    assert ">[1]:all<" in tabs[0] and tabs[0].rstrip().endswith("…")
    assert ">[9]:worker_07<" in tabs[1] and "Neuron Apps  …" in tabs[1]
    assert ">[8]:worker_06<" in tabs[2]
    assert all(len(t) <= 80 for t in tabs)


def test_f_mode_scales_small_flops_to_g_and_m():
    doc = document(runtime_entry(257726, "my_app_1", [0, 1], [42.01, 63.5], flops=3.2e8),
                   runtime_entry(257999, "257999", [4], [80.0], flops=2.5e9))

    async def script(pilot):
        return await press(pilot, "f")
    flops = run(NeuronTop(repeating(doc), period=0.02), (100, 30), script)
    assert "[320.00MF]" in flops and "[  2.50GF]" in flops   # was "[  0.00TF]" for a working core
    assert "Utilization (Total: 3.14 GFLOPS)" in flops


def test_engines_panel_shows_dma_and_sync_at_80x24():
    async def script(pilot):
        return await press(pilot, "e")
    extras = run(NeuronTop(repeating(TWO_APPS), period=0.02), (80, 24), script)
    assert "DMA" in extras and "20.00%" in extras and "Sync" in extras


def test_a_refresh_repaints_only_the_rows_that_changed():
    """One core's utilization changes: its panel repaints those rows alone (not the panel), unchanged panels
    nothing, and the screen shows the new figure, not the old one."""
    from top.widgets import Panel

    after = document(runtime_entry(257726, "my_app_1", [0, 1], [42.01, 87.25], recompiles=1, fallbacks=2),
                     runtime_entry(257999, "257999", [4], [80.0], flops=2.5e12))
    source, gate = switching(TWO_APPS, after)
    app = NeuronTop(source, period=0.02)

    async def script(pilot):
        await wait_for_frame(pilot, 3)
        panel = app.query_one("#utilization", Panel)
        calls = []
        original = Panel.refresh

        def spy(self, *regions, **kw):
            calls.append((self.id, regions, kw))
            return original(self, *regions, **kw)
        Panel.refresh = spy
        try:
            gate.set()
            await wait_until(pilot, lambda: any(c[0] == "utilization" for c in calls))
        finally:
            Panel.refresh = original
        rows = [r for pid, regions, kw in calls if pid == "utilization" for r in regions]
        assert rows and all(r.height == 1 for r in rows), calls
        assert len({r.y for r in rows}) < len(panel._last_lines)
        assert not any(pid == "memory_summary" for pid, _, _ in calls)
        return app.screen_text()

    screen = run(app, (200, 60), script)
    assert "87.2" in screen and "63.5" not in screen


@pytest.mark.parametrize("width", [30, 76, 116])
def test_panel_rows_are_drawn_as_rich_renders_them(width):
    """neuron-top splits and draws panel rows itself (cheaper): the same rows, cells, styles and offsets as rich."""
    from rich.console import Console
    from rich.style import Style

    from top import render
    from top.widgets import _lines, _strip
    console, base = Console(), Style(color="white", bgcolor="black")

    def cells(segments):
        out, x = [], 0
        for text, style in segments:
            plain = (style or Style()).copy().clear_meta_and_links()
            offset = style.meta.get("offset") if style else None
            out += [(ch, str(plain), (offset[0] + i, offset[1]) if offset else (x + i, None))
                    for i, ch in enumerate(text)]
            x += len(text)
        return out

    snaps = [build_snapshot(TWO_APPS), build_snapshot(document())]
    states = [render.ViewState(), render.ViewState(flops=True, tab=1, compact=True)]
    for snap in snaps:
        for state in states:
            for body in (render.utilization_body, render.vcpu_body, render.memory_summary_body, render.engine_body,
                         render.history_body, render.counters_body):
                text = body(snap, state, width)[1]
                rows = _lines(text)
                assert [(r.plain, r.spans, r.style) for r in rows] == \
                    [(r.plain, r.spans, r.style) for r in text.split("\n", allow_blank=True)]
                for y, row in enumerate(rows):
                    clipped = row.copy()
                    clipped.truncate(width, overflow="ellipsis")
                    expected = [(t, base + s if s else base) for t, s, _ in clipped.render(console)]
                    expected.append((" " * (width - clipped.cell_len), base))
                    got = cells((s.text, s.style) for s in _strip(row, width, base, console, y))
                    assert [(ch, st) for ch, st, _ in got] == [(ch, st) for ch, st, _ in cells(expected)]
                    assert [o for _, _, o in got] == [(x, y) for x in range(len(got))]
