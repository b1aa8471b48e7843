"""The Source page's ``view --framework-source-root DIR`` (the current files under DIR, and files the profile
names but does not embed) and its multi-line select (a range of lines: the sums of their device and host
time, and the window their instructions cover), driven through the page's layout and callback as a click
does, and the flag as a user types it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_explorer_app import triggered
from test_explorer_profiles import MODEL_FILE, MODEL_TEXT, build_tables, make_profile, write_profile

from explorer import data, sources
from explorer.app import create_app
from explorer.figures import fmt_ns

KEY, BARE = "20260101_mlp", "20260103_bare"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    tables = build_tables()
    tables["source_files"] = tables["source_files"].slice(0, 0)     # a profile that embeds no text
    app = create_app([make_profile(root / KEY), write_profile(root / BARE, tables)])
    yield app
    sources.set_root(None)
    data.registry().close()


@pytest.fixture
def source_root(tmp_path):
    """DIR/project/model.py: the user's current copy, one comment line longer than the recorded text."""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "model.py").write_text(MODEL_TEXT + "# edited after the run\n")
    yield sources.set_root(tmp_path)
    sources.set_root(None)


def test_source_root_shows_the_current_file_and_files_the_profile_does_not_embed(app, source_root):
    from explorer.pages import source

    page = source.layout(profile=KEY)
    assert f"text from {source_root / 'project' / 'model.py'}" in str(page)
    assert "# edited after the run" in str(page)                  # the file on disk, not the embedded text
    bare = source.layout(profile=BARE)                             # no text in the profile: read from DIR
    assert "self.fc2(h)" in str(bare) and "embeds no source files" not in str(bare)
    sources.set_root(None)
    assert "embeds no source files" in str(source.layout(profile=BARE))
    assert "text from the profile" in str(source.layout(profile=KEY))


def test_source_root_never_leaves_the_directory(tmp_path):
    (tmp_path / "model.py").write_text("x = 1\n")
    assert sources.resolve("/elsewhere/model.py", tmp_path) == tmp_path / "model.py"
    assert sources.resolve("/home/../../etc/passwd", tmp_path) is None
    with pytest.raises(data.ExplorerError, match="no such directory"):
        sources.set_root(tmp_path / "nope")


def test_framework_source_root_flag_bad_directory_is_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "explorer.cli", "view", str(tmp_path / "x.duckdb"),
                          "--framework-source-root", str(tmp_path / "nope")], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0 and "--framework-source-root" in run.stderr and "no such directory" in run.stderr
    assert "Traceback" not in run.stderr


def _click(source, sid, state, mode, outputs):
    prop = json.dumps({"sid": sid, "type": "source-line"}, separators=(",", ":")) + ".n_clicks"
    return triggered(prop, source.pick_line, [1] * len(outputs), state, mode,
                     outputs_list=[{}, outputs, {}, {}])


def test_range_select_sums_the_lines_and_frames_their_window(app):
    from explorer.pages import source

    L = data.resolve(KEY)
    by_line = {t["line"]: t for t in data.line_totals(L).values() if t["file"] == MODEL_FILE}
    outputs = [{"id": {"type": "source-line", "sid": str(t["source_id"])}, "property": "className"}
               for t in by_line.values()]
    first, last = str(by_line[13]["source_id"]), str(by_line[16]["source_id"])
    _panel, _classes, state, _url = _click(source, first, {"profile": KEY}, [], outputs)
    panel, classes, state2, url = _click(source, last, state, ["range"], outputs)
    assert url == {"lines": f"{first}..{last}", "line": None, "file": None} and state2["line"] == first
    picked = [by_line[n] for n in (13, 14, 15, 16)]
    assert classes.count("src-line hot selected") == len(picked)
    device, host = sum(t["device_ns"] for t in picked), sum(t["host_ns"] for t in picked)
    assert device > 0 and host > 0                                  # line 16 falls back to the CPU
    text = str(panel)
    assert "lines model.py:13-16" in text and f"{fmt_ns(device)} device time" in text
    assert f"{fmt_ns(host)} host time" in text
    # the window: from the first to the last instruction of these lines' ops in the measured executions
    r = data.line_range(L, f"lines:{first}..{last}")
    ops = data.selection_ops(L, f"lines:{first}..{last}")
    t0 = data.bounds(L)["t0"]
    spans = L.profile.sql("""SELECT min(i.start_ns) AS a, max(i.start_ns + i.dur_ns) AS b FROM instructions i
                             JOIN executions x USING (exec_id) WHERE NOT coalesce(x.warmup, FALSE)
                             AND list_contains($ids, i.op_id)""", {"ids": sorted(ops)}).to_pylist()[0]
    assert r["window"] == (spans["a"] - t0, spans["b"] - t0)
    assert f"start={r['window'][0]}" in text and "sel=lines" in text
    # the link opens the range: its lines marked, the same sums
    page = str(source.layout(profile=KEY, lines=f"{first}..{last}"))
    assert page.count("src-line hot selected") == len(picked) and f"{fmt_ns(device)} device time" in page


def test_a_range_of_unknown_lines_is_one_line(app):
    from explorer.pages import source

    L = data.resolve(KEY)
    sid = next(t["source_id"] for t in data.line_totals(L).values() if t["line"] == 13)
    assert "no recorded source line with id 1" in str(source.layout(profile=KEY, lines="1..2"))
    assert "both ends must be recorded lines" in str(source.layout(profile=KEY, lines=f"{sid}..2"))
    with pytest.raises(data.ExplorerError, match="lines:<source_id>..<source_id>"):
        data.line_range(data.resolve(KEY), "lines:12")
