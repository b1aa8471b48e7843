"""Token generation's attention over the KV cache: the grouped-query heads read the one cache in place.

Hugging Face's ``repeat_kv`` materialises each KV head's cache once per query head of its group; NxDI and the
hardware read it as stored. :func:`prepare_kv_reads` holds those copies back before lowering, and
:func:`repeat_kv_operands` gives the decode bmm its operands straight from the cache (the matmul lowering asks
it first).
"""
from __future__ import annotations

from neuron_stack.compiler.lower.chain import epilogue_chain
from neuron_stack.compiler.lower.common import reshape_view
from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.registry import named, prepare_pass
from neuron_stack.compiler.lower.resident import lane_layout
from neuron_stack.compiler.lower.tiles import PMAX, View, aten_op, is_ref, meta_tensor, packet_name
from neuron_stack.ir import Node

#: ops a bmm operand may reach its repeat_kv copy through (metadata only)
_KV_VIEWS = ("view", "_unsafe_view", "expand", "permute", "transpose", "unsqueeze", "squeeze", "alias", "t")


def _kv_chain(low: Lowerer, arg) -> tuple[Node, list[Node]] | None:
    """The ``clone`` a bmm operand reads through view ops only (each read by the next alone) and those views
    (clone first), or None."""
    chain: list[Node] = []
    while is_ref(arg):
        v = low.by_name[arg["node"]]
        if v.name not in low.in_part or v.fused_into or low.fused.get(v.name) or low._escapes(v.name) \
                or len(set(low.users.get(v.name, []))) != 1:
            return None
        if v.target == "aten.clone.default" and v.outputs:
            return (v, chain[::-1]) if _repeats(low, v.args[0] if v.args else None) else None
        if v.op_class != "view" or packet_name(v.target) not in _KV_VIEWS:
            return None
        chain.append(v)
        arg = v.args[0] if v.args else None
    return None


def _repeats(low: Lowerer, arg) -> bool:
    """True when view ops (from ``arg`` back to a computed value) broadcast a size-1 dim: ``repeat_kv``'s
    ``expand``. (A plain layout copy, e.g. a key transpose made contiguous, stays a copy: see layout.py.)"""
    while is_ref(arg):
        v = low.by_name[arg["node"]]
        if v.op_class != "view" or not v.args:
            return False
        if packet_name(v.target) == "expand" and v.inputs and v.outputs \
                and tuple(v.inputs[0].shape) != tuple(v.outputs[0].shape):
            return True
        arg = v.args[0]
    return False


@prepare_pass
def prepare_kv_reads(low: Lowerer) -> None:
    """Find the decode step's copies of the KV cache that only a bmm reads: HF's ``repeat_kv`` (``expand`` +
    ``reshape``) and ``matmul``'s batch flattening materialise K and V once per query head of a group. Neither
    NxDI nor the hardware copies them: NxDI's token generation (``modules/attention/attention_base.py``
    ``compute_for_token_gen``) writes the same ``repeat_kv`` + ``matmul``, traced to an HLO broadcast feeding
    a dot (an access pattern, not a copy), and its kernel (``attn_tkg_nki_kernel_enabled``: nki-library
    ``src/nkilib_src/nkilib/core/attention/attention_tkg.py``, "k_prior [B, 1, s_prior, d]", one KV head per
    rank) loads each K/V tile once for every query head of its group. Such a copy is not lowered
    (:func:`repeat_kv_operands` reads its source) when the bmm has at most 128 query rows per head (decode,
    or a prompt of at most 128 tokens): longer prefills take the flash path."""
    low.kv_reads = {}
    for n in low.nodes:
        if n.target != "aten.bmm.default" or n.name not in low.in_part or len(n.args) < 2 or not n.outputs \
                or n.outputs[0].shape[-2] > PMAX:
            continue
        found = {}
        for i in (0, 1):
            hit = _kv_chain(low, n.args[i])
            if hit is not None and hit[0].name not in low.done:
                found[i] = hit
        if found:
            low.kv_reads[n.name] = found
            low.done.update(c.name for c, _ in found.values())


def _slice_in_source(off: int, strides, sizes, shape, xs, x_off: int):
    """Element (offset ``off`` + sum(i * strides)) of a contiguous array of ``shape``, as offset and strides
    into ``xs``-strided storage holding the same array; None when a stride spans dims."""
    cs, idx, rest = [1] * len(shape), [], off
    for d in range(len(shape) - 2, -1, -1):
        cs[d] = cs[d + 1] * shape[d + 1]
    for d in range(len(shape)):
        idx.append(rest // cs[d])
        rest %= cs[d]
    out = []
    for st, size in zip(strides, sizes):
        if size == 1:
            out.append(0)
            continue
        dims = [d for d in range(len(shape)) if cs[d] == st and shape[d] > 1 and idx[d] + size <= shape[d]]
        if not dims:
            return None
        out.append(xs[dims[0]])
    return x_off + sum(i * s for i, s in zip(idx, xs)), out


def _kv_operand(low: Lowerer, clone: Node, chain: list[Node]) -> tuple[View, list, tuple] | None:
    """The bmm operand ``chain(clone(x))`` [nb, K, N] read from ``x``'s storage: (``x``, ``nb`` (offset,
    strides) slices, its shape), or None when a slice is not one strided view of ``x``."""
    x = low.value(clone.args[0])
    shape = tuple(clone.outputs[0].shape)
    meta = meta_tensor(shape, x.dtype)
    for v in chain:
        meta = aten_op(v.target)(meta, *v.args[1:])
    if meta.dim() != 3:
        return None
    xs, x_off = x.meta.stride(), x.meta.storage_offset()
    slices = [_slice_in_source(meta[b].storage_offset(), meta.stride()[1:], meta.shape[1:], shape, xs, x_off)
              for b in range(meta.shape[0])]
    return None if None in slices else (x, slices, tuple(meta.shape))


def repeat_kv_operands(low: Lowerer, n: Node):
    """``(A, B, None, 1, 1)`` for a bmm of few query rows whose K/V operand repeats one KV head's cache for
    several query heads (GQA): the copy :func:`prepare_kv_reads` found is read in place, or a stride-0
    broadcast as it is; None otherwise (the bmm's operands as usual).

    The query heads sharing a KV head become rows of one matmul: the [R x M, d] queries of a group against its
    one [d, S] K^T (and its [R x M, S] probabilities against its one V), so each K/V tile is loaded once per
    KV head, as ``attention_tkg`` flattens its ``q_head`` x ``s_active`` into the moving free dim
    (``s_active_qh``) against one stationary K/V tile. Should a copy not be a view of the cache after all,
    it is lowered here, before the bmm reads it.

    >>> import torch
    >>> from neuron_stack.frontend.export import capture
    >>> from neuron_stack.compiler import fuse, legalize, partition, schedule
    >>> from neuron_stack.device.profiles import get_profile
    >>> def decode(q, k, v):                      # one KV head for four query heads
    ...     k, v = k.expand(1, 4, 512, 16), v.expand(1, 4, 512, 16)
    ...     return (q @ k.transpose(-1, -2)).softmax(-1) @ v
    >>> q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 1, 512, 16), torch.randn(1, 1, 512, 16)
    >>> prog = fuse.fuse(partition.partition(legalize.legalize(capture(decode, (q, k, v)))))
    >>> s = schedule.build_schedule(prog, 0, get_profile("inf2"), {"auto_cast": "none"})
    >>> s.hbm_read_bytes < 1.5 * (k.numel() + v.numel()) * 4      # K and V once, not once per query head
    True
    """
    found = getattr(low, "kv_reads", {}).get(n.name)
    if not found:
        if n.target != "aten.bmm.default" or not n.outputs or n.outputs[0].shape[-2] > PMAX:
            return None
        B = low.value(n.args[1])
        if B.meta.dim() != 3 or B.meta.stride()[0] or B.shape[0] == 1:
            return None         # not one K/V shared by every batch (batch-1 GQA: the heads are the batch)
        x, slices = B, [(B.meta.storage_offset(), B.meta.stride()[1:])] * B.shape[0]
        shape = B.shape
    else:
        ops = {i: _kv_operand(low, c, chain) for i, (c, chain) in found.items()}
        if any(o is None for o in ops.values()) or set(ops) != {1}:
            for c, _ in found.values():     # not a strided view of the cache (or the query side): copy it
                _copy_now(low, c)
            return None
        x, slices, shape = ops[1]
    nb, K, N = shape
    offs = [o for o, _ in slices]
    R = 1
    while R < nb and offs[R] == offs[0] and slices[R][1] == slices[0][1]:
        R += 1
    A = low.value(n.args[0])
    G = nb // R
    A2 = reshape_view(A, (G, R * A.shape[-2], A.shape[-1])) if nb % R == 0 and A.meta.dim() == 3 else None
    step = offs[R] - offs[0] if G > 1 else 0
    # the fused epilogue's operands (a mask, a scale) must read the output as [G, R x M, N] too
    folded = (G, R * A.shape[-2], N)
    uniform = all(offs[g * R + r] == offs[0] + g * step and slices[g * R + r][1] == slices[0][1]
                  for g in range(G) for r in range(R))
    if A2 is None or not uniform or any(m.reshaped(folded) is None for m in epilogue_chain(low, n)[0]):
        if found:
            _copy_now(low, found[1][0])
        return None
    if found:
        low.finished.add(found[1][0].name)
    return A2, x.with_meta(x.meta.as_strided((G, K, N), (step, *slices[0][1]), offs[0])), None, 1, 1


def _copy_now(low: Lowerer, clone: Node) -> None:
    """Lower a copy :func:`prepare_kv_reads` held back, as the copy lowering would have."""
    named("copy").fn(low, clone)
    low.finished.add(clone.name)


def lane_batches(low: Lowerer, A3: View, B3: View) -> bool:
    """True for a decode step's ``P @ V`` (:func:`lane_operand`, per batch): the probabilities ``A3`` [nb, M, S]
    kept in the lane layout (each row's ``S`` over the 128 partitions, ``S / 128`` a partition) and each
    batch's ``B3[b]`` [S, d] one contiguous block of the V cache. The contraction then runs in the lane
    order: P^T's K-tile ``j`` is read in place (no SBUF-to-SBUF DMA per 128 keys) and V's K-tile ``j`` is
    rows ``p * S / 128 + j``, so each partition reads a run of ``S / 128`` whole rows of V (4 KiB and more
    from 2,048 keys of a 128-wide bf16 head) where a natural tile is 256 B a partition. The sum over the keys
    is the same, taken in another order."""
    r = low.res.get(A3.buf)
    if r is None or r.evicted or A3.meta.dim() != 3 or not A3.meta.is_contiguous() or A3.meta.storage_offset():
        return False
    nb, S, d = B3.shape
    lanes = lane_layout(A3.shape)
    return lanes is not None and (r.C, r.T) == lanes and lanes[0] * PMAX == S and B3.buf not in low.const_ktiled \
        and B3.meta.stride()[1:] == (d, 1) and A3.shape[0] == nb
