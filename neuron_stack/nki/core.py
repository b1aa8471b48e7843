"""The NKI tracer: kernel tensors, on-chip allocation, tile rules and instruction recording.

Running a kernel function under :class:`Trace` turns every ``nl.*`` / ``nisa.*`` call into ISA
instructions (:mod:`neuron_stack.isa.instructions` opcodes with access-pattern operands), each tagged
with the kernel source line that issued it (``nki_source_location``). Nothing is computed here: the
interpreter (:mod:`neuron_stack.isa.interp`) executes the recorded list for the numbers and the
scheduler (:func:`neuron_stack.compiler.schedule.schedule_lowered`) times it.

Dependencies are found the way the hardware's semaphores need them: per buffer, an instruction waits
for earlier writes it reads (RAW) and earlier accesses it overwrites (WAR/WAW), by overlapping
partition x free ranges. On-chip tiles are placed after tracing, by liveness as the compiler does: a
tile occupies SBUF / PSUM (bytes per partition of the device profile) from its ``nl.ndarray`` to the
last instruction that touches it, and a ring allocator places it; the next tile placed over those
bytes waits for the dead tile's last accesses, so a tile allocated inside a loop body is
double-buffered as long as SBUF has room.

>>> from neuron_stack.device.profiles import get_profile
>>> t = Trace(get_profile("trn1"))
>>> with t:
...     x = t.alloc("sbuf", (128, 512), "float32")
>>> x.shape, x.buffer
((128, 512), 'sbuf')
"""
from __future__ import annotations

import dataclasses
import functools
import linecache
import math
import os
import sys
import threading
import weakref

import numpy as np

from neuron_stack.compiler.lower.tiles import Instr
from neuron_stack.device.cost import dependent_overhead_ns
from neuron_stack.isa.instructions import ENGINE_OF
from neuron_stack.isa.interp import contiguous_strides
from neuron_stack.nki.alloc import AllocationError, Allocator, place_by_liveness

# Tile limits: reference llm_serving_and_nki.md §1.6 (legacy programming_model.rst, nl.tile_size)
PMAX = 128              # nl.tile_size.pmax
PSUM_FMAX = 512         # nl.tile_size.psum_fmax (fp32 elements of one 2 KiB bank)
GEMM_STATIONARY_FMAX = 128
GEMM_MOVING_FMAX = 512
PSUM_BANK_BYTES = 2048  # 16 KiB per partition = 8 banks x 512 fp32 (§1.3)
SBUF_ALIGN = 64         # bytes: the placement unit of the compiler's own SBUF ring (compiler/lower/tiles.py)

#: element sizes of the NKI dtypes we simulate (nl.float8_e4m3 is stored as torch's e4m3fn)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "tfloat32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1,
               "int32": 4, "int16": 2, "int8": 1, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1}
_ALIASES = {"float8_e4m3": "float8_e4m3fn", "bool_": "bool", "float": "float32", "int": "int32"}
FLOATS = ("float32", "bfloat16", "float16", "tfloat32", "float8_e4m3fn", "float8_e5m2")

_HERE = os.path.dirname(os.path.abspath(__file__))

#: Tensor operations that need the instruction emitters, supplied by the modules that define them
#: (``indexing`` registers "index"; ``language`` "assign", "binary", "accumulate"), so this module
#: imports neither: ``x[i]``, ``x[i] = v``, ``x + y`` and ``acc += y`` look them up here.
TENSOR_OPS: dict = {}
_local = threading.local()


#: a kernel that unrolls past this many instructions is refused (``affine_range(10**9)`` would need ~5 TB)
MAX_INSTRUCTIONS = int(os.environ.get("NKI_MAX_INSTRUCTIONS", "500000"))


class NKIError(ValueError):
    """A kernel the simulated NeuronCore refuses; the message starts with the kernel's file:line."""


class NKIUnsupported(NKIError, AttributeError):
    """An SDK name this simulator does not implement yet (an AttributeError too, so ``hasattr`` is False)."""


class par_dim(int):
    """``nl.par_dim(n)``: marks the partition dimension of a legacy block-layout tile shape, e.g.
    ``(4, nl.par_dim(128), 512)`` is four [128, 512] tiles side by side in each partition.

    >>> par_dim(128) + 0, isinstance(par_dim(128), int)
    (128, True)
    """


def unsupported(module: str, name: str):
    """The error for an SDK name this simulator lacks (a module ``__getattr__`` raises it); dunder
    lookups stay plain AttributeErrors so ``inspect``/``pickle`` keep working.

    >>> "nl.random_seed is not supported by the simulator yet" in str(unsupported("nl", "random_seed"))
    True
    """
    if name.startswith("__"):
        return AttributeError(name)
    return NKIUnsupported(f"{where()}: {module}.{name} is not supported by the simulator yet (docs/nki.md lists "
                          f"what is); express it with the supported instructions")


def dtype_name(dt) -> str:
    """The NKI dtype name of ``dt`` (a name, a numpy dtype or a torch dtype).

    >>> dtype_name("bfloat16"), dtype_name(np.float32)
    ('bfloat16', 'float32')
    """
    if dt is None:
        return "float32"
    name = str(dt).removeprefix("torch.")
    if not isinstance(dt, str):
        try:
            name = np.dtype(dt).name
        except TypeError:
            pass
    name = _ALIASES.get(name, name)
    if name == "tfloat32":
        return "float32"
    if name not in DTYPE_BYTES:
        raise NKIError(f"{where()}: dtype {dt!r} is not supported; use one of {', '.join(DTYPE_BYTES)}")
    return name


def current() -> Trace:
    """The trace of the kernel being run (an NKI call outside a kernel is an error)."""
    t = getattr(_local, "trace", None)
    if t is None:
        raise NKIError("nki.language / nki.isa calls only work inside a kernel: decorate the function with "
                       "@nki.jit and call it (or nki.simulate_kernel(kernel, *args))")
    return t


@functools.lru_cache(maxsize=1024)
def _ours(filename: str) -> bool:
    """Whether ``filename`` is a module of this package (its frames are skipped when naming the kernel line)."""
    return os.path.dirname(os.path.abspath(filename)) == _HERE


def where() -> str:
    """``file.py:line`` of the innermost caller outside this package (the kernel line)."""
    f = sys._getframe(1)
    while f is not None and _ours(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return "<kernel>"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


def _frame():
    f = sys._getframe(1)
    while f is not None and _ours(f.f_code.co_filename):
        f = f.f_back
    return f


# -----------------------------------------------------------------------------------------------
# Buffers and tensors

class Buffer:
    """One allocation: an HBM tensor or an on-chip tile at ``addr`` (bytes per partition)."""

    __slots__ = (
        "__weakref__",
        "addr",
        "dtype",
        "kind_name",
        "lazy_zero",
        "mem",
        "name",
        "pitch",
        "reads",
        "shape",
        "size",
        "writes",
        "written",
    )

    def __init__(self, mem, name, dtype, shape, pitch, addr=0, size=0):
        self.mem, self.name, self.dtype, self.shape = mem, name, dtype, tuple(shape)
        self.pitch, self.addr, self.size = pitch, addr, size
        self.reads: list = []        # (instr, region)
        self.writes: list = []
        self.written: list = []      # regions written so far (PSUM accumulation groups)
        self.kind_name = mem
        self.lazy_zero = False      # nl.zeros(..., lazy_initialization=True): zeroed by its first write


class ndarray:
    """An NKI tensor: a strided view of an HBM tensor or an SBUF/PSUM tile (dim 0 = partitions).

    Indexing with integers, slices, ``nl.ds`` or ``nl.arange``/``nl.mgrid`` expressions gives a view;
    arithmetic operators issue Vector Engine instructions. Example: ``a[0:128, 512:1024]``.
    """

    __array_priority__ = 100    # numpy scalars on the left defer to our operators

    def __init__(self, buf: Buffer, shape, offset: int = 0, strides=None, dtype: str | None = None, pdim: int = 0):
        self.buf = buf
        self.shape = tuple(int(s) for s in shape)
        self.offset = int(offset)
        self.pdim = pdim if buf.mem != "hbm" else 0     # the partition dim (legacy nl.par_dim block layouts)
        if strides is None:
            if buf.mem != "hbm" and self.shape:     # a tile: partitions at the buffer's pitch, the rest contiguous
                rest = contiguous_strides(self.shape[:pdim] + self.shape[pdim + 1:])
                strides = rest[:pdim] + [buf.pitch] + rest[pdim:]
            else:
                strides = contiguous_strides(self.shape)
        self.strides = tuple(int(s) for s in strides)
        self.dtype = dtype or buf.dtype
        self._mm = None             # index of the MATMUL that produced this PSUM value (legacy `+=`)

    # -- description ---------------------------------------------------------------------------
    @property
    def buffer(self) -> str:
        return self.buf.mem if self.buf.mem != "hbm" else self.buf.kind_name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def name(self) -> str:
        return self.buf.name

    def operand(self) -> dict:
        """The access-pattern operand ``{"m", "b", "dt", "o", "ap"}`` of this view (partition dim first)."""
        ap = [[s, n] for s, n in zip(self.strides, self.shape)] or [[1, 1]]
        if self.pdim:
            ap.insert(0, ap.pop(self.pdim))
        return {"m": self.buf.mem, "b": self.buf.name, "dt": self.dtype, "o": self.offset, "ap": ap}

    def region(self) -> tuple:
        """The box this view touches, as (lo, hi) pairs flattened: (p_lo, p_hi, f_lo, f_hi) on chip,
        one pair per tensor dim in HBM (so disjoint blocks of one output never wait for each other)."""
        if self.buf.mem == "hbm":
            return _hbm_box(self)
        pitch = self.buf.pitch
        p0, f0 = divmod(self.offset, pitch)
        # each stride steps partitions (a multiple of the pitch) or free elements (less than it)
        p1 = p0 + sum((n - 1) * (s // pitch) for s, n in zip(self.strides, self.shape))
        f1 = f0 + sum((n - 1) * (s % pitch) for s, n in zip(self.strides, self.shape))
        return (p0, p1, f0, f1)

    def flat_range(self) -> tuple[int, int]:
        return self.offset, self.offset + sum((n - 1) * s for s, n in zip(self.strides, self.shape))

    @property
    def free_size(self) -> int:
        return math.prod(self.shape) // self.partitions if self.shape else 1

    @property
    def partitions(self) -> int:
        return self.shape[self.pdim] if self.shape else 1

    def __repr__(self) -> str:
        return f"nki.ndarray(shape={self.shape}, dtype={self.dtype}, buffer={self.buffer}, name={self.name!r})"

    def __len__(self) -> int:
        return self.shape[0]

    # -- views ---------------------------------------------------------------------------------
    def __getitem__(self, key) -> ndarray:
        return TENSOR_OPS["index"](self, key)

    def __setitem__(self, key, value) -> None:
        TENSOR_OPS["assign"](self[key], value)

    def view(self, dtype) -> ndarray:
        return ndarray(self.buf, self.shape, self.offset, self.strides, dtype_name(dtype), self.pdim)

    def reshape(self, shape) -> ndarray:
        """A reshaped view of a contiguous tensor (HBM) or of a tile's free dims."""
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if math.prod(shape) != math.prod(self.shape):
            raise NKIError(f"{where()}: cannot reshape {self.shape} into {shape}")
        if self.buf.mem == "hbm":
            if list(self.strides) != contiguous_strides(self.shape):
                raise NKIError(f"{where()}: reshape needs a contiguous HBM tensor; copy it first")
            return ndarray(self.buf, shape, self.offset, contiguous_strides(shape), self.dtype)
        if self.pdim or shape[0] != self.shape[0] or list(self.strides[1:]) != contiguous_strides(self.shape[1:]):
            raise NKIError(f"{where()}: a tile reshape must keep the partition dim ({self.shape[0]}) and a "
                           f"contiguous free part")
        strides = [self.strides[0]] + contiguous_strides(shape[1:])
        return ndarray(self.buf, shape, self.offset, strides, self.dtype)

    def broadcast_to(self, shape) -> ndarray:
        """A view repeating size-1 dims (stride 0), e.g. a ``[1, D]`` weight row to ``[128, D]``."""
        shape = tuple(int(s) for s in shape)
        if len(shape) != len(self.shape):
            raise NKIError(f"{where()}: broadcast_to {shape} needs the same rank as {self.shape}")
        strides = []
        for n, m, s in zip(self.shape, shape, self.strides):
            if n == m:
                strides.append(s)
            elif n == 1:
                strides.append(0)
            else:
                raise NKIError(f"{where()}: cannot broadcast {self.shape} to {shape}")
        if self.buf.mem != "hbm" and shape and shape[self.pdim] > PMAX:
            raise NKIError(f"{where()}: partition dimension {shape[self.pdim]} exceeds architecture limitation of "
                           f"{PMAX}")
        return ndarray(self.buf, shape, self.offset, strides, self.dtype, self.pdim)

    # -- arithmetic (the legacy tile operators) ------------------------------------------------
    def _bin(self, other, op, reverse=False):
        binary = TENSOR_OPS["binary"]
        return binary(other, self, op) if reverse else binary(self, other, op)

    def __add__(self, o): return self._bin(o, "add")
    def __radd__(self, o): return self._bin(o, "add", True)
    def __sub__(self, o): return self._bin(o, "subtract")
    def __rsub__(self, o): return self._bin(o, "subtract", True)
    def __mul__(self, o): return self._bin(o, "multiply")
    def __rmul__(self, o): return self._bin(o, "multiply", True)
    def __truediv__(self, o): return self._bin(o, "divide")
    def __rtruediv__(self, o): return self._bin(o, "divide", True)
    def __neg__(self): return self._bin(-1.0, "multiply")
    def __pow__(self, o): return self._bin(o, "power")
    def __mod__(self, o): return self._bin(o, "mod")
    def __gt__(self, o): return self._bin(o, "greater")
    def __ge__(self, o): return self._bin(o, "greater_equal")
    def __lt__(self, o): return self._bin(o, "less")
    def __le__(self, o): return self._bin(o, "less_equal")
    def __and__(self, o): return self._bin(o, "logical_and")
    def __or__(self, o): return self._bin(o, "logical_or")
    def __xor__(self, o): return self._bin(o, "logical_xor")
    __rand__, __ror__, __rxor__ = __and__, __or__, __xor__
    def __invert__(self): return self._bin(0.0, "equal")

    def __iadd__(self, o):
        return TENSOR_OPS["accumulate"](self, o)


def _last_accesses(tile: dict, reads: list, writes: list) -> None:
    """A tile's Python object is gone: keep the instructions that last touched it (its reads and
    writes not covered by a later write) for the tile placed over its bytes next."""
    tile["touched"] = {i for i, _ in reads} | {i for i, _ in writes}


def _overlap(a: tuple, b: tuple) -> bool:
    return all(a[k] <= b[k + 1] and b[k] <= a[k + 1] for k in range(0, len(a), 2))


def _inside(a: tuple, b: tuple) -> bool:
    return all(b[k] <= a[k] and a[k + 1] <= b[k + 1] for k in range(0, len(a), 2))


def _hbm_box(v: ndarray) -> tuple:
    """The per-dim bounding box of an HBM view over its tensor's dims; the whole tensor when a
    stride does not map onto one dim (a conservative dependency, never a missed one)."""
    shape = v.buf.shape or (1,)
    B = contiguous_strides(shape)
    whole = tuple(x for n in shape for x in (0, n - 1))
    if not 0 <= v.offset < math.prod(shape):
        return whole
    lo = [int(i) for i in np.unravel_index(v.offset, shape)]
    hi = list(lo)
    for s, n in zip(v.strides, v.shape):
        if n == 1 or s == 0:
            continue
        j = next((j for j in range(len(B)) if B[j] <= s and s % B[j] == 0), None)
        if j is None:
            return whole
        hi[j] += (s // B[j]) * (n - 1)
        if hi[j] >= shape[j]:
            return whole
    return tuple(x for a, b in zip(lo, hi) for x in (a, b))


# -----------------------------------------------------------------------------------------------

class Trace:
    """Records one kernel run: instructions, their kernel lines, allocations and HBM tensors.

    Use as a context manager around the kernel call; ``instrs[i].node`` is the ``file.py:line``
    of instruction ``i``. Example: see the module docstring.
    """

    def __init__(self, profile, program_id: tuple = (0,), grid: tuple = (1,)):
        self.p = profile
        self.instrs: list[Instr] = []
        self.inits: list[tuple[int, dict, float]] = []   # (before instr i, operand, fill): NaN sentinels
        self.prints: list[tuple] = []                      # nl.device_print: (before instr i, prefix, operand, shape)
        self.tuple_out = False
        self.sbuf = Allocator("sbuf", profile.sbuf_bytes_per_partition, SBUF_ALIGN)
        self.psum = Allocator("psum", profile.psum_bytes_per_partition, PSUM_BANK_BYTES)
        self.hbm: dict[str, dict] = {}          # name -> {"shape", "dtype", "role"}
        self.shared: list[Buffer] = []          # shared_hbm tensors, in allocation order (SPMD instances share)
        self.program_id, self.grid = program_id, grid
        self.shared_next = 0
        self.engine_last: dict[str, int] = {}
        self.sources: dict[str, tuple] = {}     # "file.py:line" -> (abs file, line, function, code)
        self._n = 0
        self._keep: list[Buffer] = []           # HBM buffers stay alive for the whole trace
        self.tiles: dict[str, dict] = {}        # on-chip tile name -> what placing it needs (``allocate``)
        self.allocs: list[tuple] = []           # placed tiles, as compiler Lowered.allocs (SbufAllocation rows)
        self.precise = os.environ.get("NKI_PRECISE_FP", "1") != "0"

    def __enter__(self):
        self._prev = getattr(_local, "trace", None)
        _local.trace = self
        return self

    def __exit__(self, *exc):
        _local.trace = self._prev

    # -- locations and errors --------------------------------------------------------------------
    def loc(self) -> str:
        f = _frame()
        if f is None:
            return "<kernel>"
        path = os.path.abspath(f.f_code.co_filename)
        key = f"{os.path.basename(path)}:{f.f_lineno}"
        if key not in self.sources:
            code = linecache.getline(path, f.f_lineno).strip()
            self.sources[key] = (path, f.f_lineno, f.f_code.co_name, code)
        return key

    def error(self, msg: str) -> NKIError:
        return NKIError(f"{self.loc()}: {msg}")

    # -- allocation ------------------------------------------------------------------------------
    def hbm_tensor(self, name: str, shape, dtype: str, role: str) -> ndarray:
        b = Buffer("hbm", name, dtype, shape, 0)
        b.kind_name = {"input": "hbm", "shared": "shared_hbm", "private": "private_hbm"}.get(role, "hbm")
        self.hbm[name] = {"shape": list(shape), "dtype": dtype, "role": role}
        self._keep.append(b)
        return ndarray(b, shape)

    def alloc(self, mem: str, shape, dtype, name: str = "", address=None) -> ndarray:
        """A new tensor in ``mem`` (sbuf, psum, hbm, shared_hbm, private_hbm), NaN-filled as the
        simulator does (ints: 4) so reading it before writing shows. An on-chip tile gets its address
        in :meth:`allocate`, unless ``address`` places it (``(partition, byte)`` or a byte offset)."""
        dtype = dtype_name(dtype)
        raw = tuple(shape if isinstance(shape, (tuple, list)) else (shape,))
        shape = tuple(int(s) for s in raw)
        if any(s <= 0 for s in shape):
            raise self.error(f"tensor shape {shape} has an empty dimension")
        if mem in ("hbm", "shared_hbm", "private_hbm"):
            if mem == "shared_hbm" and self.shared_next < len(self.shared):
                b = self.shared[self.shared_next]            # the same output for every SPMD instance
                self.shared_next += 1
                if b.shape != shape or b.dtype != dtype:
                    raise self.error("SPMD instances allocate shared_hbm tensors of different shapes")
                return ndarray(b, shape)
            self._n += 1
            t = self.hbm_tensor(name or f"{mem}{self._n}", shape, dtype, mem.removesuffix("_hbm") or "hbm")
            t.buf.kind_name = mem
            if mem == "shared_hbm":
                self.shared.append(t.buf)
                self.shared_next += 1
            self.inits.append((len(self.instrs), t.operand(), _sentinel(dtype)))
            return t
        if mem not in ("sbuf", "psum"):
            raise self.error(f"unknown buffer {mem!r}: use nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm")
        if len(shape) < 2:
            raise self.error(f"an on-chip tile needs a partition and a free dimension, got shape {shape}: "
                             f"use ({shape[0] if shape else 1}, 1) for a column")
        pdim = next((d for d, n in enumerate(raw) if isinstance(n, par_dim)), 0)
        if shape[pdim] > PMAX:
            raise self.error(f"Size of partition dimension {shape[pdim]} exceeds architecture limitation of {PMAX}")
        free_bytes = math.prod(shape) // shape[pdim] * DTYPE_BYTES[dtype]
        alloc = self.sbuf if mem == "sbuf" else self.psum
        block_bytes = math.prod(shape[pdim + 1:]) * DTYPE_BYTES[dtype]
        # a block-layout PSUM tile is placed block by block, each live from its first to its last use (alloc.py),
        # so only a block must fit a bank; the blocks live at once must fit PSUM when they are placed
        if mem == "psum" and ((free_bytes > alloc.capacity and not pdim) or (pdim and block_bytes > PSUM_BANK_BYTES)):
            raise self.error(f"PSUM tile {shape} {dtype} needs {free_bytes} bytes per partition ({block_bytes} per "
                             f"block): PSUM holds {alloc.capacity // 1024} KiB per partition in 2 KiB banks "
                             f"({PSUM_FMAX} fp32, nl.tile_size.psum_fmax); split the free dimension")
        if free_bytes > alloc.capacity and not (mem == "psum" and pdim):
            raise self.error(f"{mem.upper()} is full: this {shape} {dtype} tile needs {free_bytes / 1024:.1f} KiB per "
                             f"partition (capacity {alloc.capacity // 1024} KiB on {self.p.name}); use smaller tiles")
        if address is not None:
            part, address = address if isinstance(address, (tuple, list)) else (0, address)
            if int(part) != 0 or not 0 <= int(address) <= alloc.capacity - free_bytes:
                raise self.error(f"address ({part}, {address}) does not place this {shape} {dtype} tile inside "
                                 f"{mem.upper()} (partition 0, bytes 0..{alloc.capacity - free_bytes})")
            address = int(address)
        self._n += 1
        b = Buffer(mem, f"{mem}#{self._n}:{dtype}", dtype, shape, max(1, free_bytes // DTYPE_BYTES[dtype]),
                   -1 if address is None else address, free_bytes)
        tile = {"mem": mem, "size": max(free_bytes, 1), "dtype": dtype, "shape": shape, "at": len(self.instrs),
                "loc": self.loc(), "address": address, "touched": None, "ref": weakref.ref(b),
                "pitch": b.pitch, "block": math.prod(shape[pdim + 1:]) if pdim and mem == "psum" else 0}
        self.tiles[b.name] = tile
        # the access lists are updated in place, so the finalizer sees their last state
        weakref.finalize(b, _last_accesses, tile, b.reads, b.writes)
        t = ndarray(b, shape, pdim=pdim)
        self.inits.append((len(self.instrs), t.operand(), _sentinel(dtype)))
        return t

    def allocate(self) -> None:
        """Place the traced on-chip tiles by liveness (:func:`neuron_stack.nki.alloc.place_by_liveness`)."""
        try:
            place_by_liveness(self)
        except AllocationError as e:
            raise NKIError(str(e)) from None

    # -- instructions ----------------------------------------------------------------------------
    def emit(self, opcode: str, dsts: list[ndarray], srcs: list[ndarray], attrs: dict | None = None,
             dur: float = 0.0, flops: int = 0, itype: str = "", small: bool = True, latency: float = 0.0,
             loc: str | None = None) -> int:
        """Append one instruction; returns its index. Dependencies come from overlapping accesses."""
        engine = ENGINE_OF[opcode]
        if len(self.instrs) >= MAX_INSTRUCTIONS:
            raise self.error(f"the kernel unrolls to more than {MAX_INSTRUCTIONS} instructions (NKI_MAX_INSTRUCTIONS): "
                             f"every loop iteration is traced; shrink the loop bounds or the problem size")
        for v in (*dsts, *srcs):
            if not _in_bounds(v):
                raise self.error(f"access {v.shape} at offset {v.offset} is outside {v.buf.name} {v.buf.shape}: "
                                 f"index within the tensor, or add a mask for a ragged last tile")
        deps: set[int] = set()
        sregs = [(v, v.region()) for v in srcs]
        dregs = [(v, v.region()) for v in dsts]
        for v, r in sregs:
            deps.update(i for i, w in v.buf.writes if _overlap(r, w))
        for v, r in dregs:
            deps.update(i for i, w in v.buf.writes if _overlap(r, w))
            deps.update(i for i, w in v.buf.reads if _overlap(r, w))
        idx = len(self.instrs)
        prev = self.engine_last.get(engine)
        if small and engine in ("vector", "scalar", "gpsimd") and prev is not None and prev in deps:
            dur += dependent_overhead_ns(self.p, engine)
        nb = lambda v: math.prod(v.shape) * DTYPE_BYTES[v.dtype]
        ops = {"dst": [v.operand() for v in dsts], "src": [v.operand() for v in srcs]}
        ops.update(attrs or {})
        ins = Instr(engine, opcode, loc or self.loc(), dur, sorted(deps), [], ops, flops,
                    sum(nb(v) for v in srcs), sum(nb(v) for v in dsts), (), "IO" if engine == "dma" else "", itype,
                    sum(nb(v) for v in srcs if v.buf.mem == "hbm"), sum(nb(v) for v in dsts if v.buf.mem == "hbm"))
        ins.latency = latency
        self.instrs.append(ins)
        # what `retarget` needs to rewrite this instruction (the destination weakly: tiles still free on time)
        self._last = (idx, weakref.ref(dsts[0].buf), [(weakref.ref(v.buf), v.shape, v.offset, v.strides, v.dtype,
                                                        v.pdim) for v in srcs]) if len(dsts) == 1 else None
        self.engine_last[engine] = idx
        for v, r in sregs:
            v.buf.reads.append((idx, r))
        for v, r in dregs:
            b = v.buf
            b.reads[:] = [(i, w) for i, w in b.reads if not _inside(w, r)]
            b.writes[:] = [(i, w) for i, w in b.writes if not _inside(w, r)] + [(idx, r)]
            b.written.append(r)
        return idx

    def retarget(self, value: ndarray, dst: ndarray) -> bool:
        """``dst[...] = value`` where ``value`` is a temporary tile the last instruction just wrote in full
        and nothing read: that instruction writes ``dst`` instead (what the compiler does with
        ``t[...] = nl.load(...)`` or ``= nl.copy(...)``), so no extra copy is issued. False when it cannot."""
        last = getattr(self, "_last", None)
        if last is None or last[0] != len(self.instrs) - 1 or last[1]() is not value.buf:
            return False
        ins = self.instrs[-1]
        b = value.buf
        srcs = [ndarray(ref(), shape, off, st, dt, pd) for ref, shape, off, st, dt, pd in last[2] if ref() is not None]
        if len(srcs) != len(last[2]):
            return False
        box = getattr(self, "masked_box", None)
        if ins.operands["dst"][0] != value.operand() and box is not None and box[0] == value.operand() \
                and dst.shape == value.shape:
            restrict = TENSOR_OPS["restrict"]      # the instruction wrote the mask's box of value: that box of dst
            dst, value = restrict(dst, box[1], dst.shape), restrict(value, box[1], value.shape)
        if (b.mem == "hbm" or b.reads or [i for i, _ in b.writes] != [last[0]]
                or ins.operands["dst"][0] != value.operand() or dst.dtype != value.dtype
                or dst.partitions != value.partitions or dst.free_size != value.free_size
                or (dst.buf.mem == "hbm" and ins.opcode != "DMA_DIRECT2D")
                or (ins.opcode == "MATMUL" and dst.buf.mem != "psum")):
            return False
        idx = len(self.instrs) - 1
        self.instrs.pop()
        if b.name in self.tiles:
            self.tiles[b.name]["retargeted"] = True     # never touched: it takes no space
        b.writes.clear()
        b.written.clear()
        for v in srcs:              # the popped instruction's reads (the new one re-records them)
            v.buf.reads[:] = [(i, r) for i, r in v.buf.reads if i != idx]
        attrs = {k: v for k, v in ins.operands.items() if k not in ("dst", "src")}
        self.emit(ins.opcode, [dst], srcs, attrs, dur=ins.dur, flops=ins.flops, itype=ins.itype, small=False,
                  latency=getattr(ins, "latency", 0.0), loc=ins.node)
        return True

    def spread_dmas(self) -> None:
        """Once the kernel is traced: cut each large SBUF <-> HBM DMA into pieces of 8-partition groups, one per
        DMA queue, as the hardware spreads one transfer over the core's 16 DMA engines (SDK
        nki/about/nki-dma-overview.rst); the compiler's DMAs are cut the same way (``Lowerer.dma``). Indices
        into the instruction list (dependencies, allocation fills, prints) follow."""
        from neuron_stack.compiler.lower.tiles import numel_ap, split_dma
        from neuron_stack.device.cost import dma_min_piece_bytes, dma_ns
        out: list[Instr] = []
        first: list[int] = []        # old index -> its first new index
        last: list[int] = []         # old index -> one past its last new index
        min_piece = dma_min_piece_bytes(self.p)
        for ins in self.instrs:
            deps = sorted({j for d in ins.deps for j in range(first[d], last[d])})
            first.append(len(out))
            pieces = split_dma(ins.operands["dst"][0], ins.operands["src"][0], self.p.dma_engines_per_core,
                               min_piece) if ins.opcode == "DMA_DIRECT2D" else []
            if len(pieces) < 2:
                out.append(dataclasses.replace(ins, deps=deps))
            else:
                for d, s_ in pieces:
                    frac = numel_ap(d["ap"]) / numel_ap(ins.operands["dst"][0]["ap"])
                    desc = max(1, round(ins.operands.get("desc", 1) * frac))
                    nb = round(max(ins.bytes_read, ins.bytes_written) * frac)
                    piece = dataclasses.replace(
                        ins, deps=deps, operands={**ins.operands, "dst": [d], "src": [s_], "desc": desc},
                        dur=dma_ns(self.p, nb, desc) - self.p.dma_fixed_ns, bytes_read=round(ins.bytes_read * frac),
                        bytes_written=round(ins.bytes_written * frac), hbm_read=round(ins.hbm_read * frac),
                        hbm_write=round(ins.hbm_write * frac))
                    out.append(piece)
            last.append(len(out))
        first.append(len(out))
        self.inits = [(first[i], o, f) for i, o, f in self.inits]
        self.prints = [(first[i], *rest) for i, *rest in self.prints]
        self.instrs = out

    def dma(self, dst: ndarray, src: ndarray, attrs: dict | None = None) -> int:
        """DMA_DIRECT2D ``src`` -> ``dst`` (same element count, element order)."""
        from neuron_stack.device.cost import dma_ns
        n = math.prod(src.shape)
        if n != math.prod(dst.shape):
            raise self.error(f"dma_copy of {src.shape} into {dst.shape}: the element counts differ")
        for v in (dst, src):
            if v.buf.mem != "hbm" and v.partitions > PMAX:
                raise self.error(f"Size of partition dimension {v.partitions} exceeds architecture limitation "
                                 f"of {PMAX}")
        run = math.gcd(_run(src), _run(dst))
        desc = n // max(1, run)
        for v in (src, dst):
            if v.buf.mem != "hbm":
                desc = max(desc, v.partitions)
        nbytes = n * max(DTYPE_BYTES[src.dtype], DTYPE_BYTES[dst.dtype])
        # the ~1.3 us fixed cost is latency before the data moves (same split as the compiler's DMAs)
        return self.emit("DMA_DIRECT2D", [dst], [src], {"desc": desc, **(attrs or {})},
                         dur=dma_ns(self.p, nbytes, desc) - self.p.dma_fixed_ns, latency=self.p.dma_fixed_ns)


def _in_bounds(v: ndarray) -> bool:
    b = v.buf
    if b.mem == "hbm":
        f0, f1 = v.flat_range()
        return f0 >= 0 and f1 < math.prod(b.shape)
    p0, p1, f0, f1 = v.region()
    return p0 >= 0 and p1 < math.prod(b.shape) // b.pitch and f0 >= 0 and f1 < b.pitch


def _run(v: ndarray) -> int:
    """Contiguous elements per descriptor (innermost unit-stride run)."""
    if not v.shape:
        return 1
    return v.shape[-1] if v.strides[-1] == 1 else 1


def _sentinel(dtype: str) -> float:
    return float("nan") if dtype in FLOATS else 4
