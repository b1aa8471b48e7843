"""The Lowerer's SBUF residency decisions (the data model is :mod:`.resident`): whether an
intermediate stays in SBUF or goes to HBM, reading and writing resident values on chip, eviction
with counted spills, and releasing a value's SBUF once its last consumer is lowered.

A mixin of :class:`neuron_stack.compiler.lower.lowerer.Lowerer`: the methods use its state
(``heap``, ``cand``, ``res``, ``res_key``, ``users``...); nothing else uses them.
"""
from __future__ import annotations

import math

from neuron_stack.compiler.lower.placement import stored_dtype
from neuron_stack.compiler.lower.resident import Resident, row_blocks, row_layout, tile_ap, translate
from neuron_stack.compiler.lower.tiles import View, nbytes_of, numel_ap
from neuron_stack.device.cost import ceil_div, dependent_overhead_ns


class Residency:
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
        C, T, D = row_layout(meta["shape"])
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
            C, T, D = row_layout(spec.shape)
            size = row_blocks(ceil_div(spec.numel, C), T, D) * C * nbytes_of(stored_dtype(self, n.name, spec.dtype))
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
