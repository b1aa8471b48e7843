"""The Lowerer's SBUF residency decisions (the data model is :mod:`.resident`): whether an
intermediate stays in SBUF or goes to HBM, reading and writing resident values on chip, eviction
with counted spills, and releasing a value's SBUF once its last consumer is lowered.

A mixin of :class:`neuron_stack.compiler.lower.lowerer.Lowerer`: the methods use its state
(``heap``, ``cand``, ``res``, ``res_key``, ``users``...); nothing else uses them.
"""
from __future__ import annotations

import math

from neuron_stack.compiler.lower.placement import stored_dtype
from neuron_stack.compiler.lower.resident import Resident, lane_layout, row_blocks, row_layout, tile_ap, translate
from neuron_stack.compiler.lower.tiles import View, nbytes_of, numel_ap, packet_name
from neuron_stack.compiler.partition import refs
from neuron_stack.device.cost import ceil_div, dependent_overhead_ns

#: ops that read or write NCHW values as channel rows of H x W (conv.py, convbn.py, rowwise.py's pooling means)
CHANNEL_MAJOR = ("convolution", "max_pool2d_with_indices", "avg_pool2d", "_native_batch_norm_legit_no_training",
                 "_adaptive_avg_pool2d", "adaptive_avg_pool2d")
#: ops that tile a value as their neighbours do: a feature map stays one through them (ReLU, residual add)
_FOLLOWERS = ("elementwise", "activation", "data_movement", "view")

#: elementwise ops lowered as one custom kernel over whole tensors, not tile by tile (chain._NOT_TILEWISE)
NOT_TILEWISE = ("triu", "tril", "glu", "mse_loss", "mse_loss_backward", "fill", "logit")


def _lane_writer(n) -> bool:
    """``n`` writes its output in the lane layout: an elementwise pass (chain.lane_tiled), a cast
    (data._dma_view), a 2-D matmul, whose PSUM evacuation stores each bank of rows to the layout with
    one DMA of ``H / 128``-element runs (a batched matmul's outputs, attention scores, stay row-tiled), or an
    RMSNorm over the last dim (rowwise._lane_rms_norm)."""
    name = packet_name(n.target)
    if name == "rms_norm":
        return len(n.args[1]) == 1
    if n.op_class in ("elementwise", "activation"):
        return name not in NOT_TILEWISE
    if n.op_class == "matmul":
        return name in ("mm", "addmm")
    return name == "_to_copy" and bool(n.inputs) and n.inputs[0].dtype != n.outputs[0].dtype


def _lane_reader(n) -> bool:
    """``n`` reads a value kept in the lane layout in place: a lane writer (an RMSNorm among them), a last-dim
    sum or mean (rowwise._lane_sum) or a matmul's stationary operand (matmul.lane_operand)."""
    return _lane_writer(n) or n.op_class == "matmul" or packet_name(n.target) in ("sum", "mean")


class Residency:
    def layout_of(self, buf: str, shape) -> tuple[int, int, int]:
        """``(C, T, D)`` of ``buf``'s resident layout: the lane layout (:func:`.resident.lane_layout`) when
        :meth:`lanes_for` says so, else row-tiled."""
        if self.lanes_for(buf, shape):
            return (*lane_layout(shape), 0)
        return self.row_layout(buf, shape)

    def lanes_for(self, buf: str, shape) -> bool:
        """True when the value ``buf`` of ``shape`` lives in the lane layout: its rows are few and long, a lane
        writer produces it (:func:`_lane_writer`) and most of its consumers work in that layout (elementwise
        passes, casts, last-dim sums, a matmul's x^T)."""
        n = self.by_name.get(buf.split(":")[0])
        if n is None or ":" in buf or lane_layout(shape) is None:
            return False
        host = self.by_name.get(n.fused_into, n) if n.fused_into else n
        if not _lane_writer(host):
            return False
        cons = [self.by_name[c] for c in self._consumers(buf)]
        return 2 * sum(_lane_reader(c) for c in cons) >= len(cons)

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
        C, T, D = self.layout_of(buf, meta["shape"])
        rows = meta["numel"] // C
        psize = row_blocks(rows, T, D) * C
        start = self.heap.alloc(psize * nbytes_of(meta["dtype"]))
        if start is None:
            self.cand[buf] = "hbm"
            self.log.append(f"lower: {buf} does not fit in the SBUF heap; it goes through HBM (spill)")
            return
        self.cand[buf] = "resident"
        r = Resident(buf, f"__res.{buf}", meta["dtype"], rows, C, T, psize, start, D=D)
        end = start + ceil_div(psize * nbytes_of(meta["dtype"]), self.heap.unit) * self.heap.unit
        # writes into a reused region wait for the semaphores of the values that lived there
        self.res_wait[r.key] = {sem for (a, b, sem) in self.freed if a < end and start < b}
        self.res[buf] = r
        self.res_key[r.key] = r
        self.allocs.append(("heap", r.key, start, end - start, len(self.instrs), T))

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
        n = numel_ap(tile["ap"])
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
                h = dict(hb, o=hb["o"] + (e0 // inner) * s0,
                         ap=[[s0, (e1 - e0) // inner]] + [list(x) for x in hb["ap"][1:]])
                if self._try_on_chip(h) is not None:
                    break
            else:
                return None
            t = dict(tile, o=tile["o"] + p0 * tile["ap"][0][0],
                     ap=[[tile["ap"][0][0], p1 - p0]] + [list(x) for x in tile["ap"][1:]])
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

    def _on_chip_parts(self, op: dict, node: str) -> tuple[dict, int]:
        """``_on_chip(op)`` and the number of SBUF partitions it spans (0 for HBM): a resident
        value's pattern may stay inside one partition (DMA descriptors count partitions, not rows)."""
        if op["m"] == "hbm" and op["b"] in self.res and not self.res[op["b"]].evicted:
            r = self.res[op["b"]]
            t = translate(r, op["o"], [tuple(x) for x in op["ap"]])
            if t is not None:
                parts = math.prod(n for (_, n), k in zip(t[1], t[2]) if k == "p")
                return {"m": "sbuf", "b": r.key, "dt": op["dt"], "o": t[0], "ap": t[1]}, parts
        op = self._on_chip(op, node)
        return op, (0 if op["m"] == "hbm" else op["ap"][0][1])

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
        for row0, rows, j in r.blocks():
            self.dma(node, {"m": "hbm", "b": r.buf, "dt": r.dtype, "o": row0 * r.C, "ap": [[r.C, rows], [1, r.C]]},
                     {"m": "sbuf", "b": r.key, "dt": r.dtype, "o": j * r.C, "ap": [[r.psize, rows], [1, r.C]]},
                     spill="save")
        self._release(r, node)

    def _release(self, r: Resident, node: str) -> None:
        """Free a resident value's heap region behind a semaphore on its last readers."""
        if r.off < 0:
            return
        sem = self.emit("EVENT_SEMAPHORE", node, [], [], {"wait": r.key}, dur=dependent_overhead_ns(self.p, "sync"),
                        small=False, after=r.readers)
        size = ceil_div(r.psize * nbytes_of(r.dtype), self.heap.unit) * self.heap.unit
        self.freed.append((r.off, r.off + size, sem))
        self.heap.free(r.off)
        r.off = -1

    def _heap_size(self, cap: int) -> int:
        """Bytes per partition for the heap, at most ``cap``: room for every intermediate when they all fit (a
        first-fit heap that size never turns one away: its top grows only by a value placed there; sized by
        the peak of values live at once in node order, it fell short of the lowering's real peak by up to
        1.6x, and a one-layer decoder spilled with SBUF nearly empty); else that peak, the rest of SBUF
        left to the tile ring that streams weights (a decode step at a 4096-token cache slows by 6% when
        the ring gives way to a heap of ``cap``)."""
        sizes, order = {}, {n.name: i for i, n in enumerate(self.nodes)}
        pos = {k: order.get(self.by_name[k].fused_into, v) if self.by_name[k].fused_into in order else v
               for k, v in order.items()}
        delta = [0] * (len(self.nodes) + 1)
        for n in self.nodes:
            cons = [pos[c] for c in self._consumers(n.name) if c in pos]
            if n.op_class == "view" or not n.outputs or self._escapes(n.name) or not cons:
                continue
            for i, spec in enumerate(n.outputs):
                name = n.name if i == 0 else f"{n.name}:{i}"
                C, T, D = self.layout_of(name, spec.shape)
                size = row_blocks(ceil_div(spec.numel, C), T, D) * C * nbytes_of(stored_dtype(self, name, spec.dtype))
                sizes[name] = size = ceil_div(size, 64) * 64
                delta[pos[n.name]] += size
                delta[max(cons) + 1] -= size
        if sum(sizes.values()) <= cap:
            return sum(sizes.values())
        live = peak = 0
        for d in delta:
            live += d
            peak = max(peak, live)
        return min(peak, cap)

    def row_layout(self, buf: str, shape) -> tuple[int, int, int]:
        """:func:`.resident.row_layout` of value ``buf`` as its consumers read it: channel rows when it is a
        feature map; a flattened [batch x 197, hidden] value (a Linear's output) that they view as [batch, 197,
        hidden] (the residual add after it) is grouped in 197-row groups, so their 197-row tiles line up with
        its blocks instead of straddling them (SBUF->SBUF DMAs at every batch boundary); a head-major value of
        fewer than 128 tokens keeps one head a block."""
        name = buf.split(":")[0]
        C, T, D = row_layout(shape, feature_map=name in self._feature_maps())
        if len(shape) == 4 and 1 < shape[2] < T and shape[1] > 1 and C == shape[3] and self._reads_token_major(name):
            # a head-major [batch, heads, tokens < 128, d] value (a prompt's rotary q/k): one head's tokens a
            # block, on the partitions its token-major source [tokens, heads x d] holds them, not two heads
            # packed in 128 rows (each read of the source then a DMA across partitions)
            return C, shape[2], 0
        if not D and len(shape) == 2 and name == buf:
            for u in self.users.get(name, []):
                n = self.by_name[u]
                if n.op_class == "view" and n.outputs:
                    grouped = row_layout(n.outputs[0].shape)
                    if grouped[2] and grouped[0] == C:
                        return grouped
        return C, T, D

    def _reads_token_major(self, name: str) -> bool:
        """True when node ``name`` (or the op it is fused into) reads a token-major ``[batch, tokens, heads, d]``
        value as ``[batch, heads, tokens, d]`` (a transpose of dims 1 and 2 among the views of an argument)."""
        n = self.by_name.get(name)
        for m in (n, self.by_name.get(n.fused_into) if n is not None and n.fused_into else None):
            for a in refs(m.args) if m is not None else ():
                v = self.by_name.get(a)
                while v is not None and v.op_class == "view":
                    t = packet_name(v.target)
                    if len(v.outputs[0].shape) != 4 if v.outputs else True:
                        break
                    if t == "transpose" and sorted(d % 4 for d in v.args[1:3]) == [1, 2] \
                            or t == "permute" and [d % 4 for d in v.args[1]] == [0, 2, 1, 3]:
                        return True
                    v = self.by_name.get(next(iter(refs(v.args[:1])), None))
        return False

    def _feature_maps(self) -> set[str]:
        """The 4-d values the convolutional ops read or write as channel rows, and those joined to them
        through element-wise ops and copies (a ReLU between two convolutions, a residual add): their
        row layout follows these consumers. A transformer's [batch, heads, S, D] values are not among them."""
        if "_fmaps" in self.__dict__:
            return self._fmaps

        def fmap(name):
            n = self.by_name.get(name)
            return n is not None and bool(n.outputs) and len(n.outputs[0].shape) == 4

        todo = []
        for n in self.by_name.values():
            if packet_name(n.target) in CHANNEL_MAJOR:
                todo += [n.name] + list(refs([n.args, n.kwargs]))
        seen: set[str] = set()
        while todo:
            name = todo.pop()
            if name in seen or not fmap(name):
                continue
            seen.add(name)
            n = self.by_name[name]
            if n.op_class in _FOLLOWERS:
                todo += refs([n.args, n.kwargs])
            todo += [u for u in self.users.get(name, []) if self.by_name[u].op_class in _FOLLOWERS]
        self._fmaps = seen
        return seen

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
