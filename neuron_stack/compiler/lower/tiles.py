"""The data every lowering shares: instructions (:class:`Instr`, :class:`Lowered`), views over HBM
buffers (:class:`View`: a meta tensor carries shape/stride/offset, so torch's own view semantics
decide what is a view and what needs a copy), access patterns, SBUF/PSUM tiles and their rotating
pools, the NeuronCore tiling limits, and the elementwise op tables (ATen packet -> engine op).

>>> [b[0] for b in boxes((300, 64), 128 * 64)]       # row ranges of tiles of at most 128 x 64 elements
[(0, 128), (128, 128), (256, 44)]
>>> view_operand(View("x", "float32", meta_tensor((4, 8))))["ap"]
[[1, 32]]
"""
from __future__ import annotations

import bisect
import itertools
import math
from array import array
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_stack.device.cost import ceil_div

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4,
               "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "complex64": 8}


FLOATS = ("float32", "float64", "bfloat16", "float16")


PMAX = 128            # partitions


MOVING_FMAX = 512     # gemm moving free size = one PSUM bank of fp32


STAT_FMAX = 128       # gemm stationary free size


BN_FMAX = 512         # bn_stats free size limit


FREE_TILE = 2048      # free elements per Vector/Scalar tile (keeps pools small, instructions long)


def nbytes_of(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 4)


class LoweringError(ValueError):
    """A node the lowering cannot handle; the message names the node and why."""


@dataclass(slots=True)
class Instr:
    """One device instruction before scheduling (times in ns)."""
    engine: str
    opcode: str
    node: str
    dur: float
    deps: list[int]
    tdeps: list[str]
    operands: dict
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    writes: tuple = ()            # HBM buffers this instruction writes (for tensor-ready tracking)
    queue_kind: str = ""          # DMA: "IO" or "SpillReload"
    itype: str = ""               # Tensor: REGULAR / TRANSPOSE
    hbm_read: int = 0
    hbm_write: int = 0
    spill_save: int = 0
    spill_reload: int = 0
    latency: float = 0.0          # DMA: trigger-to-start time; the queue stays free for other transfers


class Instrs:
    """A partition's instructions, packed: one typed array per :class:`Instr` field, names (engines,
    opcodes, nodes, buffers) as indices into one string table, dependency lists as offsets into one
    flat array. A million-instruction prefill then holds ~150 bytes per instruction instead of an
    object with its lists and operand dicts (kilobytes); ``detail=False`` keeps no operands at all
    (what the scheduler needs of a MATMUL's, its PSUM bank and ``stop``, is a column of its own).

    Append-only; ``instrs[i]`` and iteration give :class:`Instr` values rebuilt from the columns (the
    same operand dict, so a lowering may still annotate it).

    >>> t = Instrs()
    >>> t.add("dma", "DMA_DIRECT2D", "x", 2.5, [], ["in"], {"dst": [], "src": []}, bytes_read=64, latency=1.0)
    0
    >>> t.add("scalar", "ACTIVATE", "x", 1.0, [0], [], {})
    1
    >>> len(t), t[1].deps, t[0].tdeps, t[0].bytes_read, t[-1].opcode
    (2, [0], ['in'], 64, 'ACTIVATE')
    """

    _INTS = ("flops", "bytes_read", "bytes_written", "hbm_read", "hbm_write", "spill_save", "spill_reload")

    def __init__(self, detail: bool = True):
        self.detail = detail
        self.names: dict[str, int] = {}
        self.strs: list[str] = []
        for f in ("engine", "opcode", "node", "queue_kind", "itype", "acc"):
            setattr(self, f, array("i"))       # string-table indices (acc: a MATMUL's PSUM bank, or -1)
        self.acc_stop = array("b")
        self.dur, self.latency = array("d"), array("d")
        for f in self._INTS:
            setattr(self, f, array("q"))
        # CSR lists: the items of instruction i are flat[off[i]:off[i + 1]]
        self.deps, self.deps_off = array("i"), array("q", [0])
        self.tdeps, self.tdeps_off = array("i"), array("q", [0])
        self.writes, self.writes_off = array("i"), array("q", [0])
        self.operands: list[dict] | None = [] if detail else None

    @classmethod
    def of(cls, instrs) -> "Instrs":
        """Pack a list of :class:`Instr` (an NKI trace's, a test's)."""
        t = cls()
        for x in instrs:
            t.add(x.engine, x.opcode, x.node, x.dur, x.deps, x.tdeps, x.operands, x.flops, x.bytes_read,
                  x.bytes_written, x.writes, x.queue_kind, x.itype, x.hbm_read, x.hbm_write, x.spill_save,
                  x.spill_reload, x.latency)
        return t

    def code(self, name: str) -> int:
        c = self.names.get(name)
        if c is None:
            c = self.names[name] = len(self.strs)
            self.strs.append(name)
        return c

    def add(self, engine: str, opcode: str, node: str, dur: float, deps, tdeps, operands: dict | None, flops: int = 0,
            bytes_read: int = 0, bytes_written: int = 0, writes=(), queue_kind: str = "", itype: str = "",
            hbm_read: int = 0, hbm_write: int = 0, spill_save: int = 0, spill_reload: int = 0,
            latency: float = 0.0, acc: str | None = "", stop: bool = True) -> int:
        """Append one instruction (the fields of :class:`Instr`; ``deps`` sorted); returns its index.
        ``acc``, ``stop``: a MATMUL's PSUM bank and ``stop`` flag, if not taken from ``operands``
        (which a timings-only lowering does not build: ``None``)."""
        code, names = self.code, self.names
        i = len(self.dur)
        # a table lookup first: a name is almost always in the table already (no call)
        self.engine.append(names[engine] if engine in names else code(engine))
        self.opcode.append(names[opcode] if opcode in names else code(opcode))
        self.node.append(names[node] if node in names else code(node))
        self.queue_kind.append(names[queue_kind] if queue_kind in names else code(queue_kind))
        self.itype.append(names[itype] if itype in names else code(itype))
        if operands is not None and acc == "":
            dst = operands.get("dst") if opcode == "MATMUL" else None
            acc = dst[0].get("b") if dst else None
            stop = operands.get("stop", True)
        self.acc.append(-1 if acc is None else code(acc))
        self.acc_stop.append(1 if stop else 0)
        self.dur.append(dur)
        self.latency.append(latency)
        self.flops.append(flops)
        self.bytes_read.append(bytes_read)
        self.bytes_written.append(bytes_written)
        self.hbm_read.append(hbm_read)
        self.hbm_write.append(hbm_write)
        self.spill_save.append(spill_save)
        self.spill_reload.append(spill_reload)
        self.deps.extend(deps)
        self.deps_off.append(len(self.deps))
        self.tdeps.extend(code(t) for t in tdeps)
        self.tdeps_off.append(len(self.tdeps))
        self.writes.extend(code(w) for w in writes)
        self.writes_off.append(len(self.writes))
        if self.operands is not None:
            self.operands.append({} if operands is None else operands)
        return i

    def append(self, ins: Instr) -> None:
        self.add(ins.engine, ins.opcode, ins.node, ins.dur, ins.deps, ins.tdeps, ins.operands, ins.flops,
                 ins.bytes_read, ins.bytes_written, ins.writes, ins.queue_kind, ins.itype, ins.hbm_read,
                 ins.hbm_write, ins.spill_save, ins.spill_reload, ins.latency)

    def __len__(self) -> int:
        return len(self.dur)

    def column(self, field: str) -> list[str]:
        """A name column (``engine``, ``opcode``, ``node``, ``queue_kind``, ``itype``) as strings."""
        strs = self.strs
        return [strs[c] for c in getattr(self, field)]

    def __getitem__(self, i: int) -> Instr:
        n = len(self.dur)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        s = self.strs
        return Instr(s[self.engine[i]], s[self.opcode[i]], s[self.node[i]], self.dur[i],
                     self.deps[self.deps_off[i]:self.deps_off[i + 1]].tolist(),
                     [s[c] for c in self.tdeps[self.tdeps_off[i]:self.tdeps_off[i + 1]]],
                     self.operands[i] if self.operands is not None else {},
                     self.flops[i], self.bytes_read[i], self.bytes_written[i],
                     tuple(s[c] for c in self.writes[self.writes_off[i]:self.writes_off[i + 1]]),
                     s[self.queue_kind[i]], s[self.itype[i]], self.hbm_read[i], self.hbm_write[i],
                     self.spill_save[i], self.spill_reload[i], self.latency[i])

    def __iter__(self):
        return (self[i] for i in range(len(self)))


@dataclass
class Lowered:
    """The instruction list of one partition plus what the interpreter and summary need."""
    instrs: Instrs                        # a list of Instr is packed on construction
    hbm_buffers: dict[str, dict]          # name -> {"dtype", "numel", "role": input|output|const|scratch, "shape"}
    inputs: list[str]                     # HBM buffers the partition reads from outside
    outputs: list[str]                    # HBM buffers other partitions / the program read
    values: dict[str, dict] = field(default_factory=dict)   # value name -> strided view of a buffer
    sbuf_peak_bytes: int = 0              # per partition
    log: list[str] = field(default_factory=list)
    # on-chip allocations in order: (memory "sbuf"|"psum", key, address, bytes per partition,
    # index of the first instruction after it, partitions (0: as the operands say))
    allocs: list[tuple] = field(default_factory=list)

    def __post_init__(self):
        if not isinstance(self.instrs, Instrs):
            self.instrs = Instrs.of(self.instrs)


@dataclass
class View:
    buf: str
    dtype: str
    meta: Any          # torch meta tensor (shape, stride, storage_offset)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.meta.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def with_meta(self, meta) -> "View":
        return View(self.buf, self.dtype, meta)


def meta_tensor(shape, dtype="float32"):
    tdt = getattr(torch, dtype, torch.float32) if dtype in DTYPE_BYTES else torch.float32
    return torch.empty(tuple(shape), dtype=tdt, device="meta")


def boxes(shape: tuple[int, ...], limit: int) -> list[list[tuple[int, int]]]:
    """Split the index space ``shape`` into boxes of at most ``limit`` elements, each one access pattern.

    Inner dimensions are kept whole while they fit; the first dimension that does not fit is
    chunked; outer dimensions are iterated one index at a time.
    >>> boxes((2, 100), 128)
    [[(0, 1), (0, 100)], [(1, 1), (0, 100)]]
    >>> [b[0] for b in boxes((300,), 128)]
    [(0, 128), (128, 128), (256, 44)]
    """
    if not shape:
        return [[]]
    inner = 1
    j = len(shape)
    while j > 0 and inner * shape[j - 1] <= limit:
        inner *= shape[j - 1]
        j -= 1
    if j == 0:
        return [[(0, d) for d in shape]]
    d = j - 1
    step = max(1, limit // inner)
    out = []
    for outer in _ndindex(shape[:d]):
        for s in range(0, shape[d], step):
            out.append([(i, 1) for i in outer] + [(s, min(step, shape[d] - s))] + [(0, n) for n in shape[j:]])
    return out


def _ndindex(shape):
    if not shape:
        yield ()
        return
    yield from itertools.product(*(range(n) for n in shape))


def _merge_ap(ap: list[list[int]]) -> list[list[int]]:
    """Drop unit dims and merge dims that are contiguous with each other (same element order)."""
    ap = [[s, n] for s, n in ap if n != 1] or [[1, 1]]
    out = [list(ap[0])]
    for s, n in ap[1:]:
        ps, pn = out[-1]
        if ps == s * n:
            out[-1] = [s, pn * n]
        else:
            out.append([s, n])
    return out


def view_operand(v: View, box: list[tuple[int, int]] | None = None) -> dict:
    """The HBM access-pattern operand of ``v`` restricted to ``box`` (per-dim start, length)."""
    strides = v.meta.stride()
    shape = v.shape
    box = box if box is not None else [(0, n) for n in shape]
    off = v.meta.storage_offset() + sum(s * st for (s, _), st in zip(box, strides))
    ap = _merge_ap([[st, n] for (_, n), st in zip(box, strides)])
    return {"m": "hbm", "b": v.buf, "dt": v.dtype, "o": int(off), "ap": ap}


def contiguous_run(ap: list[list[int]]) -> int:
    """Contiguous elements per descriptor of an access pattern (innermost unit-stride run)."""
    s, n = ap[-1]
    return n if s == 1 else 1


def split_dma(dst: dict, src: dict, engines: int, min_bytes: int = 64 * 1024, min_parts: int = 8):
    """Split a large SBUF<->HBM transfer into pieces of whole partitions whose HBM side is still one
    access pattern (its outer dim splits on partition boundaries); otherwise one piece."""
    sb, hb = (dst, src) if dst["m"] != "hbm" else (src, dst)
    if sb["m"] == "hbm" or hb["m"] != "hbm":
        return [(dst, src)]
    n = numel_ap(sb["ap"])
    if n * nbytes_of(sb["dt"]) < min_bytes:
        return [(dst, src)]
    P = sb["ap"][0][1]
    F = n // P
    s0, n0 = hb["ap"][0]
    inner = n // n0
    # rows of the HBM outer dim per partition group must cover whole partitions
    parts = min(engines, P // min_parts, n * nbytes_of(sb["dt"]) // min_bytes)
    if parts < 2:
        return [(dst, src)]
    per = ceil_div(P, parts)
    out = []
    for p0 in range(0, P, per):
        np_ = min(per, P - p0)
        e0, e1 = p0 * F, (p0 + np_) * F
        if e0 % inner or e1 % inner:
            return [(dst, src)]
        h = dict(hb, o=hb["o"] + (e0 // inner) * s0, ap=[[s0, (e1 - e0) // inner]] + [list(x) for x in hb["ap"][1:]])
        sp = dict(sb, o=sb["o"] + p0 * sb["ap"][0][0], ap=[[sb["ap"][0][0], np_]] + [list(x) for x in sb["ap"][1:]])
        out.append((sp, h) if dst is sb else (h, sp))
    return out


def numel_ap(ap) -> int:
    n = 1
    for _, k in ap:       # a loop: no generator for the two or three dims of a pattern
        n *= k
    return n


@dataclass
class Tile:
    """A rectangular [P partitions, F free] region of an SBUF or PSUM slot."""
    key: str
    mem: str
    dtype: str
    P: int
    F: int
    pitch: int
    off: int = 0
    free_ap: tuple | None = None     # engine read pattern over the free axis (stride 0 = broadcast)

    def op(self) -> dict:
        free = [list(x) for x in self.free_ap] if self.free_ap else [[1, self.F]]
        return {"m": self.mem, "b": self.key, "dt": self.dtype, "o": self.off,
                "ap": [[self.pitch, self.P]] + free}

    def cols(self, c0: int, n: int) -> "Tile":
        return Tile(self.key, self.mem, self.dtype, self.P, n, self.pitch, self.off + c0)

    def rows(self, p0: int, n: int) -> "Tile":
        return Tile(self.key, self.mem, self.dtype, n, self.F, self.pitch, self.off + p0 * self.pitch,
                    self.free_ap)

    def as_dtype(self, dt: str) -> "Tile":
        return Tile(self.key, self.mem, dt, self.P, self.F, self.pitch, self.off, self.free_ap)


class Ring:
    """Ring allocator over one on-chip memory (bytes per partition); reports overlapped regions.

    The live regions never overlap (an allocation evicts every region it touches), so they are kept
    sorted by address in three parallel lists and the ones an allocation hits are one slice found by
    bisection: a BERT-base compile makes ~6,000 allocations over up to thousands of regions."""

    def __init__(self, capacity: int, unit: int = 64):
        self.cap, self.unit, self.cursor, self.peak = capacity, unit, 0, 0
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.keys: list[str] = []

    def alloc(self, nbytes: int, key: str) -> list[str]:
        nbytes = ceil_div(max(nbytes, 1), self.unit) * self.unit
        if nbytes > self.cap:
            raise LoweringError(f"tile of {nbytes} bytes per partition exceeds on-chip capacity {self.cap}")
        if self.cursor + nbytes > self.cap:
            self.cursor = 0
        lo, hi = self.cursor, self.cursor + nbytes
        self.cursor = hi
        self.peak = max(self.peak, hi)
        i = bisect.bisect_right(self.ends, lo)        # first region ending after lo
        j = bisect.bisect_left(self.starts, hi, i)     # first region starting at or after hi
        hit = self.keys[i:j]
        self.starts[i:j], self.ends[i:j], self.keys[i:j] = [lo], [hi], [key]
        return hit


class Pool:
    """A rotating pool of ``bufs`` same-sized tiles (double buffering when bufs >= 2)."""

    def __init__(self, low, name: str, mem: str, P: int, F: int, dtype: str, bufs: int = 2):   # low: the Lowerer
        self.low, self.name, self.mem, self.P, self.F, self.dtype, self.bufs = low, name, mem, P, F, dtype, bufs
        self.i = 0
        self.keys = []
        per = F * (4 if mem == "psum" else nbytes_of(dtype))
        for b in range(bufs):
            key = f"{name}.{b}"
            low.claim(mem, per, key)
            self.keys.append(key)

    def tile(self, P: int | None = None, F: int | None = None) -> Tile:
        key = self.keys[self.i % self.bufs]
        self.i += 1
        dt = "float32" if self.mem == "psum" else self.dtype
        return Tile(key, self.mem, dt, P or self.P, F or self.F, self.F)


#: binary ops with a tensor or scalar second operand -> Vector ALU op
BINARY = {
    "add": "add", "sub": "subtract", "mul": "multiply", "div": "divide", "maximum": "maximum",
    "minimum": "minimum", "pow": "power", "eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
    "gt": "greater", "ge": "greater_equal", "logical_and": "logical_and", "logical_or": "logical_or",
    "logical_xor": "logical_xor", "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or",
    "bitwise_xor": "bitwise_xor", "remainder": "mod", "fmod": "fmod", "atan2": "atan2", "hypot": "hypot",
    "copysign": "copysign", "floor_divide": "floor_divide", "rsub": "rsub",
}


#: unary ops -> Scalar engine activation function
UNARY_ACT = {
    "relu": "relu", "gelu": "gelu", "silu": "silu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp",
    "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "erf": "erf", "sin": "sin", "cos": "cos", "abs": "abs",
    "sign": "sign", "sgn": "sign", "neg": "neg", "exp2": "exp2", "log2": "log2", "log1p": "log1p",
    "expm1": "expm1", "floor": "floor", "ceil": "ceil", "round": "round", "trunc": "trunc",
    "square": "square", "clone": "copy", "alias": "copy", "_to_copy": "copy", "lift_fresh_copy": "copy",
}


#: unary ops -> Vector (TENSOR_SCALAR with immediates, or RECIPROCAL)
CLAMPS = {"clamp": ("min", "max"), "clamp_min": ("min", None), "clamp_max": (None, "max"),
          "hardtanh": ("min_val", "max_val"), "relu6": (None, None)}


def packet_name(target: str) -> str:
    parts = target.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else target


def aten_op(target: str):
    parts = target.split(".")
    op = getattr(torch.ops.aten, parts[1])
    return getattr(op, parts[2] if len(parts) > 2 else "default")


def is_ref(a) -> bool:
    return isinstance(a, dict) and set(a) == {"node"}


def conv_weight_strides(shape) -> tuple[int, ...]:
    """Storage strides that put a conv weight [O, C, *K] in (C, *K, O) order: the compile-time layout
    under which one channel block of every tap and output channel is a contiguous load.

    >>> conv_weight_strides((8, 3, 3, 3))
    (1, 72, 24, 8)
    """
    O = shape[0]
    ks = list(shape[2:])
    strides, acc = [], O
    for k in reversed(ks):
        strides.append(acc)
        acc *= k
    return (1, acc) + tuple(reversed(strides))
