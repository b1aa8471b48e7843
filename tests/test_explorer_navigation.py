"""Getting around the timeline (issue 39, item 9): a click on an execution, compile or fallback zooms to it,
a selection opens on its graph's executions, empty lanes fold away, and every link between pages lands on
data (a recompile's call site, inputs named as the user named them)."""
from __future__ import annotations

import pyarrow as pa
import pytest
from test_explorer_app import triggered
from test_explorer_profiles import build_tables, make_profile, write_profile

from explorer import data
from explorer import timeline as tline
from explorer.app import create_app
from traces.q_timeline import FIT_MARGIN


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("nav")
    tables = build_tables()
    # the runtime records input shapes by position; the reasons carry the user's names
    sig = [s.replace("x: float32", "").replace("[", "(").replace("]", ") float32") if s else s
           for s in tables["graphs"].column("input_signature").to_pylist()]
    tables["graphs"] = tables["graphs"].set_column(tables["graphs"].schema.get_field_index("input_signature"),
                                                   "input_signature", pa.array(sig))
    app = create_app([make_profile(root / "20260101_mlp"), write_profile(root / "20260105_pos", tables)])
    yield app
    data.registry().close()


def test_a_click_on_an_execution_zooms_the_timeline_to_it(app):
    from explorer.pages import timeline

    key = "20260101_mlp"
    fig, state, *_ = timeline.render(key)
    spans = [t for t in fig["data"] if t["name"] == "executions"]
    assert spans and spans[0]["customdata"][0][0] == "span"
    kind, start, dur = spans[0]["customdata"][0]
    out = triggered("timeline-graph.clickData", timeline.zoom, None, None, None, None, None,
                    {"points": [{"customdata": [kind, start, dur]}]}, state)
    new_state, url = out[1], out[5]
    margin = max(1, round(dur * FIT_MARGIN))
    assert (new_state["start"], new_state["end"]) == (start - margin, start + dur + margin)
    assert (url["start"], url["end"]) == (new_state["start"], new_state["end"])
    # a click on an instruction bar does not move the window (it opens its details)
    bar = [5, "tensor", start, 0, 1]
    assert triggered("timeline-graph.clickData", timeline.zoom, None, None, None, None, None,
                     {"points": [{"customdata": bar}]}, state)[0] is __import__("dash").no_update
    # a compile span zooms too
    whole = tline.timeline(data.resolve(key), 0, data.bounds(data.resolve(key))["span"])
    # a compile, recompile or CPU-fallback span zooms too: the window holds it, with the fit margin
    for kind in ("compile", "recompile", "cpu_fallback"):
        span = next(s for s in whole["spans"] if s["kind"] == kind)
        out = triggered("timeline-graph.clickData", timeline.zoom, None, None, None, None, None,
                        {"points": [{"customdata": ["span", span["start"], span["dur"]]}]}, state)
        assert out[1]["start"] <= span["start"] <= span["start"] + span["dur"] <= out[1]["end"], kind
        assert out[1]["end"] - out[1]["start"] <= span["dur"] + 2 * max(1, round(span["dur"] * FIT_MARGIN)), kind


def test_empty_lanes_fold_away_and_come_back(app):
    from explorer.pages import timeline

    L = data.resolve("20260101_mlp")
    a, b = data.bounds(L)["fit"]
    folded = tline.timeline(L, a, b)
    every = tline.timeline(L, a, b, fold=False)
    assert folded["folded"] > 0 and len(folded["lanes"]) + folded["folded"] == len(every["lanes"])
    used = {tline.lane_key(r["core"], r["engine"], r["queue"]) for r in folded["instructions"]}
    assert used <= {lane.key for lane in folded["lanes"]}
    assert f"{folded['folded']} empty lane" in timeline._status(folded)
    _fig, state, *_ = timeline.render("20260101_mlp")
    out = triggered("timeline-fold.n_clicks", timeline.zoom, None, None, None, None, 1, None, state)
    assert out[1]["fold"] is False and out[5]["lanes"] == "all" and out[7] == "Fold empty lanes"
    assert len(out[0]["layout"]["yaxis"]["ticktext"]) == len(every["lanes"])


def test_a_graph_selection_opens_on_that_graphs_executions(app):
    L = data.resolve("20260101_mlp")
    graphs = data.recompiles(L)["recompiles"]
    g = graphs[-1]["graph_id"]
    tl = tline.timeline(L, sel=f"graph:{g}")
    ex = [s for s in tl["spans"] if s["kind"] == "exec"]
    assert ex and all(tl["start"] <= s["start"] and s["start"] + s["dur"] <= tl["end"] for s in ex
                      if s["name"] == graphs[-1]["name"])
    # it is not the profile's opening window (the first graph's executions)
    assert (tl["start"], tl["end"]) != data.bounds(L)["fit"]
    t0 = data.bounds(L)["t0"]
    mine = L.profile.sql("SELECT min(start_ns) s FROM executions WHERE graph_id = ? AND NOT warmup",
                         [g]).to_pylist()[0]["s"] - t0
    assert tl["start"] <= mine < tl["end"]


def test_the_recompiles_call_site_link_lands_on_the_line(app):
    from explorer.pages import recompiles, source

    page = str(recompiles.layout(profile="20260101_mlp"))
    L = data.resolve("20260101_mlp")
    e = data.recompiles(L)["recompiles"][0]
    assert e["source_id"] is not None and e["source_id"] not in data.line_totals(L)   # a call site, no op on it
    out = source.layout(profile="20260101_mlp", line=str(e["source_id"]))
    text = str(out)
    assert "Cannot show this page" not in text and "model.py:23 compiled graph" in text
    assert "sel=graph%3A" in text and "show" in page


def test_inputs_are_named_as_the_user_named_them(app):
    from explorer import recommend
    from explorer.pages import recompiles

    L = data.resolve("20260105_pos")
    r = data.recompiles(L)
    assert r["recompiles"][0]["diff"][0]["name"] == "x"     # '(4, 64, 512) float32' recorded by position
    assert r["suggestions"][0]["input_names"] == ["x"]
    page = str(recompiles.layout(profile="20260105_pos"))
    assert "Pad input 'x' dimension 1" in page and "input0" not in page
    words = next(f for f in recommend.recommendations(L) if f.rule == "recompile_storm").words
    assert "for 'x' dim 1" in words and "input0" not in words


def test_search_finds_by_opcode_op_line_and_zooms_to_a_match(app):
    from explorer import tracks
    from explorer.pages import timeline

    L = data.resolve("20260101_mlp")
    total = L.profile.sql("SELECT count(*) n FROM instructions WHERE opcode = 'MATMUL'").column("n")[0].as_py()
    assert tracks.search(L, "matmul")["count"] == total > 0
    line = tracks.search(L, "model.py:15")
    fc2 = L.profile.sql("""SELECT count(*) n FROM instructions i JOIN ops o USING (op_id) JOIN sources s
                           USING (source_id) WHERE s.line = 15""").column("n")[0].as_py()
    sid = next(t["source_id"] for t in data.line_totals(L).values() if t["line"] == 15)
    assert line["count"] == fc2 and line["ops"] == {"line": len(data.selection_ops(L, f"line:{sid}"))}
    assert tracks.search(L, "addmm")["ops"]["op"] > 0 and tracks.search(L, "100%")["count"] == 0
    with pytest.raises(data.ExplorerError, match="search for 1 to 100"):
        tracks.search(L, "x" * 101)
    _fig, state, *_ = timeline.render("20260101_mlp")
    req, said, listing = triggered("timeline-search-go.n_clicks", timeline.search, 1, None, None, None, "MATMUL",
                                   state)
    assert said.startswith(f"{total:,} instructions match 'MATMUL'") and "MATMUL" in str(listing)
    first = tracks.search(L, "MATMUL", after=state["start"] - 1, limit=1)["matches"][0]
    lo, hi = req["xaxis.range"]
    assert lo * 1e3 <= first["start"] < hi * 1e3
    # next moves past the window's centre; the request is what the zoom callback takes
    nxt, said2, _ = triggered("timeline-search-next.n_clicks", timeline.search, None, None, 1, None, "MATMUL",
                              dict(state, start=int(lo * 1e3), end=int(hi * 1e3)))
    assert nxt["xaxis.range"][0] > lo
    bad = triggered("timeline-search-go.n_clicks", timeline.search, 1, None, None, None, "", state)
    assert "search for 1 to 100" in bad[1]


def test_hfu_and_device_memory_tracks(app):
    from explorer import tracks
    from explorer.pages import timeline

    L = data.resolve("20260101_mlp")
    span = data.bounds(L)["span"]
    c = tracks.counters(L, 0, span)
    # FLOPs are conserved: the track's HFU integrates to the Tensor Engine's FLOPs over the peak
    peak = float(data.metadata(L)["tensor_engine_peak_bf16_flops"])
    cores = L.profile.sql("SELECT count(DISTINCT core) n FROM instructions").column("n")[0].as_py()
    flops = sum(h / 100 * peak * cores * (span / tracks.HFU_BUCKETS) / 1e9 for h in c["hfu"])
    want = L.profile.sql("SELECT sum(flops) f FROM instructions WHERE engine = 'tensor'").column("f")[0].as_py()
    assert flops == pytest.approx(float(want), rel=1e-6) and max(c["hfu"]) <= 100.0
    assert c["memory"] and all(b >= 0 for _, b in c["memory"])
    fig = timeline.counter_tracks({"profile": "20260101_mlp", "start": 0, "end": span})
    assert fig["layout"]["yaxis"]["title"]["text"] == "HFU %" and "HBM" in fig["layout"]["yaxis2"]["title"]["text"]
    assert "No throttling track" in timeline._throttle_note("20260101_mlp")
