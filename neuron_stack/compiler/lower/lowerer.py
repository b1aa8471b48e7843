"""Pass 4, lower and tile: a device partition's graph nodes become NeuronCore instructions.

Every graph value lives in HBM (inputs, weights, intermediates, outputs), as a flat buffer. An op
loads tiles of its inputs into SBUF with DMA (any view - permute, slice, broadcast - is an access
pattern, so view ops cost nothing), computes on the engines, and stores its result tiles back with
DMA. Fused elementwise nodes (``Node.fused_into``) are applied to the host's output tiles while they
are still in SBUF/PSUM (the PSUM-evacuation epilogue), never as separate loads.

Tiling obeys the NeuronCore rules (reference §5.3): at most 128 partitions, Tensor Engine stationary
<=128x128 and moving <=512 free elements accumulating in one 2 KiB PSUM bank, ``bn_stats`` free size
<=512. SBUF tiles come from rotating pools (``bufs=2`` is double buffering: the next tile's DMA runs
while the current one is computed); the pools are carved out of a ring over SBUF, and PSUM banks
out of a ring over the 8 banks, with write-after-read dependencies when a region is reused. When an
op's resident working set does not fit in SBUF, it spills to HBM and the traffic is counted as
``spill_save_bytes`` / ``spill_reload_bytes`` on the ``qSyncSpillReload`` queues.

>>> from neuron_stack.ir import Node, Program, TensorSpec
>>> t = TensorSpec((256, 256), "float32")
>>> prog = Program("g", [Node("x", "placeholder", outputs=[t]),
...     Node("mm", "aten.mm.default", [{"node": "x"}, {"node": "x"}], inputs=[t, t], outputs=[t],
...          op_class="matmul", partition=0)], ["x"], [{"node": "mm"}])
>>> from neuron_stack.device.profiles import get_profile
>>> low = lower(prog, 0, get_profile("trn1"), {})
>>> sorted({i.opcode for i in low.instrs})
['ACTIVATE', 'AFFINE_SELECT', 'DMA_DIRECT2D', 'LDWEIGHTS', 'MATMUL', 'TENSOR_COPY']
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from neuron_stack.device.cost import ceil_div, dependent_overhead_ns, dma_ns, scalar_ns, vector_ns
from neuron_stack.device.profiles import DeviceProfile
from neuron_stack.ir import Node, Program, TensorSpec
from neuron_stack.isa.instructions import ENGINE_OF
from neuron_stack.compiler.lower.resident import Heap, Resident, row_tiling, tile_ap, translate

#: share of SBUF (per partition) kept for values resident across ops; the rest holds tile pools
RESIDENT_FRACTION = 0.6

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


@dataclass
class Lowered:
    """The instruction list of one partition plus what the interpreter and summary need."""
    instrs: list[Instr]
    hbm_buffers: dict[str, dict]          # name -> {"dtype", "numel", "role": input|output|const|scratch, "shape"}
    inputs: list[str]                     # HBM buffers the partition reads from outside
    outputs: list[str]                    # HBM buffers other partitions / the program read
    values: dict[str, dict] = field(default_factory=dict)   # value name -> strided view of a buffer
    sbuf_peak_bytes: int = 0              # per partition
    log: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# Views over HBM buffers: a meta tensor carries shape/stride/offset, so torch's own view semantics
# decide what is a view and what needs a copy.

def _torch():
    import torch
    return torch


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


def _meta(shape, dtype="float32"):
    torch = _torch()
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
    import itertools
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


def _run(ap: list[list[int]]) -> int:
    """Contiguous elements per descriptor of an access pattern (innermost unit-stride run)."""
    s, n = ap[-1]
    return n if s == 1 else 1


def _split_dma(dst: dict, src: dict, engines: int, min_bytes: int = 64 * 1024, min_parts: int = 8):
    """Split a large SBUF<->HBM transfer into pieces of whole partitions whose HBM side is still one
    access pattern (its outer dim splits on partition boundaries); otherwise one piece."""
    sb, hb = (dst, src) if dst["m"] != "hbm" else (src, dst)
    if sb["m"] == "hbm" or hb["m"] != "hbm":
        return [(dst, src)]
    n = _numel_ap(sb["ap"])
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


def _numel_ap(ap) -> int:
    return math.prod(n for _, n in ap)


# ----------------------------------------------------------------------------------------------

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


class _Ring:
    """Ring allocator over one on-chip memory (bytes per partition); reports overlapped regions."""

    def __init__(self, capacity: int, unit: int = 64):
        self.cap, self.unit, self.cursor, self.regions, self.peak = capacity, unit, 0, [], 0

    def alloc(self, nbytes: int, key: str) -> list[str]:
        nbytes = ceil_div(max(nbytes, 1), self.unit) * self.unit
        if nbytes > self.cap:
            raise LoweringError(f"tile of {nbytes} bytes per partition exceeds on-chip capacity {self.cap}")
        if self.cursor + nbytes > self.cap:
            self.cursor = 0
        lo, hi = self.cursor, self.cursor + nbytes
        self.cursor = hi
        self.peak = max(self.peak, hi)
        hit = [k for (a, b, k) in self.regions if a < hi and lo < b]
        self.regions = [(a, b, k) for (a, b, k) in self.regions if not (a < hi and lo < b)] + [(lo, hi, key)]
        return hit


class Pool:
    """A rotating pool of ``bufs`` same-sized tiles (double buffering when bufs >= 2)."""

    def __init__(self, low: "Lowerer", name: str, mem: str, P: int, F: int, dtype: str, bufs: int = 2):
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


# ----------------------------------------------------------------------------------------------
# Elementwise op tables (data): ATen packet -> how it lowers.

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


def _packet_name(target: str) -> str:
    parts = target.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else target


# ----------------------------------------------------------------------------------------------

class Lowerer:
    """Lowers one partition. Use :func:`lower`."""

    def __init__(self, program: Program, partition: int, profile: DeviceProfile, flags: dict):
        self.prog, self.part, self.p, self.flags = program, partition, profile, flags or {}
        self.auto_cast = self.flags.get("auto_cast", "none") or "none"
        self.cast_type = {"bf16": "bfloat16", "fp16": "float16"}.get(self.flags.get("auto_cast_type", "bf16"), "bfloat16")
        self.by_name = {n.name: n for n in program.nodes}
        self.instrs: list[Instr] = []
        self.last_writer: dict[str, int] = {}
        self.readers: dict[str, dict] = {}
        self.pending: dict[str, set[int]] = {}
        self.engine_last: dict[str, int] = {}
        # SBUF: a ring of rotating tile pools, and a heap of values resident across ops (resident.py)
        # (sized in run() by the peak of live intermediates, at most RESIDENT_FRACTION of SBUF)
        self.sbuf = _Ring(profile.sbuf_bytes_per_partition)
        self.heap = Heap(0)
        self.cand: dict[str, str] = {}           # intermediate buffer -> "undecided" | "hbm" | "resident"
        self.res: dict[str, Resident] = {}        # resident buffer -> its placement
        self.res_key: dict[str, Resident] = {}    # SBUF key -> the same
        self.res_wait: dict[str, set[int]] = {}   # SBUF key -> semaphores its writes wait for (region reuse)
        self.freed: list[tuple[int, int, int]] = []   # heap regions released: (start, end, semaphore)
        self.finished: set[str] = set()
        self.engine_busy: dict[str, float] = {}
        self.psum = _Ring(profile.psum_bytes_per_partition, unit=profile.psum_bytes_per_partition // profile.psum_banks)
        self.values: dict[str, View] = {}      # value name ("n" or "n:i") -> HBM view
        self.hbm: dict[str, dict] = {}
        self.inputs: list[str] = []
        self.log: list[str] = []
        self.const_names = set()
        for n in program.nodes:
            if n.target == "get_attr":
                self.const_names.add(n.name)
        self.nodes = [n for n in program.nodes
                      if n.partition == partition and n.is_compute and n.placement == "device"]
        self.in_part = {n.name for n in self.nodes}
        self.users: dict[str, list[str]] = {}
        for n in program.nodes:
            for r in _refs([n.args, n.kwargs]):
                self.users.setdefault(r, []).append(n.name)
        self.out_refs = set(_refs(program.output_names))
        self.fused: dict[str, list[Node]] = {}
        for n in self.nodes:
            if n.fused_into and n.fused_into in self.in_part:
                self.fused.setdefault(n.fused_into, []).append(n)
        self.scratch_i = 0
        self.done: set[str] = set()
        self.preparing = False

    # ---- buffers and dependency tracking -------------------------------------------------
    def claim(self, mem: str, nbytes: int, key: str) -> None:
        ring = self.sbuf if mem == "sbuf" else self.psum
        deps = set()
        for old in ring.alloc(nbytes, key):
            if old.startswith("__identity_"):       # overwritten: the next transpose rebuilds it
                ids = self.__dict__.get("_identity", {})
                for dt in [d for d, t in ids.items() if t.tile.key == old]:
                    del ids[dt]
            w = self.last_writer.get(old)
            if w is not None:
                deps.update(w) if isinstance(w, tuple) else deps.add(w)
            deps.update(self.readers.get(old, {}).values())
            deps.update(self.pending.pop(old, ()))
        self.pending[key] = deps
        self.last_writer.pop(key, None)
        self.readers.pop(key, None)

    def emit(self, opcode: str, node: str, dst: list[dict], src: list[dict], attrs: dict | None = None,
             dur: float = 0.0, flops: int = 0, queue_kind: str = "IO", itype: str = "",
             hbm_read: int = 0, hbm_write: int = 0, spill_save: int = 0, spill_reload: int = 0,
             small: bool = True, piece_of: int | None = None) -> int:
        engine = ENGINE_OF[opcode]
        deps: set[int] = set()
        tdeps: list[str] = []
        writes = []
        br = sum(_numel_ap(o["ap"]) * nbytes_of(o["dt"]) for o in src)
        bw = sum(_numel_ap(o["ap"]) * nbytes_of(o["dt"]) for o in dst)
        if engine not in ("dma",) or opcode != "DMA_DIRECT2D":
            self._raw_hbm_access(src, dst, node)
        for o in src:
            if o["m"] == "hbm" or o["b"] in self.res_key:
                if o["b"] not in tdeps:
                    tdeps.append(o["b"])
                if o["b"] in self.res_key:
                    self.res_key[o["b"]].readers.append(len(self.instrs))
            else:
                w = self.last_writer.get(o["b"])
                if w is not None:
                    deps.update(w) if isinstance(w, tuple) else deps.add(w)
                deps.update(self.pending.get(o["b"], ()))
        for o in dst:
            if o["m"] == "hbm" or o["b"] in self.res_key:
                writes.append(o["b"])
                deps.update(self.res_wait.get(o["b"], ()))
            else:
                k = o["b"]
                w = self.last_writer.get(k)
                if piece_of is not None and isinstance(w, tuple) and piece_of in w:
                    w = None            # sibling pieces of one DMA write disjoint partitions
                if w is not None:
                    deps.update(w) if isinstance(w, tuple) else deps.add(w)
                deps.update(self.readers.get(k, {}).values())
                deps.update(self.pending.get(k, ()) if piece_of is not None else self.pending.pop(k, ()))
        idx = len(self.instrs)
        prev = self.engine_last.get(engine)
        if small and engine in ("vector", "scalar", "gpsimd") and prev is not None and prev in deps:
            dur += dependent_overhead_ns(self.p, engine)
        ops = {"dst": dst, "src": src}
        if attrs:
            ops.update(attrs)
        self.instrs.append(Instr(engine, opcode, node, dur, sorted(deps), tdeps, ops, flops, br, bw,
                                 tuple(writes), queue_kind if engine == "dma" else "", itype,
                                 hbm_read, hbm_write, spill_save, spill_reload))
        self.engine_last[engine] = idx
        self.engine_busy[engine] = self.engine_busy.get(engine, 0.0) + dur
        rk = idx
        for o in src:
            if o["m"] != "hbm" and o["b"] not in self.res_key:
                r = self.readers.setdefault(o["b"], {})
                if engine == "tensor":
                    r[engine] = idx     # the Tensor Engine stays in program order: its last reader suffices
                else:
                    r[rk] = idx         # other queues may be reordered by the scheduler: wait for every reader
        for o in dst:
            if o["m"] != "hbm" and o["b"] not in self.res_key:
                prev_w = self.last_writer.get(o["b"])
                if piece_of is not None and isinstance(prev_w, tuple) and piece_of in prev_w:
                    self.last_writer[o["b"]] = prev_w + (idx,)
                else:
                    self.last_writer[o["b"]] = (idx,) if piece_of is not None else idx
                    self.readers[o["b"]] = {}
        return idx

    # ---- DMA ------------------------------------------------------------------------------
    def dma(self, node: str, dst: dict, src: dict, spill: str = "", piece_of: int | None = None) -> int:
        """DMA_DIRECT2D ``src`` -> ``dst`` (access patterns with equal element counts). Transfers of
        64 KiB or more are split by partition ranges over several queues, as the compiler spreads a
        tile over the core's DMA engines."""
        # a piece is worth its fixed cost only when its transfer is several times longer
        min_piece = int(4 * self.p.dma_fixed_ns * self.p.dma_bytes_per_ns_per_engine)
        pieces = _split_dma(dst, src, self.p.dma_engines_per_core, min_piece)
        # ``piece_of``: the instruction whose disjoint sibling writes this is (no WAW chain between them)
        if len(pieces) > 1:
            first = piece_of
            for d, s_ in pieces:
                i = self._dma1(node, d, s_, spill, first)
                first = i if first is None else first
            return first
        return self._dma1(node, dst, src, spill, piece_of)

    def _dma1(self, node: str, dst: dict, src: dict, spill: str, piece_of: int | None) -> int:
        if dst["m"] == "hbm" and dst["b"] in self.cand:
            self._decide(dst["b"])
        if self._try_on_chip(src) is None or self._try_on_chip(dst) is None:
            # a tile crossing the resident value's row blocks: one DMA per block it touches
            pieces = self._block_pieces(dst, src)
            if pieces:
                first = piece_of
                for d, s_ in pieces:
                    i = self._dma1(node, d, s_, spill, first)
                    first = i if first is None else first
                return first
        src, dst = self._on_chip(src, node), self._on_chip(dst, node)
        n = _numel_ap(src["ap"])
        assert n == _numel_ap(dst["ap"]), (src, dst)
        nb = n * nbytes_of(src["dt"])
        run = math.gcd(_run(src["ap"]), _run(dst["ap"]))
        # SBUF/PSUM partitions are separate address ranges: at least one descriptor per partition
        desc = n // max(1, run)
        for o in (src, dst):
            if o["m"] != "hbm":
                desc = max(desc, o["ap"][0][1])
        wbytes = n * nbytes_of(dst["dt"])
        kw = {}
        if src["m"] == "hbm":
            kw["hbm_read"] = nb
        if dst["m"] == "hbm":
            kw["hbm_write"] = wbytes
        if spill == "save" or dst["m"] == "hbm" and dst["b"] in self.cand:
            kw["spill_save"] = wbytes       # an intermediate value that went through HBM
        if spill == "reload" or src["m"] == "hbm" and src["b"] in self.cand:
            kw["spill_reload"] = nb
        idx = len(self.instrs)
        # the fixed ~1.3 us (descriptors, sync, semaphore-to-start) is latency before the data moves;
        # the queue's engine moves other transfers meanwhile, so only the transfer occupies it
        i = self.emit("DMA_DIRECT2D", node, [dst], [src], {"desc": desc},
                      dur=dma_ns(self.p, max(nb, wbytes), desc) - self.p.dma_fixed_ns,
                      queue_kind="SpillReload" if spill else "IO", piece_of=idx if piece_of is None else piece_of,
                      **kw)
        self.instrs[i].latency = self.p.dma_fixed_ns
        return i

    def load(self, node: str, v: View, box: list[tuple[int, int]], pool: Pool, split: int) -> Tile:
        """DMA the ``box`` of ``v`` into a tile of ``pool``: dims before ``split`` go to partitions."""
        P = math.prod(n for _, n in box[:split])
        F = math.prod(n for _, n in box[split:])
        strides = v.meta.stride()
        bcast = [k for k in range(split, len(box)) if strides[k] == 0 and box[k][1] > 1]
        if bcast:
            # broadcast along the free axis: DMA the compact tile once, the engines read it with
            # stride 0 (an SBUF access pattern) instead of paying a descriptor per element
            cbox = [(s, 1) if k in bcast else (s, n) for k, (s, n) in enumerate(box)]
            Fc = math.prod(n for _, n in cbox[split:])
            t = pool.tile(P, Fc).as_dtype(v.dtype)
            self.dma(node, t.op(), view_operand(v, cbox))
            free, step = [], 1
            for k in reversed(range(split, len(box))):
                n = box[k][1]
                if n == 1:
                    continue
                free.append([0, n] if k in bcast else [step, n])
                if k not in bcast:
                    step *= n
            return Tile(t.key, t.mem, t.dtype, P, F, t.pitch, t.off, tuple(reversed(free)) or ((1, 1),))
        r = self.res.get(v.buf)
        if r is not None and not r.evicted:
            got = self._resident_tile(r, v, box, split)
            if got is not None:       # read in place: no instruction
                off, free = got
                return Tile(r.key, "sbuf", v.dtype, P, F, r.psize, off, None if free == [[1, F]] else tuple(map(tuple, free)))
        t = pool.tile(P, F)
        self.dma(node, t.op() if t.dtype == v.dtype else t.as_dtype(v.dtype).op(), view_operand(v, box))
        return t.as_dtype(v.dtype) if t.dtype != v.dtype else t

    def store(self, node: str, t: Tile, v: View, box: list[tuple[int, int]]) -> int:
        """Write tile ``t`` to the ``box`` of ``v``: one engine copy when ``v`` is resident in SBUF
        and the box lines up with its rows, else a DMA (SBUF->SBUF or to HBM)."""
        if v.buf in self.cand:
            self._decide(v.buf)
        r = self.res.get(v.buf)
        if r is not None and not r.evicted and t.mem == "sbuf":
            k, acc = 0, 1
            while k < len(box) and acc < t.P:
                acc *= box[k][1]
                k += 1
            got = self._resident_tile(r, v, box, k) if acc == t.P else None
            if got is not None:
                off, free = got
                dst = {"m": "sbuf", "b": r.key, "dt": v.dtype, "o": off, "ap": [[r.psize, t.P]] + free}
                # the less loaded of Scalar and Vector copies it (both read SBUF at one element per cycle)
                if self.engine_busy.get("scalar", 0.0) <= self.engine_busy.get("vector", 0.0):
                    return self.emit("ACTIVATE", node, [dst], [t.op()], {"func": "copy", "scale": 1.0, "bias": 0.0},
                                     dur=scalar_ns(self.p, t.F))
                return self.emit("TENSOR_COPY", node, [dst], [t.op()], {},
                                 dur=vector_ns(self.p, "TENSOR_COPY", t.F, 1, v.dtype))
        return self.dma(node, view_operand(v, box), t.op())

    # ---- residency (resident.py) -------------------------------------------------------------
    def _resident_tile(self, r: Resident, v: View, box, split: int):
        strides = v.meta.stride()
        o = v.meta.storage_offset() + sum(s0 * st for (s0, _), st in zip(box, strides))
        dims = [(st, n) for (_, n), st in zip(box, strides)]
        got = tile_ap(r, o, dims[:split], dims[split:])
        return None if got is None else (got[0], got[2])

    def _decide(self, buf: str) -> None:
        """At an intermediate value's first write: resident in the SBUF heap if it has room."""
        if self.cand.get(buf) != "undecided":
            return
        meta = self.hbm[buf]
        C, T = row_tiling(meta["shape"])
        rows = meta["numel"] // C
        psize = ceil_div(rows, T) * C
        start = self.heap.alloc(psize * nbytes_of(meta["dtype"]))
        if start is None:
            self.cand[buf] = "hbm"
            self.log.append(f"lower: {buf} does not fit in the SBUF heap; it goes through HBM (spill)")
            return
        self.cand[buf] = "resident"
        r = Resident(buf, f"__res.{buf}", meta["dtype"], rows, C, T, psize, start)
        end = start + ceil_div(psize * nbytes_of(meta["dtype"]), self.heap.unit) * self.heap.unit
        # writes into a reused region wait for the semaphores of the values that lived there
        self.res_wait[r.key] = {sem for (a, b, sem) in self.freed if a < end and start < b}
        self.res[buf] = r
        self.res_key[r.key] = r

    def _try_on_chip(self, op: dict) -> dict | None:
        """``op`` over SBUF when it addresses a resident value (None if it cannot), else ``op``."""
        if op["m"] != "hbm" or op["b"] not in self.res or self.res[op["b"]].evicted:
            return op
        r = self.res[op["b"]]
        t = translate(r, op["o"], [tuple(x) for x in op["ap"]])
        return None if t is None else {"m": "sbuf", "b": r.key, "dt": op["dt"], "o": t[0], "ap": t[1]}

    def _block_pieces(self, dst: dict, src: dict):
        """Split a tile <-> resident-value DMA by partition ranges so that each piece stays inside
        one row block of the value; None when the tile side or the pattern does not allow it."""
        tile, hb = (src, dst) if dst["m"] == "hbm" else (dst, src)
        if tile["m"] == "hbm" or tile["b"] in self.res_key or hb["m"] != "hbm":
            return None
        n = _numel_ap(tile["ap"])
        P = tile["ap"][0][1]
        F = n // P
        s0, n0 = hb["ap"][0]
        inner = n // n0
        out, p0 = [], 0
        while p0 < P:
            for p1 in range(P, p0, -1):
                e0, e1 = p0 * F, p1 * F
                if e0 % inner or e1 % inner:
                    continue
                h = dict(hb, o=hb["o"] + (e0 // inner) * s0, ap=[[s0, (e1 - e0) // inner]] + [list(x) for x in hb["ap"][1:]])
                if self._try_on_chip(h) is not None:
                    break
            else:
                return None
            t = dict(tile, o=tile["o"] + p0 * tile["ap"][0][0], ap=[[tile["ap"][0][0], p1 - p0]] + [list(x) for x in tile["ap"][1:]])
            out.append((h, t) if hb is dst else (t, h))
            p0 = p1
        return out

    def _on_chip(self, op: dict, node: str) -> dict:
        """A DMA operand over a resident value's HBM buffer, re-expressed over its SBUF placement
        (evicting the value when the pattern cannot be)."""
        if op["m"] != "hbm" or op["b"] not in self.res or self.res[op["b"]].evicted:
            return op
        r = self.res[op["b"]]
        t = translate(r, op["o"], [tuple(x) for x in op["ap"]])
        if t is None:
            self._evict(r, "an access pattern that does not follow its rows", node)
            return op
        return {"m": "sbuf", "b": r.key, "dt": op["dt"], "o": t[0], "ap": t[1]}

    def _raw_hbm_access(self, src: list[dict], dst: list[dict], node: str) -> None:
        """An instruction that addresses whole HBM tensors (GpSimd kernel, indirect DMA, collective):
        resident operands go back to HBM first; undecided outputs stay in HBM."""
        for o in list(src) + list(dst):
            if o["m"] != "hbm":
                continue
            r = self.res.get(o["b"])
            if r is not None and not r.evicted:
                self._evict(r, "an instruction that reads it from HBM", node)
            elif self.cand.get(o["b"]) == "undecided":
                self.cand[o["b"]] = "hbm"

    def _evict(self, r: Resident, why: str, node: str) -> None:
        """Save a resident value's rows to its HBM buffer (spill) and release its heap region."""
        r.evicted = True
        self.log.append(f"lower: {r.buf} leaves SBUF for HBM ({why}); spilled")
        es = nbytes_of(r.dtype)
        for j in range(ceil_div(r.rows, r.T)):
            rows = min(r.T, r.rows - j * r.T)
            self.dma(node, {"m": "hbm", "b": r.buf, "dt": r.dtype, "o": j * r.T * r.C, "ap": [[r.C, rows], [1, r.C]]},
                     {"m": "sbuf", "b": r.key, "dt": r.dtype, "o": j * r.C, "ap": [[r.psize, rows], [1, r.C]]},
                     spill="save")
        del es
        self._release(r, node)

    def _release(self, r: Resident, node: str) -> None:
        """Free a resident value's heap region behind a semaphore on its last readers."""
        if r.off < 0:
            return
        sem = self.emit("EVENT_SEMAPHORE", node, [], [], {"wait": r.key}, dur=dependent_overhead_ns(self.p, "sync"),
                        small=False)
        self.instrs[sem].deps = sorted(set(self.instrs[sem].deps) | set(r.readers))
        size = ceil_div(r.psize * nbytes_of(r.dtype), self.heap.unit) * self.heap.unit
        self.freed.append((r.off, r.off + size, sem))
        self.heap.free(r.off)
        r.off = -1

    def _heap_need(self) -> int:
        """Peak bytes per partition of the intermediate values live at once (in node order), as
        row-tiled resident values: what the heap needs so that none of them has to spill."""
        order = {}
        for i, n in enumerate(self.nodes):
            order[n.name] = i
        pos = {k: order.get(self.by_name[k].fused_into, v) if self.by_name[k].fused_into in order else v
               for k, v in order.items()}
        delta = [0] * (len(self.nodes) + 1)
        for n in self.nodes:
            if n.op_class == "view" or not n.outputs or self._escapes(n.name):
                continue
            cons = [pos[c] for c in self._consumers(n.name) if c in pos]
            if not cons:
                continue
            spec = n.outputs[0]
            C, T = row_tiling(spec.shape)
            size = ceil_div(ceil_div(spec.numel, C), T) * C * nbytes_of(spec.dtype)
            size = ceil_div(size, 64) * 64
            delta[pos[n.name]] += size
            delta[max(cons) + 1] -= size
        live = peak = 0
        for d in delta:
            live += d
            peak = max(peak, live)
        return peak

    def _consumers(self, name: str) -> set[str]:
        out = set()
        for u in self.users.get(name, []):
            un = self.by_name[u]
            if un.op_class == "view" or un.target == "getitem":
                out |= self._consumers(u)
            else:
                out.add(u)
        return out

    def _release_finished(self, node: str) -> None:
        for buf, r in self.res.items():
            if r.off >= 0 and not r.evicted and self._consumers(buf.split(":")[0]) <= self.finished:
                self._release(r, node)

    # ---- compute helpers -------------------------------------------------------------------
    def vec(self, opcode: str, node: str, dst: Tile, srcs: list[dict], n_inputs: int = 1, fast: bool = False,
            flops: int = 0, cost_n: int | None = None, **attrs) -> int:
        n = cost_n if cost_n is not None else dst.F
        if any(s["m"] == "psum" for s in srcs) and n_inputs == 2:
            fast = True
        d = vector_ns(self.p, opcode, n, n_inputs, dst.dtype, fast, attrs.get("op", ""))
        return self.emit(opcode, node, [dst.op()], srcs, attrs, dur=d, flops=flops)

    def act(self, node: str, dst: Tile, src: dict, func: str, bias: Any = 0.0, scale: Any = 1.0,
            acc: Tile | None = None, acc_op: str = "add", flops: int = 0, piece_of: int | None = None,
            **attrs) -> int:
        srcs = [src]
        a = {"func": func, "scale": scale, "bias": bias, **attrs}
        if isinstance(bias, dict):
            srcs.append(bias)
            a["bias"] = {"src": len(srcs) - 1}
        if isinstance(scale, dict):
            srcs.append(scale)
            a["scale"] = {"src": len(srcs) - 1}
        dsts = [dst.op()]
        if acc is not None:
            dsts.append(acc.op())
            a["acc_op"] = acc_op
        d = scalar_ns(self.p, src["ap"][-1][1] if src["ap"] else dst.F, accumulate=acc is not None)
        return self.emit("ACTIVATE", node, dsts, srcs, a, dur=d, flops=flops, piece_of=piece_of)

    def new_scratch(self, dtype: str, numel: int, shape=None) -> str:
        self.scratch_i += 1
        name = f"__spill{self.scratch_i}"
        self.hbm[name] = {"dtype": dtype, "numel": numel, "role": "scratch", "shape": list(shape or [numel])}
        return name

    # ---- values ----------------------------------------------------------------------------
    def node_of(self, name: str) -> Node:
        return self.by_name[name]

    def value(self, ref: Any) -> View:
        """The HBM view of a ``{"node": name}`` argument (resolving metadata-only views)."""
        name = ref["node"] if isinstance(ref, dict) else ref
        if name in self.values:
            return self.values[name]
        n = self.by_name[name]
        if name in self.in_part and name not in self.done and n.op_class != "view" and not self.preparing:
            # produced in this partition but not lowered yet (an epilogue operand): lower it now
            host = n.fused_into if n.fused_into in self.in_part else name
            self.lower_node(self.by_name[host])
            if name in self.values:
                return self.values[name]
        if n.target == "getitem":
            src = n.args[0]["node"]
            idx = n.args[1]
            self.value(src) if idx == 0 else None
            key = src if idx == 0 else f"{src}:{idx}"
            if key not in self.values:
                self._external(key, self.by_name[src].outputs[idx])
            self.values[name] = self.values[key]
            return self.values[name]
        if n.op_class == "view" and n.name in self.in_part and n.target.startswith("aten."):
            v = self._apply_view(n)
            if v is not None:
                self.values[name] = v
                return v
            if not self.preparing:          # not expressible as a view: materialise a copy
                from neuron_stack.compiler.lower import ops as lower_ops
                self.done.add(name)
                lower_ops.lower_copy(self, n)
                return self.values[name]
        spec = n.outputs[0] if n.outputs else TensorSpec((), "float32")
        return self._external(name, spec)

    def _external(self, name: str, spec: TensorSpec) -> View:
        role = "const" if name in self.const_names else "input"
        dtype = getattr(self, "const_dtype", {}).get(name, spec.dtype)
        strides = getattr(self, "const_strides", {}).get(name)
        meta = _meta(spec.shape, dtype)
        if strides is not None:
            meta = _torch().empty_strided(tuple(spec.shape), strides, dtype=meta.dtype, device="meta")
        self.hbm[name] = {"dtype": dtype, "numel": spec.numel, "role": role, "shape": list(spec.shape),
                          "strides": list(meta.stride())}
        if name not in self.inputs:
            self.inputs.append(name)
        v = View(name, dtype, meta)
        self.values[name] = v
        return v

    def out_view(self, name: str, spec: TensorSpec, strides: tuple | None = None) -> View:
        """A fresh HBM buffer for an op's output (contiguous unless ``strides`` is given)."""
        meta = _meta(spec.shape, spec.dtype)
        if strides is not None:
            meta = _torch().empty_strided(tuple(spec.shape), strides, dtype=meta.dtype, device="meta")
        self.hbm[name] = {"dtype": spec.dtype, "numel": spec.numel, "role": "output", "shape": list(spec.shape),
                          "strides": list(meta.stride())}
        if meta.is_contiguous() and spec.numel > 0 and not self._escapes(name.split(":")[0]):
            self.cand[name] = "undecided"     # an intermediate: may stay in SBUF (resident.py)
        v = View(name, spec.dtype, meta)
        self.values[name] = v
        return v

    def value_table(self) -> dict[str, dict]:
        """Every value of the partition as a strided view of an HBM buffer (JSON-able)."""
        out = {}
        for k, v in self.values.items():
            if v.buf in self.res and not self.res[v.buf].evicted:
                continue          # lived only in SBUF: no HBM copy to read back
            out[k] = {"buf": v.buf, "dtype": v.dtype, "shape": list(v.shape), "strides": list(v.meta.stride()),
                      "offset": int(v.meta.storage_offset())}
        return out

    def _apply_view(self, n: Node) -> View | None:
        torch = _torch()
        base: list[View] = []

        def conv(a):
            if isinstance(a, dict) and set(a) == {"node"}:
                v = self.value(a)
                base.append(v)
                return v.meta
            if isinstance(a, list):
                return [conv(x) for x in a]
            if isinstance(a, dict) and "dtype" in a:
                return getattr(torch, a["dtype"])
            if isinstance(a, dict) and "memory_format" in a:
                return getattr(torch, a["memory_format"])
            return a

        try:
            op = _aten_op(n.target)
            args = conv(n.args)
            kwargs = {k: conv(v) for k, v in n.kwargs.items()}
            out = op(*args, **kwargs)
        except Exception as e:  # not expressible as a view: materialise with a copy
            self.log.append(f"lower: {n.name} {n.target} is not a plain view ({type(e).__name__}); copied")
            return None
        if not base:
            return None
        src = base[0]
        outs = out if isinstance(out, (list, tuple)) else [out]
        first = None
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                continue
            if o.data_ptr() != src.meta.data_ptr() and not (o._is_view() or o.untyped_storage() is src.meta.untyped_storage()):
                return None
            v = src.with_meta(o)
            if i == 0:
                first = v
            else:
                self.values[f"{n.name}:{i}"] = v
        return first

    # ---- driver -----------------------------------------------------------------------------
    def run(self) -> Lowered:
        from neuron_stack.compiler.lower import ops as lower_ops
        heap = min(self._heap_need(), int(self.p.sbuf_bytes_per_partition * RESIDENT_FRACTION))
        self.heap = Heap(heap)
        self.sbuf = _Ring(self.p.sbuf_bytes_per_partition - heap)
        lower_ops.prepare_constants(self)
        for n in self.nodes:
            if n.fused_into and n.fused_into in self.in_part or n.name in self.done:
                continue
            if n.op_class == "view":
                continue            # metadata only: resolved when a consumer asks (value())
            self.lower_node(n)
        for n in self.nodes:      # views other partitions or the program read
            if n.op_class == "view" and self._escapes(n.name):
                self.value(n.name)
        outputs = []
        for n in self.nodes:
            for key in [n.name] + [f"{n.name}:{i}" for i in range(1, len(n.outputs))]:
                if key in self.hbm and self.hbm[key]["role"] == "output" and self._escapes(n.name):
                    outputs.append(key)
        return Lowered(self.instrs, self.hbm, self.inputs, outputs, self.value_table(), self.sbuf.peak + self.heap.peak,
                       self.log)

    def _escapes(self, name: str) -> bool:
        if name in self.out_refs:
            return True
        for u in self.users.get(name, []):
            un = self.by_name[u]
            if un.target == "getitem" and un.partition == self.part:
                if self._escapes(u):      # a tuple element read outside, or not at all
                    return True
                continue
            if u not in self.in_part:
                return True
            if un.op_class == "view" and self._escapes(u):
                return True
        return False

    def lower_node(self, n: Node) -> None:
        if n.name in self.done:
            return
        from neuron_stack.compiler.lower import ops as lower_ops
        self.done.add(n.name)
        members = self.fused.get(n.name, [])
        self.done.update(f.name for f in members)
        lower_ops.dispatch(n)(self, n)
        if members and members[-1].name not in self.values:
            # the host's lowering has no epilogue (e.g. a GpSimd kernel): its fused nodes run alone
            lower_ops._lower_alone(self, [f for f in members if f.name not in self.values])
        self.finished.add(n.name)
        self.finished.update(f.name for f in members)
        self._release_finished(n.name)


def _refs(value: Any):
    if isinstance(value, dict):
        if "node" in value and len(value) == 1:
            yield value["node"]
        else:
            for v in value.values():
                yield from _refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _refs(v)


def _aten_op(target: str):
    torch = _torch()
    parts = target.split(".")
    op = getattr(torch.ops.aten, parts[1])
    return getattr(op, parts[2] if len(parts) > 2 else "default")


def lower(program: Program, partition: int, profile: DeviceProfile, flags: dict | None = None) -> Lowered:
    """Lower the device nodes of ``partition`` to instructions (unscheduled).

    Example: ``lower(prog, 0, get_profile("trn1"), {"auto_cast": "matmult"}).instrs[0].opcode``.
    """
    return Lowerer(program, partition, profile, flags or {}).run()
