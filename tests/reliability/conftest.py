"""The reliability battery (issue 9). Quick by default; ``--full`` (tests/conftest.py's option) or
NEURON_STACK_RELIABILITY_FULL=1 runs the issue's counts, e.g. ``.venv/bin/python -m pytest tests/reliability --full``.
bench/reliability.py runs the same scenarios with the full counts and prints the table."""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: test -> (quick count, full count): trials, seconds or examples, as each test reads it.
COUNTS = {"kill": (2, 50), "many": (3, 8), "fuzz": (40, 10_000), "browser": (1, 20), "races": (3.0, 60.0),
          "rank": ((2,), (2, 4)), "disk": (2, 10)}


@pytest.fixture(scope="session")
def full(request) -> bool:
    return bool(request.config.getoption("--full", default=False) or os.environ.get("NEURON_STACK_RELIABILITY_FULL"))


@pytest.fixture(scope="session")
def count(full):
    """``count("kill")`` -> the number of trials for this mode."""
    return lambda name: COUNTS[name][1 if full else 0]


@pytest.fixture
def rng(request) -> random.Random:
    """A seeded RNG per test (the seed is printed on failure: NEURON_STACK_RELIABILITY_SEED reproduces)."""
    seed = int(os.environ.get("NEURON_STACK_RELIABILITY_SEED", random.randrange(1 << 30)))
    print(f"reliability seed {seed}")
    return random.Random(seed)


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory) -> Path:
    """One compile cache for the battery's workloads (the first run compiles, the rest hit)."""
    return tmp_path_factory.mktemp("rel-cache")
