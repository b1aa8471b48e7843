"""The user-facing front end, shaped like ``torch_neuronx``: ``trace``, ``load``, ``analyze``,
``PartitionerConfig``, and the :class:`NeuronModule` they return.

A traced model runs the shapes it was traced with. Like a real ``torch_neuronx.trace`` model it
*refuses* any other input shape, with an error naming the input, the compiled shape and the one
given (trace again, or pad/bucket the inputs). Use ``torch.compile(backend="neuron")`` to get a
recompile per new shape instead.

>>> import torch, neuron_stack
>>> m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.GELU())
>>> x = torch.randn(2, 8)
>>> nm = neuron_stack.trace(m, x, compiler_args="--no_cache")          # doctest: +SKIP
>>> torch.allclose(nm(x), m(x), rtol=1e-4, atol=1e-6)                    # doctest: +SKIP
True
"""
from __future__ import annotations

import inspect
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from .compiler import compile_program, compiler_version, graph_hash
from .flags import DEFAULTS, parse_flags
from .frontend import capture, user_frame
from .ir import Source
from .legalize import aten_name, legalize
from .neff import Neff
from .neff import load as load_neff


@dataclass
class PartitionerConfig:
    """Which ops to force onto the CPU, as ``torch_neuronx.PartitionerConfig``.

    Only ``ops_to_partition`` changes placement here (the other fields are accepted for API
    compatibility and recorded). Example: ``PartitionerConfig(ops_to_partition={"aten::sort"})``.
    """

    model_support_percentage_threshold: float = 0.5
    min_subgraph_size: int = -1
    max_subgraph_count: int = -1
    ops_to_partition: set = field(default_factory=set)
    analyze_parameters: dict | None = None

    def __post_init__(self):
        bad = [o for o in self.ops_to_partition if not str(o).startswith("aten::")]
        if bad:
            raise ValueError(f"ops_to_partition entry {bad[0]!r} is not an ATen op name: spell it like 'aten::sort'")


def caller_source() -> Source | None:
    """The innermost frame of the current Python stack that is user code (the call site)."""
    frames = "".join(f'File "{f.filename}", line {f.lineno}, in {f.function}\n' for f in reversed(inspect.stack()[1:]))
    return user_frame(frames)


class NeuronModule(torch.nn.Module):
    """A compiled model on a simulated NeuronCore: CPU tensors in, CPU tensors out.

    ``save(path)`` writes the NEFF; :func:`load` reads it back without recompiling.
    ``neff`` is the compiled artifact, ``model`` the loaded runtime model (``model.core``).
    """

    def __init__(self, neff: Neff, compile_info: dict | None = None, in_spec=None, out_spec=None):
        super().__init__()
        from .runtime import LoadedModel

        self.neff = neff
        self.model = LoadedModel(neff, compile_info)
        specs = neff.program.io_specs or {}
        self._in_spec = in_spec or (pytree.treespec_loads(specs["in"]) if "in" in specs else None)
        self._out_spec = out_spec or (pytree.treespec_loads(specs["out"]) if "out" in specs else None)

    @property
    def compile_log(self) -> str:
        return self.neff.log

    @property
    def cache_hit(self) -> bool:
        return bool(self.model.compile_info.get("cache_hit"))

    def forward(self, *args, **kwargs):
        flat, spec = pytree.tree_flatten((args, kwargs))
        if self._in_spec is not None and spec != self._in_spec and len(flat) != len(self.model.input_specs):
            raise TypeError(f"{self.neff.name} was traced with {len(self.model.input_specs)} inputs in another "
                            f"structure: call it the way it was traced")
        self.model.check_inputs(flat)
        outs = self.model.run(flat)
        if self._out_spec is not None:
            return pytree.tree_unflatten(outs, self._out_spec)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the NEFF to ``path``. Example: ``nm.save("model.neff")``."""
        return self.neff.save(path)

    def __repr__(self) -> str:
        h = self.neff.header
        return f"NeuronModule(name={h['name']!r}, target={h['target']!r}, core={self.model.core}, hash={h['hash']})"


def trace(model, example_inputs, *, compiler_args=None, compiler_workdir=None, target: str = "trn1",
          partitioner_config: PartitionerConfig | None = None) -> NeuronModule:
    """Capture ``model`` on ``example_inputs``, compile it ahead of time and load it on a NeuronCore.

    ``example_inputs``: a tensor, a tuple of positional inputs, or a dict of keyword inputs.
    ``compiler_args``: neuronx-cc flags (``"--auto-cast matmult -O1"`` or a list), added to
    ``NEURON_CC_FLAGS``. ``compiler_workdir`` receives ``model.neff`` and ``log-neuron-cc.txt``.
    ``target``: trn1, inf2 or trn2 (a ``--target`` flag wins over the default).
    Compiles go through the persistent cache (``NEURON_COMPILE_CACHE_URL``).

    >>> nm = trace(torch.nn.Linear(4, 2), torch.randn(1, 4), target="inf2")   # doctest: +SKIP
    """
    from .cache import compile_cached

    call_site = caller_source()
    t0 = time.perf_counter_ns()
    probe = parse_flags(compiler_args)
    flags = parse_flags(compiler_args, target=None if target == DEFAULTS["target"] and probe["target"] != target
                        else target)
    program = capture(model, example_inputs)
    # forced CPU placement changes the artifact, so it is part of the graph identity
    forced = sorted(partitioner_config.ops_to_partition) if partitioner_config is not None else []
    ghash = graph_hash(program, salt=",".join(forced))

    def build() -> Neff:
        return compile_program(program, flags, partitioner_config=partitioner_config, graph_hash_value=ghash)

    neff, hit, entry = compile_cached(ghash, flags, build)
    if compiler_workdir is not None:
        wd = Path(compiler_workdir)
        wd.mkdir(parents=True, exist_ok=True)
        neff.save(wd / "model.neff")
        (wd / "log-neuron-cc.txt").write_text(neff.log)
    info = {"kind": "trace", "compile_wall_ns": time.perf_counter_ns() - t0, "cache_hit": hit,
            "cache_path": str(entry) if entry else "", "source": call_site}
    return NeuronModule(neff, info, in_spec=getattr(program, "in_spec", None),
                        out_spec=getattr(program, "out_spec", None))


def load(path: str | os.PathLike, target: str | None = None) -> NeuronModule:
    """Load a saved NEFF as a :class:`NeuronModule` without recompiling.

    ``target`` (optional) must match the NEFF's. Example: ``neuron_stack.load("model.neff")``.
    """
    from traces import TraceError

    from .cores import CoreAllocationError
    from .neff import NeffError
    from .runtime import OutOfDeviceMemory

    t0 = time.perf_counter_ns()
    neff = load_neff(path, target=target)
    try:
        return NeuronModule(neff, {"kind": "trace", "cache_hit": False, "loaded_from": str(path),
                                   "load_wall_ns": time.perf_counter_ns() - t0, "source": caller_source()})
    except (NeffError, CoreAllocationError, OutOfDeviceMemory, TraceError):
        raise
    except Exception as exc:  # checksums matched but the program is not one this runtime can build
        first = str(exc).splitlines()[0][:120] if str(exc) else ""
        raise NeffError(f"{path}: its program cannot be loaded ({type(exc).__name__}: {first}); "
                        "recompile the model with this neuron_stack") from None


_DATA_DEP_AT = "Lowering to HLO"


def analyze(model, example_inputs, compiler_workdir=None, additional_ignored_ops=frozenset(),
            is_hf_transformers: bool = False, **_ignored) -> dict:
    """The operator-support report of ``torch_neuronx.analyze`` for ``model`` on ``example_inputs``.

    Returns ``{"torch_neuronx_version", "neuronx_cc_version", "support_percentage",
    "supported_operators": {"aten::addmm": 3, ...}, "unsupported_operators": [{"kind",
    "failureAt", "call", "opGraph"}]}``; ``call`` is the user's ``file(line): function`` stack.

    >>> r = analyze(torch.nn.Linear(4, 2), torch.randn(1, 4))     # doctest: +SKIP
    >>> r["support_percentage"]                                    # doctest: +SKIP
    '100.00%'
    """
    program = capture(model, example_inputs)
    legalize(program)
    supported: dict[str, int] = {}
    unsupported = []
    total = 0
    for n in program.nodes:
        if not n.is_compute:
            continue
        name = aten_name(n.target)
        if name in additional_ignored_ops:
            continue
        total += 1
        if n.placement == "device":
            supported[name] = supported.get(name, 0) + 1
            continue
        src = n.source
        call = f"{src.file}({src.line}): {src.function}\n" if src else ""
        ins = ", ".join(f"{tuple(s.shape)} {s.dtype}" for s in n.inputs)
        outs = ", ".join(f"{tuple(s.shape)} {s.dtype}" for s in n.outputs)
        unsupported.append({
            "kind": name,
            "failureAt": _DATA_DEP_AT if "data-dependent" in n.fallback_reason else "neuronx-cc",
            "call": call, "reason": n.fallback_reason, "module": n.module_path,
            "opGraph": f"graph({ins}):\n  %{n.name} = {n.target}(...) -> ({outs})"})
    pct = 100.0 * sum(supported.values()) / total if total else 100.0
    return {"torch_neuronx_version": _pkg_version(), "neuronx_cc_version": compiler_version(),
            "support_percentage": f"{pct:.2f}%", "supported_operators": dict(sorted(supported.items())),
            "unsupported_operators": unsupported}


def _pkg_version() -> str:
    try:
        from importlib.metadata import version
        return version("neuron-stack")
    except Exception:
        return "0.0.0"

