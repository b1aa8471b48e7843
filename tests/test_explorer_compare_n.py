"""N-way comparison (issue 39, item 1): any number of profiles against a chosen base, the structural diff
computed once in traces (``traces.q_compare``), stacked timelines that zoom together, ``diff A B C``."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_explorer_app import triggered
from test_explorer_profiles import make_profile

from explorer import data
from explorer.app import create_app
from traces import q_compare

KEYS = ("20260101_mlp", "20260102_mlp", "20260103_mlp")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    return [make_profile(root / KEYS[0]), make_profile(root / KEYS[1], seqs=(64, 128), iterations=4),
            make_profile(root / KEYS[2], seqs=(64,), iterations=2)]


@pytest.fixture(scope="module")
def app(paths):
    app = create_app(paths)
    yield app
    data.registry().close()


def test_the_structure_is_the_explorers_line_and_op_totals(app):
    L = data.resolve(KEYS[0])
    s = q_compare.structure(L.profile)
    for t in data.line_totals(L, include_warmup=True).values():   # one number: each line over every execution
        key = q_compare.line_key(t["file"], t["line"])
        assert s["lines"][key]["ns"] == t["device_ns"] + t["host_ns"]
    assert sum(v["ns"] for v in s["ops"].values()) == sum(
        t["device_ns"] + t["host_ns"] for t in data.op_totals(L, include_warmup=True).values())


def test_three_profiles_against_a_chosen_base(app):
    Ls = [data.resolve(k) for k in KEYS]
    c = data.compare_n(Ls, base=1)
    assert c["keys"] == list(KEYS) and c["base"] == 1
    row = next(r for r in c["by_line"] if r["line"] == "model.py:15")
    assert row["delta_ns"][1] == 0 and row["delta_ns"][0] == row["ns"][0] - row["ns"][1]
    assert row["delta_ns"][2] == row["ns"][2] - row["ns"][1] and all(row["present"])
    assert c["totals"]["recompiles"]["values"] == [3, 1, 0]
    # the two-profile answer is the N-way one with A as the base
    two = data.compare(Ls[0], Ls[1])
    r2 = next(r for r in two["by_line"] if r["line"] == "model.py:15")
    n2 = next(r for r in data.compare_n(Ls[:2], 0)["by_line"] if r["line"] == "model.py:15")
    assert (r2["a_ns"], r2["b_ns"], r2["delta_ns"]) == (n2["ns"][0], n2["ns"][1], n2["delta_ns"][1])


def test_the_page_stacks_synchronised_timelines(app):
    from explorer.pages import compare

    page = compare.layout(keys=",".join(KEYS), base=KEYS[2])
    text = str(page)
    assert "Compare 3 profiles" in text and "(base)" in text and "compare-lines" in text
    figs = compare._figures(list(KEYS), None)
    assert len(figs) == 3 and len({tuple(f["layout"]["xaxis"]["range"]) for f in figs}) == 1
    # zoom one: all three move to the same span after their first busy execution
    relayout = [None, {"xaxis.range[0]": 5.0, "xaxis.range[1]": 25.0}, None]
    out, state = triggered(json.dumps({"i": 1, "type": "compare-tl"}, separators=(",", ":")) + ".relayoutData",
                           compare.synchronise, relayout, {"keys": list(KEYS), "window": None})
    assert state["window"] == (5000, 25000)
    assert all(f["layout"]["xaxis"]["range"] == pytest.approx([5.0, 25.0]) for f in out)
    # a bad key is one line
    assert "unknown profile" in str(compare.layout(keys="nope,20260101_mlp"))


def test_diff_takes_n_profiles(paths):
    run = subprocess.run([sys.executable, "-m", "explorer.cli", "diff", *map(str, paths), "--base", "2", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    c = json.loads(run.stdout)
    assert c["base"] == 1 and len(c["paths"]) == 3 and c["totals"]["recompiles"]["delta"] == [2, 0, -1]
    text = subprocess.run([sys.executable, "-m", "explorer.cli", "diff", *map(str, paths)], capture_output=True,
                          text=True, timeout=120)
    assert text.returncode == 0 and "(base)" in text.stdout and "By source line (Δ against A)" in text.stdout
    bad = subprocess.run([sys.executable, "-m", "explorer.cli", "diff", *map(str, paths), "--base", "4"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--base 4: pick 1 to 3" in bad.stderr and "Traceback" not in bad.stderr
