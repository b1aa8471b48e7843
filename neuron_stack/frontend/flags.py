"""Compiler flags as ``neuronx-cc`` spells them, from ``compiler_args`` and ``NEURON_CC_FLAGS``.

``NEURON_CC_FLAGS`` also carries the wrapper-only flags of the real framework wrapper
(``--cache_dir=``, ``--no_cache``, ``--retry_failed_compilation``, ``--log_level=``); they steer
the compile cache and never reach the compiler or its flags hash.

>>> f = parse_flags(["--auto-cast", "matmult", "-O1"], env="")
>>> f["auto_cast"], f["optlevel"], f["target"]
('matmult', 1, 'trn1')
>>> parse_flags("--bogus", env="")  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
neuron_stack.frontend.flags.FlagError: unrecognized compiler flag '--bogus': see `neuron-cc compile --help`
for the flags neuronx-cc accepts
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
from collections.abc import Iterable

from neuron_stack.device.profiles import PROFILES, get_profile

#: Flags that change the compiled artifact, hence the cache key (defaults as neuronx-cc documents them).
DEFAULTS = {"target": "trn1", "optlevel": 2, "auto_cast": "none", "auto_cast_type": "bf16",
            "model_type": "generic", "verbose": "warning"}
TARGETS = ("trn1", "inf2", "trn2")
AUTO_CAST = ("none", "matmult", "all")
AUTO_CAST_TYPES = ("bf16", "fp16")
MODEL_TYPES = ("generic", "transformer", "unet-inference")
VERBOSE = ("debug", "info", "warning", "error", "critical")
LNC_TARGETS = tuple(t for t in TARGETS if len(PROFILES[t].lnc_choices) > 1)
#: The compile cache when neither ``--cache_dir`` nor ``$NEURON_COMPILE_CACHE_URL`` names one.
DEFAULT_URL = "/var/tmp/neuron-compile-cache"


def cache_url(flags: dict | None = None) -> str:
    """Where the compile cache lives: ``--cache_dir`` > ``$NEURON_COMPILE_CACHE_URL`` > the default.

    Here, not in ``compiler.cache``, so a tool that only needs the path does not import torch.

    >>> cache_url({"cache_dir": "/tmp/c"})
    '/tmp/c'
    """
    return (flags or {}).get("cache_dir") or os.environ.get("NEURON_COMPILE_CACHE_URL") or DEFAULT_URL


class FlagError(ValueError):
    """A bad compiler flag; the message is one line naming the flag and the fix."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit; we want one clear line
        raise FlagError(f"{message}: see `neuron-cc compile --help` for the flags neuronx-cc accepts")


def add_compiler_flags(p: argparse.ArgumentParser) -> None:
    """Add the neuronx-cc flags to ``p`` (shared by :func:`parse_flags` and the ``neuron-cc`` CLI)."""
    p.add_argument("--target", choices=TARGETS, default=None, help="device generation (default trn1)")
    p.add_argument("-O", "--optlevel", type=int, choices=(1, 2, 3), default=None,
                   help="optimisation level: 1 fast compile, 2 default, 3 best performance")
    p.add_argument("--auto-cast", dest="auto_cast", choices=AUTO_CAST, default=None,
                   help="none (default), matmult: matmul inputs in --auto-cast-type with fp32 accumulation, all")
    p.add_argument("--auto-cast-type", dest="auto_cast_type", choices=AUTO_CAST_TYPES, default=None)
    p.add_argument("--model-type", dest="model_type", choices=MODEL_TYPES, default=None)
    p.add_argument("--verbose", choices=VERBOSE, default=None, help="compile log level (info shows every decision)")
    p.add_argument("-lnc", "--logical-nc-config", "--lnc", dest="lnc", type=int, choices=(1, 2), default=None,
                   help="physical NeuronCores per logical core (trn2 only; default $NEURON_LOGICAL_NC_CONFIG or 2)")


def _split(args: str | Iterable[str] | None, where: str = "compiler_args") -> list[str]:
    if args is None:
        return []
    if isinstance(args, str):
        try:
            return shlex.split(args)
        except ValueError as exc:   # shlex: "No closing quotation" names neither the variable nor the fix
            raise FlagError(f"{where}={args[:60]!r} cannot be split into flags ({exc.args[0].lower()}): "
                            "balance its quotes, e.g. --verbose 'info'") from None
    return [str(a) for a in args]


def parse_flags(compiler_args: str | Iterable[str] | None = None, *, target: str | None = None,
                env: str | None = None) -> dict:
    """Parse compiler flags: ``NEURON_CC_FLAGS`` first, then ``compiler_args`` (which win), then ``target``.

    Returns ``DEFAULTS`` updated with what was given, plus ``cache_dir`` (str or None), ``no_cache``
    (bool) and ``retry_failed_compilation`` (bool). ``env`` overrides ``$NEURON_CC_FLAGS`` (tests).
    Example: ``parse_flags("--auto-cast matmult", target="inf2")``.
    """
    env_tokens = _split(os.environ.get("NEURON_CC_FLAGS", "") if env is None else env, "NEURON_CC_FLAGS")
    tokens = env_tokens + _split(compiler_args)
    p = _Parser(prog="neuronx-cc", add_help=False)
    add_compiler_flags(p)
    p.add_argument("--cache_dir", default=None)
    p.add_argument("--no_cache", action="store_true")
    p.add_argument("--retry_failed_compilation", action="store_true")
    p.add_argument("--log_level", default=None, choices=("INFO", "WARNING", "ERROR", "DEBUG"))
    ns, extra = p.parse_known_args(tokens)
    if extra:
        raise FlagError(f"unrecognized compiler flag {extra[0]!r}: see `neuron-cc compile --help` "
                        "for the flags neuronx-cc accepts")
    flags = dict(DEFAULTS)
    for k in DEFAULTS:
        v = getattr(ns, k)
        if v is not None:
            flags[k] = v
    if target is not None:
        if target not in TARGETS:
            raise FlagError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}")
        if ns.target is not None and ns.target != target:
            raise FlagError(f"conflicting targets: --target {ns.target} in the flags but target={target!r}; pass one")
        flags["target"] = target
    try:   # the LNC degree the artifact is built for: the flag, else the runtime's env var (EVRF066)
        flags["lnc"] = get_profile(flags["target"], ns.lnc).lnc
    except ValueError as exc:
        raise FlagError(str(exc)) from None
    flags["cache_dir"] = ns.cache_dir
    flags["no_cache"] = bool(ns.no_cache)
    flags["retry_failed_compilation"] = bool(ns.retry_failed_compilation)
    return flags


def compiler_flags(flags: dict) -> dict:
    """Only the flags that change the compiled artifact (no cache or logging switches); the LNC degree
    only on a target that has a choice of it (trn1/inf2 keys stay as they were)."""
    out = {k: flags[k] for k in DEFAULTS if k != "verbose"}
    if flags["target"] in LNC_TARGETS:
        out["lnc"] = flags.get("lnc") or get_profile(flags["target"]).lnc
    return out


def flags_hash(flags: dict) -> str:
    """8 hex digits over the artifact-changing flags, as the cache's ``MODULE_<graph>+<flags>`` suffix."""
    blob = json.dumps(compiler_flags(flags), sort_keys=True).encode()
    return hashlib.md5(blob).hexdigest()[:8]


def command_line(flags: dict) -> str:
    """The flags as a neuronx-cc command line, e.g. ``--target=trn1 -O2 --auto-cast=none ...``."""
    f = compiler_flags(flags)
    return (f"--target={f['target']} -O{f['optlevel']} --auto-cast={f['auto_cast']} "
            f"--auto-cast-type={f['auto_cast_type']} --model-type={f['model_type']}"
            + (f" --logical-nc-config={f['lnc']}" if "lnc" in f else ""))
