"""The profile manager and the JSON API (issue 39, item 3): names, favourites and folders stored in the
profile, delete only inside the output directory, bounded and validated upload, ``view -d DIR``,
``--ingest-only``, and the read-only JSON API beside the pages."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from test_explorer_profiles import make_profile

import traces
import traces.synthetic
from explorer import data, manager
from explorer.app import create_app

KEYS = ("20260101_mlp", "20260102_mlp")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("managed")
    make_profile(root / KEYS[0])
    make_profile(root / KEYS[1], seqs=(64, 128), iterations=4)
    return root


@pytest.fixture()
def app(root, tmp_path):
    outside = make_profile(tmp_path / "20260109_outside")
    app = create_app([root / k / "profile.duckdb" for k in KEYS] + [outside])
    manager.SETTINGS["directory"] = root
    yield app
    manager.SETTINGS["directory"] = None
    data.registry().close()


def test_names_favourites_and_folders_are_stored_in_the_profile(app, root):
    manager.rename(KEYS[1], "bucketed run")
    manager.set_favourite(KEYS[1], True)
    manager.set_folder(KEYS[1], "runs/bf16")
    rows = manager.listing()
    assert rows[0]["key"] == KEYS[1] and rows[0]["favourite"] and rows[0]["folder"] == "runs/bf16"
    assert rows[0]["name"] == "bucketed run"
    md = data.resolve(KEYS[1]).profile.metadata()       # reopened from the file: it travels with it
    assert (md["profile_name"], md["explorer_favourite"], md["explorer_folder"]) == (
        "bucketed run", "true", "runs/bf16")
    with pytest.raises(data.ExplorerError, match="folder"):
        manager.set_folder(KEYS[1], "../etc")
    with pytest.raises(data.ExplorerError, match="display name"):
        manager.rename(KEYS[1], "two\nlines")
    manager.set_favourite(KEYS[1], False)
    manager.set_folder(KEYS[1], "")


def test_delete_only_inside_the_output_directory(app, root, tmp_path):
    outside = next(k for k in data.registry().keys() if "outside" in k)
    with pytest.raises(data.ExplorerError, match="only profiles inside the output directory"):
        manager.delete(outside)
    assert (tmp_path / "20260109_outside" / "profile.duckdb").is_file()
    copy = root / "20260103_copy"
    shutil.copytree(root / KEYS[0], copy)
    key = data.registry().add(copy / "profile.duckdb")
    data.resolve(key)                                   # open, as a page would
    assert manager.delete(key) == str(copy.resolve()) and not copy.exists()
    assert key not in data.registry().keys()


def test_upload_is_bounded_and_validated(app, root, monkeypatch):
    blob = (root / KEYS[0] / "profile.duckdb").read_bytes()
    key = manager.upload("my run.duckdb", blob)
    assert key == "uploaded_my-run" and (root / "uploaded_my-run" / "profile.duckdb").is_file()
    assert data.resolve(key).profile.figures().executions > 0
    with pytest.raises(data.ExplorerError, match="no DuckDB header"):
        manager.upload("notes.txt", b"hello world, not a profile at all")
    monkeypatch.setattr(manager, "MAX_UPLOAD_BYTES", 1000)
    with pytest.raises(data.ExplorerError, match="at most 0 MiB"):
        manager.upload("big.duckdb", blob)
    manager.delete(key)
    monkeypatch.setitem(manager.SETTINGS, "directory", None)
    with pytest.raises(data.ExplorerError, match="view -d DIR"):
        manager.upload("x.duckdb", blob)


def test_the_json_api_answers_what_the_pages_show(app):
    client = app.server.test_client()
    profiles = client.get("/api/profiles").get_json()
    assert {p["key"] for p in profiles} >= set(KEYS)
    s = client.get(f"/api/profiles/{KEYS[0]}/summary").get_json()
    assert s["figures"] == data.resolve(KEYS[0]).profile.figures().as_dict()
    tl = client.get(f"/api/profiles/{KEYS[0]}/timeline").get_json()
    assert (tl["start"], tl["end"]) == tuple(data.bounds(data.resolve(KEYS[0]))["fit"]) and tl["lanes"]
    sel = client.get(f"/api/profiles/{KEYS[0]}/selection?start={tl['start']}&end={tl['end']}").get_json()
    assert sel["figures"]["executions"] > 0 and sel["aggregates"]["by_engine"]
    assert client.get(f"/api/profiles/{KEYS[0]}/search?q=MATMUL").get_json()["count"] > 0
    assert client.get(f"/api/profiles/{KEYS[0]}/annotations").get_json() == []
    c = client.get(f"/api/compare?keys={KEYS[0]},{KEYS[1]}&base={KEYS[1]}").get_json()
    assert c["base"] == 1 and c["keys"] == list(KEYS)
    bad = client.get("/api/profiles/nope/summary")
    assert bad.status_code == 404 and "unknown profile" in bad.get_json()["error"]
    assert client.get(f"/api/profiles/{KEYS[0]}/timeline?start=x").status_code == 400
    assert client.get(f"/api/profiles/{KEYS[0]}/drop").status_code == 400
    assert client.post("/api/profiles").status_code == 405          # read-only


def test_view_directory_and_ingest_only(tmp_path):
    out = tmp_path / "output"
    traces.synthetic.write_run(out / "vm_pid_7" / "20260110T000000_1", executions=2, instructions=40)
    make_profile(out / "20260111_mlp")
    run = subprocess.run([sys.executable, "-m", "explorer.cli", "view", "-d", str(out), "--ingest-only"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "2 profile(s) ready" in run.stdout and (out / "vm_pid_7" / "20260110T000000_1" / "profile.duckdb").is_file()
    bad = subprocess.run([sys.executable, "-m", "explorer.cli", "view", "-d", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "no such directory" in bad.stderr and "Traceback" not in bad.stderr
    # --output-format, as the real tool: the Summary printed (no server), or the export written beside the profile
    view = [sys.executable, "-m", "explorer.cli", "view", "-d", str(out), "--output-format"]
    text = subprocess.run([*view, "summary-text"], capture_output=True, text=True, timeout=300)
    assert text.returncode == 0 and text.stdout.count("total_time") == 2, text.stdout + text.stderr
    js = subprocess.run([*view, "summary-json"], capture_output=True, text=True, timeout=300)
    assert js.returncode == 0 and js.stdout.count('"summary": [') == 2
    full = subprocess.run([*view, "json"], capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr
    docs = [json.loads(f.read_text()) for f in (out / "20260111_mlp").glob("device_profile_model_*.json")]
    assert docs and (out / "20260111_mlp" / "system_profile.json").is_file()   # the real files (test_json_files)
    with traces.open(out / "20260111_mlp") as p:    # the same rows as the profile's real tables
        n = p.sql('SELECT count(*) FROM "Instruction"').column(0)[0].as_py()
        assert sum(len(d["tables"]["Instruction"]) for d in docs) == n
        total = p.sql('SELECT total_time FROM "Summary"').column(0)[0].as_py()
        assert docs[0]["tables"]["Summary"][0]["total_time"] == total
    assert docs[0]["truncated"] == [] and "DmaPacket" in docs[0]["tables"]
    perf = subprocess.run([*view, "perfetto"], capture_output=True, text=True, timeout=300)   # the real files
    assert perf.returncode == 0 and (out / "20260111_mlp" / "system_profile.pftrace").is_file(), perf.stderr
    assert list((out / "20260111_mlp").glob("device_profile_model_*.pftrace"))


def test_delete_removes_the_profiles_parquet_tables_under_a_separate_data_path(app, root, tmp_path):
    from traces import processed

    copy = root / "20260104_copy"
    shutil.copytree(root / KEYS[0], copy)
    key = data.registry().add(copy / "profile.duckdb")
    manager.rename(key, "the copy")   # its own <display-name>@latest: one name is one processed directory
    workspace = tmp_path / "workspace"
    out, _ = processed.process(copy / "profile.duckdb", workspace)        # as view --data-path writes it
    kept, _ = processed.process(root / KEYS[1] / "profile.duckdb", workspace)
    assert (out / "Summary.parquet").is_file()
    manager.SETTINGS["data_path"] = workspace
    try:
        manager.delete(key)
    finally:
        manager.SETTINGS["data_path"] = None
    assert out != kept and not out.exists() and not copy.exists()
    assert (kept / "Summary.parquet").is_file()                          # another profile's tables stay


def test_delete_right_after_upload_stops_the_profiles_background_processing(app, root):
    blob = (root / KEYS[0] / "profile.duckdb").read_bytes()
    key = manager.upload("fresh.duckdb", blob)
    child = manager._CHILDREN[-1][1]
    assert child.poll() is None                         # still writing its Parquet tables into the directory
    manager.delete(key)
    assert child.poll() is not None and not (root / "uploaded_fresh").exists()
