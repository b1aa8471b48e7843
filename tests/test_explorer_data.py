"""The Explorer's queries (explorer.data, explorer.recommend) over small real profiles."""
from __future__ import annotations

import pytest
from test_explorer_profiles import MODEL_FILE, make_compile_first_profile, make_profile

from explorer import data, recommend
from explorer import timeline as tline
from traces.q_timeline import busy_extent, fit_window
from traces.timefmt import fmt_ns, fmt_window, time_ticks


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = make_profile(tmp_path_factory.mktemp("data") / "20260101-000000_mlp")
    reg = data.Registry([path])
    data.set_registry(reg)
    yield data.resolve(reg.default_key())
    reg.close()


def test_exp001_registry_keys_come_from_session_directories(tmp_path):
    a = tmp_path / "s1_mlp" / "profile.duckdb"
    b = tmp_path / "other" / "s1_mlp" / "profile.duckdb"
    reg = data.Registry([a, b, tmp_path / "run.duckdb"])
    assert reg.keys() == ["s1_mlp", "s1_mlp-2", "run"]
    with pytest.raises(data.ExplorerError, match="unknown profile '../etc/passwd'"):
        reg.get("../etc/passwd")


def test_exp002_summary_matches_the_trace_store_summary(loaded):
    s = data.summary(loaded)
    stored = loaded.profile.summary()
    assert s["device_ns"] == round(stored["total_time"] * 1e9)
    assert s["mfu_estimated_percent"] == pytest.approx(stored["mfu_estimated_percent"])
    assert s["recompiles"] == 3 and s["graphs"] == 4
    assert s["fallback_ops"] == 4 and s["fallback_calls"] == 12
    assert s["is_simulation"] == "true"


def test_exp003_top_ops_and_lines_rank_by_device_time(loaded):
    ops = data.top_ops(loaded, 5)
    assert [o["device_ns"] for o in ops] == sorted((o["device_ns"] for o in ops), reverse=True)
    assert ops[0]["module"] == "fc2" and ops[0]["where"] == "model.py:15" and ops[0]["graphs"] == 4
    # "graphs" counts the distinct graphs an op path ran in, never its op rows (issue 31)
    info, totals = data.ops(loaded), data.op_totals(loaded)
    for row in ops:
        ids = {o["graph_id"] for i, o in info.items() if data.op_path_key(o) == row["sel"][len("path:"):]
               and totals.get(i, {}).get("device_ns")}
        assert row["graphs"] == len(ids)
    lines = data.top_lines(loaded, 3)
    assert [ln["line"] for ln in lines] == [15, 13, 14]
    # the per-line sums equal the per-op sums: nothing counted twice or lost
    assert sum(ln["device_ns"] for ln in data.line_totals(loaded).values()) == \
        sum(t["device_ns"] for t in data.op_totals(loaded).values())


def test_exp004_raw_window_returns_each_instruction_with_lanes_named_like_the_real_tool(loaded):
    labels = [lane.label for lane in tline.lanes(loaded)]
    assert labels[:3] == ["Compile", "Host (CPU)", "Executions(nc0)"]
    assert "Tensor(nc0)" in labels and "qSyncIO0(nc1)" in labels and "qSyncSpillReload0(nc0)" in labels
    tl = tline.timeline(loaded, 0, data.bounds(loaded)["span"])     # the whole session
    assert tl["mode"] == "raw" and len(tl["instructions"]) == tl["count"] == data.bounds(loaded)["instructions"]
    kinds = {s["kind"] for s in tl["spans"]}
    assert {"exec", "cpu_fallback", "compile", "recompile"} <= kinds


def test_exp005_wide_windows_use_level_of_detail_with_bounded_cells(loaded, monkeypatch):
    monkeypatch.setattr(tline, "RAW_CAP", 50)
    # the one LOD rule (traces.q_timeline): a pyramid level at most 1/16 of a bucket; this small profile's
    # finest level is 16 µs, so 10 buckets over its 10 ms read the pyramid (100 would read instructions)
    tl = tline.timeline(loaded, 0, data.bounds(loaded)["span"], buckets=10)
    assert tl["mode"] == "lod" and "instructions" not in tl
    assert tl["lod_source"].startswith("lod_busy level")
    cells = sum(len(c) for c in tl["buckets"].values())
    assert cells <= 10 * len(tl["buckets"])
    assert all(0 < frac <= 1.0 for c in tl["buckets"].values() for _, frac, _, _ in c)
    # busy time is conserved by the pyramid: the sum over cells equals the instructions' total
    busy = sum(frac * tl["bucket_ns"] for c in tl["buckets"].values() for _, frac, _, _ in c)
    total = loaded.profile.sql("SELECT sum(dur_ns)::BIGINT FROM instructions").column(0)[0].as_py()
    assert busy == pytest.approx(total, rel=1e-6)


def test_exp006_zoomed_window_below_the_pyramid_aggregates_instructions(loaded, monkeypatch):
    monkeypatch.setattr(tline, "RAW_CAP", 5)
    first = tline.timeline(loaded)["spans"]
    ex = min((s for s in first if s["kind"] == "exec"), key=lambda s: s["start"])
    tl = tline.timeline(loaded, ex["start"], ex["start"] + ex["dur"], buckets=50)
    assert tl["mode"] == "lod" and tl["lod_source"] == "instructions"
    assert any(top is not None for c in tl["buckets"].values() for *_, top in c)


def test_exp007_selection_of_a_source_line_highlights_its_instructions(loaded):
    sid = next(t["source_id"] for t in data.line_totals(loaded).values() if t["line"] == 13)
    tl = tline.timeline(loaded, sel=f"line:{sid}")
    chosen = set(tl["selection"])
    assert chosen and all(data.ops(loaded)[o]["line"] == 13 for o in chosen)
    assert tl["selection_text"].startswith("line model.py:13")
    assert data.selection_ops(loaded, "module:fc1") == chosen
    assert data.selection_ops(loaded, "path:fc1/aten.addmm.default") == chosen
    with pytest.raises(data.ExplorerError):
        tline.timeline(loaded, sel="line:1;DROP")


def test_exp008_range_aggregates_clip_to_the_range(loaded):
    full = tline.range_aggregates(loaded, 0, data.bounds(loaded)["span"])
    total = loaded.profile.sql("SELECT sum(dur_ns)::BIGINT FROM instructions").column(0)[0].as_py()
    assert sum(r["busy_ns"] for r in full["by_engine"]) == total
    ex = min((s for s in tline.timeline(loaded)["spans"] if s["kind"] == "exec"), key=lambda s: s["start"])
    half = tline.range_aggregates(loaded, ex["start"], ex["start"] + ex["dur"] // 2)
    assert 0 < sum(r["busy_ns"] for r in half["by_engine"]) < total
    assert half["by_line"][0]["where"].startswith("model.py:")


def test_exp009_instruction_lookup_links_back_to_its_source_line(loaded):
    r = tline.timeline(loaded)["instructions"][0]
    got = tline.instruction_at(loaded, r["core"], r["engine"], r["start"], r["pc"])
    assert got["opcode"] == r["opcode"] and got["file"] == MODEL_FILE and got["line"] in (13, 14, 15)


def test_exp010_hierarchy_weights_sum_to_the_root(loaded):
    nodes = {n["id"]: n for n in data.hierarchy(loaded)}
    children = [n for n in nodes.values() if n["parent"] == "root"]
    assert sum(n["value"] for n in children) == nodes["root"]["value"] > 0
    assert {"m:fc1", "m:fc2", "m:act"} <= set(nodes)
    assert any(n["label"] == "MATMUL" for n in nodes.values())


def test_exp011_source_view_annotates_each_line(loaded):
    files = data.source_files(loaded)
    assert files == [MODEL_FILE]
    rows = data.source_view(loaded, MODEL_FILE)
    by_line = {r["line"]: r for r in rows}
    assert by_line[15]["device_ns"] > by_line[13]["device_ns"] > by_line[14]["device_ns"] > 0
    assert by_line[16]["host_ns"] > 0 and by_line[16]["instructions"] == 0
    assert by_line[1]["device_ns"] == 0
    with pytest.raises(data.ExplorerError, match="embeds no file"):
        data.source_view(loaded, "/etc/passwd")


def test_exp012_fallbacks_and_recompiles(loaded):
    fb = data.fallbacks(loaded)
    assert {f["op"] for f in fb} == {"aten.nonzero.default"}
    assert all(f["where"] == "model.py:16" and f["calls"] == 3 for f in fb)
    r = data.recompiles(loaded)
    assert len(r["recompiles"]) == 3
    first = next(e for e in r["recompiles"] if e["reason"].endswith("57 -> 64"))
    assert first["diff"][0]["old"] == [4, 57, 512] and first["diff"][0]["changed"] == [1]
    (s,) = r["suggestions"]
    assert (s["input"], s["dim"], s["buckets"], s["compiles_saved"]) == ("x", 1, [64, 128], 2)
    assert s["padding_percent"] == pytest.approx(100 * (64 + 64 + 128 + 128 - 349) / 349)


def test_exp013_signature_parsing_accepts_text_and_json():
    assert data.parse_signature("x: float32[4, 57], m: bool[4]")[1] == {"name": "m", "dtype": "bool", "shape": [4]}
    assert data.parse_signature('{"x": {"dtype": "int64", "shape": [2, 9]}}') == \
        [{"name": "x", "dtype": "int64", "shape": [2, 9]}]
    assert data.signature_diff("x: f32[2, 3]", "x: f32[2, 5]")[0]["changed"] == [1]


def test_exp014_recommendations_are_ranked_and_link_evidence(loaded):
    found = recommend.recommendations(loaded)
    rules = [f.rule for f in found]
    assert {"host_starved", "recompile_storm", "cpu_fallback", "dma_bound", "fp32_matmul"} <= set(rules)
    assert [f.impact_ns for f in found] == sorted((f.impact_ns for f in found), reverse=True)
    storm = next(f for f in found if f.rule == "recompile_storm")
    assert "[64, 128]" in storm.words and storm.page == "recompiles"
    fb = next(f for f in found if f.rule == "cpu_fallback")
    assert "aten.nonzero.default at model.py:16" in fb.words and fb.page == "source" and fb.query["line"]
    gap = next(f for f in found if f.rule == "host_starved")
    assert gap.query["end"] > gap.query["start"] >= 0


def test_exp015_compare_aligns_by_line_and_op_path(loaded, tmp_path):
    other = make_profile(tmp_path / "20260102_mlp", seqs=(64, 128), iterations=4)
    reg = data.Registry([loaded.path, other])
    try:
        a, b = (reg.get(k) for k in reg.keys())
        c = data.compare(a, b)
        lines = {r["line"]: r for r in c["by_line"]}
        assert set(lines) >= {"model.py:13", "model.py:15"}
        r15 = lines["model.py:15"]
        assert r15["delta_ns"] == r15["b_ns"] - r15["a_ns"] and r15["a_ns"] > 0 and r15["b_ns"] > 0
        assert any(r["op_path"] == "fc2 / aten.addmm.default" for r in c["by_op"])
        assert c["totals"]["recompiles"] == {"a": 3, "b": 1, "delta": -2}
    finally:
        reg.close()


def _compile_then_run(tmp_path, executions: bool = True):
    path = make_compile_first_profile(tmp_path / f"20260103-000000_tp{int(executions)}", executions)
    reg = data.Registry([path])
    L = reg.get(reg.default_key())
    comp = next(r for r in L.profile.sql("SELECT kind, ts_ns, dur_ns FROM events").to_pylist()
                if r["kind"] == "compile")
    return reg, L, comp


def test_timeline_opens_fitted_to_the_executions_not_the_compile(tmp_path):
    reg, L, comp = _compile_then_run(tmp_path)
    try:
        b = data.bounds(L)
        t0, (a, e) = b["t0"], b["fit"]
        ex = L.profile.sql("SELECT start_ns, end_ns FROM executions WHERE NOT warmup").to_pylist()
        first, last = min(r["start_ns"] for r in ex) - t0, max(r["end_ns"] for r in ex) - t0
        # every execution inside, the 2 s compile outside but for the small margin
        assert a <= first and last <= e
        margin = (last - first) * 0.05
        compile_end = comp["ts_ns"] + comp["dur_ns"] - t0
        assert comp["ts_ns"] - t0 < a and compile_end - a <= margin and e - last <= margin
        assert e - a < b["span"] / 100
        # the timeline opens there and draws every execution
        tl = tline.timeline(L)
        assert (tl["start"], tl["end"]) == (a, e) and tl["fit"] == (a, e)
        assert sum(s["kind"] == "exec" for s in tl["spans"]) >= len(ex)
        whole = tline.timeline(L, 0, b["span"])
        assert (whole["start"], whole["end"]) == (0, b["span"])
        # an empty window asked for in the URL falls back to the fit, not to the whole session
        assert tline.clamp_window(L, 500, 500) == (a, e)
        # its axis and label read in µs, never as bare numbers or as "2 s – 2 s"
        ticks = time_ticks(a, e)
        assert ticks.labels and all(lab.endswith(" µs") for lab in ticks.labels)
        label = fmt_window(a, e)
        start_text, _, rest = label.partition(" … ")
        assert label.endswith(f"({fmt_ns(e - a)})") and start_text != rest.split(" (")[0]
    finally:
        reg.close()


def test_timeline_without_executions_opens_on_the_whole_session(tmp_path):
    reg, L, _comp = _compile_then_run(tmp_path, executions=False)
    try:
        b = data.bounds(L)
        assert b["fit"] == (0, b["span"]) and b["span"] > 2_000_000_000
        tl = tline.timeline(L)
        assert (tl["start"], tl["end"]) == (0, b["span"]) and {s["kind"] for s in tl["spans"]} >= {"compile"}
    finally:
        reg.close()
    assert fit_window(None, None, session=(5, 9)) == (5, 9)
    # the busy executions: back-to-back steps stay together; one step per second of host work opens on one
    assert busy_extent([(0, 20), (20, 40), (40, 60)]) == (0, 60)
    steps = [(k * 50_000_000, k * 50_000_000 + 20_000) for k in range(38)]
    assert busy_extent(steps) == (0, 20_000)
    assert busy_extent([(0, 10), (200, 210)] + [(300 + 10 * k, 310 + 10 * k) for k in range(100)]) == (0, 1300)
    assert fit_window(100, 200, session=(0, 150)) == (98, 150)      # clipped to the session


@pytest.mark.parametrize("start, end, unit", [
    (0, 2_160_000_000, " s"), (2_140_312_000, 2_140_408_400, " µs"), (0, 5_000_000, " ms"),
    (1_000, 1_400, " ns")])
def test_axis_ticks_and_window_labels_carry_units(start, end, unit):
    ticks = time_ticks(start, end)
    assert 3 <= len(ticks.labels) <= 12 and all(lab.endswith(unit) for lab in ticks.labels)
    assert all(start <= v <= end for v in ticks.values_ns) and ticks.title.endswith(f"({unit.strip()})")
    lo, _, hi = fmt_window(start, end).partition(" … ")
    assert lo != hi.split(" (")[0]           # never "2.14 s – 2.14 s"
    if start > 10 * (end - start):           # far from zero: offsets after a named instant
        assert ticks.labels[0].startswith("+") and "2.140" in ticks.title


def test_execution_labels_say_what_each_execution_was_with_the_summarys_device_time(loaded):
    """The execution pickers' labels (``data.execution_labels``, ``Profile.execution_labels``): graph, input shapes,
    warm-up, device time, core; the measured executions' device times add up to the Summary's device time."""
    L = loaded
    rows = L.profile.execution_labels().to_pylist()
    labels = data.execution_labels(L)
    assert set(labels) == {r["exec_id"] for r in rows}
    warm = next(r for r in rows if r["warmup"])
    cold = next(r for r in rows if not r["warmup"] and r["input_signature"] != warm["input_signature"])
    first = labels[warm["exec_id"]]
    assert first.startswith(f"{warm['graph']} · x float32[") and "· warm-up ·" in first
    assert "warm-up" not in labels[cold["exec_id"]]
    assert labels[cold["exec_id"]].endswith(f"· {fmt_ns(cold['device_ns'])} · core {cold['core']}")
    assert sum(r["device_ns"] for r in rows if not r["warmup"]) == L.profile.figures().device_ns


def test_schema_fields_give_each_column_required_unit_and_example(loaded):
    """The SQL page's schema inspector reads SchemaFields through ``Profile.columns``: a real table's columns with
    the real reference's required flag, unit and example; our own tables' columns with their meaning."""
    L = loaded
    fields = data.schema_fields(L)
    instr = {c["column"]: c for c in fields["Instruction"]}
    assert instr["start_ts"]["required"] is True and instr["start_ts"]["unit"] == "nanoseconds"
    assert instr["opcode"]["example"] == "MATMUL" and instr["engine"]["example"] == "tensor"
    assert {c["column"] for c in fields["executions"]} >= {"exec_id", "device_ns"}
    assert all(c["description"] for c in fields["executions"])
    assert data.schema(L)["Flow"] == [(c["column"], c["type"]) for c in fields["Flow"]]


def test_a_region_link_names_a_region_the_timeline_opens_on_and_shades(loaded):
    """``region=layer:<n>`` (a Regions page link): the timeline opens on the region with the fitted window's
    margin and draws its span shaded and named; a bad or out-of-range spec is one line."""
    from explorer import records
    from explorer.figures import timeline_figure

    L = loaded
    r = records.regions(L, None, "layer")["all"][1]
    mark = tline.region_mark(L, "layer:1")
    assert (mark["name"], mark["start"], mark["end"], mark["core"]) == (r["region"], r["start_ns"], r["end_ns"],
                                                                         r["core"])
    tl = tline.timeline(L, region="layer:1")
    assert (tl["start"], tl["end"]) == fit_window(r["start_ns"], r["end_ns"], (0, data.bounds(L)["span"]))
    assert tl["count"] > 0                       # it lands on data
    fig = timeline_figure(tl, data.ops(L))
    shade = next(s for s in fig["layout"]["shapes"] if s.get("name") == "region")
    assert (shade["x0"], shade["x1"]) == (r["start_ns"] / 1e3, r["end_ns"] / 1e3)
    core = [i for i, lane in enumerate(tl["lanes"]) if lane.key.split(":")[1:2] == [str(r["core"])]]
    assert (shade["yref"], shade["y0"], shade["y1"]) == ("y", min(core) - 0.5, max(core) + 0.5)   # its core's lanes
    assert any(a.get("name") == "region" and r["region"] in a["text"] for a in fig["layout"]["annotations"])
    for bad, said in (("layer:x", "region must look like"), ("layer:100000", "region must be an integer"),
                      ("bogus:1", "region must look like")):
        with pytest.raises(data.ExplorerError, match=said):
            tline.region_mark(L, bad)
