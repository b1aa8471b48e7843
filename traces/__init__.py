"""neuron_stack's trace store: Arrow schema, segment writer, DuckDB profile, queries, exporters.

Importing ``traces`` is light (pyarrow only); DuckDB loads on first use of :func:`finalize`
or :func:`open`. See docs/traces.md and docs/trace_schema.md.

>>> import tempfile, traces
>>> d = tempfile.mkdtemp()
>>> with traces.Writer(d, run={"run_id": "doc"}) as w:
...     w.append("events", {"ts_ns": [1], "kind": "compile", "detail": "{}"})
>>> with traces.open(traces.finalize(d)) as p:
...     p.sql("SELECT kind FROM events").to_pylist()
[{'kind': 'compile'}]
"""
from __future__ import annotations

from traces.errors import TraceError
from traces.schema import ENGINES, EVENT_KINDS, SCHEMA_VERSION, TABLES
from traces.writer import Writer

__all__ = ["Writer", "finalize", "open", "Profile", "TraceError", "SCHEMA_VERSION", "TABLES", "ENGINES",
           "EVENT_KINDS"]


def finalize(out_dir, include_warmup: bool = False):
    """Build ``out_dir/profile.duckdb`` from the segments in ``out_dir``; see :func:`traces.store.finalize`.

    Example: ``path = traces.finalize("output/session")``.
    """
    from traces.store import finalize as _finalize
    return _finalize(out_dir, include_warmup=include_warmup)


def open(path, **options):  # noqa: A001 - the documented name, like io.open / tarfile.open
    """Open a profile read-only: a ``profile.duckdb``, a directory of segments (finalised first),
    or an exported Parquet dataset; see :func:`traces.opening.open_profile`.

    Example: ``with traces.open("output/session/profile.duckdb") as p: p.summary()``.
    """
    from traces.opening import open_profile
    return open_profile(path, **options)


def __getattr__(name):
    if name == "Profile":
        from traces.query import Profile
        return Profile
    raise AttributeError(f"module 'traces' has no attribute {name!r}")
