"""Attention scores never leave the chip: a softmax over the last dim of a matmul's output (after
its fused epilogue, e.g. the ``/ sqrt(d)``) runs in that matmul's PSUM evacuation.

The scores of one (batch, head) row block are a [<=128, N] tile in PSUM; with N <= 512 (one bank)
the whole row is there, so max, exp (with the running sum on the Scalar engine's accumulator),
reciprocal and the multiply run on it and only the probabilities are stored, as fused attention
kernels do (NKI's ``flash_fwd``; the arch guide's softmax example keeps the row in SBUF). Before,
the full [B, H, S, S] fp32 scores went to SBUF (or, at BERT-base batch 8, 6.3 MB of HBM spill) and
came back for a separate softmax pass.

Longer rows (prefill of thousands of tokens) take the flash path (:class:`FlashAttention`): the whole
``softmax(Q K^T) @ V`` runs per 128-query block with a running max and sum, so no [S, S] score
matrix is ever stored, however long the prompt. So do rows of one bank that carry steps the softmax
epilogue does not (SDPA's mask and its fully-masked-row guard: BERT's 128 and ViT's 197 tokens), from
one full 128-query block up: their [B, H, S, S] scores went to SBUF whole, and past its size to HBM.

>>> from neuron_stack.compiler.lower.attention import FLASH_MIN_KEYS, SOFTMAX_MAX_ROW
>>> SOFTMAX_MAX_ROW, FLASH_MIN_KEYS
(512, 512)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from neuron_stack.compiler.lower.chain import (
    _NOT_TILEWISE,
    TileCtx,
    _member,
    chain_outputs,
    epilogue_chain,
    run_chain,
)
from neuron_stack.compiler.lower.common import reshape_view
from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.registry import lower_alone
from neuron_stack.compiler.lower.tiles import (
    MOVING_FMAX,
    PMAX,
    Pool,
    Tile,
    View,
    aten_op,
    is_ref,
    meta_tensor,
    packet_name,
)
from neuron_stack.device.cost import gpsimd_ns, ldweights_ns, matmul_ns
from neuron_stack.ir import Node

#: the row must fit one PSUM bank of the evacuation (fp32)
SOFTMAX_MAX_ROW = MOVING_FMAX


def fusable_softmax(low: Lowerer, last: str, N: int) -> Node | None:
    """The softmax node reading matmul chain value ``last`` as its only consumer, over its last dim,
    when the row (N) fits one bank; else None."""
    if N > SOFTMAX_MAX_ROW or last in low.out_refs or low._escapes(last):
        return None
    users = low._consumers(last)
    if len(users) != 1:
        return None
    s = low.by_name[next(iter(users))]
    if packet_name(s.target) != "_softmax" or s.name not in low.in_part or s.name in low.done:
        return None
    if s.fused_into or low.fused.get(s.name) or not s.outputs or len(s.args) < 3:
        return None
    src = s.args[0]
    if not (isinstance(src, dict) and src.get("node") == last):
        return None                     # read through a view: the row may not be the tile's row
    nd = len(s.outputs[0].shape)
    if s.args[1] % nd != nd - 1 or s.args[2] or tuple(s.outputs[0].shape)[-1] != N:
        return None
    return s


class SoftmaxEpilogue:
    """Softmax of evacuated score tiles, stored as the softmax node's output."""

    def __init__(self, low: Lowerer, host: str, s: Node, hshape):
        self.low, self.s = low, s
        low.done.add(s.name)
        N = hshape[-1]
        self.small = Pool(low, f"{host}.sm", "sbuf", PMAX, 8, "float32", bufs=8)
        self.work = Pool(low, f"{host}.smw", "sbuf", PMAX, N, "float32", bufs=4)
        out = low.out_view(s.name, s.outputs[0])
        self.view: View = reshape_view(out, tuple(hshape))

    def __call__(self, x: Tile, box) -> None:
        low, name, P = self.low, self.s.name, x.P
        m, negm, sums, r = (self.small.tile(P, 1) for _ in range(4))
        low.vec("REDUCE", name, m, [x.op()], op="max", cost_n=x.F)
        low.vec("TENSOR_SCALAR", name, negm, [m.op()], op0="multiply", scalar0=-1.0)
        e = self.work.tile(P, x.F)
        low.act(name, e, x.op(), "exp", bias=negm.op(), acc=sums.cols(0, 1), flops=2 * P * x.F)
        low.vec("RECIPROCAL", name, r, [sums.op()])
        o = self.work.tile(P, x.F).as_dtype(self.s.outputs[0].dtype)
        low.vec("TENSOR_SCALAR", name, o, [e.op(), r.op()], op0="multiply", scalar0={"src": 1}, flops=P * x.F)
        low.store(name, o, self.view, box)

    def finish(self) -> None:
        self.low.finished.add(self.s.name)


#: a score row longer than one PSUM bank takes the flash path (when the whole attention is there); a
#: shorter one does when the softmax epilogue cannot take it (a mask between the matmul and the softmax)
FLASH_MIN_KEYS = SOFTMAX_MAX_ROW
_CASTS = ("_to_copy", "clone", "alias")
_RESHAPES = ("view", "_unsafe_view", "reshape", "expand", "alias", "unsqueeze", "squeeze")


class FlashMatch:
    """The nodes of ``softmax(scores) @ V`` after a scores matmul: ``skip`` are the ones the flash
    loop computes without materialising (softmax, the fully-masked-row guard, casts), ``pv`` the
    second matmul, ``zero_masked`` whether a row of only ``-inf`` scores must give 0, ``pre`` the
    elementwise steps between the first matmul's epilogue and the softmax (casts, the mask)."""

    def __init__(self, softmax: Node, pv: Node, skip: list[Node], zero_masked: bool, pre: list[Node]):
        self.softmax, self.pv, self.skip, self.zero_masked, self.pre = softmax, pv, skip, zero_masked, pre


def _only_user(low: Lowerer, name: str) -> Node | None:
    users = low._consumers(name)
    if len(users) != 1 or name in low.out_refs or low._escapes(name):
        return None
    u = low.by_name[next(iter(users))]
    return u if u.name in low.in_part and u.name not in low.done else None


def _reads(low: Lowerer, n: Node, arg, name: str, ops=_RESHAPES) -> bool:
    """True when argument ``arg`` of ``n`` is ``name`` itself or reshapes of it."""
    while isinstance(arg, dict) and "node" in arg:
        if arg["node"] == name:
            return True
        v = low.by_name[arg["node"]]
        if v.op_class != "view" or packet_name(v.target) not in ops or not v.args:
            return False
        arg = v.args[0]
    return False


def _row_guard(low: Lowerer, last: str, cond) -> list[Node] | None:
    """The SDPA decomposition's ``where(~any(scores != -inf, -1), 0, probs)`` condition chain
    (eq -inf, not, any over the row, not) reading ``last``; None when ``cond`` is anything else."""
    chain = []
    for want in ("logical_not", "any", "logical_not", "eq"):
        if not (isinstance(cond, dict) and "node" in cond):
            return None
        g = low.by_name[cond["node"]]
        if packet_name(g.target) != want or g.name not in low.in_part or g.name in low.done:
            return None
        if want == "any" and g.args[1:] not in ([-1, True], [[-1], True]):
            return None
        chain.append(g)
        cond = g.args[0]
    eq = chain[-1]
    if eq.args[1:] != [float("-inf")] or not _reads(low, eq, eq.args[0], last):
        return None
    if any(len(low._consumers(g.name)) != 1 or low._escapes(g.name) for g in chain):
        return None
    return chain


def flash_attention(low: Lowerer, last: str, N: int) -> FlashMatch | None:
    """``softmax(scores, -1) @ V`` fed by matmul chain value ``last`` (rows of any length N: the caller
    offers it when the softmax epilogue does not apply), as the SDPA decomposition writes it, or None."""
    pre = []
    while True:     # elementwise steps and casts between the matmul and the softmax (the mask)
        if last in low.out_refs or low._escapes(last):
            return None
        users = low._consumers(last)
        if any(packet_name(low.by_name[u].target) == "_softmax" for u in users):
            break
        u = _only_user(low, last)
        if u is None or packet_name(u.target) in _NOT_TILEWISE \
                or u.op_class not in ("elementwise", "activation") and packet_name(u.target) not in _CASTS:
            return None
        pre.append(u)
        last = u.name
    sms = [low.by_name[u] for u in users if packet_name(low.by_name[u].target) == "_softmax"]
    if len(sms) != 1:
        return None
    s = sms[0]
    nd = len(s.outputs[0].shape) if s.outputs else 0
    if (s.name not in low.in_part or s.name in low.done or s.fused_into or low.fused.get(s.name) or len(s.args) < 3
            or not _reads(low, s, s.args[0], last, ("view",)) or s.args[1] % nd != nd - 1 or s.args[2]):
        return None
    skip, cur, zero_masked = [*pre, s], s, False
    while True:
        u = _only_user(low, cur.name)
        if u is None:
            return None
        name = packet_name(u.target)
        if name == "where" and len(u.args) == 3 and _reads(low, u, u.args[2], cur.name) and not zero_masked:
            zero = u.args[1]
            if isinstance(zero, dict):
                z = low.by_name[zero["node"]]
                zero = z.args[0] if packet_name(z.target) == "scalar_tensor" and z.args else None
            guard = _row_guard(low, last, u.args[0])
            if zero != 0 or guard is None or users != {s.name, guard[-1].name}:
                return None   # the scores have no reader but the softmax and the guard
            skip += [u, *guard]
            zero_masked = True
        elif name in _CASTS and len(u.args) == 1 and _reads(low, u, u.args[0], cur.name):
            skip.append(u)
        elif name == "bmm" and _reads(low, u, u.args[0], cur.name) and not _reads(low, u, u.args[1], cur.name):
            break
        else:
            return None
        cur = u
    if not zero_masked and users != {s.name}:
        return None
    names = {x.name for x in skip}
    if any(x.fused_into and x.fused_into not in names or any(f.name not in names for f in low.fused.get(x.name, []))
           for x in skip):
        return None     # fused with a node outside the attention: that host would still need the values
    return FlashMatch(s, u, skip, zero_masked, pre)


#: ops a mask may be computed with for the compiler to evaluate it (pure, cheap, no data but their literals)
_CONST_OPS = frozenset((
    "arange", "full", "ones", "zeros", "scalar_tensor", "tril", "triu", "add", "sub", "mul", "neg",
    "le", "lt", "ge", "gt", "eq", "ne", "logical_not", "logical_and", "logical_or", "bitwise_not", "bitwise_and",
    "bitwise_or", "where", *_RESHAPES, "view", "permute", "slice", "select", "_to_copy", "clone", "lift_fresh_copy"))
#: the largest tensor the compiler evaluates (a 16k x 16k boolean mask)
_CONST_MAX_NUMEL = 1 << 28
MASKED, CLEAN, MIXED = 0, 1, 2
#: the running row max starts here; a masked score on the diagonal is the float32 minimum, below it
_MAX_START, _MASKED_SCORE = -3.0e38, float(torch.finfo(torch.float32).min)


class _NotConstant(Exception):
    pass


def _arg(low: Lowerer, a, seen: dict):
    if isinstance(a, list):
        return [_arg(low, x, seen) for x in a]
    if isinstance(a, dict):
        if set(a) == {"node"}:
            return _const_value(low, a["node"], seen)
        if set(a) == {"dtype"}:
            return getattr(torch, a["dtype"])
        if set(a) == {"device"}:
            return torch.device("cpu")      # evaluated here, whatever device the capture ran on
        raise _NotConstant
    return a


def _const_value(low: Lowerer, name: str, seen: dict | None = None) -> torch.Tensor:
    """The value of node ``name`` when the graph fixes it: computed only from literals (``arange``,
    ``full``, comparisons, reshapes), no input, no weight. Raises ``_NotConstant`` otherwise."""
    seen = {} if seen is None else seen
    if name not in seen:
        n = low.by_name[name]
        if (not n.target.startswith("aten.") or packet_name(n.target) not in _CONST_OPS or len(n.outputs) != 1
                or n.outputs[0].numel > _CONST_MAX_NUMEL):
            raise _NotConstant
        args = [_arg(low, a, seen) for a in n.args]
        kwargs = {k: _arg(low, v, seen) for k, v in n.kwargs.items() if k not in ("pin_memory", "layout")}
        seen[name] = aten_op(n.target)(*args, **kwargs)
    return seen[name]


class ConstMask:
    """A flash attention's ``where(cond, -inf, scores)`` step whose ``cond`` the graph fixes (the causal
    mask of a prompt whose positions start at 0, or sdpa's ``is_causal``), known per (128-query, 512-key)
    block: MASKED blocks are skipped (their ``exp(-inf)`` adds nothing to a row's max, sum or output),
    CLEAN blocks drop the step, MIXED blocks mask on GpSimd with one AFFINE_SELECT when the mask is
    causal with a constant offset (``key > query + offset``: NKI's causal ``flash_fwd`` masks its diagonal
    blocks so: one per head when a block's rows stack several heads of a grouped-query group), else apply
    the step with the mask loaded. ``states[b or 0, m0 // 128, n0 // 512]``; ``rows``: one head's query rows."""

    def __init__(self, node: Node, states: torch.Tensor, offset: int | None, rows: int):
        self.node, self.states, self.offset, self.rows = node, states, offset, rows

    def segments(self, m0: int, mp: int) -> list[tuple[int, int, int]]:
        """The rows ``[m0, m0 + mp)`` of a query block cut where a head's rows end: (first row within the
        block, rows, query position of that row).

        >>> ConstMask(None, None, 0, 48).segments(0, 128)
        [(0, 48, 0), (48, 48, 0), (96, 32, 0)]
        """
        out, r = [], m0
        while r < m0 + mp:
            n = min(m0 + mp, r - r % self.rows + self.rows) - r
            out.append((r - m0, n, r % self.rows))
            r += n
        return out

    def state(self, b: int, mi: int, ni: int) -> int:
        return int(self.states[b if self.states.shape[0] > 1 else 0, mi, ni])


def const_mask(low: Lowerer, pre: list[Node], scores: str, hshape, rows: int | None = None) -> ConstMask | None:
    """The :class:`ConstMask` of the ``where(cond, -inf, x)`` in ``pre`` (the steps from the scores matmul
    ``scores`` to the softmax: its epilogue and the flash match's own), or None when there is none, its
    ``cond`` is data, or a step after it is not a cast (a cast keeps ``-inf``; an add might not). ``rows``: the
    query rows of one head when the ``M`` rows of ``hshape`` stack a grouped-query group's heads (the decode-
    style read of one KV head for its whole group, kvread.py): row ``r`` is then query ``r % rows``."""
    prev = scores
    for i, f in enumerate(pre):
        if packet_name(f.target) == "where" and len(f.args) == 3 and _reads(low, f, f.args[2], prev):
            break
        prev = f.name
    else:
        return None
    if any(packet_name(g.target) not in _CASTS for g in pre[i + 1:]) or not is_ref(f.args[0]):
        return None
    fill = f.args[1]
    if is_ref(fill):
        z = low.by_name[fill["node"]]
        fill = z.args[0] if packet_name(z.target) == "scalar_tensor" and z.args else None
    shape = tuple(f.outputs[0].shape)
    if fill != float("-inf") or tuple(f.inputs[-1].shape) != shape:
        return None
    try:
        cond = _const_value(low, f.args[0]["node"]).to(torch.bool).expand(shape)
    except Exception:       # anything the compiler cannot evaluate is data
        return None
    nb, M, N = hshape
    rows = rows or M
    lead = cond.stride()[:-2]
    if any(lead) and cond.numel() > _CONST_MAX_NUMEL or M % rows:
        return None
    base = cond[(0,) * len(lead)][None] if not any(lead) else cond.reshape(nb, M, N)
    pn, NB = -N % MOVING_FMAX, -(-N // MOVING_FMAX)
    states = torch.full((base.shape[0], -(-M // PMAX), NB), MIXED)
    offset = int((~base[0, 0]).sum()) - 1
    causal, keys = True, torch.arange(N)[None, :]
    # one 128-query row of blocks at a time: a 10,000-token prompt's [L, S] mask is 100 MB of bools, and
    # padded, compared and tested whole it held three such copies at once (the 405B projection's peak RSS);
    # stacked heads (``rows`` query rows each) repeat one head's mask down the block's rows
    for mi in range(states.shape[1]):
        idx = torch.arange(mi * PMAX, min((mi + 1) * PMAX, M))
        block = base[:, idx % rows] if not any(lead) else base[:, idx]
        r = block.shape[1]
        masked = F.pad(block, (0, pn), value=True).view(-1, r, NB, MOVING_FMAX).all(3).all(1)
        clean = ~F.pad(block, (0, pn), value=False).view(-1, r, NB, MOVING_FMAX).any(3).any(1)
        row_states = states[:, mi]
        row_states[masked], row_states[clean] = MASKED, CLEAN
        if causal:
            causal = bool((block == (keys > (idx % rows)[:, None] + offset)).all())
    return ConstMask(f, states, offset if causal else None, rows)


def _drop_dead(low: Lowerer, name: str, gone: set[str]) -> None:
    """Mark ``name`` (and what only it reads) lowered when nothing but ``gone`` reads it: a mask the flash
    loop folded in is never computed."""
    n = low.by_name[name]
    host = low.by_name.get(n.fused_into) if n.fused_into else n
    group = [host, *low.fused.get(host.name, [])] if host is not None else []
    names = {g.name for g in group}
    if (name not in names or host.name in low.done or host.name not in low.in_part
            or any(low._escapes(g) or not low._consumers(g) <= gone | names for g in names)):
        return          # lowered already, or another value needs it (or its fusion group)
    low.done.update(names)
    low.finished.update(names)
    for g in group:
        for a in g.args:
            if is_ref(a) and a["node"] not in names:
                _drop_dead(low, a["node"], gone | names)


class FlashAttention:
    """``softmax(alpha * Q K^T + mask) @ V`` one 128-query block at a time, the scores never leaving
    the chip (NKI's ``flash_fwd``, sample_workloads/nki/flash_attention.py): per key block of one PSUM
    bank, the scores' epilogue (scale, mask), a running row max ``m`` and sum ``l``, ``p = exp(s - m)``
    transposed on the PE array into the stationary of ``p @ V``, and the output accumulator rescaled
    by ``exp(m_old - m)``; at the end ``o / l`` (0 for a row of only masked keys, as the
    decomposition's guard) goes through the second matmul's epilogue. SBUF holds O(128 x (D + 512))
    per block however long the sequence: no [S, S] score matrix in HBM."""

    def __init__(self, low: Lowerer, n: Node, fl: FlashMatch, q: View, kt: View, v: View, alpha, members,
                 hshape, qk_dt: str, pv_dt: str, evac_dt: str, transpose):
        self.low, self.n, self.fl, self.q, self.kt, self.v, self.alpha = low, n, fl, q, kt, v, alpha
        self.transpose = transpose      # matmul.transpose_to (PE-array transpose through PSUM)
        self.members, self.hshape, self.qk_dt, self.pv_dt, self.evac_dt = members, hshape, qk_dt, pv_dt, evac_dt
        self.steps = self._score_steps()

    @property
    def possible(self) -> bool:
        """Every step on the scores is tile-wise in this layout (else the caller lowers the attention unfused)."""
        return self.steps is not None

    def _load(self, v: View, box, pool: Pool) -> Tile:
        """DMA a box into ``pool``'s dtype (a staging tile and a ScalarE copy when it differs)."""
        low, name = self.low, self.n.name
        if v.dtype == pool.dtype:
            return low.load(name, v, box, pool, 1)
        stage = low.load(name, v, box, self.stage(v.dtype), 1)
        t = pool.tile(stage.P, stage.F)
        low.act(name, t, stage.op(), "copy")
        return t

    def stage(self, dtype: str) -> Pool:
        if dtype not in self.stages:
            self.stages[dtype] = Pool(self.low, f"{self.n.name}.fa.ld{dtype}", "sbuf", PMAX, MOVING_FMAX, dtype, 4)
        return self.stages[dtype]

    def _transposed(self, v2: View, r0: int, rn: int, cn: int, pool: Pool) -> Tile:
        """Tile [cn, rn] = v2[r0:r0+rn, :cn].T: natural loads, PE transposes (cast on evacuation)."""
        t = pool.tile(cn, rn)
        for rr in range(0, rn, PMAX):
            rl = min(PMAX, rn - rr)
            src = self.low.load(self.n.name, v2, [(r0 + rr, rl), (0, cn)], self.stage(v2.dtype), 1)
            self.transpose(self.low, self.n.name, src, t.cols(rr, rl), self.tp)
        return t

    def _operand(self, v2: View, r0: int, rn: int, pool: Pool) -> Tile:
        """[K, rn] tile of the [K, R] view ``v2`` (direct when its rows are contiguous)."""
        K = v2.shape[0]
        if v2.meta.stride()[-1] == 1 or rn == 1:
            return self._load(v2, [(0, K), (r0, rn)], pool)
        return self._transposed(v2.with_meta(v2.meta.t()), r0, rn, K, pool)

    def _score_steps(self):
        """The mask and the tile-wise steps on the scores: ``(mask, folded, pre, clean)``, ``pre`` the steps on a
        block the mask touches, ``clean`` on a block it does not; ``folded``: the mask is causal with an offset,
        applied as an ``AFFINE_SELECT`` (:meth:`run` drops its nodes). None when a step is not tile-wise (a mask
        shared by the heads has no layout over rows that stack a grouped-query group's heads)."""
        low, fl = self.low, self.fl
        prev, layout = (self.members[-1].node.name, self.members[-1].layout) if self.members \
            else (self.n.name, meta_tensor(self.hshape))
        # the bmm's own rows are one head's queries; hshape's may stack a group's heads (kvread.py)
        mask = const_mask(low, [m.node for m in self.members] + fl.pre, self.n.name, self.hshape,
                          self.n.outputs[0].shape[-2])
        folded = mask is not None and mask.offset is not None
        # the steps on a block the mask touches, on a block it does not
        pre = [m for m in self.members if not (folded and m.node is mask.node)]
        clean = [m for m in self.members if mask is None or m.node is not mask.node]
        for f in fl.pre:
            if folded and f is mask.node:
                prev = f.name   # an AFFINE_SELECT instead; it read the previous value as is: same layout
                continue
            m = _member(low, f, prev, layout, self.hshape)
            if m is None:
                return None
            pre.append(m)
            if mask is None or f is not mask.node:
                clean.append(m)
            prev, layout = f.name, m.layout
        return mask, folded, pre, clean

    def run(self) -> None:
        low, name, fl = self.low, self.n.name, self.fl
        nb, M, N = self.hshape
        K, D = self.q.shape[-1], self.v.shape[-1]
        pv = fl.pv
        low.done.add(pv.name)
        low.done.update(x.name for x in fl.skip)
        mask, folded, pre, clean = self.steps
        if folded:
            _drop_dead(low, mask.node.args[0]["node"], {mask.node.name} | {x.name for x in fl.skip})
        members2, alone2 = epilogue_chain(low, pv)
        low.done.update(m.node.name for m in members2)
        oshape2 = tuple(pv.outputs[0].shape)
        outs2 = {k: reshape_view(x, (nb, M, D)) for k, x in chain_outputs(low, pv, members2, oshape2).items()}
        members2 = [m.reshaped((nb, M, D)) for m in members2]
        self.stages: dict[str, Pool] = {}
        self.tp = Pool(low, f"{name}.fa.tp", "psum", PMAX, PMAX, "float32", bufs=2)
        qpool = Pool(low, f"{name}.fa.q", "sbuf", PMAX, PMAX, self.qk_dt, bufs=2)
        kpool = Pool(low, f"{name}.fa.k", "sbuf", PMAX, MOVING_FMAX, self.qk_dt, bufs=2)
        vpool = Pool(low, f"{name}.fa.v", "sbuf", PMAX, D, self.pv_dt, bufs=4)
        ppool = Pool(low, f"{name}.fa.p", "sbuf", PMAX, MOVING_FMAX, self.pv_dt, bufs=2)
        ptpool = Pool(low, f"{name}.fa.pt", "sbuf", PMAX, PMAX, self.pv_dt, bufs=4)
        spool = Pool(low, f"{name}.fa.s", "psum", PMAX, MOVING_FMAX, "float32", bufs=2)
        opsum = Pool(low, f"{name}.fa.ops", "psum", PMAX, D, "float32", bufs=2)
        acc = Pool(low, f"{name}.fa.acc", "sbuf", PMAX, D, "float32", bufs=2)
        mpool = Pool(low, f"{name}.fa.m", "sbuf", PMAX, 1, "float32", bufs=2)    # running max: old and new
        lpool = Pool(low, f"{name}.fa.l", "sbuf", PMAX, 1, "float32", bufs=2)
        small = Pool(low, f"{name}.fa.sm", "sbuf", PMAX, 1, "float32", bufs=8)
        epi = {"__F": MOVING_FMAX, "__bufs": 4}
        epi2 = {"__F": D, "__bufs": 4}
        for b in range(nb):
            qT = self.q.with_meta(self.q.meta[b].t())       # [K, M]
            kT = self.kt.with_meta(self.kt.meta[b])         # [K, N]
            vb = self.v.with_meta(self.v.meta[b])           # [N, D]
            for m0 in range(0, M, PMAX):
                mp = min(PMAX, M - m0)
                qt = self._operand(qT, m0, mp, qpool)
                m, l, o = mpool.tile(mp, 1), lpool.tile(mp, 1), acc.tile(mp, D)
                # finite: exp(m_old - m) of a masked row is 1, not NaN
                low.vec("MEMSET", name, m, [], value=_MAX_START)
                low.vec("MEMSET", name, l, [], value=0.0)
                low.vec("MEMSET", name, o, [], value=0.0)
                for n0 in range(0, N, MOVING_FMAX):
                    nw = min(MOVING_FMAX, N - n0)
                    state = MIXED if mask is None else mask.state(b, m0 // PMAX, n0 // MOVING_FMAX)
                    if state == MASKED:
                        continue
                    kt = self._operand(kT, n0, nw, kpool)
                    ps = spool.tile(mp, nw)
                    low.emit("LDWEIGHTS", name, [], [qt.op()], {}, dur=ldweights_ns(low.p, mp, self.qk_dt))
                    low.emit("MATMUL", name, [ps.op()], [qt.op(), kt.op()], {"start": True, "stop": True},
                             dur=matmul_ns(low.p, nw, mp, self.qk_dt), flops=2 * K * mp * nw, itype="REGULAR",
                             small=False)
                    box = [(b, 1), (m0, mp), (n0, nw)]
                    ctx = TileCtx(low, self.hshape, box, 2, epi)
                    s = ctx.out_tile(name, "evac", self.evac_dt)
                    low.act(name, s, ps.op(), "copy", scale=self.alpha)
                    s = run_chain(ctx, name, s, clean if state == CLEAN else pre, {})
                    for p0, pn, q0 in mask.segments(m0, mp) if state == MIXED and folded else ():
                        # keep key n0 + f for query q0 + p where q0 + p + offset - (n0 + f) >= 0 (one select per
                        # head the block's rows hold); the fill is below the running max's start, so its exp is
                        # 0 as -inf's (and the operands stay JSON)
                        seg = s.rows(p0, pn) if pn < mp else s
                        low.emit("AFFINE_SELECT", mask.node.name, [seg.op()], [seg.op()],
                                 {"cmp": "greater_equal", "channel_multiplier": 1, "step": -1,
                                  "base": q0 + mask.offset - n0, "on_true": 1.0, "on_false": _MASKED_SCORE},
                                 dur=gpsimd_ns(low.p, nw))
                    mb, negm, corr, rs = (small.tile(mp, 1) for _ in range(4))
                    low.vec("REDUCE", fl.softmax.name, mb, [s.op()], op="max", cost_n=nw)
                    mn = mpool.tile(mp, 1)
                    low.vec("TENSOR_TENSOR", fl.softmax.name, mn, [m.op(), mb.op()], n_inputs=2, op="maximum")
                    low.vec("TENSOR_SCALAR", fl.softmax.name, negm, [mn.op()], op0="multiply", scalar0=-1.0)
                    low.act(fl.softmax.name, corr, m.op(), "exp", bias=negm.op())
                    p = ppool.tile(mp, nw)
                    low.act(fl.softmax.name, p, s.op(), "exp", bias=negm.op(), acc=rs.cols(0, 1),
                            flops=2 * mp * nw)
                    low.vec("TENSOR_SCALAR", fl.softmax.name, l, [l.op(), corr.op()], op0="multiply",
                            scalar0={"src": 1})
                    low.vec("TENSOR_TENSOR", fl.softmax.name, l, [l.op(), rs.op()], n_inputs=2, op="add")
                    m = mn
                    ops = opsum.tile(mp, D)
                    for c0 in range(0, nw, PMAX):
                        cw = min(PMAX, nw - c0)
                        pt = ptpool.tile(cw, mp)
                        self._transpose(p.cols(c0, cw), pt)
                        vt = self._load(vb, [(n0 + c0, cw), (0, D)], vpool)
                        low.emit("LDWEIGHTS", pv.name, [], [pt.op()], {}, dur=ldweights_ns(low.p, mp, self.pv_dt))
                        low.emit("MATMUL", pv.name, [ops.op()], [pt.op(), vt.op()],
                                 {"start": c0 == 0, "stop": c0 + cw >= nw}, dur=matmul_ns(low.p, D, mp, self.pv_dt),
                                 flops=2 * cw * mp * D, itype="REGULAR", small=False)
                    low.vec("TENSOR_SCALAR", pv.name, o, [o.op(), corr.op()], op0="multiply", scalar0={"src": 1})
                    low.vec("TENSOR_TENSOR", pv.name, o, [o.op(), ops.op()], n_inputs=2, op="add", flops=mp * D)
                r = small.tile(mp, 1)
                if fl.zero_masked:      # l = 0 only where every key was masked (then o = 0): o / max(l, tiny) = 0
                    low.vec("TENSOR_SCALAR", pv.name, r, [l.op()], op0="maximum", scalar0=1e-30)
                    low.vec("RECIPROCAL", pv.name, r, [r.op()])
                else:
                    low.vec("RECIPROCAL", pv.name, r, [l.op()])
                ctx2 = TileCtx(low, (nb, M, D), [(b, 1), (m0, mp), (0, D)], 2, epi2)
                y = ctx2.out_tile(pv.name, "evac", pv.outputs[0].dtype if not members2 else "float32")
                low.vec("TENSOR_SCALAR", pv.name, y, [o.op(), r.op()], op0="multiply", scalar0={"src": 1},
                        flops=mp * D)
                run_chain(ctx2, pv.name, y, members2, outs2)
        done = [x.name for x in fl.skip] + [pv.name] + [m.node.name for m in members2]
        low.finished.update(done)
        lower_alone(low, alone2)
        low._release_finished(pv.name)

    def _transpose(self, src: Tile, dst: Tile) -> None:
        self.transpose(self.low, self.fl.pv.name, src, dst, self.tp)
