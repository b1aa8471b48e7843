"""The trace verbs of ``neuron-explorer``: ``summary``, ``sql`` and ``export``.

``explorer/cli.py`` calls :func:`register`; each verb's ``func(args)`` returns an exit code and
raises :class:`~traces.errors.TraceError` (printed as one line by ``run_guarded``) on bad input.
PROFILE is a ``profile.duckdb``, a session directory (its segments are finalised first when
needed) or a Parquet export.

Examples::

    neuron-explorer summary output/session --json
    neuron-explorer sql output/session "SELECT opcode, count(*) FROM instructions WHERE core = ? GROUP BY ALL" -p 0
    neuron-explorer export output/session --format perfetto -o trace.json
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from traces import q_host
from traces.errors import OutOfMemory, TraceError
from traces.timefmt import fmt_ns, fmt_window
from traces.vocab import ENGINE_LABELS

#: ``neuron-explorer sql`` stops a query after this long unless ``--timeout`` or ``--unsafe`` says otherwise.
SQL_TIMEOUT_S = 60.0   # a query over a profile answers in seconds; a runaway one is stopped soon

PROG = "neuron-explorer"

#: Summary sections for the human-readable table: (title, metric names); all of them are in --json.
SUMMARY_SECTIONS = (
    ("Time", ("total_time", "total_exec_time", "execution_count", "core_count", "run_count",
              "neuroncore_cycle_count")),
    ("Engines", ("tensor_engine_active_time_percent", "vector_engine_active_time_percent",
                 "scalar_engine_active_time_percent", "gpsimd_engine_active_time_percent",
                 "sync_engine_active_time_percent", "dma_active_time_percent", "cc_op_active_time_percent")),
    ("Instructions", ("event_count", "tensor_engine_instruction_count", "vector_engine_instruction_count",
                      "scalar_engine_instruction_count", "gpsimd_engine_instruction_count",
                      "sync_engine_instruction_count", "dma_transfer_count", "cc_op_count")),
    ("FLOPs", ("model_flops", "hardware_flops", "mfu_estimated_percent", "hfu_estimated_percent",
               "mm_arithmetic_intensity", "tensor_engine_peak_bf16_flops")),
    ("Memory traffic", ("hbm_read_bytes", "hbm_write_bytes", "dma_transfer_total_bytes",
                        "dma_transfer_average_bytes")),
    ("Host", ("cpu_fallback_count", "cpu_fallback_op_count", "cpu_fallback_time", "graph_count",
              "recompile_count", "cache_hit_count", "compile_count", "compile_time", "before_window_graph_count",
              "before_window_compile_count", "before_window_recompile_count", "before_window_compile_time")),
)


class _OneLine(logging.Handler):
    """Library log records (notes, skipped segments) as ``neuron-explorer: note: ...`` lines."""

    def emit(self, record: logging.LogRecord) -> None:
        level = "warning" if record.levelno >= logging.WARNING else "note"
        print(f"{PROG}: {level}: {record.getMessage()}", file=sys.stderr)


def _setup_logging() -> None:
    log = logging.getLogger("traces")
    if not any(isinstance(h, _OneLine) for h in log.handlers):
        log.addHandler(_OneLine())
        log.setLevel(logging.INFO)
        log.propagate = False


def register(subparsers) -> None:
    """Add the ``summary``, ``sql`` and ``export`` verbs to ``neuron-explorer``'s subparsers."""
    p = subparsers.add_parser(
        "summary", help="print the Summary metrics of a profile (real profiler names)",
        description="Print the Summary metrics of a profile under the real profiler's names. "
                    "Warm-up executions are excluded unless --include-warmup.")
    p.add_argument("profile", metavar="PROFILE", help="profile.duckdb, session directory or Parquet export")
    p.add_argument("--json", action="store_true", help='print {"summary": [ {...} ]} as JSON')
    p.add_argument("--per-core", action="store_true", help="one row per run and NeuronCore")
    p.add_argument("--include-warmup", action="store_true", help="count warm-up executions too")
    p.set_defaults(func=summary_cmd)

    p = subparsers.add_parser(
        "sql", help="run read-only SQL over a profile",
        description="Run one read-only SQL statement over a profile (tables: docs/trace_schema.md). "
                    "Pass values with -p, never inside the SQL text.")
    p.add_argument("profile", metavar="PROFILE", help="profile.duckdb, session directory or Parquet export")
    p.add_argument("query", metavar="SQL", help='the statement, or "-" to read it from stdin')
    p.add_argument("-p", "--param", action="append", default=[], metavar="VALUE",
                   help="value for the next ? placeholder (JSON literal or plain text); repeatable")
    p.add_argument("--format", choices=("table", "csv", "json", "arrow"), default="table",
                   help="output format (default: a table)")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--max-rows", type=int, default=100, metavar="N",
                   help="rows shown by --format table (default 100; other formats write all)")
    p.add_argument("--expanded", action="store_true",
                   help="--format table: each row as a column/value block (a single row wider than the "
                        "terminal is shown so anyway)")
    p.add_argument("--timeout", type=float, default=SQL_TIMEOUT_S, metavar="SECONDS",
                   help=f"stop the query after this long (default {SQL_TIMEOUT_S:g})")
    p.add_argument("--unsafe", action="store_true",
                   help="DuckDB's full power: the query may read and write other files (COPY ... TO, "
                        "read_csv), load extensions and use any memory, threads and time; only for your "
                        "own machine")
    p.set_defaults(func=sql_cmd)

    p = subparsers.add_parser(
        "export", help="export a profile to Perfetto (JSON or protobuf), a Parquet dataset or CSV",
        description="Export a profile: perfetto = Chrome/Perfetto trace JSON, one file (ui.perfetto.dev), "
                    "pftrace = Perfetto's protobuf, a new directory with system_profile.pftrace and one "
                    "device_profile_model_<graph_id>.pftrace per graph (what view --output-format perfetto writes), "
                    "parquet = hive-partitioned dataset (run_id/core) plus the real tool's files "
                    "(Instruction.parquet, Summary.parquet, SystemProfileEvents.parquet, ...), "
                    "csv = one file per table.")
    p.add_argument("profile", metavar="PROFILE", help="profile.duckdb, session directory or Parquet export")
    p.add_argument("--format", required=True, choices=("perfetto", "pftrace", "parquet", "csv", "json"),
                   help="export format (json: every real table in one document, at most 1,000,000 rows each)")
    p.add_argument("-o", "--output", required=True, type=Path, metavar="OUT",
                   help="output file (perfetto, json) or new directory (pftrace, parquet, csv)")
    p.add_argument("--start-ns", type=int, help="perfetto, pftrace: first ns (projected clock) to export")
    p.add_argument("--end-ns", type=int, help="perfetto, pftrace: ns (projected clock) to stop at")
    add_group_flags(p)
    p.set_defaults(func=export_cmd)


def _open(path: str, **options):
    import traces

    _setup_logging()
    return traces.open(path, **options)


# -- summary ---------------------------------------------------------------------------------------
def summary_cmd(args: argparse.Namespace) -> int:
    """``neuron-explorer summary PROFILE [--json] [--per-core] [--include-warmup]``."""
    with _open(args.profile) as p:
        warm = True if args.include_warmup else None
        rows = p.summary_per_core(warm).to_pylist() if args.per_core else [p.summary(warm)]
        figures = p.figures(warm)
        host = q_host.host_figures(p)
        meta = p.metadata()
        path = p.path
        ranks = p.ranks().to_pylist()
        verdict = p.capture_verdict()
        serving = p.serving_request_time()
        notes = p.annotations()
        t0 = p.timeline_bounds().t0 if notes else 0
    if len(ranks) < 2:
        ranks = []
    if args.json:
        print(json.dumps({"summary": rows, "figures": figures.as_dict(), "host": host.as_dict(),
                          "capture": verdict.as_dict(), "annotations": notes,
                          **({"serving_request_time": serving} if serving else {}),
                          **({"ranks": ranks} if ranks else {})},
                         indent=2, default=str))
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(soft_wrap=False)
    console.print(f"[bold]{path}[/]  target [bold]{meta.get('target', '?')}[/] "
                  f"({meta.get('instance_type', '?')}), simulated={meta.get('is_simulation', 'true')}, "
                  f"timing model {meta.get('timing_model', '?')}")
    for line in verdict.lines:   # an incomplete capture says so before any figure
        console.print(f"[bold yellow]{verdict.status}:[/] {escape(line)}", highlight=False, soft_wrap=True)
    for row in rows:
        title = f"Summary — run {row['run_id']} nc{row['core']}" if args.per_core else "Summary"
        if not row.get("warmup_included") and not args.include_warmup:
            title += " (warm-up executions excluded)"
        table = Table(title=title, title_justify="left", show_header=True, header_style="bold")
        table.add_column("section")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for section, names in SUMMARY_SECTIONS:
            shown = [n for n in names if n in row]
            for i, name in enumerate(shown):
                table.add_row(section if i == 0 else "", name, _human(name, row[name]),
                              end_section=i == len(shown) - 1)
        console.print(table)
    _print_figures(console, figures, host)
    if serving:
        _print_serving(console, serving)
    for a in notes:   # the user's notes from the Explorer's timeline (traces.annotate)
        when = (fmt_ns(a["start_ns"] - t0) if a["kind"] == "point"
                else fmt_window(a["start_ns"] - t0, a["end_ns"] - t0))
        console.print(f"annotation {a['id']} at {when}: {escape(a['text'])}", highlight=False, soft_wrap=True)
    if ranks:
        _print_ranks(console, ranks)
    return 0


def _print_figures(console, f, h) -> None:
    """The headline figures (``Profile.figures()``), as the Explorer and neuron-top --replay show them."""
    from rich.table import Table

    table = Table(title="Figures (as the Explorer and neuron-top --replay show them)", title_justify="left",
                  header_style="bold")
    table.add_column("figure")
    table.add_column("value", justify="right")
    engines = "  ".join(f"{ENGINE_LABELS[e]} {pct:.1f} %" for e, pct in f.engine_percent.items())
    for name, value in (("device time (host time excluded)", _seconds(f.device_ns / 1e9)),
                        ("device busy", f"{f.device_busy_percent:.2f} % of {_seconds(f.span_ns / 1e9)} × "
                                        f"{f.cores} core{'s' if f.cores != 1 else ''}"),
                        ("engine active (% of device time)", engines),
                        ("MFU (estimated)", f"{f.mfu_percent:.2f} %"),
                        ("CPU fallbacks", f"{f.fallback_ops} ops · {f.fallback_calls} calls · "
                                          f"{_seconds(f.fallback_host_ns / 1e9)} host time"),
                        ("compiles", f"{f.compiles} ({f.recompiles} recompiles, {f.cache_hits} cache hits) · "
                                     f"{_seconds(f.compile_ns / 1e9)}"
                                     + (f" · {f.before_window_text()}" if f.before_window_text() else "")),
                        ("host side (warm-ups included)",
                         f"{h.executions} executions of {h.graphs} graphs · {h.ops_per_execution:.1f} ops each · "
                         f"dispatch {_seconds(h.dispatch_ns / 1e9)} (host) · {h.transfers} transfers, "
                         f"{h.transfer_bytes:,} B, {_seconds(h.transfer_ns / 1e9)} PCIe")):
        table.add_row(name, value)
    console.print(table)


def _print_serving(console, rows: list[dict]) -> None:
    """Device time and request time per serving step (``Profile.serving_request_time``, as the Serving page)."""
    from rich.table import Table

    table = Table(title="Serving: time per step (request = device + launch + host-link copies)",
                  title_justify="left", header_style="bold")
    for col in ("phase", "steps", "device time", "request time", "request adds"):
        table.add_column(col, justify="right")
    for r in rows:
        req = [fmt_ns(r[k]) if r[k] is not None else "not recorded" for k in ("request_ns", "added_ns")]
        table.add_row(r["phase"], str(r["steps"]), fmt_ns(r["device_ns"]), *req)
    console.print(table)


def _print_ranks(console, ranks: list[dict]) -> None:
    """The ranks of a multi-process job; the straggler waits least in collectives (the others wait for it)."""
    from rich.table import Table

    table = Table(title="Ranks", title_justify="left", header_style="bold")
    for col in ("node", "rank", "executions", "device time", "collective wait"):
        table.add_column(col, justify="right")
    for r in ranks:
        table.add_row(str(r["node"]), str(r["rank"]), str(r["executions"]), _seconds(r["device_ns"] / 1e9),
                      _seconds(r["cc_wait_ns"] / 1e9))
    console.print(table)
    slow = min(ranks, key=lambda r: r["cc_wait_ns"])
    others = [r["cc_wait_ns"] for r in ranks if r is not slow]
    lag = sum(others) / len(others) - slow["cc_wait_ns"]
    if lag > 0:
        console.print(f"straggler: rank {slow['rank']} (node {slow['node']}): the other ranks waited "
                      f"{_seconds(lag / 1e9)} more on average in collectives for it")


def _human(name: str, value) -> str:
    if value is None:
        return "—"
    if name.endswith("_percent"):
        return f"{value:.2f} %"
    if name.endswith("_time"):
        return _seconds(value)
    if name.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{_bytes(value)} ({int(value):,})"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() and abs(value) >= 1e6 else f"{value:,.3f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _seconds(s: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3f} {unit}"
    return f"{s * 1e9:.0f} ns"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


# -- sql -------------------------------------------------------------------------------------------
def _param(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


#: ``neuron-explorer sql P - < file``: a statement longer than this is not one (``< /dev/zero`` would
#: otherwise fill the memory).
MAX_STDIN_SQL_CHARS = 1 << 20


def _stdin_sql() -> str:
    query = sys.stdin.read(MAX_STDIN_SQL_CHARS + 1)
    if len(query) > MAX_STDIN_SQL_CHARS:
        raise TraceError(f"the SQL read from stdin is longer than {MAX_STDIN_SQL_CHARS:,} characters: "
                         "pipe in one statement (for example from a .sql file)")
    return query


def sql_cmd(args: argparse.Namespace) -> int:
    """``neuron-explorer sql PROFILE "SELECT …" [-p VALUE]… [--format table|csv|json|arrow] [-o FILE]``."""
    query = _stdin_sql() if args.query == "-" else args.query
    if not query.strip():
        raise TraceError("empty SQL statement: pass a query such as \"SELECT * FROM summary\"")
    if args.format == "arrow" and args.output is None and sys.stdout.isatty():
        raise TraceError("--format arrow writes binary Arrow IPC: redirect stdout or pass -o FILE")
    # read-only by default: no file writes (COPY ... TO), no reads outside the profile (read_text),
    # no extension installs; the setting is locked so the query cannot turn it back on
    if not args.unsafe and not 0 < args.timeout <= 86400:
        raise TraceError(f"--timeout {args.timeout:g}: give seconds between 0 and 86400")
    with _open(args.profile, external_access=args.unsafe, bounded=not args.unsafe) as p:
        if not args.unsafe:   # bounded like the web console: memory (address space), threads, time
            from traces.console import cap_address_space

            cap_address_space()
        try:
            result = p.user_sql(query, [_param(v) for v in args.param] or None,
                                timeout_s=None if args.unsafe else args.timeout).table
        except OutOfMemory as exc:
            raise TraceError(f"{exc} (or pass --unsafe to lift the bound)") from None
        except TraceError as exc:
            if args.unsafe or not any(k in str(exc) for k in ("Permission Error", "configuration has been locked")):
                raise
            raise TraceError(f"{str(exc).splitlines()[0]} (neuron-explorer sql is read-only: it reads only the "
                             "profile; pass --unsafe to let a query read or write other files)") from None
    from traces import sql_output

    try:
        sql_output.write(result, args.format, args.output, max_rows=args.max_rows, expanded=args.expanded)
    except OSError as exc:
        raise TraceError(f"cannot write {args.output or 'stdout'}: {exc.strerror or exc}") from None
    return 0


# -- export ----------------------------------------------------------------------------------------
def add_group_flags(p: argparse.ArgumentParser) -> None:
    """The real tool's Perfetto grouping flags (``export --format pftrace``, ``view --output-format perfetto``)."""
    from traces import perfetto_proto as pp

    p.add_argument("--system-trace-primary-group", metavar="FIELDS",
                   help="Perfetto: the System Trace's first-order grouping (a parent track per value), comma-separated "
                        f"from {', '.join(pp.PRIMARY_FIELDS)} (default {pp.PRIMARY_DEFAULT})")
    p.add_argument("--system-trace-secondary-group", metavar="FIELDS",
                   help="Perfetto: the second-order grouping (one row per value), comma-separated from "
                        f"{', '.join(pp.SECONDARY_FIELDS)} (default {pp.SECONDARY_DEFAULT})")


def pftrace_cmd(profile: str, out_dir: Path, args: argparse.Namespace, new_dir: bool) -> None:
    """Write ``profile``'s ``.pftrace`` files into ``out_dir`` (a new directory when ``new_dir``) and say
    what was written."""
    from traces import perfetto_proto as pp
    from traces.export import _into_new_dir

    groups = (pp.parse_group(getattr(args, "system_trace_primary_group", None)),
              pp.parse_group(getattr(args, "system_trace_secondary_group", None), "--system-trace-secondary-group"))
    window = {"t0": getattr(args, "start_ns", None), "t1": getattr(args, "end_ns", None)}
    sides = {"system": not getattr(args, "ignore_system_profile", False),   # view's --ignore-*-profile, as the real
             "device": not getattr(args, "ignore_device_profile", False)}   # tool's Perfetto output
    with _open(profile) as p:
        files = []
        if new_dir:
            _into_new_dir(Path(out_dir), lambda tmp: files.extend(pp.write(p, tmp, *window.values(), *groups, **sides)))
        else:
            files = pp.write(p, out_dir, *window.values(), *groups, **sides)
    for f in files:
        cut = f" ({f.cut:,} more left out: at most {pp.MAX_SLICES:,} per file; export a window)" if f.cut else ""
        print(f"{PROG}: wrote {Path(out_dir) / f.path.name}: {f.slices:,} slices{cut}")
    print(f"{PROG}: open them at https://ui.perfetto.dev")


def json_files_cmd(profile: str, out_dir: Path, args: argparse.Namespace) -> None:
    """Write ``profile``'s real JSON files (``system_profile.json``, ``device_profile_model_<graph_id>.json``)
    into ``out_dir`` (``view --output-format json``) and say what was written."""
    from traces import json_files

    with _open(profile) as p:
        files = json_files.write(p, out_dir, system=not getattr(args, "ignore_system_profile", False),
                                 device=not getattr(args, "ignore_device_profile", False))
    for f in files:
        cut = (f" ({', '.join(f.truncated)} cut at {json_files.MAX_ROWS:,} rows: query the profile for the rest)"
               if f.truncated else "")
        print(f"{PROG}: wrote {Path(out_dir) / f.path.name}: {len(f.rows)} tables, "
              f"{sum(f.rows.values()):,} rows{cut}")


def export_cmd(args: argparse.Namespace) -> int:
    """``neuron-explorer export PROFILE --format perfetto|pftrace|parquet|csv|json -o OUT``."""
    from traces.export import export

    options = {}
    if args.format in ("perfetto", "pftrace"):
        options = {"t0": args.start_ns, "t1": args.end_ns}
    elif args.start_ns is not None or args.end_ns is not None:
        raise TraceError("--start-ns/--end-ns apply to --format perfetto and pftrace only")
    if args.format != "pftrace" and (getattr(args, "system_trace_primary_group", None) is not None
                                     or getattr(args, "system_trace_secondary_group", None) is not None):
        raise TraceError("--system-trace-*-group apply to --format pftrace only")
    if args.format == "pftrace":
        pftrace_cmd(args.profile, args.output, args, new_dir=True)
        return 0
    with _open(args.profile) as p:
        out = export(p, args.format, args.output, **options)
    hint = {"perfetto": " (open it at https://ui.perfetto.dev)",
            "parquet": f" (neuron-explorer sql {out} \"SELECT ...\" reads it back)", "csv": "",
            "json": ""}[args.format]
    print(f"{PROG}: exported {args.format} to {out}{hint}")
    return 0
