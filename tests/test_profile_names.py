"""A display name for every profile (issue 36): the script and mode it recorded by default, the user's
``neuron-explorer view --display-name`` when given, and that name in every picker and in ``diff``."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

import traces

EXE = str(Path(sys.executable).parent / "neuron-explorer")

TRAIN = textwrap.dedent("""
    import sys, torch
    mode = sys.argv[1]
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to("neuron")
    step = torch.compile(model) if mode == "compiled" else model
    for _ in range(2):
        y = step(torch.randn(4, 8).to("neuron"))
    print(float(y.sum().cpu()))
""")


def explorer(*args, **kw):
    return subprocess.run([EXE, *map(str, args)], capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture(scope="module")
def eager_and_compiled(tmp_path_factory):
    """The same script run eager and compiled under ``neuron-explorer inspect``, as a user does."""
    tmp = tmp_path_factory.mktemp("names")
    (tmp / "train.py").write_text(TRAIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_INSPECT")}
    env.update(NEURON_COMPILE_CACHE_URL=str(tmp / "cache"), NEURON_STACK_LIVE_DIR=str(tmp / "live"))
    procs = {mode: subprocess.Popen([EXE, "inspect", "-o", str(tmp / mode), "--", sys.executable,
                                     str(tmp / "train.py"), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env)
             for mode in ("eager", "compiled")}   # side by side
    out = {}
    for mode, proc in procs.items():
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-2000:]
        [out[mode]] = (tmp / mode).glob("*/profile.duckdb")
    return out


def name_in_sql(path) -> str:
    r = explorer("sql", path, "SELECT profile_name FROM neuron_explorer.Metadata", "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]["profile_name"]


def test_the_default_name_is_the_script_and_how_it_ran(eager_and_compiled):
    assert name_in_sql(eager_and_compiled["eager"]) == "train.py · eager"
    assert name_in_sql(eager_and_compiled["compiled"]) == "train.py · compiled"
    with traces.open(eager_and_compiled["compiled"]) as p:
        assert p.display_name() == "train.py · compiled"
        assert p.metadata()["default_profile_name"] == "train.py · compiled"


def test_every_picker_and_diff_show_the_names(eager_and_compiled):
    from explorer import data
    from explorer.app import create_app
    from explorer.pages import compare, summary

    paths = [eager_and_compiled["eager"], eager_and_compiled["compiled"]]
    reg = data.Registry(paths)
    try:
        app = create_app([], registry=reg)
        assert app is not None
        keys = reg.keys()
        assert [reg.label(k) for k in keys] == ["train.py · eager", "train.py · compiled"]
        page = str(compare.layout(a=keys[0], b=keys[1]))
        assert "A = train.py · eager · B = train.py · compiled" in page and page.count("train.py · compiled") >= 3
        listing = str(summary.layout())
        assert "train.py · eager" in listing and "train.py · compiled" in listing
        assert "train.py · eager" in str(summary.layout(profile=keys[0]))
    finally:
        reg.close()
    r = explorer("diff", *paths)
    assert r.returncode == 0, r.stderr
    assert "A train.py · eager" in r.stdout and "B train.py · compiled" in r.stdout
    assert json.loads(explorer("diff", *paths, "--json").stdout)["b_label"] == "train.py · compiled"


def test_two_profiles_with_one_name_are_told_apart_by_their_key(eager_and_compiled):
    from explorer import data

    reg = data.Registry([eager_and_compiled["eager"], eager_and_compiled["eager"]])
    try:
        assert len(set(map(reg.label, reg.keys()))) == 2
        assert all(reg.label(k).startswith("train.py · eager (") for k in reg.keys())
    finally:
        reg.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_view_display_name_is_stored_and_shown(eager_and_compiled, tmp_path):
    import shutil

    paths = []
    for mode, src in eager_and_compiled.items():   # copies: the other tests keep the default names
        paths.append(str(shutil.copytree(src.parent, tmp_path / mode) / "profile.duckdb"))
    port = _free_port()
    proc = subprocess.Popen([EXE, "view", *paths, "--port", str(port), "--display-name", "eager baseline",
                             "--display-name", "compiled, bf16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().startswith("View a list of profiles at")
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_dash-layout", timeout=5).close()
                break
            except OSError:
                time.sleep(0.1)
        request = {"output": "..app-nav.children...app-profile.options...app-profile.value...app-profiles.children..",
                   "outputs": [{"id": "app-nav", "property": "children"}, {"id": "app-profile", "property": "options"},
                               {"id": "app-profile", "property": "value"},
                               {"id": "app-profiles", "property": "children"}],
                   "inputs": [{"id": "app-url", "property": "pathname", "value": "/"},
                              {"id": "app-url", "property": "search", "value": ""}],
                   "changedPropIds": ["app-url.pathname"], "state": []}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/_dash-update-component", json.dumps(request).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            options = json.load(r)["response"]["app-profile"]["options"]
        assert [o["label"] for o in options] == ["eager baseline", "compiled, bf16"]
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    assert [name_in_sql(p) for p in paths] == ["eager baseline", "compiled, bf16"]
    # the name outlives re-finalising the session (a rebuild from its segments)
    before = os.stat(paths[0]).st_ino
    traces.finalize(Path(paths[0]).parent)
    assert os.stat(paths[0]).st_ino != before
    with traces.open(paths[0]) as p:
        assert p.display_name() == "eager baseline"


@pytest.mark.parametrize("extra, message", [
    (["--display-name", "one"], "1 --display-name for 2 profile(s)"),
    (["--display-name", "a\nb", "--display-name", "b"], "printable characters on one line"),
    (["--display-name", "x" * 200, "--display-name", "b"], "printable characters on one line"),
])
def test_bad_display_names_are_one_line(eager_and_compiled, extra, message):
    r = explorer("view", eager_and_compiled["eager"], eager_and_compiled["compiled"], "--port", _free_port(), *extra)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
