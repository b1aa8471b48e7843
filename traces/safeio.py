"""Reading a small file a user names (a config, a JSON document) with a size bound.

A path can be ``/dev/zero`` (endless), a FIFO (blocks until someone writes), a directory or a huge
file; each would hang or eat memory with a plain ``read_text()``. :func:`read_small_text` opens
without blocking, accepts only regular files and reads at most ``limit`` bytes.

>>> import tempfile, os
>>> with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
...     _ = f.write('{"period": "1s"}')
>>> read_small_text(f.name, what="config file")
'{"period": "1s"}'
>>> try:
...     read_small_text("/dev/zero", what="config file")
... except InputFileError as exc:
...     print(exc)
config file '/dev/zero' is a character device, not a regular file: give the path of a file
>>> os.unlink(f.name)
"""
from __future__ import annotations

import errno
import os
import stat

DEFAULT_LIMIT = 1 << 20   # 1 MiB: far above any real config; the bound that keeps memory flat

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_kind(path) -> str | None:
    """What ``path`` is when it is not a regular file ("a FIFO (named pipe)", ...), else None.

    For readers that hand a path to a library (DuckDB, zipfile) which would block on a FIFO or read
    a device forever. Example: ``special_kind("/dev/zero") == "a character device"``.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:   # missing or unreadable: the caller's own open reports it; a loop is named
        return "a symbolic link loop" if exc.errno == errno.ELOOP else None
    return next((kind for test, kind in _KINDS if test(mode)), None)


class InputFileError(ValueError):
    """A file a user named cannot be read as asked; the message is one line with the fix."""


def read_small_text(path, limit: int = DEFAULT_LIMIT, what: str = "file") -> str:
    """The UTF-8 text of the regular file ``path``, at most ``limit`` bytes, else :class:`InputFileError`.

    Opens with ``O_NONBLOCK`` so a FIFO cannot hang the caller, and checks the opened file
    (``fstat``), not the name, so a swap between check and read changes nothing.
    Example: ``read_small_text("monitor.json", what="config file")``.
    """
    name = repr(str(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputFileError(f"{what} {name} not found: check the path") from None
    except IsADirectoryError:
        raise InputFileError(f"{what} {name} is a directory, not a regular file: give the path of a file") \
            from None
    except OSError as exc:
        raise InputFileError(f"cannot read {what} {name}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    for test, kind in _KINDS:
        if test(mode):
            os.close(fd)
            raise InputFileError(f"{what} {name} is {kind}, not a regular file: give the path of a file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise InputFileError(f"cannot read {what} {name}: {exc.strerror}") from None
    if len(data) > limit:
        raise InputFileError(f"{what} {name} is larger than {limit // 1024} KiB: give the small JSON file "
                             "it should be")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{what} {name} is not UTF-8 text (byte {exc.start}): give a text file") \
            from None
