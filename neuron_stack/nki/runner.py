"""The SDK's entry points: ``jit``, ``simulate``, and the legacy ``baremetal``, ``simulate_kernel``,
``benchmark`` and ``profile`` decorators.

``benchmark`` reports latency percentiles of the *simulated device time* (the schedule of the
kernel's instructions on the device profile), so they are the same every iteration: the simulator
is deterministic, and a spread would be invented. ``profile`` writes a finalised
``profile.duckdb`` (our NTFF) into ``working_directory``.

>>> import numpy as np
>>> import neuron_stack.nki.language as nl
>>> @benchmark(warmup=2, iters=5)
... def copy_kernel(a):
...     out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
...     nl.store(out, value=nl.load(a))
...     return out
>>> _ = copy_kernel(np.zeros((128, 512), np.float32))
>>> copy_kernel.benchmark_result.nc_latency.get_latency_percentile(50) > 0
True
"""
from __future__ import annotations

import inspect
import os
import time
from pathlib import Path

from .core import NKIError
from .kernel import Kernel
from .torch_op import captured, torch_op

PERCENTILES = (0, 1, 10, 25, 50, 90, 99, 100)


def _deco(func, make):
    """Support ``@deco``, ``@deco(...)`` and ``deco(fn)``; a kernel given keeps its launch grid."""
    def build(f):
        k = make(getattr(f, "__wrapped__", f))
        k.grid = getattr(f, "grid", k.grid)
        return k
    return build(func) if func is not None else build


class _Jit(Kernel):
    def __call__(self, *args, **kwargs):
        if args and not kwargs and captured(args):
            return torch_op(self, args)(*args)      # one op in the model's graph (docs/nki.md)
        t0 = time.perf_counter_ns()
        before = self.last
        out = super().__call__(*args, **kwargs)
        if self.last is not before:            # ran here (not captured into a model's graph)
            from .record import record_if_inspecting
            record_if_inspecting(self.last, time.perf_counter_ns() - t0)
        return out


def jit(func=None, mode: str = "auto", **kwargs):
    """``@nki.jit``: the kernel runs on the simulated NeuronCore when called with numpy arrays or CPU
    torch tensors (``mode`` is accepted for the legacy values and changes nothing here)."""
    return _deco(func, lambda f: _Jit(f, mode, **kwargs))


def trace(func=None, **kwargs):
    """Legacy ``@nki.trace`` (``from neuronxcc.nki import trace``): a helper that a kernel calls, inlined at the
    call as ``@nki.jit(mode='trace')`` is."""
    return jit(func, mode="trace", **kwargs)


def simulate(kernel):
    """``nki.simulate(kernel)(*args)``: numbers only (same as calling the kernel; timing is also computed)."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    return k


def simulate_kernel(kernel, *args, **kwargs):
    """Legacy ``nki.simulate_kernel(kernel, *args)``: run it and return its outputs (numpy)."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(getattr(kernel, "__wrapped__", kernel))
    return k(*args, **kwargs)


def baremetal(kernel=None, *, save_neff_name=None, save_trace_name=None, additional_compile_opt=None,
              artifacts_dir=None, **_):
    """Legacy ``@nki.baremetal``: run the kernel on the (simulated) device with numpy inputs."""
    return _deco(kernel, lambda f: _Jit(f, "baremetal"))


class LatencyStats:
    """``nc_latency``: per-iteration simulated device latencies, read as percentiles in microseconds."""

    def __init__(self, latencies_ns: list[int]):
        self.latencies_ns = list(latencies_ns)

    def get_latency_percentile(self, p: int) -> float:
        """The ``p``-th percentile (p in 0, 1, 10, 25, 50, 90, 99, 100) in microseconds."""
        if p not in PERCENTILES:
            raise NKIError(f"latency percentile {p} is not reported: use one of {', '.join(map(str, PERCENTILES))}")
        import numpy as np
        return float(np.percentile(np.asarray(self.latencies_ns, dtype=np.float64), p)) / 1e3


class BenchmarkResult:
    def __init__(self, latencies_ns: list[int], run):
        self.nc_latency = LatencyStats(latencies_ns)
        self.run = run

    def __repr__(self) -> str:
        return (f"BenchmarkResult(p50={self.nc_latency.get_latency_percentile(50):.3f} us, "
                f"iters={len(self.nc_latency.latencies_ns)}, instructions={self.run.num_instructions})")


class _Benchmark(Kernel):
    def __init__(self, fn, warmup: int, iters: int, save_neff_name=None, save_trace_name=None):
        super().__init__(fn, "benchmark")
        self.warmup, self.iters = int(warmup), int(iters)
        if self.iters < 1 or self.warmup < 0:
            raise NKIError(f"nki.benchmark needs iters >= 1 and warmup >= 0 (got {iters}, {warmup})")
        self.save_neff_name, self.save_trace_name = save_neff_name, save_trace_name
        self.benchmark_result: BenchmarkResult | None = None

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        # one NEFF, run warmup + iters times: every iteration replays the same static schedule
        self.benchmark_result = BenchmarkResult([self.last.device_ns] * self.iters, self.last)
        if self.save_trace_name:
            write_profile(self.last, self.__name__, Path(self.save_trace_name), executions=self.warmup + self.iters)
        if self.save_neff_name:
            save_neff(self, args, Path(self.save_neff_name), self.last.trace.p.name)
        return out


def save_neff(kernel: Kernel, args: tuple, path: Path, target: str) -> Path:
    """The kernel compiled as the one op of a model (its own instructions, ``torch.ops.nki``) and saved as a
    NEFF (``neuron_stack.isa.neff.load`` reads it back). Every argument must be an array.

    >>> import numpy as np, tempfile
    >>> import neuron_stack.nki.language as nl
    >>> @jit
    ... def neg(a):
    ...     out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    ...     nl.store(out, value=nl.negative(nl.load(a)))
    ...     return out
    >>> save_neff(neg, (np.ones((4, 4), np.float32),), Path(tempfile.mkdtemp()) / "neg.neff", "trn1").suffix
    '.neff'
    """
    import numpy as np
    import torch

    from neuron_stack.compiler.driver import compile_program, graph_hash
    from neuron_stack.frontend.export import capture
    from neuron_stack.frontend.flags import parse_flags

    tensors = []
    for a in args:
        if not hasattr(a, "shape"):
            raise NKIError(f"save_neff_name: kernel {kernel.__name__} takes a non-array argument {a!r}; a NEFF is "
                           f"saved for kernels whose arguments are all tensors")
        arr = np.asarray(a)
        dt = arr.dtype.name
        t = torch.from_numpy(np.ascontiguousarray(arr.astype(np.float32) if dt in ("bfloat16",) else arr))
        tensors.append(t.to(torch.bfloat16) if dt == "bfloat16" else t)
    jit = _Jit(kernel.fn)
    jit.grid = kernel.grid
    # forward takes the kernel's own parameter names: they name the NEFF's inputs (capture a x.npy ...)
    names = [n if n.isidentifier() and n not in ("self", "_kernel") else f"x{i}"
             for i, n in enumerate(list(inspect.signature(kernel.fn).parameters)[:len(tensors)])]
    ns: dict = {}
    exec(f"def forward(self, {', '.join(names)}):\n    return _kernel({', '.join(names)})", {"_kernel": jit}, ns)
    KernelModel = type("KernelModel", (torch.nn.Module,), {"forward": ns["forward"]})

    with torch.no_grad():
        program = capture(KernelModel(), tuple(tensors))
    neff = compile_program(program, parse_flags(None, target=target), graph_hash_value=graph_hash(program))
    path.parent.mkdir(parents=True, exist_ok=True)
    return neff.save(path)


def benchmark(kernel=None, *, warmup: int = 10, iters: int = 100, save_neff_name=None, save_trace_name=None,
              additional_compile_opt=None, **_):
    """Legacy ``@nki.benchmark``: afterwards ``kernel.benchmark_result.nc_latency.get_latency_percentile(p)``
    gives the simulated device latency in microseconds. ``save_trace_name`` writes the run's profile there
    (a ``profile.duckdb``; our NTFF), ``save_neff_name`` the kernel's NEFF."""
    return _deco(kernel, lambda f: _Benchmark(f, warmup, iters, save_neff_name, save_trace_name))


def write_profile(run, name: str, target: Path, executions: int = 1, overwrite: bool = True) -> Path:
    """Write ``run`` as a finalised profile at ``target``: one row per instruction with its kernel line.

    >>> import numpy as np, tempfile
    >>> from neuron_stack.nki.kernel import run_kernel
    >>> import neuron_stack.nki.language as nl
    >>> def neg(a):
    ...     out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    ...     nl.store(out, value=nl.negative(nl.load(a)))
    ...     return out
    >>> write_profile(run_kernel(neg, (np.ones((4, 4), np.float32),)), "neg",
    ...               Path(tempfile.mkdtemp()) / "profile.duckdb").name
    'profile.duckdb'
    """
    import shutil

    import traces
    from traces.schema import SCHEMA_VERSION

    from .record import TIMING_MODEL, record
    if target.exists() and not overwrite:
        raise NKIError(f"{target} exists: pass overwrite=True to nki.profile or choose another working_directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    seg = target.parent / (target.stem + ".segments")
    shutil.rmtree(seg, ignore_errors=True)
    prof = run.trace.p
    meta = dict(prof.metadata())
    meta.update({"schema_version": SCHEMA_VERSION, "target": prof.name, "is_simulation": "true",
                 "warmup_executions": str(executions - 1), "nki_kernel": name, "timing_model": TIMING_MODEL})
    w = traces.Writer(seg, run={"tag": f"nki:{name}", "target": prof.name}, metadata=meta)
    record(w.append, w.run_id, run, executions=executions)
    w.close(status="ok")
    built = traces.finalize(seg)
    os.replace(built, target)
    shutil.rmtree(seg, ignore_errors=True)
    return target


class _Profile(Kernel):
    def __init__(self, fn, working_directory, save_trace_name: str, overwrite: bool, profile_nth: int,
                 save_neff_name=None):
        super().__init__(fn, "profile")
        if not working_directory:
            raise NKIError("nki.profile needs working_directory=<directory for the profile>")
        self.dir = Path(working_directory)
        self.trace_name = save_trace_name or "profile.ntff"
        self.overwrite, self.profile_nth = overwrite, max(1, int(profile_nth))
        self.save_neff_name = save_neff_name
        self.profile_path: Path | None = None

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        self.profile_path = write_profile(self.last, self.__name__, self.dir / "profile.duckdb", self.profile_nth,
                                          self.overwrite)
        if self.save_neff_name:
            save_neff(self, args, self.dir / self.save_neff_name, self.last.trace.p.name)
        return out


def profile(func=None, *, working_directory=None, save_neff_name=None, save_trace_name="profile.ntff",
            additional_compile_opt=None, overwrite: bool = False, profile_nth: int = 1, **_):
    """Legacy ``@nki.profile(working_directory=...)``: run the kernel and write
    ``working_directory/profile.duckdb`` with one row per instruction and its kernel line; with
    ``save_neff_name`` also the kernel's NEFF there (``neuron-explorer capture -n`` runs it anywhere)."""
    return _deco(func, lambda f: _Profile(f, working_directory, save_trace_name, overwrite, profile_nth,
                                          save_neff_name))
