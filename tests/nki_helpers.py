"""What the NKI tests share: loading a sample kernel file, finding a marked line, and checking that a misuse
fails with one line naming the kernel line (imported by tests/test_nki*.py)."""
import importlib.util
from pathlib import Path

import pytest

from neuron_stack import nki

SAMPLES = Path(__file__).resolve().parents[1] / "sample_workloads" / "nki"


def sample(name: str):
    """The module ``sample_workloads/nki/<name>.py``, freshly loaded."""
    spec = importlib.util.spec_from_file_location(f"nki_sample_{name}", SAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def line_of(where, text: str) -> int:
    """The first line holding ``text`` in a file (a path, or a function's own source file), skipping the
    ``raises_at(...)`` calls that name the marker."""
    path = Path(where) if isinstance(where, (str, Path)) else Path(where.__code__.co_filename)
    lines = path.read_text().splitlines()
    return next(i + 1 for i, s in enumerate(lines) if text in s and "raises_at(" not in s)


def raises_at(kernel, args, fragment: str, marker: str) -> None:
    """``kernel(*args)`` fails with one line holding ``fragment`` that starts with the ``file.py:line`` of the
    kernel line marked ``marker``."""
    fn = getattr(kernel, "fn", kernel)
    with pytest.raises(nki.NKIError) as e:
        kernel(*args)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{Path(fn.__code__.co_filename).name}:{line_of(fn, marker)}:"), msg
    assert fragment in msg, msg
