"""The :class:`Lowerer`: the state of lowering one partition (instruction list, dependency tracking,
the SBUF ring and resident heap, PSUM banks, HBM buffers and views) and the driver loop that lowers
each node through the registry (:mod:`neuron_stack.compiler.lower.registry`).

Use :func:`neuron_stack.compiler.lower.lower`.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from neuron_stack.compiler.lower import registry
from neuron_stack.compiler.lower.placement import cast_for_store, const_broadcast, eager_copies, stored_dtype
from neuron_stack.compiler.lower.residency import Residency
from neuron_stack.compiler.lower.resident import Heap, Resident
from neuron_stack.compiler.lower.tiles import (
    Instrs,
    Lowered,
    Pool,
    Ring,
    Tile,
    View,
    aten_op,
    contiguous_run,
    meta_tensor,
    nbytes_of,
    numel_ap,
    split_dma,
    view_operand,
)
from neuron_stack.compiler.partition import refs
from neuron_stack.device.cost import dependent_overhead_ns, dma_min_piece_bytes, dma_ns, scalar_ns, vector_ns
from neuron_stack.device.profiles import DeviceProfile
from neuron_stack.ir import Node, Program, TensorSpec
from neuron_stack.isa.instructions import ENGINE_OF

#: share of SBUF (per partition) kept for values resident across ops; the rest holds tile pools
RESIDENT_FRACTION = 0.6


#: weight dtypes a matmul dequantizes on the fly (NxDI ``quantization_dtype``: int8; fp8 on trn2)
QUANTIZED_DTYPES = ("int8", "float8_e4m3fn", "float8_e5m2")


def ktiled_fill_ap(shape, dk: int, nk: int) -> list[list[int]]:
    """Where the elements of a K-tiled weight go, in its logical order: a 2-D weight whose dim ``dk`` (K,
    ``nk`` x 128) is the matmul's contraction is stored [128 partitions, nk K-tiles, N], so the K-tiles one
    partition holds are contiguous (``constants.prepare_constants``).

    >>> ktiled_fill_ap((4, 256), 1, 2)      # W [N=4, K=256]: W[n, k] at (k % 128) * 2 * 4 + (k // 128) * 4 + n
    [[1, 4], [4, 2], [8, 128]]
    """
    N = shape[1 - dk]
    k_dims, n_dim = [[N, nk], [nk * N, 128]], [[1, N]]
    return k_dims + n_dim if dk == 0 else n_dim + k_dims


class Lowerer(Residency):
    """Lowers one partition. Use :func:`lower`."""

    def __init__(self, program: Program, partition: int, profile: DeviceProfile, flags: dict, detail: bool = True):
        self.prog, self.part, self.p, self.flags = program, partition, profile, flags or {}
        self.auto_cast = self.flags.get("auto_cast", "none") or "none"
        self.cast_type = {"bf16": "bfloat16", "fp16": "float16"}.get(self.flags.get("auto_cast_type", "bf16"),
                                                                     "bfloat16")
        self.by_name = {n.name: n for n in program.nodes}
        self.instrs = Instrs(detail)         # detail=False: no operands kept (timings only)
        self.last_writer: dict[str, int] = {}
        self.readers: dict[str, dict] = {}
        self.pending: dict[str, set[int]] = {}
        self.engine_last: dict[str, int] = {}
        # SBUF: a ring of rotating tile pools, and a heap of values resident across ops (resident.py)
        # (sized in run(): every intermediate when they fit in RESIDENT_FRACTION of SBUF, see _heap_size)
        self.sbuf = Ring(profile.logical_sbuf_bytes_per_partition)
        self.heap = Heap(0)
        self.cand: dict[str, str] = {}           # intermediate buffer -> "undecided" | "hbm" | "resident"
        self.res: dict[str, Resident] = {}        # resident buffer -> its placement
        self.res_key: dict[str, Resident] = {}    # SBUF key -> the same
        self.res_wait: dict[str, set[int]] = {}   # SBUF key -> semaphores its writes wait for (region reuse)
        self.freed: list[tuple[int, int, int]] = []   # heap regions released: (start, end, semaphore)
        self.finished: set[str] = set()
        # every on-chip allocation: (memory, key, address, bytes per partition, first instruction, partitions or 0)
        self.allocs: list[tuple] = []
        self.engine_busy: dict[str, float] = {}
        self.psum = Ring(profile.psum_bytes_per_partition, unit=profile.psum_bytes_per_partition // profile.psum_banks)
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
            for r in refs([n.args, n.kwargs]):
                self.users.setdefault(r, []).append(n.name)
        self.out_refs = set(refs(program.output_names))
        self.fused: dict[str, list[Node]] = {}
        for n in self.nodes:
            if n.fused_into and n.fused_into in self.in_part:
                self.fused.setdefault(n.fused_into, []).append(n)
        self.scratch_i = 0
        # hoisted broadcast weights and cast staging pools (placement.const_broadcast, cast_for_store)
        self.bcast_tiles: dict = {}
        self.bcast_count = 0
        self.cast_pools: dict = {}
        self.done: set[str] = set()
        self.preparing = False
        # filled by the op lowerings: identity tiles for transposes (dtype -> tile) and tile
        # pools reused across a node's tiles (key -> pools); weight layouts (constants.py)
        self.identity_tiles: dict = {}
        self.pool_cache: dict = {}
        self.const_strides: dict[str, tuple] = {}
        self.const_dtype: dict[str, str] = {}
        self.const_ktiled: dict[str, tuple[int, int]] = {}    # weight -> (its contraction dim, K / 128)

    # ---- buffers and dependency tracking -------------------------------------------------
    def claim(self, mem: str, nbytes: int, key: str) -> None:
        ring = self.sbuf if mem == "sbuf" else self.psum
        deps = set()
        for old in ring.alloc(nbytes, key):
            if old.startswith("__identity_"):       # overwritten: the next transpose rebuilds it
                ids = self.identity_tiles
                for dt in [d for d, t in ids.items() if t.tile.key == old]:
                    del ids[dt]
            if old.startswith("__bcast"):            # a hoisted broadcast weight: reloaded on next use
                for k in [k for k, t in self.bcast_tiles.items() if t.key == old]:
                    del self.bcast_tiles[k]
            w = self.last_writer.get(old)
            if w is not None:
                deps.update(w) if isinstance(w, tuple) else deps.add(w)
            deps.update(self.readers.get(old, {}).values())
            deps.update(self.pending.pop(old, ()))
        self.pending[key] = deps
        # recorded for the Memory Viewer (SbufAllocation): the region is the ring's last [cursor - size, cursor)
        size = -(-max(nbytes, 1) // ring.unit) * ring.unit
        self.allocs.append((mem, key, ring.cursor - size, size, len(self.instrs), 0))
        self.last_writer.pop(key, None)
        self.readers.pop(key, None)

    def emit(self, opcode: str, node: str, dst: list[dict], src: list[dict], attrs: dict | None = None,
             dur: float = 0.0, flops: int = 0, queue_kind: str = "IO", itype: str = "",
             hbm_read: int = 0, hbm_write: int = 0, spill_save: int = 0, spill_reload: int = 0,
             small: bool = True, piece_of: int | None = None, latency: float = 0.0, after=(),
             rw: tuple[int, int] | None = None) -> int:
        """Append one instruction reading ``src`` and writing ``dst`` (operand dicts), with its
        dependencies from the buffers it touches, plus ``after`` (instructions it also waits for);
        ``latency``: a DMA's trigger-to-start time (see :meth:`_dma1`); ``rw``: the bytes read and
        written, if the caller knows them. Returns its index."""
        engine = ENGINE_OF[opcode]
        deps: set[int] = set(after)
        tdeps: list[str] = []
        writes = []
        if rw is None:
            br = sum(numel_ap(o["ap"]) * nbytes_of(o["dt"]) for o in src)
            bw = sum(numel_ap(o["ap"]) * nbytes_of(o["dt"]) for o in dst)
        else:
            br, bw = rw
        if opcode != "DMA_DIRECT2D":
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
        if self.instrs.detail:
            ops = {"dst": dst, "src": src}
            if attrs:
                ops.update(attrs)
        else:       # timings only: of the operands the scheduler needs only a MATMUL's PSUM bank and stop
            ops = None
        self.instrs.add(engine, opcode, node, dur, sorted(deps), tdeps, ops, flops, br, bw, writes,
                        queue_kind if engine == "dma" else "", itype, hbm_read, hbm_write, spill_save, spill_reload,
                        latency, acc=dst[0]["b"] if opcode == "MATMUL" and dst else None,
                        stop=attrs.get("stop", True) if attrs else True)
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
        """DMA_DIRECT2D ``src`` -> ``dst`` (access patterns with equal element counts). A big SBUF <-> HBM
        transfer is cut into 8-partition groups over several queues, as the hardware spreads one transfer
        over the core's DMA engines (``cost.dma_min_piece_bytes``), every physical core's at LNC > 1."""
        pieces = split_dma(dst, src, self.p.dma_queues, dma_min_piece_bytes(self.p))
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
        (src, ps), (dst, pd) = self._on_chip_parts(src, node), self._on_chip_parts(dst, node)
        n = numel_ap(src["ap"])
        assert n == numel_ap(dst["ap"]), (src, dst)
        nb = n * nbytes_of(src["dt"])
        run = math.gcd(contiguous_run(src["ap"]), contiguous_run(dst["ap"]))
        # SBUF/PSUM partitions are separate address ranges: at least one descriptor per partition
        # (the partitions an operand spans: a resident value's pattern may stay inside one)
        desc = max(n // max(1, run), ps, pd)
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
        moved = max(nb, wbytes)
        if src["m"] == "hbm" and dst["m"] != "hbm" and wbytes > nb:
            # a casting load (a quantized weight, lower/quantized.py): its stored bytes come from HBM at the
            # calibrated rate, the wider ones go into SBUF at no more than the engine's theoretical rate
            moved = max(nb, wbytes * self.p.dma_bytes_per_ns_per_engine / self.p.dma_engine_peak_bytes_per_ns)
        # the fixed ~1.3 us (descriptors, sync, semaphore-to-start) is latency before the data moves;
        # the queue's engine moves other transfers meanwhile, so only the transfer occupies it
        return self.emit("DMA_DIRECT2D", node, [dst], [src], {"desc": desc},
                         dur=dma_ns(self.p, moved, desc) - self.p.dma_fixed_ns,
                         queue_kind="SpillReload" if spill else "IO", piece_of=idx if piece_of is None else piece_of,
                         latency=self.p.dma_fixed_ns, rw=(nb, wbytes), **kw)

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
        if self.hbm.get(v.buf, {}).get("role") == "const" and P > 1 and all(
                strides[k] == 0 or n == 1 for k, (_, n) in enumerate(box[:split])):
            return const_broadcast(self, node, v, box, split, P, F)
        r = self.res.get(v.buf)
        if r is not None and not r.evicted:
            got = self._resident_tile(r, v, box, split)
            if got is not None:       # read in place: no instruction
                off, free = got
                return Tile(r.key, "sbuf", v.dtype, P, F, r.psize, off,
                            None if free == [[1, F]] else tuple(map(tuple, free)))
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
        if t.dtype != v.dtype and t.mem == "sbuf":
            t = cast_for_store(self, node, t, v.dtype)
        return self.dma(node, view_operand(v, box), t.op())

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

    def cast_copy(self, node: str, dst: Tile, src: Tile) -> int:
        """A dtype-converting copy (a quantized weight's K-tile on its way to the Tensor Engine) on whichever
        of ScalarE (``activation`` copy) and VectorE (``tensor_copy``) frees up first: both convert as they
        copy (reference §5.3), so the compiler spreads the casts over the two instead of queueing them all on
        one engine, which would then bound a decode step that reads half the weight bytes."""
        on_scalar = self.engine_busy.get("scalar", 0.0) + scalar_ns(self.p, src.F)
        on_vector = self.engine_busy.get("vector", 0.0) + vector_ns(self.p, "TENSOR_COPY", src.F, 1, dst.dtype)
        if on_scalar <= on_vector:
            return self.act(node, dst, src.op(), "copy")
        return self.vec("TENSOR_COPY", node, dst, [src.op()])

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
        quantized = self.folded_dequant(n)
        if quantized is not None:
            self.values[name] = self.value(quantized)
            return self.values[name]
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
                self.done.add(name)
                registry.named("copy").fn(self, n)
                return self.values[name]
        spec = n.outputs[0] if n.outputs else TensorSpec((), "float32")
        return self._external(name, spec)

    def _external(self, name: str, spec: TensorSpec) -> View:
        role = "const" if name in self.const_names else "input"
        dtype = getattr(self, "const_dtype", {}).get(name, spec.dtype)
        strides = getattr(self, "const_strides", {}).get(name)
        meta = meta_tensor(spec.shape, dtype)
        if strides is not None:
            meta = torch.empty_strided(tuple(spec.shape), strides, dtype=meta.dtype, device="meta")
        self.hbm[name] = {"dtype": dtype, "numel": spec.numel, "role": role, "shape": list(spec.shape),
                          "strides": list(meta.stride())}
        kt = getattr(self, "const_ktiled", {}).get(name)
        if kt is not None:
            self.hbm[name]["fill_ap"] = ktiled_fill_ap(spec.shape, *kt)
        if name not in self.inputs:
            self.inputs.append(name)
        v = View(name, dtype, meta)
        self.values[name] = v
        return v

    def out_view(self, name: str, spec: TensorSpec, strides: tuple | None = None) -> View:
        """A fresh HBM buffer for an op's output (contiguous unless ``strides`` is given); with
        ``--auto-cast`` a value only matmuls read is stored in the cast type (placement.stored_dtype)."""
        spec = TensorSpec(spec.shape, stored_dtype(self, name, spec.dtype))
        meta = meta_tensor(spec.shape, spec.dtype)
        if strides is not None:
            meta = torch.empty_strided(tuple(spec.shape), strides, dtype=meta.dtype, device="meta")
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
            op = aten_op(n.target)
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
            if o.data_ptr() != src.meta.data_ptr() and not (o._is_view()
                                                            or o.untyped_storage() is src.meta.untyped_storage()):
                return None
            v = src.with_meta(o)
            if i == 0:
                first = v
            else:
                self.values[f"{n.name}:{i}"] = v
        return first

    # ---- driver -----------------------------------------------------------------------------
    def run(self) -> Lowered:
        heap = self._heap_size(int(self.p.logical_sbuf_bytes_per_partition * RESIDENT_FRACTION))
        self.heap = Heap(heap)
        self.sbuf = Ring(self.p.logical_sbuf_bytes_per_partition - heap)
        for prepare in registry.PREPARE_PASSES:     # weight layouts, before any node (constants.py)
            prepare(self)
        for n in self.nodes:
            if n.fused_into and n.fused_into in self.in_part or n.name in self.done:
                continue
            if n.op_class == "view":
                continue            # metadata only: resolved when a consumer asks (value())
            self.lower_node(n)
            eager_copies(self)
        for n in self.nodes:      # views other partitions or the program read
            if n.op_class == "view" and self._escapes(n.name):
                self.value(n.name)
        outputs = []
        for n in self.nodes:
            for key in [n.name] + [f"{n.name}:{i}" for i in range(1, len(n.outputs))]:
                if key in self.hbm and self.hbm[key]["role"] == "output" and self._escapes(n.name):
                    outputs.append(key)
        # the resident heap sits above the tile ring in each partition's address range
        allocs = [a if a[0] != "heap" else ("sbuf", a[1], self.sbuf.cap + a[2], *a[3:]) for a in self.allocs]
        return Lowered(self.instrs, self.hbm, self.inputs, outputs, self.value_table(), self.sbuf.peak + self.heap.peak,
                       self.log, allocs)

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

    def folded_dequant(self, n: Node) -> str | None:
        """The quantized weight (an int8/fp8 constant) that ``n`` converts, when only matmuls read the
        conversion: they load the weight as stored (half the bytes of bf16), cast by its DMA on its way to
        the Tensor Engine (weight-only quantization, NxDI's ``quantized``; lower/quantized.py)."""
        if n.target != "aten._to_copy.default" or not n.args or not isinstance(n.args[0], dict):
            return None
        src = n.args[0].get("node")
        if src not in self.const_names or self.by_name[src].outputs[0].dtype not in QUANTIZED_DTYPES:
            return None
        return src if self._only_matmuls_read(n.name) else None

    def _only_matmuls_read(self, name: str) -> bool:
        users = self.users.get(name, [])
        return bool(users) and all(
            self.by_name[u].op_class == "matmul"
            or self.by_name[u].op_class == "view" and self._only_matmuls_read(u) for u in users)

    def lower_node(self, n: Node) -> None:
        if n.name in self.done:
            return
        self.done.add(n.name)
        if self.folded_dequant(n) is not None:
            return              # its matmuls read the quantized weight themselves
        members = self.fused.get(n.name, [])
        self.done.update(f.name for f in members)
        registry.lookup(n.target, n.op_class).fn(self, n)
        if members and members[-1].name not in self.values:
            # the host's lowering has no epilogue (e.g. a GpSimd kernel): its fused nodes run alone
            registry.lower_alone(self, [f for f in members if f.name not in self.values])
        self.finished.add(n.name)
        self.finished.update(f.name for f in members)
        self._release_finished(n.name)
