"""SBUF residency across ops: intermediate values stay on chip between their producer and consumers.

Part of pass 4 (:mod:`neuron_stack.compiler.lower.lowerer`). SBUF is split in two: a ring of rotating tile pools
(each op's working tiles) and a *heap* for resident values. An intermediate value (produced and
consumed inside one partition, contiguous) becomes resident at its first store: it gets a heap
region sized by its liveness (freed once its last consumer is lowered) and lives *row-tiled* the
way NKI kernels lay out big tensors: viewing it as ``[R rows, C]`` and cut in blocks of ``T <= 128``
rows (:func:`row_tiling`: the same cut the tiling of its consumers makes), row ``r`` is in
partition ``r % T`` at free offset ``(r // T) * C``. Then

* a consumer tile whose rows map onto consecutive partitions and whose columns stay inside a row
  is read in place (no instruction at all);
* a producer tile of that shape is written by one engine copy (Scalar or Vector, whichever has
  less work so far) instead of a DMA to HBM;
* any other access pattern that can still be expressed over the row-tiled layout is an
  SBUF->SBUF DMA (no HBM bytes);
* an access that cannot (or a GpSimd library kernel that reads whole HBM tensors) evicts the value:
  its rows are saved to its HBM buffer (``spill_save_bytes``) and later reads come from HBM
  (``spill_reload_bytes``). A value that finds no room in the heap lives in HBM from the start and
  its traffic is counted the same way, so HBM traffic is weights, graph inputs/outputs and spills.

>>> h = Heap(1024)
>>> h.alloc(512), h.alloc(512), h.alloc(64)
(0, 512, None)
>>> h.free(0); h.alloc(256)
0
>>> row_tiling([2, 96, 64]), row_tiling([1, 256, 1024]), row_tiling([16, 256, 256]), row_tiling([8, 32, 64])
((64, 96), (1024, 128), (256, 128), (64, 128))
>>> translate(Resident("v", "__res.v", "float32", rows=300, C=8, T=128, psize=24, off=0), 128 * 8, [(8, 128), (1, 8)])
(8, [[24, 128], [1, 8]], ['p', 'f'])
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from neuron_stack.device.cost import ceil_div

PMAX = 128


def row_tiling(shape, feature_map: bool = False) -> tuple[int, int]:
    """``(C, T)`` of a value's row-tiled layout (:func:`row_layout` without the group)."""
    return row_layout(shape, feature_map)[:2]


def row_layout(shape, feature_map: bool = False) -> tuple[int, int, int]:
    """``(C, T, D)`` of a value's row-tiled layout, the cut its consumers make: the row length C is the
    longest run of trailing dims up to 4096 elements that leaves at least 128 rows (a reshape of the last
    dims, e.g. heads x head_dim -> hidden, still reads whole rows), or the H x W of a ``feature_map``
    (convolution, pooling and batch norm read channel rows of H x W; a [batch, heads, 64, 64] attention
    score is not one: softmax reads it in 128-row tiles of 64 columns, and element-wise ops follow); the
    block height T is the product of the trailing row dims while it fits in 128 partitions, times the chunk
    of the next dim that still fits (128 when the innermost one alone does not), as ``lower.boxes`` cuts
    tiles. ``D``: when that innermost row dim is longer than 128 and not a multiple of it (197 tokens), rows
    come in groups of D, each group starting a new block (its last block partial), so a tile of a group's
    rows lines up with a block as ``lower.boxes`` cuts it (a ragged 69-row tile is 69 partitions of one
    block); 0 otherwise.

    >>> row_layout([12, 197, 64]), row_layout([12, 256, 64])
    ((64, 128, 197), (64, 128, 0))
    >>> row_layout([1, 4, 64, 64]), row_layout([1, 4, 64, 64], feature_map=True)
    ((64, 128, 0), (4096, 4, 0))
    """
    shape = list(shape) or [1]
    k = len(shape) - 1
    C = max(1, shape[k])
    rows = max(1, int(math.prod(shape[:k])))
    # longer rows only while they stay short and still leave 128 rows to spread over partitions;
    # the spatial dims of a channel-rows value are one row
    while k > 0 and C * shape[k - 1] <= 4096 and (rows // max(1, shape[k - 1]) >= PMAX
                                                  or feature_map and len(shape) == 4 and k == 3):
        k -= 1
        C *= shape[k]
        rows //= max(1, shape[k])
    T, D = 1, 0
    for d in reversed(shape[:k]):
        if T * d > PMAX:
            # lower.boxes chunks this dim in steps of PMAX // T: a tile is that many blocks
            # (sequences of 32 tokens at batch 8 are 128-row tiles, not 32-row ones)
            if T == 1 and d % PMAX and d < rows:
                D = d
            T = PMAX if T == 1 else T * max(1, min(d, PMAX // T))
            break
        T *= d
    return C, max(1, T), D


#: a value of at most this many rows (a decode step's batch) whose rows are long is laid out across the
#: partitions instead (:func:`lane_layout`): with one row per partition, an op over it would run on a
#: handful of the 128 lanes
LANE_ROWS = 32
#: ... provided each partition's piece of a row is at least this many elements: a DMA between this layout
#: and rows on partitions then moves runs of >= 8 elements, not one element per descriptor
LANE_MIN_RUN = 8


def lane_layout(shape) -> tuple[int, int] | None:
    """``(C, T)`` of the *lane layout* of a value with few, long rows (``[batch, hidden]`` in a decode step),
    or None: each row of H elements spread over the 128 partitions, partition ``p`` holding the ``H / 128``
    elements ``p * H / 128 ...`` of every row, rows side by side along the free axis (NKI's decode kernels
    keep the hidden dimension on partitions, the batch on the free axis). It is the row-tiled layout of the
    value viewed as ``[rows x 128, H / 128]``.

    >>> lane_layout([1, 1, 4096]), lane_layout([8, 4096]), lane_layout([128, 4096]), lane_layout([1, 600])
    ((32, 128), (32, 128), None, None)
    """
    C, _, _ = row_layout(shape)
    rows = math.prod(shape) // C if shape else 1
    if rows > LANE_ROWS or C % PMAX or C // PMAX < LANE_MIN_RUN:
        return None
    return C // PMAX, PMAX


def row_blocks(rows: int, T: int, D: int = 0) -> int:
    """Blocks of T partitions a row-tiled value of ``rows`` rows takes (each group of D rows padded to whole blocks).

    >>> row_blocks(12 * 197, 128, 197), row_blocks(12 * 197, 128)
    (24, 19)
    """
    return rows // D * ceil_div(D, T) if D else ceil_div(rows, T)



class Heap:
    """First-fit allocator over the resident part of SBUF (bytes per partition, 64-byte units)."""

    def __init__(self, capacity: int, unit: int = 64):
        self.cap, self.unit = capacity, unit
        self.used: dict[int, int] = {}        # start -> size
        self.peak = 0

    def alloc(self, nbytes: int) -> int | None:
        """Start of a free region of ``nbytes`` (rounded up to the unit), or None when none is free."""
        size = -(-max(nbytes, 1) // self.unit) * self.unit
        pos = 0
        for s in sorted(self.used):
            if s - pos >= size:
                break
            pos = max(pos, s + self.used[s])
        if pos + size > self.cap:
            return None
        self.used[pos] = size
        self.peak = max(self.peak, pos + size)
        return pos

    def free(self, start: int) -> None:
        self.used.pop(start, None)


@dataclass
class Resident:
    """A value living in the SBUF heap, row-tiled: element (r, c) at partition r' % T, free
    ``(r' // T) * C + c`` of a buffer whose partition pitch is ``psize`` elements, where r' is r with each
    group of D rows padded to whole blocks (r' = r when D is 0)."""
    buf: str          # the HBM buffer it stands for
    key: str          # its SBUF buffer name
    dtype: str
    rows: int
    C: int
    T: int            # rows per block (partitions used)
    psize: int        # elements per partition
    off: int          # heap start in bytes per partition
    readers: list[int] = field(default_factory=list)
    evicted: bool = False
    D: int = 0        # rows per group padded to whole blocks (0: none)

    def prow(self, r: int) -> int:
        """Row ``r``'s row in the padded layout."""
        if not self.D:
            return r
        return r // self.D * ceil_div(self.D, self.T) * self.T + r % self.D

    def blocks(self):
        """``(first row, rows, block)`` of each block, in order (a group's last block may be partial)."""
        if not self.D:
            return [(j * self.T, min(self.T, self.rows - j * self.T), j) for j in range(ceil_div(self.rows, self.T))]
        nb = ceil_div(self.D, self.T)
        return [(g * self.D + b * self.T, min(self.T, self.D - b * self.T), g * nb + b)
                for g in range(self.rows // self.D) for b in range(nb)]


def translate(r: Resident, o: int, dims: list[tuple[int, int]]):
    """Map an access pattern over the flat HBM buffer (offset ``o``, ``[(stride, num), ...]``) to
    the resident layout: ``(sbuf offset, ap, kinds)`` with kind ``p`` for dims stepping partitions
    and ``f`` for dims inside a partition, or None when the pattern cannot be expressed."""
    C, P, T = r.C, r.psize, r.T
    r0, c0 = divmod(o, C)
    ap, kinds = [], []
    col_extent = c0
    expanded = []
    for s, n in dims:
        # a contiguous run of whole rows is a rows dim times a columns dim
        if s == 1 and n > C and n % C == 0 and c0 == 0:
            expanded += [(C, n // C), (1, C)]
        else:
            expanded.append((s, n))
    if r.D:
        expanded = _pad_rows(r, r0, expanded)
        if expanded is None:
            return None
        r0 = r.prow(r0)
    part_extent = r0 % T
    for s, n in expanded:
        if n == 1:
            continue
        if s == 0:
            ap.append([0, n]), kinds.append("f")
        elif s % C == 0:
            m = s // C
            if m % T == 0:
                ap.append([(m // T) * C, n]), kinds.append("f")
            elif part_extent + (n - 1) * m < T:
                ap.append([m * P, n]), kinds.append("p")
                part_extent += (n - 1) * m
            elif m == 1 and n % T == 0 and r0 % T == 0 and part_extent == 0:
                ap += [[C, n // T], [P, T]]
                kinds += ["f", "p"]
                part_extent = T - 1
            else:
                return None
        elif s < C:
            col_extent += (n - 1) * s
            if col_extent >= C:
                return None
            ap.append([s, n]), kinds.append("f")
        else:
            return None
    return (r0 % T) * P + (r0 // T) * C + c0, ap or [[1, 1]], kinds or ["f"]


def _pad_rows(r: Resident, r0: int, dims):
    """``dims`` over the padded rows: a step of whole groups becomes a step of whole padded groups; the
    other row steps must keep the pattern inside row ``r0``'s group (None when they leave it)."""
    C, D = r.C, r.D
    Dp = ceil_div(D, r.T) * r.T
    out, within = [], r0 % D
    for s, n in dims:
        if s and s % C == 0 and n > 1:
            m = s // C
            if m % D == 0:
                out.append(((m // D) * Dp * C, n))
                continue
            within += (n - 1) * m
        out.append((s, n))
    return out if within < D else None


def tile_ap(r: Resident, o: int, pdims, fdims):
    """The engine operand of a tile over a resident value: ``(offset, P, free_ap)`` when the
    partition dims ``pdims`` step consecutive partitions and ``fdims`` stay inside one row, else None."""
    t = translate(r, o, list(pdims) + list(fdims))
    if t is None:
        return None
    off, ap, kinds = t
    npd = sum(1 for _, n in pdims if n != 1)
    # the partition part must be one run of consecutive partitions; the free part, in-partition
    pk = [(a, k) for a, k in zip(ap, kinds)][:npd] if npd else []
    fk = [(a, k) for a, k in zip(ap, kinds)][npd:] if npd else list(zip(ap, kinds))
    if any(k != "p" for _, k in pk) or any(k != "f" for _, k in fk):
        return None
    merged = _merge([a for a, _ in pk])
    if len(merged) > 1 or (merged and merged[0][0] != r.psize):
        return None
    P = merged[0][1] if merged else 1
    if P != math.prod(n for _, n in pdims):
        # a partition dim that translate split into rows x columns (64 elements of 16-element rows: 4
        # partitions x 16) is not a run of partitions: the tile cannot be read in place
        return None
    return off, P, [a for a, _ in fk] or [[1, 1]]


def _merge(ap):
    out = []
    for s, n in ap:
        if n == 1:
            continue
        if out and out[-1][0] == s * n:
            out[-1] = [s, out[-1][1] * n]
        else:
            out.append([s, n])
    return out
