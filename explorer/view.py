"""``neuron-explorer view`` (the web Explorer) and ``neuron-explorer diff`` (two profiles compared).

Examples::

    neuron-explorer view output/20260101-120000_mlp/profile.duckdb          # http://127.0.0.1:3001/
    neuron-explorer view A/profile.duckdb B/profile.duckdb --port 3005
    neuron-explorer diff A/profile.duckdb B/profile.duckdb --json
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
from pathlib import Path


def register(subparsers) -> None:
    """Add the ``view`` and ``diff`` verbs to the ``neuron-explorer`` parser."""
    from traces import cli

    p = subparsers.add_parser("view", help="serve the Explorer web app over one or more profiles",
                              description="Serve the Explorer (Summary, Timeline, Hierarchy, Source, Fallbacks, "
                                          "Recompiles, SQL, Compare, System Trace). With no profile, lists the "
                                          "profiles in the inspect output directory "
                                          "($NEURON_RT_INSPECT_OUTPUT_DIR or ./output).")
    p.add_argument("profiles", nargs="*", metavar="PROFILE", help="profile.duckdb files or session directories")
    p.add_argument("-s", "--session-file", metavar="PROFILE",
                   help="the profile `capture -s profile.ntff` wrote (as the real `view -n x.neff -s profile.ntff`; "
                        "same as a PROFILE argument)")
    p.add_argument("-n", "--neff", metavar="NEFF",
                   help="with -s: the NEFF that was captured; checked to be the one the profile ran (ours keeps the "
                        "compiled model in the profile, so it is not read for anything else)")
    p.add_argument("--port", type=int, default=3001, help="port to serve on (default 3001, as the real tool)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: only this machine; use 0.0.0.0 deliberately)")
    p.add_argument("--system-trace-filter-neuron-core", metavar="CORES",
                   help='System Trace: show these NeuronCores only ("0,1")')
    p.add_argument("--system-trace-filter-event-type", metavar="NAMES",
                   help='System Trace: show these event types only ("nrt_execute,nrt_load")')
    p.add_argument("--system-trace-filter-instance-id", metavar="IDS", help="System Trace: these instances only")
    p.add_argument("--ignore-device-profile", action="store_true",
                   help="System Trace: no drill-down from an execution into its device timeline; --output-format "
                        "perfetto / json: no device_profile_model_*.pftrace / .json")
    p.add_argument("--ignore-system-profile", action="store_true",
                   help="do not show the system profile; --output-format perfetto / json: no "
                        "system_profile.pftrace / .json")
    p.add_argument("-d", "--directory", metavar="DIR",
                   help="serve every profile under DIR (session directories, finalised first) and manage them: "
                        "the Profiles page deletes and uploads there")
    p.add_argument("--ingest-only", action="store_true",
                   help="finalise the profiles (segments into profile.duckdb) and exit without serving")
    p.add_argument("--output-format", choices=("summary-text", "summary-json", "json", "perfetto", "parquet"),
                   help="instead of serving, as the real flag: print each profile's Summary (summary-text, "
                        "summary-json: neuron-explorer summary [--json]) or write it beside the profile "
                        "(json: system_profile.json and one device_profile_model_<graph_id>.json per graph, "
                        "every real table, at most 1,000,000 rows each; "
                        "perfetto: Perfetto's protobuf, system_profile.pftrace and one "
                        "device_profile_model_<graph_id>.pftrace per graph (Chrome JSON: neuron-explorer export "
                        "--format perfetto); parquet: the processed profile, as "
                        "--ingest-only). Without it, view and --ingest-only write parquet, the real default: "
                        "<data-path>/profiles/global/<display-name>@latest/Instruction.parquet, Summary.parquet, …")
    cli.add_group_flags(p)
    p.add_argument("--data-path", metavar="DIR",
                   help="write processed profiles (Parquet tables) under DIR/profiles/global/ instead of each "
                        "profile's session directory")
    p.add_argument("--framework-source-root", metavar="DIR",
                   help="Source page: read the model's source files from DIR (the current files; a recorded path "
                        "resolves to its longest tail under DIR) instead of the text the profile embeds")
    p.add_argument("--api-port", type=int, metavar="PORT",
                   help="also serve the read-only JSON API alone on PORT (the real tool's 3002); it is always at "
                        "/api on the UI's port")
    p.add_argument("--display-name", action="append", metavar="NAME",
                   help="the name every picker shows for the profile (stored in it as Metadata.profile_name); "
                        "once per PROFILE, in order. Default: the script and mode it recorded "
                        "(\"aws_train.py · eager\")")
    p.add_argument("--ai-recommendation", action="store_true",
                   help="add the Summary's Get AI recommendation button: it sends that Summary to Claude Sonnet 4.5 "
                        "on Amazon Bedrock with your default AWS credentials (billed to you; off by default)")
    p.add_argument("--ai-model", metavar="ID", help="with --ai-recommendation: Bedrock model id")
    p.add_argument("--ai-region", metavar="REGION", help="with --ai-recommendation: US Region to call")
    p.set_defaults(func=_view)

    d = subparsers.add_parser("diff", help="compare two or more profiles by source line and op path",
                              description="Align profiles by source line (file:line) and op path "
                                          "(module / ATen op) and print the device-time deltas against the "
                                          "base (B - A for two; each minus the --base one for more).")
    d.add_argument("a", metavar="A", help="baseline profile.duckdb (or its session directory)")
    d.add_argument("b", metavar="B", help="profile to compare against A")
    d.add_argument("more", nargs="*", metavar="PROFILE", help="more profiles: an N-way comparison")
    d.add_argument("--base", type=int, default=1, metavar="K",
                   help="with more than two profiles: the K-th (1-based, default 1) is the base")
    d.add_argument("--json", action="store_true", help="print the comparison as JSON")
    d.add_argument("-n", "--top", type=int, default=15, help="rows per table (default 15)")
    d.set_defaults(func=_diff)


def resolve_profile(arg: str) -> Path:
    """A profile path from the command line: a ``.duckdb`` file or a session directory holding one."""
    path = Path(arg)
    if path.is_dir():
        if (path / "profile.duckdb").is_file():
            return path / "profile.duckdb"
        raise ValueError(f"{arg}: no profile.duckdb in this directory; finalise the session with "
                         f"`neuron-explorer summary {arg}` or pass the .duckdb file")
    if not path.exists():
        raise ValueError(f"{arg}: no such file; pass a profile.duckdb written by `neuron-explorer inspect`")
    if not path.is_file():
        raise ValueError(f"{arg}: not a regular file; pass a profile.duckdb")
    return path


def check_pair(neff: Path, profile: Path) -> None:
    """Refuse (one line) a NEFF that is not the one ``profile`` ran: the real tool needs the matching
    ``.neff`` / ``.ntff`` pair; ours compares the NEFF header's hash (``neff.json``) with the profile's graphs'.

    >>> check_pair(Path("/nonexistent.neff"), Path("p.ntff"))
    Traceback (most recent call last):
    ValueError: -n /nonexistent.neff: no such file; pass the NEFF given to capture -n
    """
    import json
    import zipfile

    import traces

    if not neff.is_file():
        raise ValueError(f"-n {neff}: no such file; pass the NEFF given to capture -n")
    try:
        with zipfile.ZipFile(neff) as z:
            info = z.getinfo("neff.json")
            if info.file_size > 1 << 20:   # a header is a few KiB; read it bounded
                raise ValueError(f"-n {neff}: its neff.json header is {info.file_size} bytes, not a NEFF's")
            digest = json.loads(z.read(info)).get("hash")
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        raise ValueError(f"-n {neff}: not a NEFF (no readable neff.json header); pass the NEFF given to "
                         "capture -n") from None
    with traces.open(profile) as p:
        ran = {h for h in p.graphs().column("neff_hash").to_pylist() if h}
    if str(digest) not in ran:
        raise ValueError(f"-n {neff} is not the NEFF {profile} ran (its hash {digest} is not among the profile's "
                         f"{len(ran)} graph(s)); pass the NEFF given to capture -n, or leave -n out")


def discover(output_dir: Path) -> list[Path]:
    """Profiles under the inspect output directory (``DIR/<session>/profile.duckdb``), newest first."""
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.glob("*/profile.duckdb") if p.is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _check_port(host: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise ValueError(f"--port {port} is not a port number; use 1-65535 (default 3001)")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ValueError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); "
                             f"pick another port with --port") from None


def sessions(root: Path, depth: int = 3) -> list[Path]:
    """Session directories under ``root`` (a ``profile.duckdb``, or segments not finalised yet), at most
    ``depth`` levels down (``DIR/vm_pid_N/<session>/`` as torch.profiler writes them), sorted."""
    found = []
    for d in [root] + [p for n in range(1, depth + 1) for p in root.glob("/".join(["*"] * n)) if p.is_dir()]:
        if (d / "profile.duckdb").is_file() or any(d.glob("*.arrow")):
            found.append(d)
    return sorted(set(found))


def _view(args) -> int:
    from explorer import manager, sources

    sources.set_root(args.framework_source_root)   # a bad DIR is one line before anything runs
    if args.output_format != "perfetto" and (args.system_trace_primary_group or args.system_trace_secondary_group):
        raise ValueError("--system-trace-primary-group/--system-trace-secondary-group apply to "
                         "--output-format perfetto only (the real tool's Perfetto output view options)")
    if args.ai_recommendation:   # a bad model or region is one line too; nothing is contacted until asked
        from explorer import ai_recommend

        ai_recommend.SETTINGS.update(ai_recommend.settings(args.ai_model, args.ai_region), enabled=True)
    paths = [resolve_profile(a) for a in args.profiles]
    if args.neff and not args.session_file:
        raise ValueError(f"view -n {args.neff}: give the profile it was captured into too: "
                         f"view -n {args.neff} -s profile.ntff")
    if args.session_file:
        paths.append(resolve_profile(args.session_file))
        if args.neff:
            check_pair(Path(args.neff), paths[-1])
    if args.directory:
        root = Path(args.directory)
        if not root.is_dir():
            raise ValueError(f"-d {args.directory}: no such directory; give the output directory of "
                             "neuron-explorer inspect (default ./output)")
        paths += [_finalised(d) for d in sessions(root)]
        manager.SETTINGS["directory"] = root.resolve()
        print(f"neuron-explorer: {len(paths)} profile(s) in {root}/", file=sys.stderr)
    elif not paths:
        out_dir = Path(os.environ.get("NEURON_RT_INSPECT_OUTPUT_DIR", "output"))
        paths = discover(out_dir)
        manager.SETTINGS["directory"] = out_dir.resolve() if out_dir.is_dir() else None
        print(f"neuron-explorer: {len(paths)} profile(s) found in {out_dir}/", file=sys.stderr)
    if args.ingest_only or args.output_format == "parquet":
        return _ingest(paths, args.display_name or [], args.data_path)
    if args.output_format:
        return _output(paths, args)
    _check_port(args.host, args.port)
    if args.api_port is not None:
        _check_port(args.host, args.api_port)
    _name_profiles(paths, args.display_name or [])
    from explorer import data
    from explorer.app import create_app
    from explorer.pages import system

    system.SETTINGS.update(system_trace_settings(args))

    registry = data.Registry(paths)
    warnings = []
    for key in registry.keys():   # say what is wrong now, and keep serving the good ones
        try:
            registry.get(key)
        except data.ExplorerError as exc:
            warnings.append(f"neuron-explorer: warning: {exc}")
    # nothing to serve but error pages: refuse up front
    if (args.profiles or args.session_file) and len(warnings) == len(paths):
        registry.close()
        raise ValueError(next(e.error for e in registry.entries.values()))
    for line in warnings:
        print(line, file=sys.stderr)
    app = create_app(paths, registry=registry)
    url_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    print(f"View {'a list of profiles' if len(paths) != 1 else 'the profile'} at http://{url_host}:{args.port}/",
          flush=True)
    print("ctrl-c to exit", flush=True)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)   # one line per request drowns the URL
    # SIGTERM (a service manager, a script's `kill`) stops the server as ctrl-c does, exit status 0.
    # A script that starts the view in the background has SIGINT ignored (inherited), so SIGTERM
    # is the way to stop it there, as with neuron-monitor.
    signal.signal(signal.SIGTERM, _interrupt)
    if args.api_port is not None:
        _serve_api(args.host, args.api_port)
        print(f"JSON API at http://{url_host}:{args.api_port}/api/profiles", flush=True)
    manager.SETTINGS["data_path"] = args.data_path
    writer = manager.process_in_background(paths)
    try:
        app.run(host=args.host, port=args.port, debug=False)
    finally:
        if writer is not None and writer.poll() is None:
            import subprocess

            writer.terminate()   # it removes its half-written directory; the next view writes it again
            try:
                writer.wait(timeout=10)
            except subprocess.TimeoutExpired:   # inside one long COPY: its temporary directory stays hidden
                writer.kill()
                writer.wait()
    return 0


def _finalised(session: Path) -> Path:
    """A session's ``profile.duckdb``, finalising its segments first when it has none (``traces.open``)."""
    import traces

    if not (session / "profile.duckdb").is_file():
        traces.open(session).close()
    return session / "profile.duckdb"


def _ingest(paths: list[Path], names: list[str], data_path: str | None = None) -> int:
    """``view --ingest-only``: every profile finalised, checked (and named) and processed into the real tool's
    Parquet tables (``traces.processed``: skipped while up to date), then exit."""
    import traces
    from traces import processed

    _name_profiles(paths, names)
    for path in paths:
        with traces.open(path) as p:
            label, n = p.display_name() or path.parent.name, p.timeline_bounds().instructions
        out, wrote = processed.process(path, data_path)
        print(f"ingested {path}: {label}, {n:,} instructions; Parquet tables "
              f"{'written to' if wrote else 'up to date in'} {out}/", flush=True)
    print(f"{len(paths)} profile(s) ready; view them with neuron-explorer view {' '.join(map(str, paths[:3]))}"
          f"{' …' if len(paths) > 3 else ''}", flush=True)
    return 0


def _output(paths: list[Path], args) -> int:
    """``view --output-format``: each profile's Summary printed, or its export written beside it (no server)."""
    import argparse

    from traces import cli

    fmt = args.output_format
    if not paths:
        raise ValueError("--output-format: no profile to process; name one or use -d DIR")
    _name_profiles(paths, args.display_name or [])
    for path in paths:
        if fmt.startswith("summary"):
            cli.summary_cmd(argparse.Namespace(profile=str(path), json=fmt == "summary-json", per_core=False,
                                               include_warmup=False))
        elif fmt == "perfetto":   # the real files, beside the profile: system_profile.pftrace, device_profile_model_*
            cli.pftrace_cmd(str(path), path.parent, args, new_dir=False)
        else:                     # json: system_profile.json, device_profile_model_<graph_id>.json
            cli.json_files_cmd(str(path), path.parent, args)
    return 0


def _serve_api(host: str, port: int) -> None:
    """The JSON API alone on ``port``, in a thread (the real tool's API server beside its UI)."""
    import threading

    from flask import Flask
    from werkzeug.serving import make_server

    from explorer import api

    app = Flask("explorer_api")
    app.register_blueprint(api.blueprint())
    srv = make_server(host, port, app, threaded=True)
    threading.Thread(target=srv.serve_forever, daemon=True, name="explorer-api").start()


def _name_profiles(paths: list[Path], names: list[str]) -> None:
    """Store each ``--display-name`` in its profile (one per PROFILE, in order)."""
    if not names:
        return
    if len(names) != len(paths):
        raise ValueError(f"{len(names)} --display-name for {len(paths)} profile(s): give one per PROFILE, in order "
                         "(neuron-explorer view A B --display-name eager --display-name compiled)")
    from traces.naming import set_display_name

    for path, name in zip(paths, names):
        set_display_name(path, name)


def system_trace_settings(args) -> dict:
    """The System Trace page's defaults from the --system-trace-filter-* and --ignore-* flags; a malformed
    list is one line (ValueError). Example: ``--system-trace-filter-neuron-core 0,1`` → ``{"cores": [0, 1], ...}``."""
    def words(raw, flag, pattern=r"[A-Za-z0-9_.:-]{1,128}"):
        if raw is None:
            return None
        items = [w.strip() for w in raw.split(",") if w.strip()]
        bad = [w for w in items if not re.fullmatch(pattern, w)]
        if bad or not items:
            raise ValueError(f"{flag} {raw[:60]!r}: expected a comma-separated list such as "
                             f"{'0,1' if 'core' in flag else 'nrt_execute,nrt_load'}")
        return items
    cores = words(args.system_trace_filter_neuron_core, "--system-trace-filter-neuron-core", r"[0-9]{1,4}")
    return {"cores": [int(c) for c in cores] if cores else None,
            "names": words(args.system_trace_filter_event_type, "--system-trace-filter-event-type"),
            "instances": words(args.system_trace_filter_instance_id, "--system-trace-filter-instance-id"),
            "ignore_device": bool(args.ignore_device_profile), "ignore_system": bool(args.ignore_system_profile)}


def _interrupt(signum, frame):
    raise KeyboardInterrupt   # the server's loop closes its socket and returns


def _diff(args) -> int:
    from explorer import data

    a, b = resolve_profile(args.a), resolve_profile(args.b)
    if args.top < 1:
        raise ValueError("--top must be at least 1")
    if args.more:
        return _diff_n([a, b] + [resolve_profile(x) for x in args.more], args)
    registry = data.Registry([a, b])
    ka, kb = registry.keys()
    result = data.compare(registry.get(ka), registry.get(kb), limit=args.top)
    result["a_path"], result["b_path"] = str(a), str(b)
    result["a_label"], result["b_label"] = registry.label(ka), registry.label(kb)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        _print_diff(result)
    registry.close()
    return 0


def _diff_n(paths: list[Path], args) -> int:
    """``diff A B C …``: N profiles against the ``--base`` one (``data.compare_n``)."""
    from explorer import data

    if not 1 <= args.base <= len(paths):
        raise ValueError(f"--base {args.base}: pick 1 to {len(paths)} (the profiles in the order given)")
    registry = data.Registry(paths)
    data.set_registry(registry)            # the display names
    try:
        c = data.compare_n([registry.get(k) for k in registry.keys()], args.base - 1, limit=args.top)
    finally:
        registry.close()
    c["paths"] = [str(p) for p in paths]
    if args.json:
        print(json.dumps(c, indent=2, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    from explorer.figures import fmt_ns

    console = Console()
    names = [chr(ord("A") + i) if i < 26 else f"P{i + 1}" for i in range(len(paths))]
    for n, label, path, i in zip(names, c["labels"], c["paths"], range(len(paths))):
        console.print(f"[bold]{n}[/] {label}  {path}{'  (base)' if i == c['base'] else ''}", highlight=False,
                      soft_wrap=True)
    base = names[c["base"]]
    t = Table("metric", *names, title=f"Totals (Δ against {base})")
    for k, v in c["totals"].items():
        f = fmt_ns if k.endswith("_ns") else (lambda x: f"{x:.4g}" if isinstance(x, float) else f"{x:,}")
        t.add_row(k, *[f(x) + ("" if i == c["base"] else f" ({'+' if d > 0 else ''}{f(d)})")
                       for i, (x, d) in enumerate(zip(v["values"], v["delta"]))])
    console.print(t)
    for title, key, rows in (("By source line", "line", c["by_line"]), ("By op path", "op_path", c["by_op"]),
                             ("Backward ops by the forward line they came from", "line", c["by_fwd_line"])):
        if rows:
            t = Table(key, *names, title=f"{title} (Δ against {base})")
            for r in rows:
                t.add_row(r[key], *[("—" if not present else fmt_ns(x)) + (
                    "" if i == c["base"] or not d else f" ({'+' if d > 0 else ''}{fmt_ns(d)})")
                    for i, (x, d, present) in enumerate(zip(r["ns"], r["delta_ns"], r["present"]))])
            console.print(t)
    return 0


def _print_diff(c: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from explorer.figures import fmt_ns

    console = Console()
    console.print(f"[bold]A[/] {c['a_label']}  {c['a_path']}\n[bold]B[/] {c['b_label']}  {c['b_path']}",
                  highlight=False, soft_wrap=True)   # one line each, whatever the terminal's width
    why = c["why"]
    named = "" if why["a_name"] == "A" else f"A = {why['a_name']}, B = {why['b_name']}; "
    console.print(f"[bold]Why[/] ({named}every execution, warm-ups included)")
    for line in why["lines"]:
        console.print(f"  • {line}", highlight=False)
    t = Table("metric", "A", "B", "B - A", title="Totals (every execution, warm-ups included)")
    for k, v in c["totals"].items():
        f = fmt_ns if k.endswith("_ns") else (lambda x: f"{x:.4g}" if isinstance(x, float) else f"{x:,}")
        t.add_row(k, f(v["a"]), f(v["b"]), f(v["delta"]))
    console.print(t)
    for title, key, rows in (("By source line", "line", c["by_line"]), ("By op path", "op_path", c["by_op"]),
                             ("Backward ops by the forward line they came from", "line", c["by_fwd_line"])):
        if not rows:
            continue
        t = Table(key, "A", "B", "delta", "delta %", title=title)
        for r in rows:
            pct = "" if r["delta_percent"] is None else f"{r['delta_percent']:+.1f}%"
            t.add_row(r[key], fmt_ns(r["a_ns"]), fmt_ns(r["b_ns"]),
                      ("+" if r["delta_ns"] > 0 else "") + fmt_ns(r["delta_ns"]),
                      pct or (f"only in {r['only_in'].upper()}" if r["only_in"] else ""))
        console.print(t)
