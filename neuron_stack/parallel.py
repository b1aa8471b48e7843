"""Data and tensor parallelism over the NeuronCores of one process (public API, as ``torch_neuronx``'s;
built on :func:`neuron_stack.trace`, so it sits beside the facade, after every stage).

- :class:`DataParallel` splits a batch over cores, as ``torch_neuronx.DataParallel`` does: one
  copy of the compiled model per core, every chunk starting at the same projected time, the
  call ending when the slowest core ends.
- :class:`TensorParallel` runs a model sharded over cores stage by stage: each stage is a
  compiled per-core shard followed by a collective (``all_reduce`` or ``all_gather``) costed by
  :mod:`neuron_stack.runtime.collectives` and recorded as ``cc``-engine instructions. Micro-batches let
  the collective of one micro-batch overlap the compute of the next (each core's compute
  engines and its CC engine are scheduled separately on the projected clock).
- :func:`column_parallel` / :func:`row_parallel` shard an ``nn.Linear`` as Megatron does.

>>> import torch, neuron_stack
>>> nm = neuron_stack.trace(torch.nn.Linear(8, 4), torch.randn(2, 8))       # doctest: +SKIP
>>> dp = DataParallel(nm, device_ids=[0, 1])                                # doctest: +SKIP
>>> dp(torch.randn(4, 8)).shape                                              # doctest: +SKIP
torch.Size([4, 4])
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils import _pytree as pytree

from neuron_stack.api import trace
from neuron_stack.device import clock
from neuron_stack.runtime import cores as _cores
from neuron_stack.runtime.collectives import Group, record_collective
from neuron_stack.runtime.collectives import plan as plan_collective
from neuron_stack.runtime.model import LoadedModel
from neuron_stack.runtime.session import MEMORY_CATEGORIES, Session


class ParallelError(ValueError):
    """A parallel setup that cannot work; the message names the problem and the fix."""


# -- runtime plumbing ---------------------------------------------------------------------------

def _adopt(session, core_ids: list[int]) -> None:
    """Make ``core_ids`` (already reserved by a lease) usable by this process's runtime session."""
    for c in core_ids:
        session.device_memory.setdefault(c, dict.fromkeys(MEMORY_CATEGORIES, 0))
        if c not in session.cores:
            session.cores.append(c)
    session.live.cores = sorted(session.cores)


def _load_on(neff, core: int, info: dict | None = None):
    """A copy of ``neff`` loaded on ``core`` (a :class:`neuron_stack.runtime.model.LoadedModel`)."""
    return LoadedModel(neff, dict(info or {"kind": "trace", "cache_hit": True}), core=core)


def _run_at(model, inputs: list, start_ns: int, host: bool = False) -> tuple[list, int]:
    """Run ``model`` as if it started at projected time ``start_ns``; returns (outputs, end_ns).

    The projected clock is set back (or forward) to ``start_ns`` first: executions on different
    cores overlap on the projected clock although the simulator runs them one after another.

    ``host=True`` (DataParallel): the call's host time (input checks, the runtime's per-execution
    work; the simulation itself is already replaced by device time) stays in this core's lane, as
    it does for a single-core call, so N cores never look more than N times faster. ``host=False``
    (tensor-parallel stages, which on hardware run inside one NEFF per core with no host round
    trip in between): device time only.
    """
    _set_clock(start_ns)
    if host:
        model.check_inputs(inputs)
    outs = model.run(inputs, start_ns=start_ns)
    if host or model.has_cpu:  # measured host time (and CPU islands): take the clock's word for it
        return outs, clock.now_ns()
    end = start_ns + model.static_device_ns  # device time only, not the simulator's recording
    _set_clock(end)
    return outs, end


def _set_clock(t_ns: int) -> None:
    clock.advance(real_ns=clock.now_ns() - t_ns, simulated_ns=0)


# -- data parallel ------------------------------------------------------------------------------

class DataParallel(torch.nn.Module):
    """Run a compiled model on several NeuronCores, splitting the batch along ``dim``.

    As ``torch_neuronx.DataParallel``: ``device_ids`` are core indices (relative to
    ``NEURON_RT_VISIBLE_CORES`` when it is set; default: every core the process may use, or
    every free core of the instance). The input is split into one chunk per core (like
    ``torch.chunk``; with dynamic batching a batch that is a multiple of the compiled batch is
    cut into compiled-size chunks, round-robin over the cores); outputs are concatenated
    along ``dim``. All chunks start at the same projected time: the call takes as long as the
    slowest core, not the sum. Each core's lane includes the host time of its execution (input
    checks, runtime bookkeeping), as a single-core call's does.

    >>> dp = DataParallel(neuron_stack.trace(model, x[:1]), device_ids=[0, 1])   # doctest: +SKIP
    >>> y = dp(x)                                                                 # doctest: +SKIP
    """

    def __init__(self, neuron_module, device_ids: list[int] | None = None, dim: int = 0,
                 set_dynamic_batching: bool = True):
        super().__init__()
        base = getattr(neuron_module, "model", None)
        if base is None or not hasattr(neuron_module, "neff"):
            raise ParallelError("DataParallel needs a compiled module from neuron_stack.trace(...): "
                                f"got {type(neuron_module).__name__}")
        self.module = neuron_module
        self.dim = dim
        self.dynamic_batching = set_dynamic_batching
        session = base.session
        env_set = any(os.environ.get(v, "").strip() for v in ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES"))
        if device_ids is not None:
            ids = [int(str(d).removeprefix("nc:")) for d in device_ids]
            self.lease = _cores.acquire(session.profile, cores=ids)
        elif env_set:
            self.lease = _cores.acquire(session.profile, num_cores=len(session.cores))
        else:
            self.lease = _cores.acquire(session.profile, num_cores=0)   # all free cores, as the runtime does
        self.device_ids = list(self.lease.cores)
        _adopt(session, self.device_ids)
        info = {**base.compile_info, "cache_hit": True}
        self.replicas = [base if c == base.core else _load_on(neuron_module.neff, c, info) for c in self.device_ids]
        spec = base.input_specs[0] if base.input_specs else None
        self.compiled_batch = spec.shape[dim] if spec is not None and len(spec.shape) > dim else None
        self._out_spec = getattr(neuron_module, "_out_spec", None)

    def _chunks(self, x: torch.Tensor) -> list[torch.Tensor]:
        b, n = x.shape[self.dim], len(self.replicas)
        cb = self.compiled_batch
        if cb and b % cb == 0 and (b // cb) != n and self.dynamic_batching:
            return list(torch.split(x, cb, dim=self.dim))       # compiled-size pieces, round-robin
        if cb and b == cb * n or not cb:
            return list(torch.chunk(x, n, dim=self.dim))
        if cb and b == cb:
            return [x]
        raise ParallelError(
            f"batch {b} along dim {self.dim} does not split over {n} cores into the compiled batch {cb}: "
            f"use a batch that is a multiple of {cb}, or trace with batch {b // n if b % n == 0 else 'b'}")

    def forward(self, *args):
        if not args or not isinstance(args[0], torch.Tensor):
            raise ParallelError("DataParallel splits tensor inputs: call it with the batch tensor(s)")
        pieces = [self._chunks(a) if isinstance(a, torch.Tensor) and a.dim() > self.dim else None for a in args]
        count = len(pieces[0])
        start = clock.now_ns()
        ends = [start] * len(self.replicas)
        outs = []
        for k in range(count):
            r = k % len(self.replicas)
            inputs = [p[k] if p is not None else a for p, a in zip(pieces, args)]
            # chunks on one core run back to back; different cores run side by side
            res, ends[r] = _run_at(self.replicas[r], inputs, ends[r], host=True)
            outs.append(res)
        _set_clock(max(ends))
        merged = [torch.cat([o[i] for o in outs], dim=self.dim) for i in range(len(outs[0]))]
        if self._out_spec is not None:
            return pytree.tree_unflatten(merged, self._out_spec)
        return merged[0] if len(merged) == 1 else tuple(merged)

    def release(self) -> None:
        """Unload the replicas and release their cores."""
        for m in self.replicas:
            if m is not self.module.model:
                m.unload()
        self.lease.release()


# -- tensor parallel -----------------------------------------------------------------------------

def column_parallel(linear: torch.nn.Linear, n: int) -> list[torch.nn.Linear]:
    """Split ``linear`` by output features into ``n`` shards (each keeps its slice of the bias).

    >>> [s.out_features for s in column_parallel(torch.nn.Linear(4, 6), 3)]
    [2, 2, 2]
    """
    if linear.out_features % n:
        raise ParallelError(f"{linear.out_features} output features do not split over {n} cores: "
                            f"use a tensor-parallel degree that divides them")
    shards = []
    for w, b in zip(linear.weight.chunk(n, 0), (linear.bias.chunk(n, 0) if linear.bias is not None else [None] * n)):
        s = torch.nn.Linear(linear.in_features, w.shape[0], bias=b is not None)
        with torch.no_grad():
            s.weight.copy_(w)
            if b is not None:
                s.bias.copy_(b)
        shards.append(s)
    return shards


def row_parallel(linear: torch.nn.Linear, n: int) -> list[torch.nn.Linear]:
    """Split ``linear`` by input features into ``n`` bias-free shards (add the bias once after the
    all-reduce). Example: ``sum(s(x_i) for s, x_i in zip(row_parallel(l, 2), x.chunk(2, -1))) + l.bias``.
    """
    if linear.in_features % n:
        raise ParallelError(f"{linear.in_features} input features do not split over {n} cores: "
                            f"use a tensor-parallel degree that divides them")
    shards = []
    for w in linear.weight.chunk(n, 1):
        s = torch.nn.Linear(w.shape[1], linear.out_features, bias=False)
        with torch.no_grad():
            s.weight.copy_(w)
        shards.append(s)
    return shards


@dataclass
class Stage:
    """One tensor-parallel step: ``shards[i]`` runs on core i on the stage inputs, then
    ``collective`` combines the per-core results (``all_reduce``: sum; ``all_gather``: concat on
    the last dim), then ``combine(inputs, combined)`` (host-side glue such as adding the bias and
    the residual) gives the stage's output: the next stage's inputs.
    """

    name: str
    shards: list[torch.nn.Module]
    collective: str = "all_reduce"
    combine: Callable | None = None


@dataclass
class TensorParallelReport:
    """Projected timing of the last call: makespan, collective time and overlap."""

    start_ns: int = 0
    end_ns: int = 0
    compute_ns: dict = field(default_factory=dict)     # core -> busy compute time
    collective_ns: int = 0                              # sum of collective durations (per core)
    collectives: list = field(default_factory=list)     # CcOp records

    @property
    def makespan_ns(self) -> int:
        return self.end_ns - self.start_ns


class TensorParallel:
    """Run a stage list sharded over ``cores``; see :class:`Stage`.

    Each shard is compiled with ``neuron_stack.trace`` on the first call's shapes and loaded
    on its core. Per micro-batch and stage: each core's shard starts when its compute engines
    are free and the stage input is there; the collective starts when the last core has
    finished (over the cores, on the CC engine, which runs beside the compute engines)
    and its result feeds the next stage. With ``micro_batches=2`` the collective of the first
    half overlaps the compute of the second.

    >>> tp = TensorParallel(stages, cores=[0, 1], target="trn1")    # doctest: +SKIP
    >>> y = tp(x)                                                     # doctest: +SKIP
    """

    def __init__(self, stages: list[Stage], cores: list[int] | None = None, target: str = "trn1",
                 micro_batches: int = 1, compiler_args=None):
        n = len(stages[0].shards)
        if any(len(s.shards) != n for s in stages):
            raise ParallelError("every stage needs one shard per core")
        self.session = Session.get(target)
        self.lease = _cores.acquire(self.session.profile, cores=cores if cores is not None else list(range(n)))
        if len(self.lease.cores) != n:
            raise ParallelError(f"{n} shards per stage but {len(self.lease.cores)} cores: pass one core per shard")
        self.cores = list(self.lease.cores)
        _adopt(self.session, self.cores)
        self.stages, self.target, self.micro_batches = stages, target, micro_batches
        self.compiler_args = compiler_args
        self.loaded: dict[tuple[int, int], object] = {}
        self.report = TensorParallelReport()

    def _model(self, si: int, ci: int, inputs: list):
        key = (si, ci)
        if key not in self.loaded:
            nm = trace(self.stages[si].shards[ci], tuple(inputs), target=self.target,
                                    compiler_args=self.compiler_args)
            core = self.cores[ci]
            if nm.model.core == core:
                self.loaded[key] = nm.model
            else:
                self.loaded[key] = _load_on(nm.neff, core, {**nm.model.compile_info})
                nm.model.unload()
        return self.loaded[key]

    def __call__(self, *inputs: torch.Tensor):
        with torch.no_grad():
            return self._call(list(inputs))

    def _prepare(self, mb: list) -> None:
        """Compile and load every shard for the first call's shapes before its schedule starts.

        On hardware a NEFF is loaded before it runs: compiling lazily inside the schedule would put
        the executions at the call's start time, before the compiles and loads they need (the
        profile's timeline showed them at t=0 with the compiles after). The later stages' inputs come
        from the eager shards (only their shapes matter to the compiler).
        """
        if len(self.loaded) == len(self.stages) * len(self.cores):
            return
        for si, stage in enumerate(self.stages):
            partials = []
            for ci, shard in enumerate(stage.shards):
                self._model(si, ci, mb)
                y = shard(*mb)
                partials.append(y[0] if isinstance(y, (tuple, list)) else y)
            reduce = stage.collective == "all_reduce"
            combined = torch.stack(partials).sum(0) if reduce else torch.cat(partials, -1)
            out = stage.combine(mb, combined) if stage.combine else combined
            mb = list(out) if isinstance(out, (tuple, list)) else [out]

    def _call(self, inputs: list):
        n, prof = len(self.cores), self.session.profile
        mbs = [list(t) for t in zip(*[x.chunk(self.micro_batches, 0) for x in inputs])]
        self._prepare(mbs[0])
        t0 = clock.now_ns()   # after the loads: the schedule is the call's device work only
        compute_free = [t0] * n       # each core's compute engines
        cc_free = t0                  # the collective (all cores' CC engines together)
        ready = [t0] * len(mbs)       # when each micro-batch's current inputs are on every core
        report = TensorParallelReport(start_ns=t0, compute_ns={c: 0 for c in self.cores})
        group = Group.on_cores(self.cores)
        for si, stage in enumerate(self.stages):
            for mi, mb in enumerate(mbs):
                partials, arrivals = [], []
                for ci in range(n):
                    model = self._model(si, ci, mb)
                    start = max(compute_free[ci], ready[mi])
                    outs, end = _run_at(model, mb, start)
                    report.compute_ns[self.cores[ci]] += end - start
                    compute_free[ci] = end
                    partials.append(outs[0])
                    arrivals.append(end)
                p = plan_collective(stage.collective, partials[0].numel(),
                                    str(partials[0].dtype).removeprefix("torch."), group, prof)
                cc_start = max(max(arrivals), cc_free)
                record_collective(self.session, p, self.cores, arrivals, cc_start, tag=stage.name)
                cc_free = cc_start + p.dur_ns
                report.collective_ns += p.dur_ns
                report.collectives.append(p.ccop())
                combined = torch.stack(partials).sum(0) if stage.collective == "all_reduce" else torch.cat(partials, -1)
                out = stage.combine(mb, combined) if stage.combine else combined
                mbs[mi] = list(out) if isinstance(out, (tuple, list)) else [out]
                ready[mi] = cc_free
        report.end_ns = max(max(ready), max(compute_free))
        _set_clock(report.end_ns)
        self.report = report
        result = [torch.cat([mb[i] for mb in mbs], 0) for i in range(len(mbs[0]))]
        return result[0] if len(result) == 1 else tuple(result)

    def release(self) -> None:
        for m in self.loaded.values():
            m.unload()
        self.lease.release()
