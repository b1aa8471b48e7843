"""On-chip allocation of a traced NKI kernel: a ring allocator per memory (SBUF, PSUM) and the placement
of tiles by liveness after tracing, as the compiler's allocator does.
"""
from __future__ import annotations


class AllocationError(Exception):
    """Live tiles that do not fit; the message names the line allocating the one that overflows."""


class Allocator:
    """A ring over one on-chip memory (bytes per partition). Live tiles may not overlap; a freed
    tile's accesses are inherited by the next tile placed over its bytes (write-after-read)."""

    def __init__(self, mem: str, capacity: int, align: int):
        self.mem, self.capacity, self.align = mem, capacity, align
        self.live: dict = {}                           # key -> (addr, size)
        self.ghosts: list[tuple[int, int, set]] = []   # freed (addr, size, instrs that touched it)
        self.cursor = 0
        self.peak = 0

    def _fits(self, a: int, size: int, avoid) -> bool:
        return a + size <= self.capacity and all(a + size <= b or b + n <= a for b, n in avoid)

    def place(self, size: int, reserved=()) -> int:
        """A free address for ``size`` bytes (-1: none), avoiding the live tiles and ``reserved`` ranges."""
        size = -(-size // self.align) * self.align
        if size > self.capacity:
            return -1
        avoid = [*self.live.values(), *reserved]
        starts = sorted({self.cursor, 0} | {b + n for b, n in avoid})
        for a in [s for s in starts if s >= self.cursor] + [s for s in starts if s < self.cursor]:
            if self._fits(a, size, avoid):
                self.cursor = a + size if a + size < self.capacity else 0
                return a
        return -1

    def used(self) -> int:
        return sum(n for _, n in self.live.values())

    def take(self, key, addr: int, size: int) -> set:
        size = -(-size // self.align) * self.align
        self.live[key] = (addr, size)
        self.peak = max(self.peak, self.used())
        inherited: set = set()
        keep = []
        for g in self.ghosts:
            g0, g1, touched = g
            if g0 < addr + size and addr < g0 + g1:
                inherited |= touched
                # the new tile's accesses carry the constraint on for its bytes; keep the rest
                if g0 < addr:
                    keep.append((g0, addr - g0, touched))
                if addr + size < g0 + g1:
                    keep.append((addr + size, g0 + g1 - addr - size, touched))
            else:
                keep.append(g)
        self.ghosts = keep
        return inherited

    def free(self, key, touched: set) -> None:
        addr, size = self.live.pop(key, (0, 0))
        if size and touched:
            self.ghosts.append((addr, size, touched))


def _block_of(op: dict, pitch: int, blk: int) -> int:
    """The block of a block-layout tile that operand ``op`` lies in (-1: it spans several)."""
    p0, f0 = divmod(op["o"], pitch)
    f1 = f0 + sum((n - 1) * (s % pitch) for s, n in op["ap"] if s > 0)
    return f0 // blk if f0 // blk == f1 // blk else -1


def _rebase(op: dict, name: str, pitch: int, blk: int, k: int) -> None:
    """Point operand ``op`` of block ``k`` at that block's own placement (partition pitch ``blk``)."""
    p0, f0 = divmod(op["o"], pitch)
    op["b"], op["o"] = name, p0 * blk + f0 - k * blk
    op["ap"] = [[s // pitch * blk if s % pitch == 0 and s else s, n] for s, n in op["ap"]]


def split_blocks(trace) -> None:
    """Make each block of a block-layout PSUM tile (``nl.ndarray((n, nl.par_dim(128), 512), buffer=nl.psum)``)
    a tile of its own, live from its first to its last use, as the compiler allocates them: the legacy
    attention kernels declare more blocks than PSUM holds and use a few at a time. A tile some instruction
    reads across blocks, or placed by hand, stays whole."""
    ops: dict[str, list] = {}
    for i, ins in enumerate(trace.instrs):
        for o in (*ins.operands["dst"], *ins.operands["src"]):
            if trace.tiles.get(o["b"], {}).get("block"):
                ops.setdefault(o["b"], []).append((i, o))
    for n, uses in ops.items():
        t = trace.tiles[n]
        pitch, blk = t["pitch"], t["block"]
        blocks = [_block_of(o, pitch, blk) for _, o in uses]
        if t["address"] is not None or -1 in blocks or any(x[1]["b"] == n for x in trace.prints):
            continue
        inits = [x for x in trace.inits if x[1]["b"] == n]
        trace.inits = [x for x in trace.inits if x[1]["b"] != n]
        del trace.tiles[n]
        for k in sorted(set(blocks)):
            name = f"{n}/{k}"
            mine = [(i, o) for (i, o), b in zip(uses, blocks) if b == k]
            for _, o in mine:
                _rebase(o, name, pitch, blk, k)
            trace.tiles[name] = {**t, "size": blk * (t["size"] // pitch), "at": mine[0][0], "block": 0,
                                 "ref": lambda: None, "touched": {i for i, _ in mine}}
            for _, op, fill in inits:           # its fill, at its first use (the bytes may be another's before)
                piece = {**op, "o": k * blk, "ap": [[pitch, op["ap"][0][1]], [1, blk]]}
                _rebase(piece, name, pitch, blk, k)
                trace.inits.append((mine[0][0], piece, fill))
    trace.inits.sort(key=lambda x: x[0])


def place_by_liveness(trace) -> None:
    """Place the traced on-chip tiles by liveness, as the compiler's allocator does after tracing: a
    tile lives from its allocation to the last instruction that touches it, so a loop body's tile
    is dead before the next iteration allocates its own. Placed tiles are renamed by address (the
    interpreter reuses one array per placement), inherit the last accesses of the dead tile whose
    bytes they take (write-after-read), and become ``allocs`` (the profile's SbufAllocation rows).
    A kernel whose live tiles do not fit is refused at the line allocating the tile that overflows."""
    split_blocks(trace)
    uses: dict[str, list[int]] = {}
    for i, ins in enumerate(trace.instrs):
        for o in (*ins.operands["dst"], *ins.operands["src"]):
            if o["b"] in trace.tiles:
                uses.setdefault(o["b"], []).append(i)
    last = {n: u[-1] for n, u in uses.items()}
    for i, _, op, _ in trace.prints:          # nl.device_print reads the tile before instruction i
        if op["b"] in trace.tiles:
            last[op["b"]] = max(last.get(op["b"], i), i)
    # a retargeted temporary, or the result of an instruction masked away that nothing read, takes no space
    span = {n: (t["at"], max(t["at"], last.get(n, t["at"])))
            for n, t in trace.tiles.items() if not t.get("retargeted") and not (t.get("skipped") and n not in last)}
    order = sorted(span, key=lambda n: span[n][0])          # stable: allocation order within a position
    ends = sorted(span, key=lambda n: span[n][1])
    fixed = [n for n in order if trace.tiles[n]["address"] is not None]
    rename, extra_deps, j = {}, {}, 0
    for n in order:
        t = trace.tiles[n]
        start, end = span[n]
        while j < len(ends) and span[ends[j]][1] < start:
            d = trace.tiles[ends[j]]
            b = d["ref"]()
            touched = d["touched"] if b is None else {i for i, _ in b.reads} | {i for i, _ in b.writes}
            (trace.sbuf if d["mem"] == "sbuf" else trace.psum).free(ends[j], touched or d.get("inherited", set()))
            j += 1
        alloc = trace.sbuf if t["mem"] == "sbuf" else trace.psum
        addr = t["address"]
        if addr is None:
            # tiles the kernel placed itself and that will be live meanwhile are not ours to take
            reserved = [(trace.tiles[f]["address"], trace.tiles[f]["size"]) for f in fixed
                        if start < span[f][0] <= end]
            addr = alloc.place(t["size"], reserved)
        if addr < 0:
            raise AllocationError(
                f"{t['loc']}: {t['mem'].upper()} is full: {alloc.used() / 1024:.1f} KiB per partition are live and "
                f"this {t['shape']} {t['dtype']} tile needs {t['size'] / 1024:.1f} KiB more (capacity "
                f"{alloc.capacity // 1024} KiB on {trace.p.name}); tiles live from nl.ndarray to their last use: "
                "finish with tiles earlier or use smaller ones")
        t["inherited"] = alloc.take(n, addr, t["size"])
        if t["inherited"]:
            extra_deps[n] = t["inherited"]
        rename[n] = f"{t['mem']}@{addr}+{t['size']}:{t['dtype']}"
        trace.allocs.append((t["mem"], rename[n], addr, t["size"], start, 0))
    for n, deps in extra_deps.items():
        for i in uses.get(n, ()):
            trace.instrs[i].deps = sorted(set(trace.instrs[i].deps) | {d for d in deps if d < i})
    for ins in trace.instrs:
        for o in (*ins.operands["dst"], *ins.operands["src"]):
            o["b"] = rename.get(o["b"], o["b"])
    # a tile nothing touched (a retargeted temporary) needs no array in the interpreter
    trace.inits = [x for x in trace.inits if x[1]["b"] not in trace.tiles or x[1]["b"] in rename]
    for _, op, _ in trace.inits:
        op["b"] = rename.get(op["b"], op["b"])
    for _, _, op, _ in trace.prints:
        op["b"] = rename.get(op["b"], op["b"])
