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

``NEURON_COMPILE_CACHE_URL=s3://bucket/prefix`` keeps the same layout under the prefix
(:class:`S3CompileCache`): hosts share it with no lock, and an entry is published by its
``model.done`` object, written last and conditionally, holding the SHA-256 of every member.

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
from neuron_stack.frontend.flags import DEFAULT_URL, cache_url, command_line, flags_hash  # noqa: F401
from neuron_stack.isa.neff import Neff, NeffError, load


class CacheError(RuntimeError):
    """A cache location that cannot be used; one line with the fix."""


def open_cache(url: str) -> "CompileCache | S3CompileCache":
    """The cache at ``url``: a local directory or ``s3://bucket/prefix``.

    >>> url = open_cache("s3://ml-team/neuron-cache").entry_dir("1", "ab")
    >>> url.startswith("s3://ml-team/neuron-cache/neuronxcc-"), url.endswith("/MODULE_1+ab")
    (True, True)
    """
    return S3CompileCache(url) if str(url).startswith("s3://") else CompileCache(url)


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
        try:   # an entry stays where it is: the profiler's record tables are read when a profile needs them
            return load(entry / "model.neff", target=target, constants=constants, lazy_records=True)
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
    return open_cache(cache_url(flags)).get_or_compile(graph_hash, flags_hash(flags), flags, compile_fn,
                                                        constants=constants)


class S3CompileCache:
    """The same layout under ``s3://bucket/prefix``, shared by any number of hosts without a lock.

    Each PUT is atomic, so an object is whole or absent. A miss compiles, uploads ``model.neff``,
    ``compile_flags.json`` and ``model.log``, then publishes ``model.done`` last. Every PUT is a
    conditional write (the first writer wins where the server supports it), so a member, once there, never
    changes: a writer that finds one already there hashes that one. ``model.done`` holds each member's
    SHA-256: a reader uses an entry only when the NEFF it downloaded matches, so an entry caught
    mid-upload, overwritten by a racing writer or damaged is a miss (one warning line naming the entry and the
    fix), never a bad NEFF. A damaged entry heals: the process that missed compiles, replaces the members and
    then ``model.done`` only if it is still the damaged version (``If-Match`` on its ETag), so of several healers
    one wins and a healthy entry published meanwhile is never replaced.
    Example: ``S3CompileCache("s3://ml/cache").get_or_compile(ghash, fhash, flags, fn, constants={})``.
    """

    MEMBERS = ("model.neff", "compile_flags.json", "model.log")

    def __init__(self, url: str):
        from traces.objstore import Bucket

        self.bucket = Bucket(url)
        self.version = f"neuronxcc-{compiler_version()}"

    def entry_dir(self, graph_hash: str, flags_hash: str) -> str:
        return self.bucket.url_of(self._rel(graph_hash, flags_hash))

    def _rel(self, graph_hash: str, flags_hash: str) -> str:
        return f"{self.version}/MODULE_{graph_hash}+{flags_hash}"

    def _lookup(self, rel: str, target: str, constants: dict) -> tuple[Neff | None, str | None]:
        """``(neff, None)`` on a hit; ``(None, etag)`` when the entry is damaged (its NEFF fails the SHA-256 in
        its ``model.done``, or is no NEFF): ``etag`` is that ``model.done``'s, for the conditional replace."""
        import tempfile

        from traces.objstore import sha256_file

        done, etag = self.bucket.get_versioned(f"{rel}/model.done", max_bytes=1 << 16)
        if done is None:
            return None, None
        try:
            want = json.loads(done)["sha256"]["model.neff"]
        except (ValueError, KeyError, TypeError):
            want = None
        url = self.bucket.url_of(rel)
        fix = (f"compiling instead; this process then replaces the entry (or remove it: aws s3 rm --recursive "
               f"{url}/)")
        with tempfile.TemporaryDirectory(prefix="neuron-cache-") as tmp:
            path = Path(tmp) / "model.neff"
            self.bucket.get_file(f"{rel}/model.neff", path)
            if want is None or sha256_file(path) != want:
                print(f"neuron_stack: warning: compile cache entry {url}: model.neff does not match its model.done "
                      f"(damaged, or being replaced); {fix}", file=sys.stderr)
                return None, etag
            try:
                return load(path, target=target, constants=constants), None
            except NeffError as exc:
                print(f"neuron_stack: warning: corrupt compile cache entry {url} ({exc}); {fix}", file=sys.stderr)
                return None, etag

    def get_or_compile(self, graph_hash: str, flags_hash: str, flags: dict,
                       compile_fn: Callable[[], Neff], *, constants: dict) -> tuple[Neff, bool, str]:
        """As :meth:`CompileCache.get_or_compile`; the entry is returned as its ``s3://`` URL."""
        import tempfile

        from traces.errors import TraceError
        from traces.objstore import sha256_file

        rel = self._rel(graph_hash, flags_hash)
        try:
            neff, damaged = self._lookup(rel, flags["target"], constants)
            if neff is not None:
                return neff, True, self.bucket.url_of(rel)
            neff = compile_fn()
            done, etag = self.bucket.get_versioned(f"{rel}/model.done", max_bytes=1 << 16)
            if done is not None and (damaged is None or etag != damaged):
                return neff, False, self.bucket.url_of(rel)   # another host published (or healed) it: keep theirs
            with tempfile.TemporaryDirectory(prefix="neuron-cache-") as tmp:
                tmp = Path(tmp)
                neff.save(tmp / "model.neff", weights=False)   # a hit runs the traced model's own weights
                (tmp / "compile_flags.json").write_text(json.dumps(command_line(flags).split()))
                (tmp / "model.log").write_text(neff.log)
                manifest = {"sha256": {}}
                for name in self.MEMBERS:
                    data = (tmp / name).read_bytes()
                    if damaged is not None:   # healing: the damaged entry's members are replaced
                        self.bucket.put_bytes(f"{rel}/{name}", data)
                    elif not self.bucket.put_bytes(f"{rel}/{name}", data, if_absent=True):
                        # a racing (or crashed) writer's member is there, whole: describe it, never replace it
                        # (a member overwritten after the winner's model.done would spoil the entry for good)
                        self.bucket.get_file(f"{rel}/{name}", tmp / name)
                    manifest["sha256"][name] = sha256_file(tmp / name)
            # published last and conditionally: the first writer wins; a heal replaces only the damaged version
            body = json.dumps(manifest).encode()
            if damaged is None:
                self.bucket.put_bytes(f"{rel}/model.done", body, if_absent=True)
            elif self.bucket.put_bytes(f"{rel}/model.done", body, if_match=damaged):
                print(f"neuron_stack: compile cache entry {self.bucket.url_of(rel)} replaced (healed)", file=sys.stderr)
            return neff, False, self.bucket.url_of(rel)
        except TraceError as exc:
            raise CacheError(f"compile cache {exc}; or set NEURON_COMPILE_CACHE_URL to a local directory, "
                             "or pass --no_cache") from None
