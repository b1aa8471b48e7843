"""Shared fixtures: every test module compiles into its own temporary cache, never the user's."""
import os

import pytest
import warm_python

# the browser tests' one Explorer server and chromium, and their page (tests/explorer_browser.py)
from explorer_browser import explorer_shared, group_browser_modules, page, stop_after_browser_tests  # noqa: F401
from servers import prometheus_bin, s3_env, s3_server  # noqa: F401 - real servers as fixtures (tests/servers.py)


@pytest.fixture(scope="module", autouse=True)
def compile_cache(tmp_path_factory):
    """Point NEURON_COMPILE_CACHE_URL at a fresh directory for the module; restore it afterwards."""
    old = os.environ.get("NEURON_COMPILE_CACHE_URL")
    os.environ["NEURON_COMPILE_CACHE_URL"] = str(tmp_path_factory.mktemp("cache"))
    yield os.environ["NEURON_COMPILE_CACHE_URL"]
    if old is None:
        os.environ.pop("NEURON_COMPILE_CACHE_URL", None)
    else:
        os.environ["NEURON_COMPILE_CACHE_URL"] = old


@pytest.fixture(scope="session")
def recorded_samples(tmp_path_factory, worker_id):
    """Sample workloads recorded with profiling on, each once per run (xdist's workers share the recording,
    as pytest-xdist documents for once-only session fixtures): ``recorded_samples.get(name, ...)`` returns
    ``{name: profile.duckdb}``, this worker's copy (tests/recorded_samples.py)."""
    from recorded_samples import Recorder

    shared = tmp_path_factory.getbasetemp().parent / "samples" if worker_id != "master" else None
    return Recorder(tmp_path_factory.mktemp("samples"), shared)


@pytest.fixture(scope="session", autouse=True)
def warm_python_server(tmp_path_factory):
    """The tests' ``[sys.executable, ...]`` processes fork from a server with torch imported (tests/warm_python.py);
    a test marked ``real_python`` gets real interpreters."""
    with warm_python.serve(tmp_path_factory.mktemp("warm")):
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    warm_python.enabled = item.get_closest_marker("real_python") is None


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="full size: also run the tests marked full (every sample at its default size, on every "
                          "target) and the reliability battery's full counts (slow; see bench/reliability.py)")


def pytest_collection_modifyitems(config, items):
    group_browser_modules(items)
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="full size: run with --full")
    for item in items:
        if item.get_closest_marker("full"):
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    stop_after_browser_tests(item, nextitem)
