"""The NEFF runner behind ``neuron-explorer capture`` (the real tool's ``capture`` verb).

``neuron-explorer capture -n model.neff -s OUT [NAME file.npy ...] --num-exec N --profile-nth-exec K``
runs this module in a child process with profiling switched on (``NEURON_RT_INSPECT_ENABLE=1``,
``NEURON_RT_INSPECT_OUTPUT_DIR=OUT``) and then finalises ``OUT/profile.duckdb``::

    python -m neuron_stack.tools.capture model.neff --num-exec 3 --profile-nth-exec 2 \\
        [--save-output-npy DIR] -- [NAME file.npy ...]

It loads the NEFF on a simulated NeuronCore, feeds the given ``.npy`` files to the inputs they name
(inputs not given are zero-filled with the NEFF-declared shape and dtype, as the real tool does),
executes it N times and records per-instruction rows for the K-th execution only (``0``: no device
profile; every execution still gets its ``executions`` row). With ``--save-output-npy DIR`` the
outputs of the last execution are written as ``DIR/output0.npy``, ``DIR/output1.npy``, ...

Bad input (a missing or corrupt NEFF, an unknown input name, a wrong shape or dtype, an unreadable
``.npy``) is one line on stderr naming the problem and the fix, exit 1, and nothing is executed.

>>> to_tensors({}, {"x": ((2, 3), "float32")})[0].shape
torch.Size([2, 3])
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

# torch and the runtime are imported inside the functions that use them: a missing or damaged
# NEFF is reported (from its header) before paying for torch's import.

PROG = "neuron-explorer capture"


class CaptureError(ValueError):
    """Bad capture input; the message is one line naming the problem and the fix."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        raise CaptureError(f"{message}; usage: python -m neuron_stack.tools.capture NEFF [--num-exec N] "
                           "[--profile-nth-exec K] [--save-output-npy DIR] -- [NAME file.npy ...]")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m neuron_stack.tools.capture", description=__doc__.splitlines()[0])
    p.add_argument("neff", help="the compiled model")
    p.add_argument("--num-exec", type=int, default=1, help="number of executions (default 1)")
    p.add_argument("--profile-nth-exec", type=int, default=1,
                   help="record instructions of this execution only (1-based; 0: none)")
    p.add_argument("--save-output-npy", metavar="DIR", help="write the outputs as DIR/output<i>.npy")
    p.add_argument("inputs", nargs="*", metavar="NAME FILE.npy", help="input name and .npy file pairs")
    return p


def input_specs(path: str | Path) -> dict[str, tuple[tuple, str]]:
    """The NEFF-declared inputs in call order, ``{name: (shape, dtype)}``, read without torch.

    Only the header and the program member are read (cheap), so bad input is reported before the
    runtime starts; the full, checksummed load comes after. Raises ``NeffError`` (one line).
    Example: ``input_specs("model.neff")`` -> ``{"x": ((2, 8), "float32")}``.
    """
    import zipfile

    from neuron_stack.ir import Program
    from neuron_stack.isa.neff import NeffError, read_header

    read_header(path)
    try:
        with zipfile.ZipFile(path) as z:
            program = Program.from_json(json.loads(z.read("program.json")))
    except Exception as exc:  # a member that does not parse: the file is damaged
        raise NeffError(f"{path}: unreadable NEFF program ({type(exc).__name__}); "
                        "recompile the model to regenerate it") from None
    by_name = {n.name: n for n in program.nodes}
    out = {}
    for name in program.input_names:
        o = by_name[name].outputs
        out[name] = (tuple(o[0].shape), o[0].dtype) if o else ((), "float32")
    return out


def _describe(specs: dict) -> str:
    return ", ".join(f"{n} {list(s)} {d}" for n, (s, d) in specs.items()) or "none"


def read_input(name: str, path: str, spec: tuple[tuple, str]):
    """Load ``path`` (a .npy file) as the numpy array for input ``name``, checked against ``spec``.

    bfloat16 inputs take a float32 file (numpy has no bfloat16); it is rounded on the way in.
    Raises :class:`CaptureError` with one line on a missing or unreadable file, or a shape/dtype
    that differs from the NEFF's. Example: ``read_input("x", "x.npy", ((2, 8), "float32"))``.
    """
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise CaptureError(f"input {name!r}: no such file {path}; pass an existing .npy file")
    try:
        arr = np.load(p, allow_pickle=False)
    except Exception as exc:  # numpy raises ValueError/OSError/EOFError for non-.npy data
        raise CaptureError(f"input {name!r}: {path} is not a readable .npy file ({type(exc).__name__}); "
                           "write it with numpy.save") from None
    if not isinstance(arr, np.ndarray):
        raise CaptureError(f"input {name!r}: {path} holds several arrays (.npz); pass one .npy file per input")
    shape, dtype = spec
    want = "float32" if dtype == "bfloat16" else dtype
    if tuple(arr.shape) != tuple(shape) or str(arr.dtype) != want:
        raise CaptureError(f"input {name!r}: {path} is {list(arr.shape)} {arr.dtype} but the NEFF expects "
                           f"{list(shape)} {want}; save the array with that shape and dtype")
    return arr


def gather_inputs(pairs: list[str], specs: dict) -> dict:
    """The checked arrays of the ``NAME file.npy`` pairs, ``{name: np.ndarray}`` (the rest are absent).

    >>> gather_inputs([], {"x": ((2, 3), "float32")})
    {}
    """
    if len(pairs) % 2:
        raise CaptureError("inputs come in pairs: NAME file.npy [NAME file.npy ...]")
    given: dict[str, object] = {}
    for name, path in zip(pairs[::2], pairs[1::2]):
        if name not in specs:
            raise CaptureError(f"unknown input {name!r}: this NEFF's inputs are {_describe(specs)}")
        if name in given:
            raise CaptureError(f"input {name!r} is given twice; pass each input once")
        given[name] = read_input(name, path, specs[name])
    return given


def to_tensors(given: dict, specs: dict) -> list:
    """Input tensors in call order: the given arrays, the others zero-filled with the declared
    shape and dtype. Example: ``to_tensors({}, {"x": ((2, 3), "int64")})[0].dtype`` -> ``torch.int64``.
    """
    import torch
    out = []
    for name, (shape, dtype) in specs.items():
        t = torch.from_numpy(given[name].copy()) if name in given else torch.zeros(shape)
        out.append(t.to(getattr(torch, dtype)))
    return out


@contextlib.contextmanager
def _instructions_recorded(recorder, on: bool):
    """Record per-instruction rows for the executions inside the block only if ``on``: the others are
    recorded with the device profile off (their ``executions`` row and system events stay)."""
    if recorder is None or on:
        yield
        return
    saved = recorder.device_profile
    recorder.device_profile = "off"
    recorder.device_off = ("--profile-nth-exec 0 (no device profile)", "pass --profile-nth-exec 1")
    try:
        yield
    finally:
        recorder.device_profile = saved


def save_outputs(outputs: list, out_dir: str | Path) -> list[Path]:
    """Write ``outputs`` as ``out_dir/output<i>.npy`` (bfloat16 as float32). Returns the paths."""
    import numpy as np
    import torch

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, t in enumerate(outputs):
        if isinstance(t, torch.Tensor):
            t = t.detach()
            arr = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        else:
            arr = np.asarray(t)
        p = d / f"output{i}.npy"
        np.save(p, arr)
        paths.append(p)
    return paths


def run(argv: list[str]) -> int:
    """Parse ``argv``, execute the NEFF and print what ran. Example in the module docstring."""
    if "--" in argv:  # everything after -- is NAME file.npy pairs (names may start with '-')
        cut = argv.index("--")
        args = _parser().parse_args(argv[:cut])
        args.inputs = list(args.inputs) + argv[cut + 1:]
    else:
        args = _parser().parse_args(argv)
    if args.num_exec < 1:
        raise CaptureError(f"--num-exec {args.num_exec}: execute at least once (--num-exec 1)")
    if not 0 <= args.profile_nth_exec <= args.num_exec:
        raise CaptureError(f"--profile-nth-exec {args.profile_nth_exec} is not between 0 (no device profile) "
                           f"and --num-exec {args.num_exec}")
    # Everything is checked before torch and the runtime start: bad input leaves no profile behind.
    specs = input_specs(args.neff)            # NeffError: one line naming the file and the fix
    given = gather_inputs(args.inputs, specs)
    zero_filled = [n for n in specs if n not in given]

    from torch.utils import _pytree as pytree

    from neuron_stack.isa.neff import load
    from neuron_stack.runtime.model import LoadedModel

    neff = load(args.neff)                    # the full load verifies every member's checksum
    inputs = to_tensors(given, specs)
    model = LoadedModel(neff, {"kind": "trace", "cache_hit": False, "loaded_from": str(args.neff)})
    model.check_inputs(inputs)
    recorder = model.session.recorder
    outputs = None
    for i in range(1, args.num_exec + 1):
        with _instructions_recorded(recorder, i == args.profile_nth_exec):
            outputs = model.run(inputs)
    print(f"capture: {neff.name} ({neff.target}) on NeuronCore {model.core}: {args.num_exec} execution(s), "
          f"{model.static_device_ns / 1e3:.1f} us projected device time each")
    if zero_filled:
        print(f"capture: zero-filled inputs: {_describe({n: specs[n] for n in zero_filled})}")
    if args.profile_nth_exec:
        n = sum(p.sched.table.num_rows for p in model.parts if p.sched)
        print(f"capture: instructions recorded for execution {args.profile_nth_exec} ({n} device instructions)")
    else:
        print("capture: device profile disabled (--profile-nth-exec 0); executions recorded")
    if args.save_output_npy:
        flat = pytree.tree_leaves(outputs)
        paths = save_outputs(flat, args.save_output_npy)
        print(f"capture: saved {len(paths)} output(s) to {args.save_output_npy}")
    if recorder is None:
        print("capture: profiling is off (NEURON_RT_INSPECT_ENABLE is not set): nothing was recorded; "
              "run it through `neuron-explorer capture`", file=sys.stderr)
    model.session.close()   # flush the trace segments before the parent finalises them
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m neuron_stack.tools.capture``; errors are one line, exit 1."""
    from traces.errors import run_guarded
    return run_guarded(PROG, lambda: run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
