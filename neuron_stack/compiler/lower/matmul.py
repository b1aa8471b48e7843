"""Matmul on the Tensor Engine: stationary <=128x128 (``LDWEIGHTS``), moving <=512 free elements
accumulating in one PSUM bank, transposes through the PE array, the fused epilogue on evacuation.
"""
from __future__ import annotations

from neuron_stack.compiler.lower.attention import (
    FlashAttention,
    SoftmaxEpilogue,
    flash_attention,
    fusable_softmax,
)
from neuron_stack.compiler.lower.chain import TileCtx, chain_outputs, epilogue_chain, run_chain
from neuron_stack.compiler.lower.common import broadcast_view, reshape_view, transpose_to
from neuron_stack.compiler.lower.custom import lower_custom
from neuron_stack.compiler.lower.kvread import lane_batches, repeat_kv_operands
from neuron_stack.compiler.lower.lowerer import QUANTIZED_DTYPES, Lowerer
from neuron_stack.compiler.lower.quantized import casts_in_flight, scale_after_lanes, scale_on_evacuation
from neuron_stack.compiler.lower.registry import lower_alone, lowering
from neuron_stack.compiler.lower.resident import lane_layout
from neuron_stack.compiler.lower.tiles import (
    FLOATS,
    MOVING_FMAX,
    PMAX,
    STAT_FMAX,
    Pool,
    Tile,
    View,
    nbytes_of,
    packet_name,
    view_operand,
)
from neuron_stack.device.cost import ceil_div, dma_efficiency, ldweights_ns, matmul_ns
from neuron_stack.ir import Node


def matmul_operands(low: Lowerer, n: Node):
    """(A [..,M,K], B [..,K,N], bias or None, alpha, beta, batched) as views, or None."""
    name = packet_name(n.target)
    a = n.args
    try:
        if name == "mm":
            A, B, C, alpha, beta = low.value(a[0]), low.value(a[1]), None, 1, 1
        elif name == "addmm":
            C, A, B = low.value(a[0]), low.value(a[1]), low.value(a[2])
            beta, alpha = n.kwargs.get("beta", 1), n.kwargs.get("alpha", 1)
        elif name == "bmm":
            A, B, C, alpha, beta = low.value(a[0]), low.value(a[1]), None, 1, 1
        elif name == "baddbmm":
            C, A, B = low.value(a[0]), low.value(a[1]), low.value(a[2])
            beta, alpha = n.kwargs.get("beta", 1), n.kwargs.get("alpha", 1)
        elif name in ("mv", "addmv"):
            off = 1 if name == "addmv" else 0
            A, x = low.value(a[off]), low.value(a[off + 1])
            B = x.with_meta(x.meta.unsqueeze(-1))
            C = low.value(a[0]) if name == "addmv" else None
            beta, alpha = n.kwargs.get("beta", 1), n.kwargs.get("alpha", 1)
        elif name == "dot":
            x, y = low.value(a[0]), low.value(a[1])
            A, B, C, alpha, beta = x.with_meta(x.meta.unsqueeze(0)), y.with_meta(y.meta.unsqueeze(-1)), None, 1, 1
        else:
            return None
    except (KeyError, IndexError, TypeError):
        return None
    return A, B, C, alpha, beta


def group_chunks(r0: int, rn: int, D: int = 0, step: int = PMAX) -> list[tuple[int, int]]:
    """``(offset from r0, rows)`` chunks of rows ``r0 .. r0+rn``: at most ``step`` rows, cut where a group of ``D``
    rows ends (``D`` = 0: no groups).

    >>> group_chunks(0, 258, 129)
    [(0, 128), (128, 1), (129, 128), (257, 1)]
    """
    out, rr = [], 0
    while rr < rn:
        n = min(step, rn - rr)
        if D:
            n = min(n, D - (r0 + rr) % D)
        out.append((rr, n))
        rr += n
    return out


def row_chunks(low: Lowerer, v2: View, r0: int, rn: int) -> list[tuple[int, int]]:
    """Rows ``r0 .. r0+rn`` of the 2-D ``v2`` in chunks of at most 128, also cut where a group of the resident
    value it reads ends (a flattened [batch x 197, C] operand whose batches start new row blocks): each chunk is
    read in place from one block, where a 128-row chunk straddling two would be two SBUF->SBUF DMAs.

    ``(offset from r0, rows)`` pairs, as :func:`group_chunks`."""
    r = low.res.get(v2.buf)
    st = v2.meta.stride()
    D = r.D if r is not None and not r.evicted and st[-1] == 1 and st[0] == r.C else 0
    return group_chunks(v2.meta.storage_offset() // r.C + r0 if D else r0, rn, D)


def lane_operand(low: Lowerer, A: View, B: View) -> bool:
    """True when a matmul's stationary operand ``A`` [M, K] is a value SBUF keeps in the lane layout (a decode
    step's normalised hidden state: element ``k`` of a row on partition ``k // (K / 128)``) and the weight ``B``
    [K, N] is stored K-major (not K-tiled): then the contraction runs in that order, K-tile ``j`` being
    column ``j`` of every partition: A^T is read in place (no transpose, no one-element descriptors) and the
    weight's K-tile ``j`` is rows ``p * K / 128 + j``, ``N`` contiguous elements per partition."""
    r = low.res.get(A.buf)
    if r is None or r.evicted or A.meta.dim() != 2 or not A.meta.is_contiguous() or A.meta.storage_offset():
        return False
    lanes = lane_layout(A.shape)
    return lanes is not None and (r.C, r.T) == lanes and lanes[0] * PMAX == A.shape[1] \
        and B.buf not in low.const_ktiled and B.meta.dim() == 2 and B.meta.stride()[1] == 1 \
        and B.meta.stride()[0] == B.shape[1] and not B.meta.storage_offset()


def lane_predicted(low: Lowerer, A: View) -> bool:
    """Before lowering (weight layouts, ``constants.prepare_constants``): ``A`` will be kept in the lane layout."""
    n = low.by_name.get(A.buf)
    return n is not None and bool(n.outputs) and A.meta.dim() == 2 and A.meta.is_contiguous() \
        and not low._escapes(A.buf) and low.lanes_for(A.buf, n.outputs[0].shape)


def kgroup_of(nk: int, N: int, dtype: str) -> int:
    """K-tiles of a K-tiled weight [128, nk, N] one DMA brings: >= 4 KiB a partition (the DMA guide's saturating
    size), at most all of them.

    >>> kgroup_of(64, 448, "bfloat16"), kgroup_of(2, 128, "bfloat16")
    (5, 2)
    """
    return min(nk, ceil_div(4096, N * nbytes_of(dtype)))


def resident_columns(nk: int, N: int, es: int, room: int) -> int:
    """Columns of a weight [K, N] (``nk`` K-tiles, ``es`` bytes an element) that stay resident in ``room`` bytes per
    partition: all ``N`` when they fit, else the widest multiple of 128 that does (0: none, the weight streams).

    >>> resident_columns(64, 448, 2, 60_000), resident_columns(64, 2004, 2, 60_000), resident_columns(512, 128, 2, 9)
    (448, 384, 0)
    """
    if nk * N * es <= room:
        return N
    return room // (nk * es) // PMAX * PMAX


@lowering("matmul", ops=("mm", "addmm", "bmm", "baddbmm", "mv", "dot", "addmv"), op_classes=("matmul",))
def lower_matmul(low: Lowerer, n: Node) -> None:
    """out[M,N] = A[M,K] @ B[K,N] (batched for bmm): stationary A^T tiles [K<=128, M<=128],
    moving B tiles [K<=128, N<=512] accumulating over K in PSUM banks, evacuated through the
    epilogue (alpha, bias, fused activations) to SBUF and stored."""
    ops = repeat_kv_operands(low, n) or matmul_operands(low, n)
    if ops is None:
        lower_custom(low, n)
        return
    members, alone = epilogue_chain(low, n)
    if members and scale_after_lanes(low, n, ops[1], members):
        members, alone = [], [m.node for m in members] + alone
    if ops[0].meta.dim() > 3 or ops[1].meta.dim() > 3:
        lower_custom(low, n)
        lower_alone(low, alone)
        return
    mm = Matmul(low, n, ops, members)
    if mm.flash(alone):
        return
    mm.epilogue()
    mm.plan()
    mm.pools()
    mm.emit()
    lower_alone(low, alone)


class Matmul:
    """One matmul's lowering, in the order a reader follows it: the operands and the fused epilogue
    (:meth:`epilogue`), the tiling choice (:meth:`plan`), the SBUF/PSUM pools it needs (:meth:`pools`), and
    the instructions (:meth:`emit`: per batch, a streamed N-outer order or a sweep of M over a resident panel)."""

    def __init__(self, low: Lowerer, n: Node, ops, members):
        self.low, self.n = low, n
        A, B, C, self.alpha, self.beta = ops
        self.A, self.B, self.C, self.members = A, B, C, members
        self.oshape = tuple(n.outputs[0].shape)
        self.batched = A.meta.dim() == 3
        self.M, self.K, self.N = A.shape[-2], A.shape[-1], B.shape[-1]
        self.nb = A.shape[0] if self.batched else 1
        mm_dt = low.cast_type if low.auto_cast in ("matmult", "all") and A.dtype == "float32" else A.dtype
        self.mm_dt = mm_dt if mm_dt in FLOATS else "float32"
        self.out_dt = n.outputs[0].dtype
        self.hshape = (self.nb, self.M, self.N)       # the output as [nb, M, N] (dot/mv produce fewer dims)
        self.last = members[-1].node.name if members else n.name
        self.sm = fusable_softmax(low, self.last, self.N) if self.M and self.N else None
        self.out_views = chain_outputs(low, n, members, self.oshape)

    def flash(self, alone) -> bool:
        """Lower ``softmax(Q K^T) @ V`` as flash attention when this matmul is its ``Q K^T`` (True: done).

        Flash wherever a head has more than one query row (a prompt or an encoder's sequence, however short:
        the loop takes a partial query block as NKI's ``flash_fwd`` takes its last one): the mask, the
        softmax and ``P V`` then run on the score tiles in SBUF, where the unfused path writes the masked
        scores and the probabilities out and reads them back between passes. Token generation's one query row
        per head keeps the batched score tiles (NxDI's token generation is no flash kernel either:
        ``attention_base.py`` ``compute_for_token_gen``)."""
        low, n, A, B, last = self.low, self.n, self.A, self.B, self.last
        fl = flash_attention(low, last, self.N) if self.batched and self.sm is None and self.C is None \
            and not alone and self.K <= PMAX and n.outputs[0].shape[-2] > 1 else None
        V = low.value(fl.pv.args[1]) if fl is not None else None     # not args[0]: that would lower the softmax
        if V is None or not set(self.out_views) <= {last} or not B.meta.dim() == V.meta.dim() == 3 \
                or V.shape[-1] > MOVING_FMAX:
            return False
        pv_dt = low.cast_type if low.auto_cast in ("matmult", "all") and V.dtype == "float32" else V.dtype
        fa = FlashAttention(low, n, fl, A, B, V, self.alpha, self.members, self.hshape, self.mm_dt,
                            pv_dt if pv_dt in FLOATS else "float32", "float32" if self.members else self.out_dt,
                            transpose_to)
        if not fa.possible:
            return False
        low.hbm.pop(last, None), low.cand.pop(last, None)     # the scores never leave the chip
        fa.run()
        return True

    def epilogue(self) -> None:
        """The evacuation's operands: a fused softmax's state, the outputs and chain members as [nb, M, N], the
        bias broadcast to it."""
        low, hshape, oshape, C = self.low, self.hshape, self.oshape, self.C
        if self.sm is not None:
            self.out_views.pop(self.last, None)   # the scores stay in PSUM/SBUF: only probabilities are stored
            low.hbm.pop(self.last, None), low.cand.pop(self.last, None)
            self.sm = SoftmaxEpilogue(low, self.n.name, self.sm, hshape)
        self.out3 = {k: reshape_view(v, hshape) for k, v in self.out_views.items()}
        self.members = [m.reshaped(hshape) for m in self.members]
        if any(m is None for m in self.members):
            raise AssertionError("matmul epilogue operands are contiguous reshapes of the output")
        Cv = None
        if C is not None:
            Cv = reshape_view(broadcast_view(C, oshape), hshape) if oshape != hshape else broadcast_view(C, oshape)
            if Cv is not None and Cv.meta.dim() == 2:
                Cv = Cv.with_meta(Cv.meta.unsqueeze(0))
        self.Cv = Cv

    def plan(self) -> None:
        """The tiling: column groups ``NG`` and row groups ``MG``, which operands load as stored (``a_direct``,
        ``b_direct``) or transpose on the PE array, whether the moving panel stays resident, the decode lane
        layout, and whether the rows sweep a resident block of columns (:meth:`_sweep_choice`)."""
        low, A, B, M, K, N, nb = self.low, self.A, self.B, self.M, self.K, self.N, self.nb
        self.A3 = A3 = A if self.batched else A.with_meta(A.meta.unsqueeze(0))
        self.B3 = B if B.meta.dim() == 3 else B.with_meta(B.meta.unsqueeze(0).expand(nb, K, N))
        self.nk = nk = ceil_div(K, PMAX)
        self.NG = NG = min(N, 2 * MOVING_FMAX)
        self.MG = min(M, 4 * STAT_FMAX)
        # A^T rows are contiguous along M; a one-row A that SBUF holds where the PE array can read it is transposed
        # there, not DMA'd one element per partition (a copy of single elements is not a DMA: docs/cost_model.md)
        ra = low.res.get(A.buf)
        self.a_inplace = M == 1 and ra is not None and not ra.evicted and low._resident_tile(
            ra, A3.with_meta(A3.meta[0]), [(0, 1), (0, min(K, PMAX))], 1) is not None
        self.a_direct = A3.meta.stride()[-2] == 1 or M == 1 and not self.a_inplace
        self.b_direct = self.B3.meta.stride()[-1] == 1 or N == 1
        # pools (SBUF bytes per partition; PSUM banks)
        self.es = es = nbytes_of(self.mm_dt)
        self.b_bytes = b_bytes = nk * NG * es
        self.budget = budget = low.sbuf.cap          # the tile-pool ring (the rest of SBUF holds resident values)
        self.panel_resident = b_bytes <= budget // 2
        # double-buffer the moving panel when two fit: the next panel loads while this one multiplies
        # a streamed panel (weights too big to hold: decode, wide MLPs) keeps up to 16 tiles in flight,
        # one per DMA queue, as the DMA guide's "16 transfers x 8 buffers" (3 left 13 queues idle)
        self.streamed = streamed = max(3, min(16, nk, (budget // 2) // max(1, NG * es)))
        self.panel_bufs = (2 * nk if 2 * b_bytes <= budget // 2 else nk) if self.panel_resident else streamed
        self.lanes = lane_operand(low, A, B) if not self.batched else lane_batches(low, A3, self.B3)
        # stores are slow next to one bank's evacuation: enough output slots to keep PSUM draining
        self.epi_pools = {"__F": min(NG, MOVING_FMAX), "__bufs": 6}
        self._sweep_choice()
        if self.sweep and not self.a_direct:
            self.MG = STAT_FMAX     # the panel is resident: x^T blocks of several row chunks would reuse nothing
        # a K-tiled weight (constants.prepare_constants): g K-tiles per DMA, each partition's g x N elements
        # contiguous, so the DMA guide's >= 4 KiB per partition is reached where one [128, N] tile had N x 2 B
        self.kgroup = 0
        if B.buf in low.const_ktiled and self.b_direct and N <= NG and not B.meta.storage_offset():
            self.kgroup = kgroup_of(nk, min(N, self.NB), B.dtype)

    def _sweep_choice(self) -> None:
        """Whether the rows sweep a resident block of ``NB`` weight columns (``sweep``), with x^T read ``xg``
        K-tiles per load and ``xbufs`` x^T buffers.

        Several 128-row blocks (a prefill's projections, x [tokens, K] @ W [K, N]): as the NKI matmul tutorial's
        optimisations (aws-neuron-sdk nki/guides/tutorials/matrix_multiplication.rst: hoist the loads out of the
        inner loop, block the free dimensions so a block of the moving operand stays in SBUF and every row block
        reuses it) the weight, or the widest block of its columns that fits beside the x^T tiles, staging and the
        epilogue's pools, is loaded once for the whole sweep of M; each block of columns costs one more read of x,
        where streaming re-read the whole weight for each 128-row block (79 times for 10,000 tokens)."""
        low, A, B, M, K, N = self.low, self.A, self.B, self.M, self.K, self.N
        nk, NG, MG, es, mm_dt, a_direct = self.nk, self.NG, self.MG, self.es, self.mm_dt, self.a_direct
        self.NB, self.xg, self.xbufs = N, 1, 1
        # only where streaming is DMA-bound: its HBM bytes (x once per NG columns, the weight once per 128-row block
        # unless resident, each over its DMAs' efficiency) under the roofline's ridge ("memory bound region"); a
        # compute-bound matmul keeps the N-outer order, whose next panel loads while this one multiplies
        x_run = MG * es if a_direct else min(K, PMAX) * nbytes_of(A.dtype)
        w_run = (kgroup_of(nk, N, B.dtype) * N if B.buf in low.const_ktiled else NG if self.b_direct else PMAX) \
            * nbytes_of(B.dtype)
        streamed_bytes = M * K * nbytes_of(A.dtype) * ceil_div(N, NG) / dma_efficiency(low.p, x_run) \
            + K * N * nbytes_of(B.dtype) * (1 if self.panel_resident else ceil_div(M, STAT_FMAX)) \
            / dma_efficiency(low.p, w_run)
        ridge = low.p.tensor_peak_flops(mm_dt) / (low.p.dma_bytes_per_ns * 1e9)      # FLOPs per byte
        self.sweep = not self.lanes and M > STAT_FMAX and 2 * M * K * N < ridge * streamed_bytes
        if not self.sweep:
            return
        # x^T tiles of one row block (all K, rolling): 128 rows from natural x loads of xg K-tiles, 4 KiB a
        # partition (the DMA guide's saturating size); x^T as stored keeps blocks of 512 rows (1 KiB a partition)
        self.xg = xg = 1 if a_direct else min(nk, max(1, 4096 // (PMAX * nbytes_of(A.dtype))))
        Cv, epi_pools = self.Cv, self.epi_pools
        epi_dts = [self.out_dt if not self.members else "float32"] + ([Cv.dtype] * 2 if Cv is not None else []) \
            + [d for m in self.members for d in ["float32", *(v.dtype for v in m.extras.values())]]
        staging = (0 if a_direct else 2 * xg * PMAX * nbytes_of(A.dtype)) \
            + (0 if self.b_direct else 16 * PMAX * nbytes_of(A.dtype))
        if A.dtype != mm_dt or B.dtype != mm_dt:
            staging += (self.streamed if B.dtype in QUANTIZED_DTYPES else 2) * max(NG, MG) * nbytes_of(A.dtype)
        xt = nk * (MG if a_direct else STAT_FMAX) * es
        room = self.budget - xt - staging \
            - sum(nbytes_of(d) for d in epi_dts) * epi_pools["__bufs"] * epi_pools["__F"]
        self.NB = NB = resident_columns(nk, N, es, room)
        # and only when it is quicker: x read once per column block and the weight once (efficiency-weighted
        # bytes at the DMA rate), plus the Tensor Engine transposing x again for each column block beyond the
        # streamed order's NG-column passes (a 405B gate, N = 832 in 128-column blocks: seven passes of
        # 10,112 transposes, more time than the weight re-reads they save, and 3x the instructions)
        x_run = (MG * es if a_direct else xg * PMAX * nbytes_of(A.dtype))
        passes = ceil_div(N, NB) if NB else 0
        retranspose_ns = 0 if a_direct else max(0, passes - ceil_div(N, NG)) * ceil_div(M, PMAX) * nk * (
            ldweights_ns(low.p, PMAX, mm_dt) + matmul_ns(low.p, PMAX, PMAX, mm_dt))
        self.sweep = NB > 0 and (M * K * nbytes_of(A.dtype) * passes / dma_efficiency(low.p, x_run)
                                 + K * N * nbytes_of(B.dtype) / dma_efficiency(low.p, w_run)) / low.p.dma_bytes_per_ns \
            + retranspose_ns < streamed_bytes / low.p.dma_bytes_per_ns
        # double-buffer x^T (the next block loads while this one multiplies) when that costs no column block
        if self.sweep and ceil_div(N, max(1, resident_columns(nk, N, es, room - xt))) == ceil_div(N, NB):
            self.xbufs, self.NB = 2, resident_columns(nk, N, es, room - xt)

    def pools(self) -> None:
        """The SBUF and PSUM pools the plan needs (created in this order: pool order places them)."""
        low, name, A, B, N, nk = self.low, self.n.name, self.A, self.B, self.N, self.nk
        NG, MG, mm_dt, es, budget, sweep = self.NG, self.MG, self.mm_dt, self.es, self.budget, self.sweep
        if self.lanes:
            # a decode step's x^T read in place, K-tile j = column j of the lane layout; the weight's K-tile j is
            # its rows p * nk + j: g K-tiles per DMA are g x N contiguous elements per partition
            self.Al, self.Bl = self.lane_views(A, B) if not self.batched else (None, None)    # (per batch)
            self.lgroup = min(nk, max(1, 4096 // (N * nbytes_of(mm_dt)))) if N <= NG else 1
            groups = ceil_div(nk, self.lgroup)
            # the moving panel's pool (in its place): a resident panel keeps every group (two panels when they
            # fit), a streamed one keeps as many transfers in flight; casts of a quantized weight go to bpool
            lbufs = (2 * groups if 2 * self.b_bytes <= budget // 2 else groups) if self.panel_resident \
                else max(2, self.streamed // self.lgroup)
            # (a quantized weight's group may land cast by its DMA: room for the matmul dtype)
            self.lpool = Pool(low, f"{name}.Bl", "sbuf", PMAX, self.lgroup * NG,
                              mm_dt if B.dtype in QUANTIZED_DTYPES else B.dtype, bufs=lbufs)
        if sweep:
            # the panel: every K-tile of every NG-column group of a block (K-tiled groups hold it in gpool)
            self.bpool = Pool(low, f"{name}.B", "sbuf", PMAX, NG, mm_dt, bufs=nk * ceil_div(self.NB, NG)) \
                if self.kgroup <= 1 or B.dtype != mm_dt else None
            self.atpool = Pool(low, f"{name}.AT", "sbuf", PMAX, MG, mm_dt, bufs=self.xbufs * nk)
        else:
            # a quantized weight's converted K-tiles are read once, by the next MATMUL: a few slots keep the
            # conversions ahead of the Tensor Engine without holding a second, bf16 copy of the panel in SBUF
            cast_bufs = min(self.panel_bufs, 6) if B.dtype in QUANTIZED_DTYPES else self.panel_bufs
            self.bpool = Pool(low, f"{name}.B", "sbuf", PMAX, NG, mm_dt, bufs=cast_bufs) \
                if not self.lanes or B.dtype != mm_dt else None
            self.atpool = Pool(low, f"{name}.AT", "sbuf", PMAX, MG, mm_dt,
                               bufs=min(2 * nk, max(2, (budget // 4) // (MG * es))))
        self.acc_pool = Pool(low, f"{name}.acc", "psum", PMAX, NG, "float32", bufs=2)
        transposes = not (self.a_direct and self.b_direct or self.lanes)
        self.tp_pool = Pool(low, f"{name}.tp", "psum", PMAX, PMAX, "float32", bufs=2) if transposes else None
        # (a resident one-row A is read in place: its natural tiles take no DMA slots)
        self.nat_pool = Pool(low, f"{name}.nat", "sbuf", PMAX, PMAX, A.dtype,
                             bufs=1 if self.a_inplace and self.b_direct else 16) \
            if transposes and not (sweep and self.b_direct) else None
        self.xnat_pool = Pool(low, f"{name}.xn", "sbuf", PMAX, self.xg * PMAX, A.dtype, bufs=2) \
            if sweep and not self.a_direct else None
        self.ld_pool = None
        # (a quantized weight read in the lane layout or K-tiled converts from its own group tiles: no staging,
        # whose 16 slots would otherwise hold SBUF the next matmuls' weight loads could stream into)
        if (self.a_direct or self.b_direct) and (A.dtype != mm_dt or B.dtype != mm_dt and not self.lanes
                                                  and self.kgroup <= 1):
            # a quantized weight streams through its staging tiles: as many in flight as the panel's
            self.ld_pool = Pool(low, f"{name}.ld", "sbuf", PMAX, max(NG, MG), A.dtype,
                                bufs=self.streamed if B.dtype in QUANTIZED_DTYPES else 2)
        # the output's rows come in groups (a flattened [batch x 197, N]): chunks of output rows stop at a group's
        # end, so each evacuated tile is one block of the resident output (resident.row_layout)
        self.out_group = 0
        for v in self.out_views.values():
            C, _, D = low.row_layout(v.buf, low.hbm.get(v.buf, {}).get("shape", ()))
            self.out_group = self.out_group or (D if self.nb == 1 and C == N else 0)
        self.memo: dict = {}
        if self.kgroup > 1:
            if sweep:       # a held panel keeps every group; a quantized one keeps its cast K-tiles in bpool
                gbufs = ceil_div(nk, self.kgroup) if B.dtype == mm_dt else 2
            else:           # a resident panel keeps every group
                gbufs = 2 * ceil_div(nk, self.kgroup) if self.panel_resident else 2
            self.gpool = Pool(low, f"{name}.Bk", "sbuf", PMAX, self.kgroup * min(N, self.NB),
                              mm_dt if B.dtype in QUANTIZED_DTYPES else B.dtype, bufs=gbufs)

    # -- instruction emission -----------------------------------------------------------------------------------

    def load_cast(self, v: View, box, pool: Pool, split: int) -> Tile:
        """DMA a box; cast to the matmul dtype on the way (auto-cast) through a staging tile."""
        if v.dtype == self.mm_dt:
            return self.low.load(self.n.name, v, box, pool, split)
        if casts_in_flight(self, v) and len(box) == 2 and split == 1:
            t = pool.tile(box[0][1], box[1][1])         # the DMA writes the matmul dtype: no copy after
            self.low.dma(self.n.name, t.op(), view_operand(v, box))
            return t
        stage = self.low.load(self.n.name, v, box, self.ld_pool, split)
        t = pool.tile(stage.P, stage.F)
        if v.dtype in QUANTIZED_DTYPES:
            self.low.cast_copy(self.n.name, t, stage)
        else:
            self.low.act(self.n.name, t, stage.op(), "copy")
        return t

    def transposed(self, v2: View, r0, rn, c0, cn, pool: Pool) -> Tile:
        """Tile [cn, rn] = v2[r0:r0+rn, c0:c0+cn].T through natural loads + TensorE transposes."""
        t = pool.tile(cn, rn)
        for rr, rlen in row_chunks(self.low, v2, r0, rn):
            src = self.low.load(self.n.name, v2, [(r0 + rr, rlen), (c0, cn)], self.nat_pool, 1)
            transpose_to(self.low, self.n.name, src, t.cols(rr, rlen).as_dtype(self.mm_dt), self.tp_pool)
        return t

    def _cast_weight(self, t: Tile, nw: int) -> Tile:
        """A quantized (or uncast) weight's K-tile cast to the matmul dtype on its way, as :meth:`load_cast`."""
        if self.B.dtype == self.mm_dt:
            return t
        c = self.bpool.tile(PMAX, nw)
        self.low.cast_copy(self.n.name, c, t)
        return c

    def ktiled_moving(self, kb: int, n0: int, nw: int) -> Tile:
        """K-tile ``kb`` of columns ``n0 .. n0+nw`` of a K-tiled weight: one DMA brings ``kgroup`` K-tiles."""
        nk, N, kgroup, B = self.nk, self.N, self.kgroup, self.B
        j0 = kb - kb % kgroup
        if self.memo.get("key") != (j0, n0):
            gl = min(kgroup, nk - j0)
            t = self.gpool.tile(PMAX, gl * nw)
            if not casts_in_flight(self, B):
                t = t.as_dtype(B.dtype)
            ap = [[nk * N, PMAX], [1, gl * N]] if nw == N else [[nk * N, PMAX], [N, gl], [1, nw]]
            self.low.dma(self.n.name, t.op(), {"m": "hbm", "b": B.buf, "dt": B.dtype, "o": j0 * N + n0, "ap": ap})
            self.memo.update(key=(j0, n0), t=t)
        t = self.memo["t"].cols((kb - j0) * nw, nw)
        return t if t.dtype == self.mm_dt else self._cast_weight(t, nw)

    def lane_views(self, A: View, B: View) -> tuple[View, View]:
        """A^T [128, nk, M] (K-tile ``j``: column ``j`` of each partition), B [128, nk, N] (rows ``p * nk + j``)."""
        M, N, nk = A.shape[-2], B.shape[-1], self.nk
        return A.with_meta(A.meta.view(M, PMAX, nk).permute(1, 2, 0)), B.with_meta(B.meta.view(PMAX, nk, N))

    def lane_moving(self, kb: int, n0: int, nw: int) -> Tile:
        """K-tile ``kb`` of a weight read in the lane layout's order, ``lgroup`` K-tiles a DMA."""
        g = self.lgroup if nw == self.N else 1
        j0 = kb - kb % g
        key = (self.Bl.meta.storage_offset(), j0, n0)      # (per batch, for P @ V)
        if self.memo.get("key") != key:
            gl, low = min(g, self.nk - j0), self.low
            box = [(0, PMAX), (j0, gl), (n0, nw)]
            if casts_in_flight(self, self.B):
                t = self.lpool.tile(PMAX, gl * nw)          # the DMA writes the matmul dtype: no copy after
                low.dma(self.n.name, t.op(), view_operand(self.Bl, box))
            else:
                t = low.load(self.n.name, self.Bl, box, self.lpool, 1)
            self.memo.update(key=key, t=t)
        t = self.memo["t"].cols((kb - j0) * nw, nw)
        return t if t.dtype == self.mm_dt else self._cast_weight(t, nw)

    def moving(self, Bb: View, kb: int, n0: int, nw: int) -> Tile:
        """The moving operand's K-tile ``kb``, columns ``n0 .. n0+nw``, of batch ``Bb``."""
        k0, kl = kb * PMAX, min(PMAX, self.K - kb * PMAX)
        if self.lanes:
            return self.lane_moving(kb, n0, nw)
        if self.kgroup > 1:
            return self.ktiled_moving(kb, n0, nw)
        if self.b_direct:
            return self.load_cast(Bb, [(k0, kl), (n0, nw)], self.bpool, 1)
        # B = W.T with K contiguous: natural tiles of W [n, k] transposed on TensorE
        return self.transposed(Bb.with_meta(Bb.meta.t()), n0, nw, k0, kl, self.bpool)

    def accumulate(self, acc: Tile, stat_of, mov_of, mp: int, nw: int) -> None:
        """acc[mp, nw] = sum over K-tiles of stat_of(kb)^T @ mov_of(kb), one PSUM bank of columns per MATMUL."""
        low, name, nk, mm_dt = self.low, self.n.name, self.nk, self.mm_dt
        for kb in range(nk):
            kl = min(PMAX, self.K - kb * PMAX)
            stat, mov_t = stat_of(kb), mov_of(kb)
            low.emit("LDWEIGHTS", name, [], [stat.op()], {}, dur=ldweights_ns(low.p, mp, mm_dt))
            for c0 in range(0, nw, MOVING_FMAX):
                cw = min(MOVING_FMAX, nw - c0)
                low.emit("MATMUL", name, [acc.cols(c0, cw).op()], [stat.op(), mov_t.cols(c0, cw).op()],
                         {"start": kb == 0, "stop": kb == nk - 1},
                         dur=matmul_ns(low.p, cw, mp, mm_dt), flops=2 * kl * mp * cw, itype="REGULAR", small=False)

    def evacuate(self, acc: Tile, b: int, r0: int, mp: int, n0: int, nw: int) -> None:
        """PSUM rows ``r0 .. r0+mp``, columns ``n0 .. n0+nw`` through the epilogue, one bank at a time."""
        low, name, Cv, nb, M, N = self.low, self.n.name, self.Cv, self.nb, self.M, self.N
        for c0 in range(0, nw, MOVING_FMAX):
            cw = min(MOVING_FMAX, nw - c0)
            box = [(b, 1), (r0, mp), (n0 + c0, cw)]
            ctx = TileCtx(low, self.hshape, box, 2, self.epi_pools)
            src = acc.cols(c0, cw)
            out_t = ctx.out_tile(name, "evac", self.out_dt if not self.members else "float32")
            if Cv is not None:
                ctile = ctx.load_extra(name, Cv.with_meta(Cv.meta.expand(nb, M, N))
                                       if Cv.meta.shape[0] != nb else Cv, "bias")
                if self.beta != 1:     # into a fresh tile: ctile may be a resident value read in place
                    scaled = ctx.out_tile(name, "beta", ctile.dtype)
                    low.vec("TENSOR_SCALAR", name, scaled, [ctile.op()], op0="multiply", scalar0=self.beta)
                    ctile = scaled
                if self.alpha != 1:
                    low.vec("TENSOR_SCALAR", name, out_t, [src.op()], op0="multiply", scalar0=self.alpha)
                    low.vec("TENSOR_TENSOR", name, out_t, [out_t.op(), ctile.op()], n_inputs=2, op="add",
                            flops=mp * cw)
                else:
                    low.vec("TENSOR_TENSOR", name, out_t, [src.op(), ctile.op()], n_inputs=2, op="add",
                            flops=mp * cw)
            elif scale_on_evacuation(self):
                # a multiply by a tensor (a quantized linear's scale) reads PSUM: one pass, no copy (quantized.py)
                cur = run_chain(ctx, name, src, self.members, self.out3)
                if self.sm is not None:
                    self.sm(cur, box)
                continue
            else:
                low.act(name, out_t, src.op(), "copy", scale=self.alpha)
            cur = run_chain(ctx, name, out_t, self.members, self.out3)
            if self.sm is not None:
                self.sm(cur, box)

    def x_tiles(self, Ab: View, m0: int, mw: int) -> list[Tile]:
        """A sweep's x^T tiles of rows ``m0 .. m0+mw``, every K-tile: as stored, or natural loads of ``xg`` K-tiles
        each (4 KiB a partition where one 128 x 128 tile was 256 B), transposed on TensorE."""
        low, name, K, nk, xg = self.low, self.n.name, self.K, self.nk, self.xg
        if self.a_direct:
            ATv = Ab.with_meta(Ab.meta.t())
            return [self.load_cast(ATv, [(kb * PMAX, min(PMAX, K - kb * PMAX)), (m0, mw)], self.atpool, 1)
                    for kb in range(nk)]
        ats = [self.atpool.tile(min(PMAX, K - kb * PMAX), mw) for kb in range(nk)]
        for rr, rlen in row_chunks(low, Ab, m0, mw):
            for j0 in range(0, nk, xg):
                cols = min(xg * PMAX, K - j0 * PMAX)
                src = low.load(name, Ab, [(m0 + rr, rlen), (j0 * PMAX, cols)], self.xnat_pool, 1)
                for kb in range(j0, min(nk, j0 + xg)):
                    kl = min(PMAX, K - kb * PMAX)
                    # (an in-place resident tile with a strided free pattern: one K-tile at a time)
                    piece = src.cols((kb - j0) * PMAX, kl) if src.free_ap is None else \
                        low.load(name, Ab, [(m0 + rr, rlen), (kb * PMAX, kl)], self.xnat_pool, 1)
                    transpose_to(low, name, piece, ats[kb].cols(rr, rlen).as_dtype(self.mm_dt), self.tp_pool)
        return ats

    def emit(self) -> None:
        """Every batch's instructions, then the fused softmax's end."""
        for b in range(self.nb):
            Ab, Bb = self.A3.with_meta(self.A3.meta[b]), self.B3.with_meta(self.B3.meta[b])
            (self._emit_sweep if self.sweep else self._emit_streamed)(b, Ab, Bb)
        if self.sm is not None:
            self.sm.finish()

    def _emit_sweep(self, b: int, Ab: View, Bb: View) -> None:
        """Column blocks of NB (all N when the weight fits): each block's panel is loaded on the first row block
        and read from SBUF by every later one."""
        N, NB, NG, MG, M = self.N, self.NB, self.NG, self.MG, self.M
        for c0 in range(0, N, NB):
            subs = [(n0, min(NG, min(N, c0 + NB) - n0)) for n0 in range(c0, min(N, c0 + NB), NG)]
            panel: dict = {}
            # row blocks stop where a group of output rows ends (each chunk one block of the resident output)
            blocks = [(m0, min(MG, M - m0)) for m0 in range(0, M, MG)] if self.a_direct else \
                group_chunks(0, M, self.out_group, STAT_FMAX)
            for m0, mw in blocks:
                ats = self.x_tiles(Ab, m0, mw)
                for ms, mp in group_chunks(m0, mw, self.out_group, STAT_FMAX):
                    for n0, nw in subs:
                        acc = self.acc_pool.tile(mp, nw)

                        def held(kb, n0=n0, nw=nw):
                            if (n0, kb) not in panel:
                                panel[(n0, kb)] = self.moving(Bb, kb, n0, nw)
                            return panel[(n0, kb)]

                        self.accumulate(acc, lambda kb, ms=ms, mp=mp: ats[kb] if mp == ats[kb].F else
                                        ats[kb].cols(ms, mp), held, mp, nw)
                        self.evacuate(acc, b, m0 + ms, mp, n0, nw)

    def _emit_streamed(self, b: int, Ab: View, Bb: View) -> None:
        """N outer: each NG-column panel (loaded once when resident, else per row block), every MG-row block's
        x^T tiles (lane layout in place, as stored, or transposed), accumulated and evacuated per 128 rows."""
        K, N, M, NG, MG, nk = self.K, self.N, self.M, self.NG, self.MG, self.nk
        ATv = Ab.with_meta(Ab.meta.t())          # [K, M]
        if self.lanes and self.batched:
            self.Al, self.Bl = self.lane_views(Ab, Bb)
        for n0 in range(0, N, NG):
            nw = min(NG, N - n0)
            panel = [self.moving(Bb, kb, n0, nw) for kb in range(nk)] if self.panel_resident else []
            for m0 in range(0, M, MG):
                mw = min(MG, M - m0)
                ats = []
                for kb in range(nk):
                    k0, kl = kb * PMAX, min(PMAX, K - kb * PMAX)
                    if self.lanes:
                        ats.append(self.load_cast(self.Al, [(0, PMAX), (kb, 1), (m0, mw)], self.atpool, 1))
                    elif self.a_direct:
                        ats.append(self.load_cast(ATv, [(k0, kl), (m0, mw)], self.atpool, 1))
                    else:
                        ats.append(self.transposed(Ab, m0, mw, k0, kl, self.atpool))
                for ms, mp in group_chunks(m0, mw, self.out_group, STAT_FMAX):
                    acc = self.acc_pool.tile(mp, nw)
                    # (a whole tile as it is: an in-place lane tile's columns are strided)
                    self.accumulate(acc, lambda kb, ms=ms, mp=mp: ats[kb] if mp == ats[kb].F else ats[kb].cols(ms, mp),
                                    lambda kb, n0=n0, nw=nw: panel[kb] if self.panel_resident
                                    else self.moving(Bb, kb, n0, nw), mp, nw)
                    self.evacuate(acc, b, m0 + ms, mp, n0, nw)
