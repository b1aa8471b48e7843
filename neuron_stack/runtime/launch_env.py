"""torchrun's integer variables (RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK), read and checked in one place.

A leaf module: ``distributed`` (which imports the session) and the recorder (which the session imports)
both read them, so the reader cannot live in either without an import cycle.
"""
from __future__ import annotations

import os
import re


class DistributedError(RuntimeError):
    """A rank could not join, or lost its peers; the message is one line with the likely cause."""


def env_int(name: str, default: int) -> int:
    """``int(os.environ[name])`` checked: ASCII digits only, at most 9. Example: ``env_int("RANK", 0)``."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not re.fullmatch(r"-?[0-9]{1,9}", raw):   # ASCII only: '²'.isdigit() is True, int('²') fails
        raise DistributedError(f"{name}={raw[:40]!r} is not an integer: launch with torchrun, which sets it")
    return int(raw)
