"""NKI indexing: integer/slice/``nl.ds`` views, ``nl.arange`` / ``nl.mgrid`` affine index expressions
and the masks built from them.

An index expression is affine in the positions of the tile it indexes: ``base + sum(coef_d * i_d)``,
so indexing a tensor with expressions is again one access pattern (strides are the tensor's strides
times the coefficients). A mask (``i_p < n``) is a boolean array over the tile; the instructions it
guards run on its bounding box, which must be exactly the true part (a rectangle), as the hardware's
access patterns are.

>>> i_p = arange(128)[:, None]; i_f = arange(512)[None, :]
>>> (i_p * 2 + 1).shape, int((i_p + i_f).values()[1, 2])
((128, 1), 3)
>>> box_of((i_p < 100) & (i_f < 512), (128, 512))
[(0, 100), (0, 512)]
"""
from __future__ import annotations

import math

import numpy as np

from .core import TENSOR_OPS, NKIError, ndarray, where


class ds:
    """``nl.ds(start, size)``: the slice ``start:start+size``. Example: ``a[nl.ds(128, 128), :]``."""

    def __init__(self, start, size):
        self.start, self.size = int(start), int(size)

    def as_slice(self) -> slice:
        return slice(self.start, self.start + self.size)


class Idx:
    """An affine index expression over a tile's positions (what ``nl.arange`` builds)."""

    __array_priority__ = 100

    def __init__(self, base: int, coefs: tuple, shape: tuple):
        self.base, self.coefs, self.shape = int(base), tuple(int(c) for c in coefs), tuple(int(s) for s in shape)

    def __getitem__(self, key) -> Idx:
        key = key if isinstance(key, tuple) else (key,)
        coefs, shape, it = [], [], iter(zip(self.coefs, self.shape))
        for k in key:
            if k is None:
                coefs.append(0)
                shape.append(1)
            elif isinstance(k, slice) and k == slice(None):
                c, n = next(it)
                coefs.append(c)
                shape.append(n)
            else:
                raise NKIError(f"{where()}: index expressions take only ':' and None (e.g. nl.arange(128)[:, None])")
        for c, n in it:
            coefs.append(c)
            shape.append(n)
        return Idx(self.base, coefs, shape)

    def _pad(self, ndim: int) -> Idx:
        k = ndim - len(self.shape)
        return Idx(self.base, (0,) * k + self.coefs, (1,) * k + self.shape)

    def __add__(self, o):
        if isinstance(o, Idx):
            nd = max(len(self.shape), len(o.shape))
            a, b = self._pad(nd), o._pad(nd)
            shape = []
            for x, y in zip(a.shape, b.shape):
                if x != y and 1 not in (x, y):
                    raise NKIError(f"{where()}: index expressions of shapes {a.shape} and {b.shape} do not broadcast")
                shape.append(max(x, y))
            return Idx(a.base + b.base, [x + y for x, y in zip(a.coefs, b.coefs)], shape)
        return Idx(self.base + _int(o), self.coefs, self.shape)

    __radd__ = __add__

    def __sub__(self, o):
        return self + (-1 * o if isinstance(o, Idx) else -_int(o))

    def __rsub__(self, o):
        return (-1 * self) + o

    def __mul__(self, o):
        k = _int(o)
        return Idx(self.base * k, [c * k for c in self.coefs], self.shape)

    __rmul__ = __mul__

    def __neg__(self):
        return self * -1

    def values(self) -> np.ndarray:
        """The expression's value at every position (broadcast shape)."""
        v = np.full(self.shape, self.base, dtype=np.int64)
        for d, (c, n) in enumerate(zip(self.coefs, self.shape)):
            if c and n > 1:
                shp = [1] * len(self.shape)
                shp[d] = n
                v = v + c * np.arange(n).reshape(shp)
        return v

    def _cmp(self, o, fn):
        ov = o.values() if isinstance(o, Idx) else _int(o)
        return Pred(fn(self.values(), ov), (self - o, fn.__name__))

    def __lt__(self, o): return self._cmp(o, np.less)
    def __le__(self, o): return self._cmp(o, np.less_equal)
    def __gt__(self, o): return self._cmp(o, np.greater)
    def __ge__(self, o): return self._cmp(o, np.greater_equal)


class Pred:
    """A mask: a boolean array over tile positions, combined with ``&`` and ``|``."""

    def __init__(self, values: np.ndarray, affine: tuple | None = None):
        self.v = np.asarray(values, dtype=bool)
        self.affine = affine        # (expr, comparison) when the mask is ``expr cmp 0`` (nisa.affine_select)

    def __and__(self, o): return Pred(self.v & _mask(o))
    def __or__(self, o): return Pred(self.v | _mask(o))
    __rand__, __ror__ = __and__, __or__

    def __invert__(self):
        return Pred(~self.v)


def _mask(o) -> np.ndarray:
    return o.v if isinstance(o, Pred) else np.asarray(bool(o))


def _int(o) -> int:
    if isinstance(o, (bool, np.bool_)) or not isinstance(o, (int, np.integer)):
        raise NKIError(f"{where()}: index arithmetic takes integers (got {type(o).__name__})")
    return int(o)


def arange(*args) -> Idx:
    """``nl.arange(n)`` / ``nl.arange(start, stop[, step])``: a 1-D index expression."""
    r = range(*[int(a) for a in args])
    if len(r) == 0:
        raise NKIError(f"{where()}: nl.arange{args} is empty")
    return Idx(r.start, (r.step,), (len(r),))


class Grid(tuple):
    """What ``nl.mgrid`` gives: a tuple of index expressions, also named ``.p`` (partition), ``.x``, ``.y``, ``.z``."""

    p = property(lambda g: g[0])
    x = property(lambda g: g[1])
    y = property(lambda g: g[2])
    z = property(lambda g: g[3])


class _MGrid:
    """``nl.mgrid[0:128, 0:512]``: one index expression per dimension, broadcast against each other."""

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        out = []
        for d, s in enumerate(key):
            r = range(s.start or 0, s.stop, s.step or 1)
            coefs, shape = [0] * len(key), [1] * len(key)
            coefs[d], shape[d] = r.step, len(r)
            out.append(Idx(r.start, coefs, shape))
        return Grid(out) if len(out) > 1 else out[0]


mgrid = _MGrid()


class DynIdx:
    """An index read from SBUF at run time (``t[ix, idx_tile[0, j] + iy]``): ``tile`` holds the offset, ``static``
    is the compile-time part of the index. ``nisa.tensor_copy_dynamic_src/dst`` and DMAs (``nl.load``, ``nl.store``,
    ``nisa.dma_copy``) accept the view it makes."""

    def __init__(self, tile: ndarray, static=None):
        self.tile, self.static = tile, static


def index_view(t: ndarray, key) -> ndarray:
    """``t[key]`` as a strided view (see the module docstring for the accepted index forms)."""
    if isinstance(key, (Pred, bool, np.bool_)):
        return _masked_view(t, key)
    key = key if isinstance(key, tuple) else (key,)
    if any(isinstance(k, (DynIdx, ndarray)) for k in key):
        return _dynamic_view(t, key)
    if len(key) == t.ndim and t.ndim > 1 and t.buf.mem != "hbm" and all(isinstance(k, (int, np.integer)) for k in key):
        key = tuple(slice(int(k), int(k) + 1) for k in key)    # one element of a tile: a [1, 1] view
    if any(k is Ellipsis for k in key):
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (t.ndim - len(key) + 1) + key[i + 1:]
    if len(key) > t.ndim:
        raise NKIError(f"{where()}: {len(key)} indices for a tensor of {t.ndim} dims {t.shape}")
    key = key + (slice(None),) * (t.ndim - len(key))
    offset = t.offset
    on_chip = t.buf.mem != "hbm"
    if any(isinstance(k, Idx) for k in key):
        exprs = []
        for d, (k, st, n) in enumerate(zip(key, t.strides, t.shape)):
            if isinstance(k, (int, np.integer)):
                offset += int(k) * st
            elif isinstance(k, Idx):
                exprs.append((k, st, d == t.pdim))
            else:
                raise NKIError(f"{where()}: mix of index expressions and slices; index every dim with "
                               f"nl.arange expressions (or integers), or every dim with slices")
        nd = max(len(e.shape) for e, _, _ in exprs)
        if len(exprs) > 1 and any(len(e.shape) == 1 for e, _, _ in exprs):
            raise NKIError(f"{where()}: a 1-D nl.arange indexes one dimension only; give each its own axis: "
                           f"nl.arange(P)[:, None] for the partitions, nl.arange(F)[None, :] for the free dim")
        shape = [1] * nd
        strides = [0] * nd
        pdim = 0
        for e, st, is_p in _aligned(exprs, nd):
            offset += e.base * st
            for d, (c, n) in enumerate(zip(e.coefs, e.shape)):
                if n > 1:
                    if shape[d] not in (1, n):
                        raise NKIError(f"{where()}: index expressions do not broadcast to one tile shape")
                    shape[d] = n
                    strides[d] += c * st
                    pdim = d if is_p and on_chip else pdim
        return _checked(t, ndarray(t.buf, shape, offset, strides, t.dtype, pdim))
    shape, strides, limits = [], [], []
    pdim = t.pdim
    for d, (k, st, n) in enumerate(zip(key, t.strides, t.shape)):
        if isinstance(k, ds):
            k = k.as_slice()
        if isinstance(k, (int, np.integer)):
            i = int(k) + (n if k < 0 else 0)
            if not 0 <= i < n:
                raise NKIError(f"{where()}: index {int(k)} is out of bounds for dim {d} of size {n}")
            if d == t.pdim and on_chip and t.ndim > 1:
                raise NKIError(f"{where()}: indexing away a tile's partition dim; use a slice such as t[0:1, ...]")
            pdim -= d < t.pdim
            offset += i * st
        elif isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step <= 0:
                raise NKIError(f"{where()}: negative slice steps are not supported by access patterns")
            m = len(range(start, stop, step))
            if m == 0:
                raise NKIError(f"{where()}: slice {k.start}:{k.stop} selects nothing from dim {d} of size {n}")
            if k.stop is not None and int(k.stop) > n:
                # a ragged last tile sliced past the end: legal when a mask trims it (checked at the instruction)
                limits.append((len(shape), m, f"slice {k.start}:{k.stop} is out of bounds for dim {d} of size {n}"))
                m = len(range(start, int(k.stop), step))
            offset += start * st
            shape.append(m)
            strides.append(st * step)
        else:
            raise NKIError(f"{where()}: unsupported index {k!r}")
    if on_chip and len(shape) == 1:         # t[:, j]: the partitions of one free column, a [P, 1] tile
        shape, strides = shape + [1], strides + [1]
    v = ndarray(t.buf, shape, offset, strides, t.dtype, pdim if on_chip else 0)
    v._limits = tuple(limits)
    return v


def _dynamic_view(t: ndarray, key) -> ndarray:
    """The view at the static part of a dynamic index, carrying ``_dyn = (index tile, stride, largest offset,
    the tensor indexed)``."""
    d = next(i for i, k in enumerate(key) if isinstance(k, (DynIdx, ndarray)))
    if t.buf.mem == "hbm" and isinstance(key[d], ndarray) and key[d].free_size == 1 and key[d].partitions > 1 \
            and sum(isinstance(x, (DynIdx, ndarray)) for x in key) == 1:
        return _gather_view(t, key, d)
    k = key[d] if isinstance(key[d], DynIdx) else DynIdx(key[d])
    if sum(isinstance(x, (DynIdx, ndarray)) for x in key) > 1 or math.prod(k.tile.shape) != 1 \
            or k.tile.buf.mem == "hbm":
        raise NKIError(f"{where()}: indexing with a tile of indices is not simulated; a dynamic index is one element "
                       f"of an SBUF tile (idx[0, j]) in one dimension, for nisa.tensor_copy_dynamic_src/dst or a DMA")
    static = k.static
    if static is None:
        nd = max([len(x.shape) for x in key if isinstance(x, Idx)] or [1])
        # hbm[idx_tile, :] keeps the dim as a one-row gather would; an integer index would drop it
        static = Idx(0, (0,) * nd, (1,) * nd) if any(isinstance(x, Idx) for x in key) else \
            slice(0, 1) if isinstance(key[d], ndarray) and t.buf.mem == "hbm" else 0
    v = index_view(t, key[:d] + (static,) + key[d + 1:])
    top = int(static.values().max()) if isinstance(static, Idx) else 0 if isinstance(static, slice) else int(static)
    v._dyn = (k.tile, t.strides[d], t.shape[d] - 1 - top, t)
    return v


def _gather_view(t: ndarray, key, d: int) -> ndarray:
    """``hbm[..., idx_tile, ...]`` with a [P, 1] integer SBUF tile of row numbers: an indirect DMA's source, partition
    p reading row ``idx_tile[p]`` of dim ``d``. The view is laid out as if the rows were 0..P-1 and carries
    ``_gather = (index tile, the whole table)``; the DMA (``nl.load``, ``nisa.dma_copy``) reads the rows at run time."""
    idx = key[d]
    if idx.buf.mem != "sbuf" or idx.dtype not in ("int32", "uint32", "int16", "uint16", "int8", "uint8"):
        raise NKIError(f"{where()}: an HBM tensor indexed by a tile takes row numbers in an integer SBUF tile, got "
                       f"{idx.dtype} in {idx.buffer}")
    P = idx.partitions
    exprs = [k for k in key if isinstance(k, Idx)]
    if exprs:
        nd = max(len(e.shape) for e in exprs)
        rows = Idx(0, (1,) + (0,) * (nd - 1), (P,) + (1,) * (nd - 1))
    else:
        rows = slice(0, P)
    v = index_view(t, key[:d] + (rows,) + key[d + 1:])
    if not v.shape or v.shape[0] != P or v.strides[0] != t.strides[d]:
        raise NKIError(f"{where()}: the tile of row numbers must index the result's partition (first) dim")
    table = ndarray(t.buf, (t.shape[d], *v.shape[1:]), v.offset, (t.strides[d], *v.strides[1:]), t.dtype)
    v._gather = (idx, table)
    v._limits = ()
    return v


def _aligned(exprs: list, nd: int) -> list:
    """Index expressions of different ranks brought to ``nd`` dims: leading 1s as numpy broadcasts; if that
    clashes, trailing ones (a lower-rank expression names the leading dims: ``arange(M)[:, None, None]``
    beside 4-D ``create_indices`` ones, contributed conv.py), else refused."""
    for pad in (lambda e: e._pad(nd), lambda e: Idx(e.base, e.coefs + (0,) * (nd - len(e.shape)),
                                                     e.shape + (1,) * (nd - len(e.shape)))):
        out = [(pad(e), st, is_p) for e, st, is_p in exprs]
        sizes = [{n for e, _, _ in out if (n := e.shape[d]) > 1} for d in range(nd)]
        if all(len(z) <= 1 for z in sizes):
            return out
    raise NKIError(f"{where()}: index expressions do not broadcast to one tile shape")


def _masked_view(t: ndarray, pred) -> ndarray:
    """``t[i_f < n]``: the legacy way to mask a tile operand: the view trimmed to the box the predicate
    selects (a predicate that is a plain ``True``, from compile-time indices, keeps the view whole)."""
    if isinstance(pred, (bool, np.bool_)) and pred:
        return t
    root = getattr(t, "_mroot", t)      # chained masks, `t[a < n][b < m]`, are each over the unmasked view
    box = box_of(pred, root.shape)
    if box is not None and hasattr(t, "_mbox"):
        box = [(max(s, u), min(s + n, u + m) - max(s, u)) for (s, n), (u, m) in zip(box, t._mbox)]
        box = None if any(n <= 0 for _, n in box) else box
    if box is None:
        raise NKIError(f"{where()}: the mask selects nothing of this {root.shape} tile; skip the instruction instead")
    v = restrict(root, box, root.shape)
    v._mroot, v._mbox = root, box       # a legacy nc_matmul maps the box onto its result (its `+=` target)
    if hasattr(root, "_root"):
        _checked(root._root, v)
    return v


def _checked(parent: ndarray, v: ndarray) -> ndarray:
    v._parent_shape = parent.shape           # bounds are checked after masking (ragged last tiles)
    v._root = parent
    return v


def box_of(mask, shape) -> list[tuple[int, int]] | None:
    """The (start, length) box per dim where ``mask`` is true over a tile of ``shape``; None when
    nothing is selected. A mask that is not a rectangle is refused."""
    m = np.broadcast_to(_mask(mask), shape)
    if not m.any():
        return None
    box = []
    for d in range(m.ndim):
        ax = tuple(j for j in range(m.ndim) if j != d)
        nz = np.flatnonzero(m.any(axis=ax) if ax else m)
        box.append((int(nz[0]), int(nz[-1] - nz[0] + 1)))
    sub = m[tuple(slice(s, s + n) for s, n in box)]
    if not sub.all():
        raise NKIError(f"{where()}: the mask is not a rectangle of the tile; split the instruction so each "
                       f"part's mask is a box")
    return box


def restrict(v: ndarray, box, shape) -> ndarray:
    """``v`` limited to ``box`` of a tile of ``shape`` (dims where ``v`` broadcasts stay whole)."""
    if box is None:
        return v
    off, new_shape = v.offset, list(v.shape)
    limits = {j: (lim, msg) for j, lim, msg in v._limits}
    k = len(shape) - len(v.shape)
    for d, (s, n) in enumerate(box):
        j = d - k
        if j < 0 or v.shape[j] != shape[d] or v.shape[j] == n:
            continue
        off += s * v.strides[j]
        new_shape[j] = n
        if j in limits:
            limits[j] = (limits[j][0] - s, limits[j][1])
    r = ndarray(v.buf, new_shape, off, v.strides, v.dtype, v.pdim)
    r._limits = tuple((j, lim, msg) for j, (lim, msg) in limits.items())
    r._dyn = getattr(v, "_dyn", None)       # a dynamic offset moves the box alike
    return r


TENSOR_OPS["index"] = index_view
TENSOR_OPS["restrict"] = restrict


def as_rank(v: ndarray, shape) -> ndarray:
    """``v`` viewed with ``shape``'s trailing unit axes (a lower-rank HBM view against a tile), keeping a
    dynamic start address (:func:`dma_dynamic`)."""
    if v.shape == tuple(shape):
        return v
    out = ndarray(v.buf, shape, v.offset, list(v.strides) + [1] * (len(shape) - len(v.shape)), v.dtype)
    out._dyn = getattr(v, "_dyn", None)
    return out


def dma_dynamic(dst: ndarray, src: ndarray) -> tuple | None:
    """(attrs, extra srcs, extra dsts) of a DMA whose src or dst starts at an offset read from SBUF when it runs
    (``hbm[idx[0, 0], i_p, i_f]``, ``hbm[i_p, idx[0, 0] + i_f]``: ``dma_copy``'s dynamic start address under
    hardware or software DGE); the whole tensor it can reach counts as accessed. None for a static DMA."""
    ds_, dd = getattr(src, "_dyn", None), getattr(dst, "_dyn", None)
    if ds_ is None and dd is None:
        return None
    if ds_ is not None and dd is not None:
        raise NKIError(f"{where()}: a DMA with dynamic offsets on both src and dst is not simulated")
    idx, stride, limit, root = ds_ or dd
    if idx.buf.mem != "sbuf" or idx.dtype not in ("int32", "uint32", "int16", "uint16", "int8", "uint8"):
        raise NKIError(f"{where()}: a DMA reads its dynamic offset from an integer SBUF tile, got {idx.dtype} in "
                       f"{idx.buffer}")
    attrs = {"side": "src" if ds_ is not None else "dst", "stride": int(stride), "limit": int(limit)}
    return (attrs, [idx, root], []) if ds_ is not None else (attrs, [idx], [root])
