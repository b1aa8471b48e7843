"""Shared fixtures: every test module compiles into its own temporary cache, never the user's."""
import os

import pytest


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
