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
from neuron_stack.compiler.lower.kvread import repeat_kv_operands
from neuron_stack.compiler.lower.lowerer import QUANTIZED_DTYPES, Lowerer
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
    A, B, C, alpha, beta = ops
    members, alone = epilogue_chain(low, n)
    oshape = tuple(n.outputs[0].shape)
    batched = A.meta.dim() == 3
    if A.meta.dim() > 3 or B.meta.dim() > 3:
        lower_custom(low, n)
        lower_alone(low, alone)
        return
    M, K = A.shape[-2], A.shape[-1]
    N = B.shape[-1]
    nb = A.shape[0] if batched else 1
    mm_dt = low.cast_type if low.auto_cast in ("matmult", "all") and A.dtype == "float32" else A.dtype
    if mm_dt not in FLOATS:
        mm_dt = "float32"
    out_dt = n.outputs[0].dtype
    # the output as [nb, M, N] (dot/mv produce fewer dims)
    hshape = (nb, M, N)
    last = members[-1].node.name if members else n.name
    sm = fusable_softmax(low, last, N) if M and N else None
    out_views = chain_outputs(low, n, members, oshape)
    # flash for prefill-sized blocks (several 128-query blocks); token generation's few query rows per
    # head keep the batched score tiles, which spill nothing there
    fl = flash_attention(low, last, N) if batched and sm is None and C is None and not alone and K <= PMAX < M \
        else None
    V = low.value(fl.pv.args[1]) if fl is not None else None     # not args[0]: that would lower the softmax
    if V is not None and set(out_views) <= {last} and B.meta.dim() == V.meta.dim() == 3 and V.shape[-1] <= MOVING_FMAX:
        low.hbm.pop(last, None), low.cand.pop(last, None)     # the scores never leave the chip
        pv_dt = low.cast_type if low.auto_cast in ("matmult", "all") and V.dtype == "float32" else V.dtype
        FlashAttention(low, n, fl, A, B, V, alpha, members, hshape, mm_dt, pv_dt if pv_dt in FLOATS else "float32",
                       "float32" if members else out_dt, transpose_to).run()
        return
    if sm is not None:
        out_views.pop(last, None)         # the scores stay in PSUM/SBUF: only probabilities are stored
        low.hbm.pop(last, None), low.cand.pop(last, None)
        sm = SoftmaxEpilogue(low, n.name, sm, hshape)
    out3 = {k: reshape_view(v, hshape) for k, v in out_views.items()}
    members = [m.reshaped(hshape) for m in members]
    if any(m is None for m in members):
        raise AssertionError("matmul epilogue operands are contiguous reshapes of the output")
    Cv = None
    if C is not None:
        Cv = reshape_view(broadcast_view(C, oshape), hshape) if oshape != hshape else broadcast_view(C, oshape)
        if Cv is not None and Cv.meta.dim() == 2:
            Cv = Cv.with_meta(Cv.meta.unsqueeze(0))
    A3 = A if batched else A.with_meta(A.meta.unsqueeze(0))
    B3 = B if B.meta.dim() == 3 else B.with_meta(B.meta.unsqueeze(0).expand(nb, K, N))
    nk = ceil_div(K, PMAX)
    NG = min(N, 2 * MOVING_FMAX)
    MG = min(M, 4 * STAT_FMAX)
    # A^T rows are contiguous along M; a one-row A that SBUF holds where the PE array can read it is transposed
    # there, not DMA'd one element per partition (a copy of single elements is not a DMA: docs/cost_model.md)
    ra = low.res.get(A.buf)
    a_inplace = M == 1 and ra is not None and not ra.evicted and low._resident_tile(
        ra, A3.with_meta(A3.meta[0]), [(0, 1), (0, min(K, PMAX))], 1) is not None
    a_direct = A3.meta.stride()[-2] == 1 or M == 1 and not a_inplace
    b_direct = B3.meta.stride()[-1] == 1 or N == 1
    # pools (SBUF bytes per partition; PSUM banks)
    es = nbytes_of(mm_dt)
    b_bytes = nk * NG * es
    budget = low.sbuf.cap          # the tile-pool ring (the rest of SBUF holds resident values)
    panel_resident = b_bytes <= budget // 2
    # double-buffer the moving panel when two fit: the next panel loads while this one multiplies
    # a streamed panel (weights too big to hold: decode, wide MLPs) keeps up to 16 tiles in flight,
    # one per DMA queue, as the DMA guide's "16 transfers x 8 buffers" (3 left 13 queues idle)
    streamed = max(3, min(16, nk, (budget // 2) // max(1, NG * es)))
    panel_bufs = (2 * nk if 2 * b_bytes <= budget // 2 else nk) if panel_resident else streamed
    lanes = not batched and lane_operand(low, A, B)
    # stores are slow next to one bank's evacuation: enough output slots to keep PSUM draining
    epi_pools = {"__F": min(NG, MOVING_FMAX), "__bufs": 6}
    # Several 128-row blocks (a prefill's projections, x [tokens, K] @ W [K, N]): as the NKI matmul tutorial's
    # optimisations (aws-neuron-sdk nki/guides/tutorials/matrix_multiplication.rst: hoist the loads out of the
    # inner loop, block the free dimensions so a block of the moving operand stays in SBUF and every row block
    # reuses it) the weight, or the widest block of its columns that fits beside the x^T tiles, staging and the
    # epilogue's pools, is loaded once for the whole sweep of M; each block of columns costs one more read of x,
    # where streaming re-read the whole weight for each 128-row block (79 times for 10,000 tokens).
    NB, xg, xbufs = N, 1, 1
    # only where streaming would be DMA-bound: its HBM bytes (x once per NG columns, the weight once per 128-row
    # block unless resident; each over its DMAs' efficiency at their bytes a partition) give an arithmetic
    # intensity under the roofline's ridge (the tutorial's "memory bound region"); a compute-bound matmul keeps
    # the N-outer order, whose next panel loads while this one multiplies (a resident sweep waits for each
    # block's whole panel on its first row block)
    x_run = MG * es if a_direct else min(K, PMAX) * nbytes_of(A.dtype)
    w_run = (kgroup_of(nk, N, B.dtype) * N if B.buf in low.const_ktiled else NG if b_direct else PMAX) \
        * nbytes_of(B.dtype)
    streamed_bytes = M * K * nbytes_of(A.dtype) * ceil_div(N, NG) / dma_efficiency(low.p, x_run) \
        + K * N * nbytes_of(B.dtype) * (1 if panel_resident else ceil_div(M, STAT_FMAX)) / dma_efficiency(low.p, w_run)
    ridge = low.p.tensor_peak_flops(mm_dt) / (low.p.dma_bytes_per_ns * 1e9)      # FLOPs per byte
    sweep = not lanes and M > STAT_FMAX and 2 * M * K * N < ridge * streamed_bytes
    if sweep:
        # x^T tiles of one row block (all K, rolling: block i+1's tile kb loads once block i's matmuls have read
        # tile kb): 128 rows from natural x loads of xg K-tiles, 4 KiB a partition (the DMA guide's saturating
        # size); x^T as stored keeps blocks of 512 rows (1 KiB a partition, its rows' longest runs)
        xg = 1 if a_direct else min(nk, max(1, 4096 // (PMAX * nbytes_of(A.dtype))))
        epi_dts = [out_dt if not members else "float32"] + ([Cv.dtype] * 2 if Cv is not None else []) \
            + [d for m in members for d in ["float32", *(v.dtype for v in m.extras.values())]]
        staging = (0 if a_direct else 2 * xg * PMAX * nbytes_of(A.dtype)) \
            + (0 if b_direct else 16 * PMAX * nbytes_of(A.dtype))
        if A.dtype != mm_dt or B.dtype != mm_dt:
            staging += (streamed if B.dtype in QUANTIZED_DTYPES else 2) * max(NG, MG) * nbytes_of(A.dtype)
        xt = nk * (MG if a_direct else STAT_FMAX) * es
        room = budget - xt - staging - sum(nbytes_of(d) for d in epi_dts) * epi_pools["__bufs"] * epi_pools["__F"]
        NB = resident_columns(nk, N, es, room)
        # and only when it is quicker: x read once per column block and the weight once (efficiency-weighted
        # bytes at the DMA rate), plus the Tensor Engine transposing x again for each column block beyond the
        # streamed order's NG-column passes (a 405B gate, N = 832 in 128-column blocks: seven passes of
        # 10,112 transposes, more time than the weight re-reads they save, and 3x the instructions)
        x_run = (MG * es if a_direct else xg * PMAX * nbytes_of(A.dtype))
        passes = ceil_div(N, NB) if NB else 0
        retranspose_ns = 0 if a_direct else max(0, passes - ceil_div(N, NG)) * ceil_div(M, PMAX) * nk * (
            ldweights_ns(low.p, PMAX, mm_dt) + matmul_ns(low.p, PMAX, PMAX, mm_dt))
        sweep = NB > 0 and (M * K * nbytes_of(A.dtype) * passes / dma_efficiency(low.p, x_run)
                            + K * N * nbytes_of(B.dtype) / dma_efficiency(low.p, w_run)) / low.p.dma_bytes_per_ns \
            + retranspose_ns < streamed_bytes / low.p.dma_bytes_per_ns
        # double-buffer x^T (the next block loads while this one multiplies) when that costs no column block
        if sweep and ceil_div(N, max(1, resident_columns(nk, N, es, room - xt))) == ceil_div(N, NB):
            xbufs, NB = 2, resident_columns(nk, N, es, room - xt)
    if sweep and not a_direct:
        MG = STAT_FMAX          # the panel is resident: x^T blocks of several row chunks would reuse nothing
    # a K-tiled weight (constants.prepare_constants): g K-tiles per DMA, each partition's g x N elements
    # contiguous, so the DMA guide's >= 4 KiB per partition is reached where one [128, N] tile had N x 2 B
    kgroup = 0
    if B.buf in low.const_ktiled and b_direct and N <= NG and not B.meta.storage_offset():
        kgroup = kgroup_of(nk, min(N, NB), B.dtype)
    if lanes:
        # a decode step's x^T read in place, K-tile j = column j of the lane layout; the weight's K-tile j is
        # its rows p * nk + j: g K-tiles per DMA are g x N contiguous elements per partition
        Al = A.with_meta(A.meta.view(M, PMAX, nk).permute(1, 2, 0))        # [128, nk, M]
        Bl = B.with_meta(B.meta.view(PMAX, nk, N))                         # [128, nk, N]
        lgroup = min(nk, max(1, 4096 // (N * nbytes_of(B.dtype)))) if N <= NG else 1
        groups = ceil_div(nk, lgroup)
        # the moving panel's pool (in its place): a resident panel keeps every group (two panels when they
        # fit), a streamed one keeps as many transfers in flight; casts of a quantized weight go to bpool
        lbufs = (2 * groups if 2 * b_bytes <= budget // 2 else groups) if panel_resident else max(2, streamed // lgroup)
        lpool = Pool(low, f"{n.name}.Bl", "sbuf", PMAX, lgroup * NG, B.dtype, bufs=lbufs)
    if sweep:
        # the panel: every K-tile of every NG-column group of a block (K-tiled groups hold it in gpool)
        bpool = Pool(low, f"{n.name}.B", "sbuf", PMAX, NG, mm_dt, bufs=nk * ceil_div(NB, NG)) \
            if kgroup <= 1 or B.dtype != mm_dt else None
        atpool = Pool(low, f"{n.name}.AT", "sbuf", PMAX, MG, mm_dt, bufs=xbufs * nk)
    else:
        # a quantized weight's converted K-tiles are read once, by the next MATMUL: a few slots keep the
        # conversions ahead of the Tensor Engine without holding a second, bf16 copy of the panel in SBUF
        cast_bufs = min(panel_bufs, 6) if B.dtype in QUANTIZED_DTYPES else panel_bufs
        bpool = Pool(low, f"{n.name}.B", "sbuf", PMAX, NG, mm_dt, bufs=cast_bufs) if not lanes or B.dtype != mm_dt \
            else None
        atpool = Pool(low, f"{n.name}.AT", "sbuf", PMAX, MG, mm_dt,
                      bufs=min(2 * nk, max(2, (budget // 4) // (MG * es))))
    acc_pool = Pool(low, f"{n.name}.acc", "psum", PMAX, NG, "float32", bufs=2)
    transposes = not (a_direct and b_direct or lanes)
    tp_pool = Pool(low, f"{n.name}.tp", "psum", PMAX, PMAX, "float32", bufs=2) if transposes else None
    # (a resident one-row A is read in place: its natural tiles take no DMA slots)
    nat_pool = Pool(low, f"{n.name}.nat", "sbuf", PMAX, PMAX, A.dtype, bufs=1 if a_inplace and b_direct else 16) \
        if transposes and not (sweep and b_direct) else None
    xnat_pool = Pool(low, f"{n.name}.xn", "sbuf", PMAX, xg * PMAX, A.dtype, bufs=2) if sweep and not a_direct else None
    ld_pool = None
    # (a quantized weight read in the lane layout or K-tiled converts from its own group tiles: no staging,
    # whose 16 slots would otherwise hold SBUF the next matmuls' weight loads could stream into)
    if (a_direct or b_direct) and (A.dtype != mm_dt or B.dtype != mm_dt and not lanes and kgroup <= 1):
        # a quantized weight streams through its staging tiles: as many in flight as the panel's
        ld_pool = Pool(low, f"{n.name}.ld", "sbuf", PMAX, max(NG, MG), A.dtype,
                       bufs=streamed if B.dtype in QUANTIZED_DTYPES else 2)

    def load_cast(v: View, box, pool: Pool, split: int) -> Tile:
        """DMA a box; cast to the matmul dtype on the way (auto-cast) through a staging tile."""
        if v.dtype == mm_dt:
            return low.load(n.name, v, box, pool, split)
        stage = low.load(n.name, v, box, ld_pool, split)
        t = pool.tile(stage.P, stage.F)
        if v.dtype in QUANTIZED_DTYPES:
            low.cast_copy(n.name, t, stage)
        else:
            low.act(n.name, t, stage.op(), "copy")
        return t

    def transposed(v2: View, r0, rn, c0, cn, pool: Pool) -> Tile:
        """Tile [cn, rn] = v2[r0:r0+rn, c0:c0+cn].T through natural loads + TensorE transposes."""
        t = pool.tile(cn, rn)
        for rr, rlen in row_chunks(low, v2, r0, rn):
            src = low.load(n.name, v2, [(r0 + rr, rlen), (c0, cn)], nat_pool, 1)
            transpose_to(low, n.name, src, t.cols(rr, rlen).as_dtype(mm_dt), tp_pool)
        return t

    # the output's rows come in groups (a flattened [batch x 197, N]): chunks of output rows stop at a group's end,
    # so each evacuated tile is one block of the resident output (resident.row_layout)
    out_group = 0
    for v in out_views.values():
        C, _, D = low.row_layout(v.buf, low.hbm.get(v.buf, {}).get("shape", ()))
        out_group = out_group or (D if nb == 1 and C == N else 0)
    if kgroup > 1:
        if sweep:       # a held panel keeps every group; a quantized one keeps its cast K-tiles in bpool
            gbufs = ceil_div(nk, kgroup) if B.dtype == mm_dt else 2
        else:
            gbufs = 2 * ceil_div(nk, kgroup) if panel_resident else 2      # a resident panel keeps every group
        gpool = Pool(low, f"{n.name}.Bk", "sbuf", PMAX, kgroup * min(N, NB), B.dtype, bufs=gbufs)
        kmemo: dict = {}

        def ktiled_moving(kb: int, n0: int = 0, nw: int = N) -> Tile:
            """K-tile ``kb`` of columns ``n0 .. n0+nw``: one DMA brings ``kgroup`` K-tiles of them."""
            j0 = kb - kb % kgroup
            if kmemo.get("key") != (j0, n0):
                gl = min(kgroup, nk - j0)
                t = gpool.tile(PMAX, gl * nw)
                ap = [[nk * N, PMAX], [1, gl * N]] if nw == N else [[nk * N, PMAX], [N, gl], [1, nw]]
                low.dma(n.name, t.op(), {"m": "hbm", "b": B.buf, "dt": B.dtype, "o": j0 * N + n0, "ap": ap})
                kmemo.update(key=(j0, n0), t=t)
            t = kmemo["t"].cols((kb - j0) * nw, nw)
            if B.dtype == mm_dt:
                return t
            c = bpool.tile(PMAX, nw)    # a quantized (or uncast) weight: each K-tile cast on its way, as load_cast
            low.cast_copy(n.name, c, t)
            return c
    if lanes:
        lmemo: dict = {}

        def lane_moving(kb: int, n0: int, nw: int) -> Tile:
            g = lgroup if nw == N else 1
            j0 = kb - kb % g
            if lmemo.get("key") != (j0, n0):
                gl = min(g, nk - j0)
                lmemo.update(key=(j0, n0), t=low.load(n.name, Bl, [(0, PMAX), (j0, gl), (n0, nw)], lpool, 1))
            t = lmemo["t"].cols((kb - j0) * nw, nw)
            if B.dtype == mm_dt:
                return t
            c = bpool.tile(PMAX, nw)    # a quantized (or uncast) weight: each K-tile cast on its way
            low.cast_copy(n.name, c, t)
            return c
    def accumulate(acc: Tile, stat_of, mov_of, mp: int, nw: int) -> None:
        """acc[mp, nw] = sum over K-tiles of stat_of(kb)^T @ mov_of(kb), one PSUM bank of columns per MATMUL."""
        for kb in range(nk):
            kl = min(PMAX, K - kb * PMAX)
            stat, mov_t = stat_of(kb), mov_of(kb)
            low.emit("LDWEIGHTS", n.name, [], [stat.op()], {}, dur=ldweights_ns(low.p, mp, mm_dt))
            for c0 in range(0, nw, MOVING_FMAX):
                cw = min(MOVING_FMAX, nw - c0)
                low.emit("MATMUL", n.name, [acc.cols(c0, cw).op()], [stat.op(), mov_t.cols(c0, cw).op()],
                         {"start": kb == 0, "stop": kb == nk - 1},
                         dur=matmul_ns(low.p, cw, mp, mm_dt), flops=2 * kl * mp * cw, itype="REGULAR", small=False)

    def evacuate(acc: Tile, b: int, r0: int, mp: int, n0: int, nw: int) -> None:
        """PSUM rows ``r0 .. r0+mp``, columns ``n0 .. n0+nw`` through the epilogue, one bank at a time."""
        for c0 in range(0, nw, MOVING_FMAX):
            cw = min(MOVING_FMAX, nw - c0)
            box = [(b, 1), (r0, mp), (n0 + c0, cw)]
            ctx = TileCtx(low, hshape, box, 2, epi_pools)
            src = acc.cols(c0, cw)
            out_t = ctx.out_tile(n.name, "evac", out_dt if not members else "float32")
            if Cv is not None:
                ctile = ctx.load_extra(n.name, Cv.with_meta(Cv.meta.expand(nb, M, N))
                                       if Cv.meta.shape[0] != nb else Cv, "bias")
                if beta != 1:     # into a fresh tile: ctile may be a resident value read in place
                    scaled = ctx.out_tile(n.name, "beta", ctile.dtype)
                    low.vec("TENSOR_SCALAR", n.name, scaled, [ctile.op()], op0="multiply", scalar0=beta)
                    ctile = scaled
                if alpha != 1:
                    low.vec("TENSOR_SCALAR", n.name, out_t, [src.op()], op0="multiply", scalar0=alpha)
                    low.vec("TENSOR_TENSOR", n.name, out_t, [out_t.op(), ctile.op()], n_inputs=2, op="add",
                            flops=mp * cw)
                else:
                    low.vec("TENSOR_TENSOR", n.name, out_t, [src.op(), ctile.op()], n_inputs=2, op="add",
                            flops=mp * cw)
            else:
                low.act(n.name, out_t, src.op(), "copy", scale=alpha)
            cur = run_chain(ctx, n.name, out_t, members, out3)
            if sm is not None:
                sm(cur, box)

    def x_tiles(Ab: View, m0: int, mw: int) -> list[Tile]:
        """A sweep's x^T tiles of rows ``m0 .. m0+mw``, every K-tile: as stored, or natural loads of ``xg`` K-tiles
        each (4 KiB a partition where one 128 x 128 tile was 256 B), transposed on TensorE."""
        if a_direct:
            ATv = Ab.with_meta(Ab.meta.t())
            return [load_cast(ATv, [(kb * PMAX, min(PMAX, K - kb * PMAX)), (m0, mw)], atpool, 1) for kb in range(nk)]
        ats = [atpool.tile(min(PMAX, K - kb * PMAX), mw) for kb in range(nk)]
        for rr, rlen in row_chunks(low, Ab, m0, mw):
            for j0 in range(0, nk, xg):
                cols = min(xg * PMAX, K - j0 * PMAX)
                src = low.load(n.name, Ab, [(m0 + rr, rlen), (j0 * PMAX, cols)], xnat_pool, 1)
                for kb in range(j0, min(nk, j0 + xg)):
                    kl = min(PMAX, K - kb * PMAX)
                    # (an in-place resident tile with a strided free pattern: one K-tile at a time)
                    piece = src.cols((kb - j0) * PMAX, kl) if src.free_ap is None else \
                        low.load(n.name, Ab, [(m0 + rr, rlen), (kb * PMAX, kl)], xnat_pool, 1)
                    transpose_to(low, n.name, piece, ats[kb].cols(rr, rlen).as_dtype(mm_dt), tp_pool)
        return ats

    for b in range(nb):
        Ab = A3.with_meta(A3.meta[b])
        Bb = B3.with_meta(B3.meta[b])
        ATv = Ab.with_meta(Ab.meta.t())          # [K, M]

        def moving(kb, n0, nw):
            k0, kl = kb * PMAX, min(PMAX, K - kb * PMAX)
            if lanes:
                return lane_moving(kb, n0, nw)
            if kgroup > 1:
                return ktiled_moving(kb, n0, nw)
            if b_direct:
                return load_cast(Bb, [(k0, kl), (n0, nw)], bpool, 1)
            # B = W.T with K contiguous: natural tiles of W [n, k] transposed on TensorE
            Wv = Bb.with_meta(Bb.meta.t())   # [N, K]
            return transposed(Wv, n0, nw, k0, kl, bpool)

        if sweep:
            # column blocks of NB (all N when the weight fits): each block's panel is loaded on the first row
            # block and read from SBUF by every later one
            for c0 in range(0, N, NB):
                subs = [(n0, min(NG, min(N, c0 + NB) - n0)) for n0 in range(c0, min(N, c0 + NB), NG)]
                panel: dict = {}
                # row blocks stop where a group of output rows ends (each chunk one block of the resident output)
                blocks = [(m0, min(MG, M - m0)) for m0 in range(0, M, MG)] if a_direct else \
                    group_chunks(0, M, out_group, STAT_FMAX)
                for m0, mw in blocks:
                    ats = x_tiles(Ab, m0, mw)
                    for ms, mp in group_chunks(m0, mw, out_group, STAT_FMAX):
                        for n0, nw in subs:
                            acc = acc_pool.tile(mp, nw)

                            def held(kb, n0=n0, nw=nw):
                                if (n0, kb) not in panel:
                                    panel[(n0, kb)] = moving(kb, n0, nw)
                                return panel[(n0, kb)]

                            accumulate(acc, lambda kb, ms=ms, mp=mp: ats[kb] if mp == ats[kb].F else
                                       ats[kb].cols(ms, mp), held, mp, nw)
                            evacuate(acc, b, m0 + ms, mp, n0, nw)
            continue
        for n0 in range(0, N, NG):
            nw = min(NG, N - n0)
            panel = [moving(kb, n0, nw) for kb in range(nk)] if panel_resident else []
            for m0 in range(0, M, MG):
                mw = min(MG, M - m0)
                ats = []
                for kb in range(nk):
                    k0, kl = kb * PMAX, min(PMAX, K - kb * PMAX)
                    if lanes:
                        ats.append(load_cast(Al, [(0, PMAX), (kb, 1), (m0, mw)], atpool, 1))
                    elif a_direct:
                        ats.append(load_cast(ATv, [(k0, kl), (m0, mw)], atpool, 1))
                    else:
                        ats.append(transposed(Ab, m0, mw, k0, kl, atpool))
                for ms, mp in group_chunks(m0, mw, out_group, STAT_FMAX):
                    acc = acc_pool.tile(mp, nw)
                    # (a whole tile as it is: an in-place lane tile's columns are strided)
                    accumulate(acc, lambda kb, ms=ms, mp=mp: ats[kb] if mp == ats[kb].F else ats[kb].cols(ms, mp),
                               lambda kb, n0=n0, nw=nw: panel[kb] if panel_resident else moving(kb, n0, nw), mp, nw)
                    evacuate(acc, b, m0 + ms, mp, n0, nw)
    if sm is not None:
        sm.finish()
    lower_alone(low, alone)
