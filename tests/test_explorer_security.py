"""The Explorer reads only the profiles it was given: the SQL console and every request parameter."""
from __future__ import annotations

import pytest
from test_explorer_profiles import make_profile

from explorer import data, profiles
from explorer import timeline as tline
from explorer.app import create_app
from traces.console import RefusedQuery

HOSTILE = [
    "DROP TABLE ops",
    "DELETE FROM instructions",
    "INSERT INTO ops (op_id) VALUES (1)",
    "UPDATE ops SET name = 'x'",
    "CREATE TABLE t AS SELECT 1",
    "ALTER TABLE ops RENAME TO o",
    "ATTACH '/tmp/other.duckdb' AS o",
    "COPY ops TO '/tmp/ops.csv'",
    "COPY (SELECT 1) TO '/tmp/x.parquet'",
    "EXPORT DATABASE '/tmp/dump'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "PRAGMA database_list",
    "SET enable_external_access = true",
    "CALL pragma_version()",
    "SELECT 1; DROP TABLE ops",
    "SELECT 1 /* harmless */; /* hidden */ DELETE FROM ops",
    "SELECT 1; -- trailing\nDROP TABLE ops",
    "WITH x AS (SELECT 1) INSERT INTO ops (op_id) SELECT * FROM x",
    "EXPLAIN SELECT 1",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM glob('/*')",
    "SELECT * FROM read_parquet('/tmp/*.parquet')",
    "SELECT * FROM '/etc/passwd'",
    "SELECT count(*) FROM (SELECT * FROM read_json_auto('/etc/hosts'))",
    "",
    "   ",
    "SELECT " + "1 + " * 10_000 + "1",
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = make_profile(tmp_path_factory.mktemp("sec") / "20260101-000000_mlp", iterations=1, seqs=(57, 64))
    reg = data.Registry([path])
    create_app([], registry=reg)   # the pages register themselves with the app
    yield data.resolve(reg.default_key())
    reg.close()


@pytest.mark.parametrize("query", HOSTILE)
def test_exp101_console_refuses_hostile_statements(loaded, query):
    with pytest.raises((RefusedQuery, data.ExplorerError)):
        data.run_console(loaded, query)
    # and the profile is untouched
    assert loaded.profile.sql("SELECT count(*) FROM ops").column(0)[0].as_py() == 8


def test_exp102_console_runs_selects_with_a_row_cap(loaded):
    res = data.run_console(loaded, "-- top engines\nWITH e AS (SELECT engine FROM instructions)\n"
                                   "SELECT engine, count(*) AS n FROM e GROUP BY 1 ORDER BY 2 DESC, 1 -- done")
    assert res["columns"] == ["engine", "n"] and not res["truncated"]
    big = data.run_console(loaded, "SELECT * FROM range(100000)")
    assert len(big["rows"]) == data.CONSOLE_LIMIT and big["truncated"]
    assert len(data.run_console(loaded, "SELECT * FROM range(50)", limit=10**9)["rows"]) == 50


def test_exp103_the_connection_itself_cannot_reach_files(loaded):
    # even a statement that slipped past the parser checks could not read or re-enable file access
    with pytest.raises(Exception, match="(?i)disabled|permission"):
        loaded.profile.sql("SELECT * FROM read_csv('/etc/passwd')")
    with pytest.raises(Exception, match="(?i)locked|cannot change"):
        loaded.profile.sql("SET enable_external_access = true")


def test_exp109_console_caps_bytes_per_cell_and_per_result(loaded):
    from traces.console import MAX_CELL_BYTES, MAX_RESULT_BYTES
    # one big cell (20 MB here, 100 MB once) used to come back whole; the worker's memory bound leaves room for 20
    res = data.run_console(loaded, "SELECT string_agg(repeat('x', 1000), ',') AS s FROM range(20000)")
    cell = res["rows"][0]["s"]
    assert len(cell.encode()) <= MAX_CELL_BYTES + 3 and cell.endswith("…")
    # many cells under the cell cap but over the result cap: cut by rows, and said so
    res = data.run_console(loaded, "SELECT repeat('y', 4000) AS a, repeat('z', 4000) AS b, 7 AS n FROM range(900)")
    size = sum(len(str(v).encode()) for r in res["rows"] for v in r.values())
    assert res["truncated"] and 0 < len(res["rows"]) < 900 and size <= MAX_RESULT_BYTES
    assert res["columns"] == ["a", "b", "n"] and res["rows"][0]["n"] == 7   # numbers keep their type
    # short cells are untouched
    assert data.run_console(loaded, "SELECT 'abc' AS s, [1, 2] AS l")["rows"] == [{"s": "abc", "l": "[1, 2]"}]


def test_exp110_console_answers_others_during_a_heavy_query(loaded):
    import threading
    heavy = {}
    t = threading.Thread(target=lambda: heavy.update(
        data.run_console(loaded, "SELECT string_agg(repeat('x', 1000), ',') AS s FROM range(20000)")))
    t.start()
    try:
        assert data.run_console(loaded, "SELECT 42 AS answer")["rows"] == [{"answer": 42}]
    finally:
        t.join()
    assert heavy["rows"][0]["s"].endswith("…")


def test_exp104_console_callback_reports_refusals_in_one_line(loaded):
    from explorer.pages import sql as sql_page

    key = data.registry().default_key()
    table, message, _fig, url, _history = sql_page.run(1, "DELETE FROM ops", key)
    assert "Refused: only a single SELECT" in str(message)
    table, message, _fig, url, _history = sql_page.run(1, "SELECT name FROM ops ORDER BY name LIMIT 2", key)
    assert "sql-table" in str(table) and url == {"q": "SELECT name FROM ops ORDER BY name LIMIT 2"}


@pytest.mark.parametrize("bad", ["../../etc/passwd", "/etc/passwd", "a" * 5000, "", None, 3])
def test_exp105_unknown_or_path_like_profile_keys_are_refused(loaded, bad):
    if bad in ("", None):
        return  # an absent key means the default profile
    with pytest.raises(data.ExplorerError, match="unknown profile"):
        data.resolve(bad)


@pytest.mark.parametrize("params", [
    {"start": "-5"}, {"start": "1e400"}, {"end": "10; DROP TABLE ops"}, {"start": "9" * 40},
    {"sel": "line:../../etc"}, {"sel": "op:1 OR 1=1"}, {"sel": "file:/etc/passwd"}, {"sel": "x" * 500},
])
def test_exp106_bad_range_and_selection_parameters_are_refused(loaded, params):
    with pytest.raises(data.ExplorerError):
        tline.timeline(loaded, params.get("start"), params.get("end"), params.get("sel"))


def test_exp107_pages_show_bad_parameters_as_a_message(loaded):
    from explorer.pages import source, timeline

    key = data.registry().default_key()
    out = str(timeline.layout(profile=key, start="abc"))
    assert "error-box" in out and "start must be an integer" in out
    out = str(source.layout(profile=key, line="/etc/passwd"))
    assert "error-box" in out and "line must be an integer" in out
    out = str(source.layout(profile=key, file="7"))
    assert "error-box" in out and "file must be an integer between 0 and 0" in out
    out = str(timeline.layout(profile="../secret"))
    assert "unknown profile" in out


def test_exp108_a_corrupt_profile_is_reported_and_others_keep_working(loaded, tmp_path):
    from explorer.pages import summary

    bad = tmp_path / "broken" / "profile.duckdb"
    bad.parent.mkdir()
    bad.write_bytes(b"this is not a database" * 100)
    reg = data.Registry([bad, loaded.path])
    old = data.registry()
    data.set_registry(reg)
    try:
        out = str(summary.layout(profile="broken"))
        assert "error-box" in out and "cannot be opened" in out
        good = [k for k in reg.keys() if k != "broken"][0]
        assert "error-box" not in str(summary.layout(profile=good))
    finally:
        profiles._REGISTRY = old   # keep the module fixture's registry open for the other tests
        reg._loaded.pop("broken", None)

