"""The timeline's Current Selection and annotations (issue 39, item 2): the Summary's figures over a
selected range from the same ``Profile.figures``, and notes stored in the profile that travel with it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from test_explorer_app import triggered
from test_explorer_profiles import make_profile

import traces
from explorer import data, selection
from explorer.app import create_app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("sel")
    app = create_app([make_profile(root / "20260101_mlp")])
    yield app
    data.registry().close()


def test_the_selection_figures_are_the_summarys(app):
    L = data.resolve("20260101_mlp")
    whole = selection.figures(L, 0, data.bounds(L)["span"]).as_dict()
    assert whole == L.profile.figures().as_dict()          # the same function: the whole session agrees
    a, b = data.bounds(L)["fit"]
    part = selection.figures(L, a, b)
    full = L.profile.figures()
    assert 0 < part.executions < full.executions and 0 < part.device_ns < full.device_ns
    assert part.mfu_percent > 0 and part.hbm_read_bytes < full.hbm_read_bytes
    # the panel shows those figures, MFU and MBU with the Summary's formatting
    text = str(selection.panel("20260101_mlp", a, b, "Figures"))
    assert f"{part.mfu_percent:.2f}%" in text and f"{part.mbu_percent:.2f}%" in text
    assert "Tensor" in text and "model.py:" in text


def test_a_range_cutting_an_execution_counts_the_part_inside(app):
    """Figures over an arbitrary range clip instructions to it, their FLOPs and bytes pro rata: two ranges
    that split the session inside an execution add up to the Summary's totals, and each holds a part of it."""
    p = data.resolve("20260101_mlp").profile
    whole = p.summary()
    lo, hi = p.sql("SELECT min(start_ns), max(end_ns) FROM executions").to_pylist()[0].values()
    x0, x1 = p.sql("SELECT start_ns, end_ns FROM executions WHERE NOT coalesce(warmup, FALSE) "
                   "ORDER BY start_ns LIMIT 1").to_pylist()[0].values()
    cut = x0 + (x1 - x0) // 3   # a third of the way into a measured execution
    left, right = p.summary(window=(lo, cut)), p.summary(window=(cut, hi))
    assert left["execution_count"] + right["execution_count"] == whole["execution_count"] + 1   # cut in two
    for k in ("total_time", "model_flops", "hbm_read_bytes", "hbm_write_bytes", "tensor_engine_instruction_time",
              "dma_active_time", "hardware_flops"):
        assert left[k] + right[k] == pytest.approx(whole[k], rel=1e-9, abs=2), k
        assert 0 < left[k] < whole[k], k
    f = p.figures(window=(x0, cut))   # one execution, a third of it
    assert f.executions == 1 and 0 < f.device_ns < (x1 - x0) // 2 and f.mfu_percent > 0 and f.hbm_read_bytes > 0


def test_annotations_are_stored_in_the_profile_and_shown_by_summary(app, tmp_path):
    from explorer.pages import timeline

    key = "20260101_mlp"
    fig, state, *_ = timeline.render(key)
    a, b = state["start"], state["end"]
    brushed = {"points": [], "range": {"x": [a / 1e3, b / 1e3]}}
    out = triggered("timeline-note-add.n_clicks", timeline.notes, 1, None, "slow all-reduce", brushed, None, None,
                    state)
    assert out[1] == "added a range note" and "slow all-reduce" in str(out[0])
    assert any(x["text"] == "✎ slow all-reduce" for x in out[2]["layout"]["annotations"])
    click = {"points": [{"customdata": [0, "tensor", a + 10, 0, 1]}]}
    out = triggered("timeline-note-add.n_clicks", timeline.notes, 2, None, "step starts", None, click, None, state)
    assert out[1] == "added a point note"
    bad = triggered("timeline-note-add.n_clicks", timeline.notes, 3, None, "two\nlines", None, None, None, state)
    assert "printable characters on one line" in bad[1]
    # in the profile file: it travels with it (copy it, open the copy)
    path = data.registry().entries[key].path
    copy = tmp_path / "copy.duckdb"
    shutil.copy(path, copy)
    with traces.open(copy) as p:
        notes = p.annotations()
        t0 = p.timeline_bounds().t0
    assert [(n["kind"], n["text"]) for n in notes] == [("range", "slow all-reduce"), ("point", "step starts")]
    assert (notes[0]["start_ns"] - t0, notes[0]["end_ns"] - t0) == (a, b) and notes[1]["start_ns"] - t0 == a + 10
    # neuron-explorer summary lists them (text and JSON)
    run = subprocess.run([sys.executable, "-m", "explorer.cli", "summary", str(copy)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "annotation 1 at" in run.stdout and "slow all-reduce" in run.stdout
    js = subprocess.run([sys.executable, "-m", "explorer.cli", "summary", "--json", str(copy)],
                        capture_output=True, text=True, timeout=120)
    assert [n["text"] for n in json.loads(js.stdout)["annotations"]] == ["slow all-reduce", "step starts"]
    # delete asks first, then removes it from the profile
    ask = triggered(json.dumps({"id": notes[1]["id"], "type": "timeline-note-del"}, separators=(",", ":"))
                    + ".n_clicks", timeline.ask_delete, [0, 1])
    assert ask[0] is True and ask[2] == notes[1]["id"]
    out = triggered("timeline-note-confirm.submit_n_clicks", timeline.notes, 2, 1, "", None, None, ask[2], state)
    assert out[1] == "deleted"
    assert [n["text"] for n in data.resolve(key).profile.annotations()] == ["slow all-reduce"]
