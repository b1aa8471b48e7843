"""Id allocation that needs no coordination between processes writing into one directory.

>>> a, b = new_id(), new_id()
>>> a != b and a > 0
True
>>> stable_id("model.py", 12) == stable_id("model.py", 12)
True
"""
from __future__ import annotations

import hashlib
import itertools
import os
import secrets
import socket

# 31 random bits per process (re-drawn after fork) + a 32-bit counter: collisions between
# processes are as unlikely as two random 31-bit draws matching, and ids stay positive int64.
_prefix = secrets.randbits(31)
_counter = itertools.count(1)


def _reseed() -> None:
    global _prefix, _counter
    _prefix, _counter = secrets.randbits(31), itertools.count(1)


os.register_at_fork(after_in_child=_reseed)


def new_id() -> int:
    """A fresh positive int64, unique across processes. Example: ``exec_id = new_id()``."""
    return (_prefix << 32) | (next(_counter) & 0xFFFFFFFF)


def stable_id(*parts: object) -> int:
    """A positive int64 derived from ``parts``: equal inputs give equal ids in every process.

    Used for ``source_id`` so that two processes recording the same line agree.
    Example: ``stable_id("/src/model.py", 88)``.
    """
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


#: Names the (simulated) host: several "hosts" on one machine, each its own instance id.
HOST_ENV = "NEURON_STACK_HOSTNAME"


def host_name() -> str:
    """This host's name: ``$NEURON_STACK_HOSTNAME`` (a simulated host), else the machine's.

    >>> host_name() == (os.environ.get(HOST_ENV) or socket.gethostname())
    True
    """
    return os.environ.get(HOST_ENV, "").strip()[:255] or socket.gethostname()


def instance_id(host: str | None = None) -> str:
    """This machine's stable EC2-style id ("i-" + 17 hex digits): the one rule neuron-ls, neuron-monitor
    and neuron-top share, so every tool names the same instance.

    The seed is ``host``, else ``$NEURON_STACK_HOSTNAME`` (a simulated host), else ``/etc/machine-id``
    (stable across renames), else the host name.

    >>> instance_id("build-box") == instance_id("build-box"), len(instance_id("build-box"))
    (True, 19)
    """
    seed = host or os.environ.get(HOST_ENV, "").strip()[:255] or None
    if seed is None:
        try:
            with open("/etc/machine-id", "rb") as f:   # 33 bytes; bounded read all the same
                seed = f.read(256).decode("ascii", "replace").strip()
        except OSError:
            seed = ""
        seed = seed or socket.gethostname()
    return "i-" + hashlib.sha256(seed.encode()).hexdigest()[:17]
