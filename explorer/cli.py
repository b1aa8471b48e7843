"""``neuron-explorer``: one command, verbs contributed by the layers that implement them.

Each module in ``VERB_MODULES`` exposes ``register(subparsers)``; every verb it adds sets
``func(args) -> int``. The trace verbs (summary, sql, export) come from ``traces``; ``inspect``
and ``capture`` run workloads in a child process, so this command never imports torch.

Example: ``neuron-explorer summary output/profile.duckdb --json``
"""
from __future__ import annotations

import argparse
import importlib
import sys

from traces.errors import run_guarded

VERB_MODULES = ("traces.cli", "explorer.inspect", "explorer.attach", "explorer.view", "explorer.recommend")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neuron-explorer",
        description="Profile, inspect and explore simulated NeuronCore workloads (is_simulation=true).")
    parser.add_argument("-v", "--version", action="version", version=f"neuron-explorer {_version()}")
    parser.add_argument("--show-profile-schema", action=_ShowSchema,
                        help="print the profile schema (the real tables and fields, and what fills them here; "
                             "then every table of ours) as OpenAPI YAML, then exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name in VERB_MODULES:
        importlib.import_module(name).register(sub)
    return parser


class _ShowSchema(argparse.Action):
    """``--show-profile-schema``: like ``--version``, it answers without a verb or a profile."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from traces.profile_schema import openapi_yaml
        from traces.store import documented_tables
        sys.stdout.write(openapi_yaml(documented_tables()))
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("neuron-stack")
    except PackageNotFoundError:
        return "0+unknown"


def main(argv: list[str] | None = None) -> int:
    """Entry point. Errors end as one line on stderr and a non-zero exit, never a traceback."""
    args = build_parser().parse_args(argv)
    return run_guarded("neuron-explorer", lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
