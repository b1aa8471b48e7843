"""The NKI tracer: on-chip allocation, tile rules and instruction recording (the tensors are
:mod:`neuron_stack.nki.tensor`).

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
import linecache
import math
import os
import weakref

from neuron_stack.compiler.lower.tiles import Instr
from neuron_stack.device.cost import dependent_overhead_ns
from neuron_stack.isa.instructions import ENGINE_OF
from neuron_stack.nki.alloc import AllocationError, Allocator, place_by_liveness

from .tensor import (  # noqa: F401  (re-exported: the NKI modules import these from core)
    DTYPE_BYTES,
    FLOATS,
    GEMM_MOVING_FMAX,
    GEMM_STATIONARY_FMAX,
    MAX_INSTRUCTIONS,
    PMAX,
    PSUM_BANK_BYTES,
    PSUM_FMAX,
    SBUF_ALIGN,
    TENSOR_OPS,
    Buffer,
    NKIError,
    NKIUnsupported,
    _frame,
    _inside,
    _last_accesses,
    _local,
    _overlap,
    current,
    dtype_name,
    ndarray,
    par_dim,
    unsupported,
    where,
)

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
        self.loops: list[tuple] = []            # the enclosing nl loops: (variable, value, file, line), outermost first
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
        for v in dsts:
            if v.lanes != 1:
                raise self.error(f"writing through a {v.buf.dtype} tile viewed as {v.dtype} is not simulated; write "
                                 f"the tile in its own dtype (a bitcast view is read-only here)")
        for v in (*dsts, *srcs):
            if getattr(v, "_gather", None) is not None:
                raise self.error("HBM rows chosen by a tile of row numbers are read by nl.load / nisa.dma_copy only "
                                 "(a gather); writing them (a scatter, an atomic update) is not simulated")
            if getattr(v, "_dyn", None) is not None and opcode not in ("TENSOR_COPY_DYNAMIC", "DMA_DIRECT2D"):
                raise self.error("a view at an offset read from SBUF (t[i, idx[0, j] + k]) is accessed only by "
                                 "nisa.tensor_copy_dynamic_src/dst and DMAs (nl.load, nl.store, nisa.dma_copy)")
            for j, lim, msg in v._limits:
                if v.shape[j] > lim:
                    raise self.error(f"{msg}: mask the ragged tile (or slice within the tensor)")
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
        if self.loops:   # the loop variables' values at this instruction (KernelIterationVariables)
            ops["nki_iv"] = [list(x) for x in self.loops]
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
        if (b.mem == "hbm" or b.reads or [i for i, _ in b.writes] != [last[0]] or len(ins.operands["dst"]) > 1
                or getattr(dst, "_dyn", None) is not None
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
                        ins, deps=deps, operands={**ins.operands, "dst": [d, *ins.operands["dst"][1:]],
                                                  "src": [s_, *ins.operands["src"][1:]], "desc": desc},
                        dur=dma_ns(self.p, nb, desc) - self.p.dma_fixed_ns, bytes_read=round(ins.bytes_read * frac),
                        bytes_written=round(ins.bytes_written * frac), hbm_read=round(ins.hbm_read * frac),
                        hbm_write=round(ins.hbm_write * frac))
                    out.append(piece)
            last.append(len(out))
        first.append(len(out))
        self.inits = [(first[i], o, f) for i, o, f in self.inits]
        self.prints = [(first[i], *rest) for i, *rest in self.prints]
        self.instrs = out

    def dma(self, dst: ndarray, src: ndarray, attrs: dict | None = None, srcs: list = (), dsts: list = ()) -> int:
        """DMA_DIRECT2D ``src`` -> ``dst`` (same element count, element order); ``srcs`` / ``dsts``: further
        operands (a dynamic offset's index tile and the tensor it moves in)."""
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
        return self.emit("DMA_DIRECT2D", [dst, *dsts], [src, *srcs], {"desc": desc, **(attrs or {})},
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
