"""Running a kernel: trace it into instructions, schedule them, execute them in the interpreter.

:class:`Kernel` is what ``@nki.jit`` returns. Calling it with numpy arrays (or CPU torch tensors)
traces the kernel once per SPMD instance (``kernel[gx, gy](...)``, run serially on one NeuronCore
as the legacy programming model says), times the instructions with the compiler's scheduler and
cost model, executes them in the ISA interpreter and returns the outputs the same type as the
inputs. ``run_kernel`` returns everything: the trace, the schedule and the outputs.

>>> import numpy as np
>>> import neuron_stack.nki as nki, neuron_stack.nki.language as nl
>>> @nki.jit
... def add(a, b):
...     out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
...     nl.store(out, value=nl.load(a) + nl.load(b))
...     return out
>>> r = run_kernel(add, (np.ones((128, 512), np.float32), np.ones((128, 512), np.float32)))
>>> float(r.outputs[0].mean()), r.schedule.device_ns > 0
(2.0, True)
"""
from __future__ import annotations

import copy
import inspect
import itertools
import os
import time
from dataclasses import dataclass, field

import numpy as np

from neuron_stack.compiler.lower.tiles import Lowered
from neuron_stack.compiler.schedule import Schedule, schedule_lowered
from neuron_stack.device.profiles import get_profile
from neuron_stack.isa.interp import Machine
from neuron_stack.isa.memory import contiguous_strides

from .core import NKIError, Trace, _local, dtype_name, ndarray

_TARGETS = {"trn1": "trn1", "inf2": "inf2", "gen2": "trn1", "trn2": "trn2", "gen3": "trn2"}


def target_from_env(target: str | None = None) -> str:
    """The simulated device: ``target``, else ``NEURON_PLATFORM_TARGET_OVERRIDE``, else trn1."""
    name = (target or os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") or "trn1").strip().lower()
    if name not in _TARGETS:
        raise NKIError(f"NEURON_PLATFORM_TARGET_OVERRIDE={name!r} is not simulated: use trn1, inf2 or trn2 "
                       f"(gen2, gen3)")
    return _TARGETS[name]


@dataclass
class KernelRun:
    """One traced (and possibly executed) kernel call."""
    name: str
    trace: Trace
    schedule: Schedule
    outputs: list = field(default_factory=list)   # numpy arrays (or torch tensors), in return order
    trace_wall_ns: int = 0
    sim_wall_ns: int = 0
    kernel_file: str = ""
    sim_cpu_ns: int = 0         # the interpreter's own CPU time (its thread)
    sim_runq_ns: int | None = None  # of its wall time, waiting for a core (Linux schedstat; None elsewhere)

    @property
    def device_ns(self) -> int:
        return self.schedule.device_ns

    @property
    def num_instructions(self) -> int:
        return len(self.trace.instrs)


class Kernel:
    """An NKI kernel (``@nki.jit``): ``kernel(*arrays)`` or ``kernel[grid](*arrays)``."""

    def __init__(self, fn, mode: str = "auto", target: str | None = None, **options):
        if not callable(fn):
            raise NKIError(f"nki.jit decorates a function, got {type(fn).__name__}")
        self.fn = fn
        self.mode = mode
        self.grid: tuple = (1,)
        self.target = target or options.get("platform_target")    # the SDK's @nki.jit(platform_target="trn2")
        self.options = options
        self.last: KernelRun | None = None
        self._parent: Kernel | None = None      # kernel[grid] reports its run on the kernel too
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        _opaque_to_dynamo(self)

    def __getitem__(self, grid) -> Kernel:
        k = copy.copy(self)                 # the same kind of kernel (jit, benchmark, profile), new grid
        k.grid = tuple(int(g) for g in (grid if isinstance(grid, tuple) else (grid,)))
        k._parent, k.last = self, None
        _opaque_to_dynamo(k)
        if any(g < 1 for g in k.grid):
            raise NKIError(f"launch grid {k.grid} must be positive")
        return k

    def __call__(self, *args, **kwargs):
        if getattr(_local, "trace", None) is not None:
            # a helper (``@nki.jit(mode='trace')``) called inside a kernel: inlined, its own lines kept
            return self.fn(*args, **kwargs)
        self.last = run_kernel(self, args, kwargs)
        if self._parent is not None:
            self._parent.last = self.last
        outs = self.last.outputs
        return None if not outs else outs[0] if len(outs) == 1 and not self.last.trace.tuple_out else tuple(outs)


def _opaque_to_dynamo(k) -> None:
    """torch.compile puts a kernel call in the graph as one call (captured by aot_autograd as the
    ``torch.ops.nki`` op) instead of tracing the kernel's Python."""
    import torch._dynamo
    torch._dynamo.allow_in_graph(k)


@dataclass(frozen=True)
class Spec:
    """An input known by shape and dtype only (timing-only runs: ``run_kernel(..., execute=False)``)."""
    shape: tuple
    dtype: str


def _to_numpy(x):
    """(array as numpy fp32/int, dtype name, is_torch)."""
    if hasattr(x, "detach") and hasattr(x, "dtype"):
        import torch
        dt = dtype_name(x.dtype)
        t = x.detach().cpu()
        arr = t.float().numpy() if t.is_floating_point() else t.numpy()
        del torch
        return arr, dt, True
    arr = np.asarray(x)
    name = dtype_name(arr.dtype)
    return (arr.astype(np.float32) if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2") else arr), name, False


def run_kernel(kernel, args: tuple, kwargs: dict | None = None, execute: bool = True,
               target: str | None = None) -> KernelRun:
    """Trace ``kernel`` on ``args``, schedule it and (``execute``) run it in the interpreter.

    ``execute=False`` traces and times only (no numbers), for shapes too large to interpret.
    Example: ``run_kernel(matmul_kernel, (lhsT, rhs), execute=False).device_ns``.
    """
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    # a kernel runs on one physical core: LNC=1 is a kernel's default (nki/get-started/about/lnc.rst)
    profile = get_profile(target_from_env(target or k.target), lnc=1)
    kwargs = dict(kwargs or {})
    try:
        params = list(inspect.signature(k.fn).parameters)
    except (TypeError, ValueError):
        params = []
    t0 = time.perf_counter_ns()
    trace = Trace(profile, grid=k.grid)
    trace.tuple_out = False
    hbm_args, inputs, torch_io = [], {}, False
    hbm_kwargs = {}
    for i, a in enumerate(list(args) + list(kwargs.values())):
        name = params[i] if i < len(params) else f"arg{i}"
        if i >= len(args):
            name = list(kwargs)[i - len(args)]
        if isinstance(a, Spec):
            v = trace.hbm_tensor(name, a.shape, dtype_name(a.dtype), "input")
        elif isinstance(a, (np.ndarray, np.generic)) or (hasattr(a, "detach") and hasattr(a, "shape")):
            arr, dt, is_t = _to_numpy(a)
            torch_io |= is_t
            if arr.ndim == 0:
                arr = arr.reshape(1)
            t = trace.hbm_tensor(name, arr.shape, dt, "input")
            inputs[name] = (arr, a)
            v = t
        else:
            v = a
        (hbm_args.append(v) if i < len(args) else hbm_kwargs.__setitem__(name, v))
    ret = None
    with trace:
        for pid in itertools.product(*(range(g) for g in k.grid)):
            trace.program_id, trace.shared_next = pid, 0
            ret = k.fn(*hbm_args, **hbm_kwargs)
    trace.allocate()
    outs = [] if ret is None else list(ret) if isinstance(ret, (tuple, list)) else [ret]
    trace.tuple_out = isinstance(ret, (tuple, list))
    for o in outs:
        if not isinstance(o, ndarray) or o.buf.mem != "hbm":
            raise NKIError(f"kernel {k.__name__} must return HBM tensors (nl.ndarray(..., buffer=nl.shared_hbm)), "
                           f"got {o!r}")
    trace.spread_dmas()
    low = Lowered(trace.instrs, {n: dict(m, numel=int(np.prod(m["shape"]))) for n, m in trace.hbm.items()},
                  [n for n, m in trace.hbm.items() if m["role"] == "input"], [o.buf.name for o in outs],
                  sbuf_peak_bytes=trace.sbuf.peak, allocs=trace.allocs)
    sched = schedule_lowered(low, profile)
    t1 = time.perf_counter_ns()
    run = KernelRun(k.__name__, trace, sched, [], t1 - t0, 0, os.path.abspath(inspect.getsourcefile(k.fn) or ""))
    if execute:
        if any(isinstance(a, Spec) for a in list(args) + list(kwargs.values())):
            raise NKIError("inputs given as shapes only (Spec) can be timed, not executed: pass execute=False")
        q0, c0 = _runqueue_ns(), time.thread_time_ns()
        run.outputs = _execute_single_threaded(trace, inputs, outs, torch_io)
        c1, q1 = time.thread_time_ns(), _runqueue_ns()
        run.sim_wall_ns = time.perf_counter_ns() - t1       # last: the wall window holds the CPU and queue ones
        run.sim_cpu_ns = c1 - c0
        run.sim_runq_ns = None if q0 is None or q1 is None else q1 - q0
    return run


def _runqueue_ns() -> int | None:
    """Nanoseconds this thread has spent runnable but waiting for a core (Linux ``schedstat``), so a run's
    wall time splits into its CPU time, waiting for a core (other processes' load) and being blocked
    (I/O, sleep, locks). None where the kernel does not report it.

    >>> n = _runqueue_ns(); n is None or n >= 0
    True
    """
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read(200).split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _execute_single_threaded(trace: Trace, inputs: dict, outs: list, torch_io: bool) -> list:
    """``_execute`` with torch on one thread: tiles are at most 128 x 512, so extra threads only wait for
    each other (20x slower per instruction on a loaded 2-core machine, bench/nki.py)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _execute(trace, inputs, outs, torch_io)
    finally:
        torch.set_num_threads(n)


def _execute(trace: Trace, inputs: dict, outs: list, torch_io: bool) -> list:
    """Run the recorded instructions in the interpreter; NaN-fill each allocation where it happens."""
    m = Machine()
    for name, (arr, _) in inputs.items():
        m.mem.fill_buffer(name, trace.hbm[name], arr)
    inits = trace.inits
    prints = trace.prints
    ii = pi = 0
    for i, ins in enumerate(trace.instrs):
        while ii < len(inits) and inits[ii][0] <= i:
            _fill(m, inits[ii][1], inits[ii][2])
            ii += 1
        while pi < len(prints) and prints[pi][0] <= i:
            _print(m, prints[pi])
            pi += 1
        try:
            m.step(ins.opcode, ins.operands)
        except Exception as e:
            raise NKIError(f"{ins.node}: {ins.opcode} failed in the simulator: {type(e).__name__}: {e}") from e
    for p in prints[pi:]:
        _print(m, p)
    result = []
    for o in outs:
        result.append(_convert(m.mem.read(o.operand()).reshape(o.shape), o.dtype, torch_io))
    # in-place writes into kernel inputs propagate back, as the NKI simulator does
    written = {d["b"] for ins in trace.instrs for d in ins.operands["dst"]}
    for name, (arr, orig) in inputs.items():
        if name in written:
            val = m.mem.read_value({"buf": name, "dtype": trace.hbm[name]["dtype"], "offset": 0,
                                    "strides": contiguous_strides(arr.shape), "shape": list(arr.shape)})
            if hasattr(orig, "copy_"):
                import torch
                orig.copy_(torch.from_numpy(np.ascontiguousarray(val)).to(orig.dtype))
            elif isinstance(orig, np.ndarray):
                orig[...] = val.astype(orig.dtype)
    return result


def _fill(m: Machine, op: dict, value) -> None:
    v = m.mem.view(op)
    v[...] = value


def _print(m: Machine, p) -> None:
    _, prefix, op, shape = p
    print(prefix, m.mem.read(op).reshape(shape))


def _convert(a: np.ndarray, dtype: str, torch_io: bool):
    if torch_io:
        import torch
        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.to(getattr(torch, dtype if dtype != "bool" else "bool"))
    if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes  # numpy's own dtypes stop at fp16: bf16/fp8 arrays as JAX has them
        return a.astype(getattr(ml_dtypes, dtype))
    return a.astype(np.dtype(dtype if dtype != "bool" else np.bool_))
