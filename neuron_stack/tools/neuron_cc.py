"""``neuron-cc``: the compiler on its own, with the verbs of ``neuronx-cc``.

    neuron-cc compile MODEL_SPEC [--input-shapes 2x16 ...] [--target trn1] [-O2] [--auto-cast none]
                      [--partition-ops aten::sort] [-o model.neff] [--logfile log-neuron-cc.txt]
    neuron-cc list-operators [--json]
    neuron-cc analyze MODEL_SPEC [--input-shapes ...]

MODEL_SPEC is either a ``torch.export`` program saved with ``torch.export.save`` (``model.pt2``:
shapes come from the program), or ``module:factory`` / ``path/to/file.py:factory`` naming a
function (or class) that returns a ``torch.nn.Module``, or a ``(module, example_inputs)`` tuple.
``--input-shapes`` gives one ``DxDx...[:dtype]`` per input (default dtype float32; integer inputs
are filled with random ids in [0, 2)). ``NEURON_CC_FLAGS`` is read as by the framework wrapper.

>>> main(["list-operators"])      # doctest: +SKIP
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
import warnings
from pathlib import Path

from traces.errors import run_guarded

# torch and the compiler are imported inside the verbs that use them, so a bad command line or
# --help answers at once instead of after torch's import (seconds on a loaded machine).

PROG = "neuron-cc"


class UsageError(ValueError):
    """Bad command-line input; one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        self.exit(2, f"{self.prog}: error: {message}; see {PROG} --help\n")


def _parser() -> argparse.ArgumentParser:
    from neuron_stack.frontend.flags import add_compiler_flags

    p = _Parser(prog=PROG, description="neuron_stack compiler (the neuronx-cc analogue)")
    sub = p.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("compile", help="compile a model to a NEFF")
    c.add_argument("model", help="model.pt2 (torch.export.save) or module:factory / file.py:factory")
    c.add_argument("--input-shapes", nargs="+", default=None, metavar="SHAPE",
                   help="one DxD[:dtype] per input, e.g. 2x16 4x128:int64")
    c.add_argument("-o", "--output", default="file.neff", help="the NEFF to write (default file.neff)")
    c.add_argument("--logfile", default=None, help="compile log (default log-neuron-cc.txt next to the NEFF)")
    c.add_argument("--partition-ops", nargs="*", default=[], metavar="OP",
                   help="ATen ops forced to the CPU, e.g. aten::sort (PartitionerConfig.ops_to_partition)")
    c.add_argument("--framework", default="PYTORCH", help="accepted for neuronx-cc compatibility")
    add_compiler_flags(c)
    lo = sub.add_parser("list-operators", help="print the operator-support table")
    lo.add_argument("--json", action="store_true", help="JSON instead of a table")
    lo.add_argument("--framework", default="PYTORCH", help="accepted for neuronx-cc compatibility")
    a = sub.add_parser("analyze", help="operator-support report (torch_neuronx.analyze)")
    a.add_argument("model")
    a.add_argument("--input-shapes", nargs="+", default=None, metavar="SHAPE")
    return p


def shape_dims(text: str) -> tuple[int, ...]:
    """The dimensions of an ``--input-shapes`` item, checked without torch.

    Example: ``shape_dims("4x8:int64") == (4, 8)``.
    """
    dims = text.partition(":")[0]
    if not re.fullmatch(r"[0-9]{1,9}(x[0-9]{1,9}){0,7}", dims.lower()):   # ASCII digits, up to 8 dims
        raise UsageError(f"bad input shape {text[:40]!r}: write dimensions like 2x16, optionally :dtype "
                         "(4x8:int64)")
    shape = tuple(int(d) for d in dims.lower().split("x"))
    if not shape or any(d <= 0 for d in shape):   # a 0-sized input compiles to nothing useful
        raise UsageError(f"bad input shape {text!r}: every dimension must be 1 or more (e.g. 2x16)")
    return shape


def parse_shape(text: str):
    """``2x16`` -> ((2, 16), torch.float32); ``4x8:int64`` -> ((4, 8), torch.int64)."""
    import torch

    shape, dtype = shape_dims(text), text.partition(":")[2]
    dt = getattr(torch, dtype or "float32", None)
    if not isinstance(dt, torch.dtype):
        raise UsageError(f"bad dtype {dtype!r} in input shape {text!r}: use float32, int64, bfloat16...")
    return shape, dt


def _example(shapes: list[str]):
    import torch

    out = []
    gen = torch.Generator().manual_seed(0)
    for s in shapes:
        shape, dt = parse_shape(s)
        out.append(torch.randint(0, 2, shape, generator=gen, dtype=dt) if not dt.is_floating_point
                   else torch.randn(shape, generator=gen).to(dt))
    return tuple(out)


def check_spec(spec: str) -> None:
    """Refuse a MODEL_SPEC that names a missing file, or no factory, before torch's import.

    >>> check_spec("missing.pt2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    neuron_stack.tools.neuron_cc.UsageError: no such file missing.pt2: save one with torch.export.save(...)
    """
    if spec.endswith(".pt2"):
        if not Path(spec).exists():
            raise UsageError(f"no such file {spec}: save one with torch.export.save(ep, '{spec}')")
        return
    mod_name, _, attr = spec.rpartition(":")
    if not mod_name or not attr:
        raise UsageError(f"model spec {spec!r}: use model.pt2, module:factory or path/to/file.py:factory")
    if mod_name.endswith(".py") and not Path(mod_name).exists():
        raise UsageError(f"model spec {spec!r}: no such file {mod_name}")


def _load_factory(spec: str):
    check_spec(spec)
    mod_name, _, attr = spec.rpartition(":")
    if mod_name.endswith(".py"):
        path = Path(mod_name)
        sys.path.insert(0, str(path.resolve().parent))
        s = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(s)
        sys.modules[path.stem] = module
        s.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(mod_name)
        except ImportError as exc:
            raise UsageError(f"model spec {spec!r}: cannot import {mod_name} ({exc}); check the module name "
                             "or give a file path (path/to/file.py:factory)") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise UsageError(f"model spec {spec!r}: {mod_name} has no attribute {attr!r}")
    return fn


def load_spec(spec: str, shapes: list[str] | None):
    """(Program, name) for a MODEL_SPEC; see the module docstring."""
    import torch

    from neuron_stack.frontend.export import capture, from_exported

    check_spec(spec)
    if spec.endswith(".pt2"):
        try:
            ep = torch.export.load(spec)
        except Exception as exc:
            raise UsageError(f"{spec} is not a torch.export program ({type(exc).__name__}); save one with "
                             "torch.export.save") from None
        return from_exported(ep, Path(spec).stem)
    made = _load_factory(spec)()
    model, example = (made if isinstance(made, tuple) else (made, None))
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"model spec {spec!r} returned {type(model).__name__}, not a torch.nn.Module")
    if shapes:
        example = _example(shapes)
    if example is None:
        raise UsageError(f"{spec} needs example inputs: pass --input-shapes (e.g. --input-shapes 2x16) or "
                         "return (model, example_inputs) from the factory")
    with _library_noise_kept_out():
        return capture(model.eval(), example, name=spec.rpartition(":")[2])


@contextlib.contextmanager
def _library_noise_kept_out():
    """Torch's log records and warnings stay out of the terminal while a model is captured.

    A wrong input shape makes torch log the whole fake-tensor traceback at ERROR (19 lines) before it
    raises; capture() turns that exception into one line, which the log would only bury. A logger's level
    is not enough: torch resets its loggers' levels when the exporter initialises its logging, so logging
    is disabled as a whole. ``NEURON_STACK_DEBUG=1`` lets everything through.
    """
    if os.environ.get("NEURON_STACK_DEBUG"):
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _compile(args) -> int:
    from neuron_stack.frontend.flags import parse_flags

    # a bad shape, spec or NEURON_CC_FLAGS is refused before torch's import (seconds on a loaded machine)
    check_spec(args.model)
    for text in args.input_shapes or ():
        shape_dims(text)
    cli = []
    for flag in ("target", "optlevel", "auto_cast", "auto_cast_type", "model_type", "verbose"):
        v = getattr(args, flag)
        if v is not None:
            cli += [f"--{flag.replace('_', '-')}", str(v)]
    flags = parse_flags(cli)

    from neuron_stack.compiler.driver import compile_program
    from neuron_stack.compiler.support import PartitionerConfig
    from neuron_stack.tools.parallel_compile import install_collector

    install_collector()          # inside neuron_parallel_compile's collect run, record instead
    cfg = PartitionerConfig(ops_to_partition=set(args.partition_ops)) if args.partition_ops else None
    program = load_spec(args.model, args.input_shapes)
    neff = compile_program(program, flags, partitioner_config=cfg)
    out = neff.save(args.output)
    log = Path(args.logfile) if args.logfile else out.with_name("log-neuron-cc.txt")
    log.write_text(neff.log)
    st = program.stats
    if flags["verbose"] in ("info", "debug"):
        print(neff.log, end="")
    print(f"Compiler status PASS: {out} ({flags['target']}, {st['num_ops']} ops, {st['num_device_ops']} on the "
          f"device, {st['num_fallbacks']} CPU fallbacks, {st['num_instructions']} instructions); log: {log}")
    return 0


def _list_operators(args) -> int:
    from neuron_stack.compiler.operators import supported_operators

    rows = supported_operators()
    if args.json:
        print(json.dumps([{"operator": o, "class": c, "lowering": n} for o, c, n in rows], indent=1))
        return 0
    width = max(len(o) for o, _, _ in rows)
    print(f"{'OPERATOR':<{width}}  {'CLASS':<13}  LOWERING / FALLBACK REASON")
    for o, c, n in rows:
        print(f"{o:<{width}}  {c:<13}  {n}")
    return 0


def _analyze(args) -> int:
    program_spec = args.model
    if program_spec.endswith(".pt2"):
        raise UsageError("analyze takes module:factory (it re-captures the model); for a .pt2 use "
                         "`neuron-cc compile --verbose info`")
    check_spec(program_spec)   # before the compiler's (and torch's) import
    from neuron_stack.compiler.support import analyze

    made = _load_factory(program_spec)()
    model, example = (made if isinstance(made, tuple) else (made, None))
    if args.input_shapes:
        example = _example(args.input_shapes)
    if example is None:
        raise UsageError(f"{program_spec} needs example inputs: pass --input-shapes")
    with _library_noise_kept_out():
        report = analyze(model.eval(), example)
    print(json.dumps(report, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``neuron-cc``. Example: ``neuron-cc compile models.py:MLP --input-shapes 4x64``."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:   # argparse already printed "neuron-cc: error: ..." for bad flags
        return int(exc.code or 0)
    fn = {"compile": _compile, "list-operators": _list_operators, "analyze": _analyze}[args.verb]
    return run_guarded(PROG, lambda: fn(args))


if __name__ == "__main__":
    sys.exit(main())
