"""The persistent compile cache, laid out as Neuron's (reference §4.2):

``$NEURON_COMPILE_CACHE_URL`` (default ``/var/tmp/neuron-compile-cache``; ``--cache_dir=`` in
``NEURON_CC_FLAGS`` wins) / ``neuronxcc-<version>`` / ``MODULE_<graph-hash>+<flags-hash>/`` holding
``model.neff``, ``compile_flags.json``, ``model.log`` and ``model.done`` (written last).
The entry's NEFF leaves the weights out: a hit runs the weights of the model being traced (the key,
the graph hash, covers their bytes), so a cold compile does not write them and a hit does not read them.

An entry is built in a hidden temp directory and renamed into place, so readers see all of it or
nothing. Two processes compiling the same graph serialise on ``MODULE_...lock`` (``fcntl.flock``:
the kernel drops the lock of a dead holder); the second finds the first's entry and uses it.
A corrupt entry is reported in one line on stderr and rebuilt.

>>> import tempfile
>>> c = CompileCache(tempfile.mkdtemp())
>>> c.entry_dir("123", "abcd1234").name
'MODULE_123+abcd1234'
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from neuron_stack.compiler.hooks import recording
from neuron_stack.compiler.version import compiler_version
from neuron_stack.frontend.flags import command_line, flags_hash
from neuron_stack.isa.neff import Neff, NeffError, load

DEFAULT_URL = "/var/tmp/neuron-compile-cache"


class CacheError(RuntimeError):
    """A cache location that cannot be used; one line with the fix."""


def cache_url(flags: dict | None = None) -> str:
    """Where the cache lives: ``--cache_dir`` > ``$NEURON_COMPILE_CACHE_URL`` > the default."""
    url = (flags or {}).get("cache_dir") or os.environ.get("NEURON_COMPILE_CACHE_URL") or DEFAULT_URL
    if url.startswith("s3://"):
        raise CacheError(f"compile cache {url}: S3 caches need network access, which neuron_stack does not use; "
                         "set NEURON_COMPILE_CACHE_URL to a local directory")
    return url


class CompileCache:
    """One cache root. Example: ``CompileCache("/tmp/cache").get_or_compile(ghash, fhash, flags, fn, constants={})``."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.version_dir = self.root / f"neuronxcc-{compiler_version()}"

    def entry_dir(self, graph_hash: str, flags_hash: str) -> Path:
        return self.version_dir / f"MODULE_{graph_hash}+{flags_hash}"

    def _lookup(self, entry: Path, target: str, constants: dict) -> Neff | None:
        if not (entry / "model.done").exists():
            if entry.exists():  # an entry without its done marker was never finished: rebuild it
                print(f"neuron_stack: warning: incomplete compile cache entry {entry}; rebuilding it",
                      file=sys.stderr)
                shutil.rmtree(entry, ignore_errors=True)
            return None
        try:
            return load(entry / "model.neff", target=target, constants=constants)
        except NeffError as exc:
            print(f"neuron_stack: warning: corrupt compile cache entry {entry} ({exc}); rebuilding it",
                  file=sys.stderr)
            shutil.rmtree(entry, ignore_errors=True)
            return None

    @contextlib.contextmanager
    def _locked(self, entry: Path):
        self.version_dir.mkdir(parents=True, exist_ok=True)
        lock = entry.with_name(entry.name + ".lock")
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)   # a dead holder's lock is released by the kernel
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def get_or_compile(self, graph_hash: str, flags_hash: str, flags: dict,
                       compile_fn: Callable[[], Neff], *, constants: dict) -> tuple[Neff, bool, Path]:
        """The cached NEFF for this graph and flags, or ``compile_fn()`` published into the cache.

        ``constants``: the captured weights a hit runs with (the graph hash covers their bytes; the
        entry holds none). Returns ``(neff, cache_hit, entry_dir)``.
        """
        entry = self.entry_dir(graph_hash, flags_hash)
        target = flags["target"]
        neff = self._lookup(entry, target, constants)
        if neff is not None:
            return neff, True, entry
        try:
            ctx = self._locked(entry)
            ctx.__enter__()
        except OSError as exc:
            raise CacheError(f"compile cache {self.root} is not writable ({exc.strerror}): set "
                             "NEURON_COMPILE_CACHE_URL to a writable directory or pass --no_cache") from None
        try:
            neff = self._lookup(entry, target, constants)   # another process may have finished it while we waited
            if neff is not None:
                return neff, True, entry
            neff = compile_fn()
            tmp = entry.with_name(f".{entry.name}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.mkdir(parents=True)
            neff.save(tmp / "model.neff", weights=False)   # a hit runs the traced model's own weights
            (tmp / "compile_flags.json").write_text(json.dumps(command_line(flags).split()))
            (tmp / "model.log").write_text(neff.log)
            (tmp / "model.done").write_text("")
            if entry.exists():
                shutil.rmtree(entry, ignore_errors=True)
            os.replace(tmp, entry)
            return neff, False, entry
        finally:
            ctx.__exit__(None, None, None)


def compile_cached(graph_hash: str, flags: dict, compile_fn: Callable[[], Neff], *,
                   constants: dict) -> tuple[Neff, bool, Path | None]:
    """Compile through the cache unless ``--no_cache``. Returns ``(neff, cache_hit, entry_dir)``.

    A hit only reads the entry (no pass runs) and gives it ``constants``, the captured weights
    (``graph_hash`` covered their bytes; the entry holds none).
    """
    # while a graph recorder is active (neuron_parallel_compile's collect run) NEFFs are quick
    # placeholders: they never enter the cache
    if flags.get("no_cache") or recording():
        return compile_fn(), False, None
    return CompileCache(cache_url(flags)).get_or_compile(graph_hash, flags_hash(flags), flags, compile_fn,
                                                        constants=constants)
