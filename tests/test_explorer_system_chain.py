"""The Dependency Chain without a browser: the JSON API answers what the System Trace's chain card shows
(``explorer.system.chain`` over ``Profile.system_chain``), and refuses a bad or unknown event in one line."""
from __future__ import annotations

import pytest
from test_explorer_profiles import build_tables, write_profile
from test_explorer_system_chain_browser import chain_events

from explorer import data, system
from explorer.app import create_app

KEY = "20260105-130000_chain"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tables = build_tables(seqs=(64,), iterations=2, tiles=1, cores=1)
    tables["system_events"] = chain_events(tables["executions"])
    app = create_app([write_profile(tmp_path_factory.mktemp("chain") / KEY, tables)])
    return app.server.test_client()


def test_the_api_answers_the_chain_the_page_draws(client):
    L = data.resolve(KEY)
    view = system.view(L)
    hw = next(e for e in view["events"] if e["name"] == "nc_exec_running")
    got = client.get(f"/api/profiles/{KEY}/system_chain?track={hw['track']}&start={hw['start']}"
                     "&name=nc_exec_running").get_json()
    assert got == system.chain(L, hw["track"], hw["start"], "nc_exec_running")
    names = [e["name"] for e in got["events"]]
    assert [names[i] for i in got["downstream"]] == ["nrt_tensor_read", "dmem_buf_copyout"]
    assert [names[i] for i in got["upstream"]][-3:] == ["nrt_execute", "nrt_tensor_write", "dmem_buf_copyin"]
    assert names[got["at"]] == "nc_exec_running" and [got["at"] - 1, got["at"]] in got["edges"]


@pytest.mark.parametrize("query, message", [
    ("track=0&start=5&name=nc_exec_running", "no such system event"),
    ("track=0&name=nc_exec_running", "track, start and name"),
    ("track=x&start=5&name=a", "track"),
])
def test_a_bad_event_is_one_line(client, query, message):
    r = client.get(f"/api/profiles/{KEY}/system_chain?{query}")
    assert r.status_code == 400 and message in r.get_json()["error"]


def test_a_framework_events_downstream_is_bounded_and_says_how_many_more(client):
    L = data.resolve(KEY)
    step = next(e for e in system.view(L)["events"] if e["name"] == "step0")
    whole = L.profile.system_chain(step["track"], step["start"] + system.origin(L), "step0")
    cut = L.profile.system_chain(step["track"], step["start"] + system.origin(L), "step0", limit=2)
    assert len(whole.downstream) == 6 and whole.more == 0
    assert [cut.events[i]["name"] for i in cut.downstream] == ["nrt_execute", "nrt_tensor_write"] and cut.more == 4
