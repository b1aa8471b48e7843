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

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from neuron_stack.compiler.cache import compile_cached
from neuron_stack.compiler.fallbacks import CPUFallbackWarning, warn_fallbacks
from neuron_stack.compiler.support import PartitionerConfig, analyze, check_partitioner_config, support_report
from neuron_stack.frontend.export import capture, register_model_pytrees, user_frame
from neuron_stack.frontend.flags import DEFAULTS, parse_flags
from neuron_stack.ir import Source, paused_gc
from neuron_stack.isa.neff import Neff, NeffError
from neuron_stack.isa.neff import load as load_neff
from neuron_stack.runtime.cores import CoreAllocationError
from neuron_stack.runtime.errors import OutOfDeviceMemory
from neuron_stack.runtime.inspect_config import InspectConfigError
from neuron_stack.runtime.model import LoadedModel
from neuron_stack.tools.parallel_compile import install_collector
from traces import TraceError

__all__ = ["trace", "load", "analyze", "NeuronModule", "PartitionerConfig", "CPUFallbackWarning", "caller_source"]

# neuron_parallel_compile's collect run (NEURON_EXTRACT_GRAPHS_ONLY=1 in the environment of the
# script it runs) records every graph compiled in this process; the compiler only sees the hook.
install_collector()


def caller_source() -> Source | None:
    """The innermost frame of the current Python stack that is user code (the call site).

    Walks the frames themselves: ``inspect.stack()`` reads every file's source and cost a load 0.17 s.
    """
    frames, f = [], sys._getframe(1)
    while f is not None:
        frames.append(f'File "{f.f_code.co_filename}", line {f.f_lineno}, in {f.f_code.co_name}\n')
        f = f.f_back
    return user_frame("".join(reversed(frames)))


def _load_spec(text: str):
    """A NEFF's input/output pytree spec; one naming a Hugging Face cache class (a KV cache captured as
    inputs/outputs) needs transformers' pytree registration, which a fresh process has not done yet."""
    try:
        return pytree.treespec_loads(text)
    except NotImplementedError as e:
        if "transformers." not in str(e):
            raise
        register_model_pytrees(None, all_caches=True)
        return pytree.treespec_loads(text)


class NeuronModule(torch.nn.Module):
    """A compiled model on a simulated NeuronCore: CPU tensors in, CPU tensors out.

    ``save(path)`` writes the NEFF; :func:`load` reads it back without recompiling.
    ``neff`` is the compiled artifact, ``model`` the loaded runtime model (``model.core``).
    """

    def __init__(self, neff: Neff, compile_info: dict | None = None, in_spec=None, out_spec=None):
        super().__init__()
        self.neff = neff
        self.model = LoadedModel(neff, compile_info)
        specs = neff.program.io_specs or {}
        self._in_spec = in_spec or (_load_spec(specs["in"]) if "in" in specs else None)
        self._out_spec = out_spec or (_load_spec(specs["out"]) if "out" in specs else None)
        # The common call (positional tensors in, one tensor or a flat tuple out) skips pytree per call.
        n_in = len(self.model.input_specs)
        self._positional = self._in_spec is None or self._in_spec == pytree.tree_structure(((0,) * n_in, {}))
        out = self._out_spec
        self._out_leaf = out is not None and out == pytree.tree_structure(0)
        #: flat input positions the model updates in place (a static KV cache): the leading outputs
        self._mutated = json.loads(specs.get("mutated_inputs", "[]"))

    @property
    def compile_log(self) -> str:
        return self.neff.log

    @property
    def cache_hit(self) -> bool:
        return bool(self.model.compile_info.get("cache_hit"))

    def forward(self, *args, **kwargs):
        if kwargs or not self._positional:
            flat, spec = pytree.tree_flatten((args, kwargs))
            if self._in_spec is not None and spec != self._in_spec and len(flat) != len(self.model.input_specs):
                raise TypeError(f"{self.neff.name} was traced with {len(self.model.input_specs)} inputs in another "
                                f"structure: call it the way it was traced")
        else:
            flat = args
        self.model.check_inputs(flat)
        outs = self.model.run(flat)
        if self._mutated:
            with torch.no_grad():
                for i, t in zip(self._mutated, outs):
                    flat[i].copy_(t)
            outs = outs[len(self._mutated):]
        if self._out_spec is None:
            return outs[0] if len(outs) == 1 else tuple(outs)
        if self._out_leaf:
            return outs[0]
        return pytree.tree_unflatten(outs, self._out_spec)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the NEFF to ``path``. Example: ``nm.save("model.neff")``."""
        return self.neff.save(path)

    def __repr__(self) -> str:
        h = self.neff.header
        return f"NeuronModule(name={h['name']!r}, target={h['target']!r}, core={self.model.core}, hash={h['hash']})"


class _Stopwatch:
    """Wall and CPU seconds per stage of one ``trace`` call (``compile_info["stages_s"]``, ``["stages_cpu_s"]``:
    CPU time tells the stages apart on a busy machine, where the wall clock mostly measures waiting)."""

    def __init__(self):
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str):
        t, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall[name] = time.perf_counter() - t
            self.cpu[name] = time.process_time() - c

    def subtract(self, outer: str, inner: str) -> None:
        """Take a stage that ran inside another out of the other's time."""
        for d in (self.wall, self.cpu):
            d[outer] -= d.get(inner, 0.0)


def trace(model, example_inputs, *, compiler_args=None, compiler_workdir=None, target: str = "trn1",
          partitioner_config: PartitionerConfig | None = None) -> NeuronModule:
    """Capture ``model`` on ``example_inputs``, compile it ahead of time and load it on a NeuronCore.

    ``example_inputs``: a tensor, a tuple of positional inputs, or a dict of keyword inputs.
    ``compiler_args``: neuronx-cc flags (``"--auto-cast matmult -O1"`` or a list), added to
    ``NEURON_CC_FLAGS``. ``compiler_workdir`` receives ``model.neff`` and ``log-neuron-cc.txt``.
    ``target``: trn1, inf2 or trn2 (a ``--target`` flag wins over the default).
    Compiles go through the persistent cache (``NEURON_COMPILE_CACHE_URL``). A model with ops that run
    on the host CPU issues one :class:`CPUFallbackWarning` naming them (``NEURON_CPU_FALLBACK_WARNING=0``
    silences it).
    ``nm.model.compile_info["stages_s"]`` holds the seconds of each stage (capture, graph_hash,
    passes, cache, runtime_load), ``["stages_cpu_s"]`` their CPU seconds; the compile log's
    ``pass times:`` line splits ``passes``.

    >>> nm = trace(torch.nn.Linear(4, 2), torch.randn(1, 4), target="inf2")   # doctest: +SKIP
    """
    # the passes are imported on first use: loading a saved NEFF never needs them
    from neuron_stack.compiler.driver import compile_program, digest_in_background, graph_hash

    call_site = caller_source()
    t0 = time.perf_counter_ns()
    cfg = partitioner_config
    if cfg is not None and not isinstance(cfg, PartitionerConfig):
        raise TypeError(f"partitioner_config must be a neuron_stack.PartitionerConfig, not {type(cfg).__name__}")
    if cfg is not None and cfg.trace_kwargs:  # trace's own arguments win over the config's
        compiler_args = compiler_args if compiler_args is not None else cfg.trace_kwargs.get("compiler_args")
        compiler_workdir = compiler_workdir if compiler_workdir is not None else cfg.trace_kwargs.get(
            "compiler_workdir")
    probe = parse_flags(compiler_args)
    flags = parse_flags(compiler_args, target=None if target == DEFAULTS["target"] and probe["target"] != target
                        else target)
    sw = _Stopwatch()
    digests = digest_in_background(model) if isinstance(model, torch.nn.Module) else None
    with sw.stage("capture"):
        program = capture(model, example_inputs)
    with paused_gc():      # the rest allocates IR objects by the hundred thousand (see paused_gc)
        # forced CPU placement changes the artifact, so it is part of the graph identity
        forced = sorted(cfg.ops_to_partition) if cfg is not None else []
        with sw.stage("graph_hash"):
            if digests is not None:
                digests.join()     # the weights' digests, made while the model was captured
            ghash = graph_hash(program, salt=",".join(forced))

        def build() -> Neff:
            with sw.stage("passes"):
                return compile_program(program, flags, partitioner_config=cfg, graph_hash_value=ghash)

        with sw.stage("cache"):
            neff, hit, entry = compile_cached(ghash, flags, build, constants=program.constants)
        sw.subtract("cache", "passes")   # the cache's own work: a hit's lookup and load, or a miss's publish
        if compiler_workdir is not None:
            wd = Path(compiler_workdir)
            wd.mkdir(parents=True, exist_ok=True)
            neff.save(wd / "model.neff")
            (wd / "log-neuron-cc.txt").write_text(neff.log)
        if cfg is not None:  # checked on cache hits too: the limits are not part of the artifact
            params = cfg.analyze_parameters or {}
            if params.get("compiler_workdir"):
                wd = Path(params["compiler_workdir"])
                wd.mkdir(parents=True, exist_ok=True)
                report = support_report(neff.program, set(params.get("additional_ignored_ops") or ()))
                (wd / "analyze.json").write_text(json.dumps(report, indent=2))
            check_partitioner_config(neff.program, cfg)
        info = {"kind": "trace", "compile_wall_ns": time.perf_counter_ns() - t0, "cache_hit": hit,
                "cache_path": str(entry) if entry else "", "source": call_site, "stages_s": sw.wall,
                "stages_cpu_s": sw.cpu}
        with sw.stage("runtime_load"):     # the runtime's partition functions, core placement
            nm = NeuronModule(neff, info, in_spec=getattr(program, "in_spec", None),
                              out_spec=getattr(program, "out_spec", None))
        warn_fallbacks(neff, call_site)     # every trace, cache hit or not: the model the user gets falls back
        return nm


def load(path: str | os.PathLike, target: str | None = None) -> NeuronModule:
    """Load a saved NEFF as a :class:`NeuronModule` without recompiling.

    ``target`` (optional) must match the NEFF's. Example: ``neuron_stack.load("model.neff")``.
    """
    t0 = time.perf_counter_ns()
    with paused_gc():
        return _load(path, target, t0)


def _load(path, target, t0) -> NeuronModule:
    neff = load_neff(path, target=target)
    try:
        return NeuronModule(neff, {"kind": "trace", "cache_hit": False, "loaded_from": str(path),
                                   "load_wall_ns": time.perf_counter_ns() - t0, "source": caller_source()})
    except (NeffError, CoreAllocationError, OutOfDeviceMemory, TraceError, InspectConfigError):
        raise   # the runtime's own one-line refusals (a bad NEURON_RT_INSPECT_* too), not a NEFF problem
    except Exception as exc:  # checksums matched but the program is not one this runtime can build
        first = str(exc).splitlines()[0][:120] if str(exc) else ""
        raise NeffError(f"{path}: its program cannot be loaded ({type(exc).__name__}: {first}); "
                        "recompile the model with this neuron_stack") from None
