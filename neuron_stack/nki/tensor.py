"""NKI tensors and what every NKI module shares: the tile limits, dtypes, errors naming the kernel line, and
:class:`ndarray`, a strided view of an HBM tensor or an on-chip tile (:mod:`neuron_stack.nki.core` records the
instructions that use them).

>>> dtype_name("bfloat16"), PMAX
('bfloat16', 128)
"""
from __future__ import annotations

import functools
import math
import os
import sys
import threading

import numpy as np

from neuron_stack.isa.memory import contiguous_strides

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


def current():
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
    _limits: tuple = ()         # (dim, length, message): a slice past a dim's end, legal once a mask trims it

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
        op = {"m": self.buf.mem, "b": self.buf.name, "dt": self.dtype, "o": self.offset, "ap": ap}
        if self.dtype != self.buf.dtype and self.lanes != 1:
            op["bc"] = self.buf.dtype       # a bitcast view: the memory decodes the buffer's bytes
        return op

    def region(self) -> tuple:
        """The box this view touches, as (lo, hi) pairs flattened: (p_lo, p_hi, f_lo, f_hi) on chip,
        one pair per tensor dim in HBM (so disjoint blocks of one output never wait for each other)."""
        if self.buf.mem == "hbm":
            return _hbm_box(self)
        r = self.lanes
        pitch = self.buf.pitch * r
        p0, f0 = divmod(self.offset, pitch)
        p1, f1 = p0, f0
        # each stride steps partitions (a multiple of the pitch) or free elements (less than it); a negative
        # one (an index like ``1 - i``) steps down from the offset
        for s, n in zip(self.strides, self.shape):
            dp, df = divmod(abs(s), pitch)
            if s > 0:
                p1, f1 = p1 + (n - 1) * dp, f1 + (n - 1) * df
            elif s < 0:
                p0, f0 = p0 - (n - 1) * dp, f0 - (n - 1) * df
        if r != 1:              # a bitcast view: the buffer elements its bytes lie in
            f0, f1 = f0 // r, f1 // r
        return (p0, p1, f0, f1)

    def flat_range(self) -> tuple[int, int]:
        steps = [(n - 1) * s for s, n in zip(self.strides, self.shape)]
        return self.offset + sum(x for x in steps if x < 0), self.offset + sum(x for x in steps if x > 0)

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

    @property
    def lanes(self) -> int:
        """Elements of this view's dtype per element of its buffer: 4 for ``t.view(nl.float8_e4m3)`` of an fp32
        tile (a bitcast view), 1 for every other view."""
        if self.dtype == self.buf.dtype:
            return 1
        return max(DTYPE_BYTES[self.buf.dtype] // DTYPE_BYTES[self.dtype], 1)

    def view(self, dtype) -> ndarray:
        """The same bytes as ``dtype``: same-size dtypes keep the shape; a narrower dtype of an on-chip tile
        splits each element of the last dim into its bytes' worth (an fp32 [P, 1] as fp8 is [P, 4]), read-only."""
        dt = dtype_name(dtype)
        old, new = DTYPE_BYTES[self.dtype], DTYPE_BYTES[dt]
        if old == new:
            return ndarray(self.buf, self.shape, self.offset, self.strides, dt, self.pdim)
        if self.buf.mem == "hbm" or old < new or self.lanes != 1 or not self.shape or self.strides[-1] != 1 \
                or self.pdim == self.ndim - 1:
            raise NKIError(f"{where()}: a {self.dtype} -> {dt} view reinterprets bytes; the simulator does that for "
                           f"an on-chip tile with a contiguous last free dim, to a narrower dtype only")
        r = old // new
        return ndarray(self.buf, (*self.shape[:-1], self.shape[-1] * r), self.offset * r,
                       [s * r for s in self.strides[:-1]] + [1], dt, self.pdim)

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
