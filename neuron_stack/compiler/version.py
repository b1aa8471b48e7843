"""The compiler's version: the package version plus a build hash over neuron_stack's own source.

>>> compiler_version().split("+")[1].startswith("neff")
True
"""
from __future__ import annotations

import functools
import hashlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from neuron_stack.isa.neff import FORMAT_VERSION


def stack_version() -> str:
    """This package's version (``0.0.0`` when run from a source tree that is not installed)."""
    try:
        return version("neuron-stack")
    except PackageNotFoundError:
        return "0.0.0"


@functools.cache
def compiler_version() -> str:
    """The version in cache paths, ``<version>+<build-hash>`` as ``neuronxcc-2.x+<hash>`` is.

    The build hash covers the compiler's own source (every module of neuron_stack), so a NEFF
    compiled by older lowering or cost-model code is never served from the cache as current.
    Example: ``compiler_version()  # '0.1.0+neff1.3f2a9c1d'``.
    """
    build = hashlib.sha256()
    package = Path(__file__).resolve().parent.parent      # neuron_stack/, every stage
    for path in sorted(package.rglob("*.py")):
        build.update(path.relative_to(package).as_posix().encode() + path.read_bytes())
    return f"{stack_version()}+neff{FORMAT_VERSION}.{build.hexdigest()[:8]}"
