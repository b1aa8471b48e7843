"""Long attention rows take the flash path (issue 24): scores of more keys than one PSUM bank never
go to HBM, and the numbers equal eager PyTorch, masked rows and partial blocks included."""
import json

import pytest
import torch
import torch.nn.functional as F

import neuron_stack
from neuron_stack.compiler.fuse import fuse
from neuron_stack.compiler.legalize import legalize
from neuron_stack.compiler.lower.attention import FLASH_MIN_KEYS
from neuron_stack.compiler.partition import partition
from neuron_stack.compiler.schedule import build_schedule
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import capture


class Attention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return causal, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _inputs(L=200, S=FLASH_MIN_KEYS + 140, d=16):
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, L, d), torch.randn(1, 2, S, d), torch.randn(1, 2, S, d)
    mask = torch.rand(L, S) > 0.3
    mask[5] = False                # a query that may see no key: its output is 0, not NaN
    return q, k, v, mask


def test_flash_attention_matches_eager_with_masks_and_partial_blocks():
    args = _inputs()
    model = Attention().eval()
    nm = neuron_stack.trace(model, args, compiler_args="--auto-cast none")
    for got, want in zip(nm(*args), model(*args)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_bf16_grouped_query_attention_is_within_bf16_error():
    # Llama's graph: bf16 scores cast to fp32, the mask, the fully-masked-row guard, GQA-repeated K/V
    q, k, v, mask = (a.to(torch.bfloat16) if a.is_floating_point() else a for a in _inputs())
    k, v = k[:, :1], v[:, :1]

    def gqa(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    nm = neuron_stack.trace(gqa, (q, k, v, mask))
    got, want = nm(q, k, v, mask).float(), gqa(q, k, v, mask).float()
    assert (got - want).norm() / want.norm() < 1e-2


def test_long_scores_never_reach_hbm():
    # 2 heads of 2048 x 2048 fp32 scores: 32 MiB, more than trn2's SBUF, so without the flash path
    # they are written to HBM and read back (at least once each)
    q = k = v = torch.randn(1, 2, 2048, 64)
    prog = fuse(partition(legalize(capture(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v)))))
    s = build_schedule(prog, 0, get_profile("trn2"), {"auto_cast": "none"})
    assert {"REDUCE", "ACTIVATE", "MATMUL"} <= set(s.table["opcode"].to_pylist())
    assert s.hbm_write_bytes == q.numel() * 4          # only the output
    assert s.hbm_read_bytes < 4 * q.numel() * 4 * 2048 // 128   # Q once, K and V once per 128-query block


def _prefill_counts(model, inputs):
    nm = neuron_stack.trace(model, inputs, compiler_args="--auto-cast none --no_cache")
    got = nm(*inputs)
    (sc,) = nm.neff.schedules.values()
    return got, sc.table["opcode"].to_pylist().count("MATMUL")


def test_causal_prefill_skips_the_key_blocks_above_the_diagonal_and_matches_eager():
    # a tiny Llama's prompt of 640 tokens into a fresh cache (the context-encoding graph): its positions and
    # causal mask are graph constants, so the compiler skips the 4 (of 10) key blocks per head wholly above
    # the diagonal; a padding mask given as an input is data: every block is computed
    import transformers as T

    from neuron_stack.llm.prefill import context_encoding_cache

    cfg = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2)

    class Prefill(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids, pad=None):
            cache = context_encoding_cache(T.StaticCache(config=self.model.config, max_cache_len=ids.shape[1]))
            return self.model(input_ids=ids, attention_mask=pad, past_key_values=cache).logits

    torch.manual_seed(0)
    model = T.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (1, 640))
    want = model(input_ids=ids).logits
    causal, skipped = _prefill_counts(Prefill(model), (ids,))
    padded, full = _prefill_counts(Prefill(model), (ids, torch.ones_like(ids)))
    for got in (causal, padded):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # per head and masked block of 128 keys, four Tensor Engine instructions fewer: the K block's and
    # the probabilities' transposes, Q K^T and P V
    assert full - skipped == 4 * 4 * 4


def test_causal_flash_instructions_compute_eager_attention_in_the_isa_interpreter():
    # the skipped blocks and the diagonal blocks' AFFINE_SELECT, run instruction by instruction; a causal mask
    # anchored top-left when there are more keys than queries (sdpa's is_causal)
    from neuron_stack.compiler.schedule import build_schedules
    from neuron_stack.isa.interp import run_program

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 200, 16), torch.randn(1, 2, 652, 16), torch.randn(1, 2, 652, 16)
    prog = fuse(partition(legalize(capture(fn, (q, k, v)))))
    schedules = build_schedules(prog, {"auto_cast": "none", "target": "trn2"})
    assert "AFFINE_SELECT" in schedules[0].table["opcode"].to_pylist()
    names = [n.name for n in prog.nodes if n.target == "placeholder"]
    (out,) = run_program(prog, dict(zip(names, (q.numpy(), k.numpy(), v.numpy()))), schedules)
    torch.testing.assert_close(torch.from_numpy(out), fn(q, k, v), rtol=1e-4, atol=1e-5)


def _decode_step(kv_heads, dtype=torch.float32, B=2, S=256, k_transposed=False):
    """One token-generation step of a tiny GQA Llama (4 query heads) over a static cache given as inputs
    (``k_transposed``: the K cache kept ``[B, kv, d, S]``, llm/kcache.py; its input is the same keys so laid)."""
    import transformers as T

    from neuron_stack.llm.kcache import transposed_k_cache

    cfg = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=S)
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(cfg).eval().to(dtype)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids, k, v, pos):
            cache = T.StaticCache(config=cfg, max_cache_len=S)
            cache.early_initialization(batch_size=B, num_heads=kv_heads, head_dim=16, dtype=dtype, device="cpu")
            if k_transposed:
                transposed_k_cache(cache)
            cache.layers[0].keys.copy_(k)
            cache.layers[0].values.copy_(v)
            return self.m(input_ids=ids, past_key_values=cache, cache_position=pos).logits

    k, v = (torch.randn(B, kv_heads, S, 16).to(dtype) for _ in range(2))
    if k_transposed:
        k = k.transpose(-1, -2).contiguous()
    return Step(), (torch.randint(0, 128, (B, 1)), k, v, torch.tensor([S // 2]))


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_gqa_decode_step_instructions_compute_eager_logits(kv_heads):
    # the query heads of a KV head multiply its cache in place, as rows of one matmul (no repeat_kv copy):
    # run instruction by instruction, fp32 equals eager and bf16 is within bf16 error
    from neuron_stack.compiler.schedule import build_schedules
    from neuron_stack.isa.interp import run_program

    for dtype in (torch.float32, torch.bfloat16):
        step, args = _decode_step(kv_heads, dtype)
        with torch.no_grad():
            want = step(*args).float()
        prog = fuse(partition(legalize(capture(step, args))))
        schedules = build_schedules(prog, {"auto_cast": "none", "target": "inf2"})
        clones = {n.name for n in prog.nodes if n.target == "aten.clone.default" and n.outputs[0].shape}
        assert clones and not clones & set(schedules[0].table["node"].to_pylist())   # the copies cost nothing
        names = [n.name for n in prog.nodes if n.target == "placeholder"]
        arrays = [a.float().numpy() if a.is_floating_point() else a.numpy() for a in args]
        got = torch.from_numpy(run_program(prog, dict(zip(names, arrays)), schedules)[0]).float()
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        else:
            assert (got - want).norm() / want.norm() < 1e-2


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_transposed_k_cache_decode_step_computes_the_untransposed_eager_logits(kv_heads):
    # NxDI's k_cache_transposed (llm/kcache.py): the same step over the same keys laid [B, kv, d, S] gives the
    # logits of the Hugging Face cache, eager and instruction by instruction; q @ K^T reads each key lane of the
    # cache as one run (no 128 x 128 transposes of K on the Tensor Engine, which the [B, kv, S, d] cache takes),
    # and P @ V runs in the lane order (matmul.lane_batches): each partition reads S / 128 whole rows of V at once
    from neuron_stack.compiler.schedule import build_schedules
    from neuron_stack.isa.interp import run_program

    S = 1024        # the lane layout's shortest row: 8 keys a partition (resident.LANE_MIN_RUN)
    step, args = _decode_step(kv_heads, S=S)
    tstep, targs = _decode_step(kv_heads, S=S, k_transposed=True)
    with torch.no_grad():
        want = step(*args)
        torch.testing.assert_close(tstep(*targs), want, rtol=1e-5, atol=1e-6)
    transposes, v_descs = [], []
    for st, a in ((step, args), (tstep, targs)):
        prog = fuse(partition(legalize(capture(st, a))))
        schedules = build_schedules(prog, {"auto_cast": "none", "target": "inf2"})
        names = [n.name for n in prog.nodes if n.target == "placeholder"]
        got = torch.from_numpy(run_program(prog, dict(zip(names, [x.numpy() for x in a])), schedules)[0])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        scores, pv = [n.name for n in prog.nodes if n.target == "aten.bmm.default"]
        t = schedules[0].table
        rows = list(zip(t["engine"].to_pylist(), t["node"].to_pylist(), t["operands"].to_pylist()))
        transposes.append(sum(1 for e, nd, o in rows if e == "tensor" and nd == scores and "__identity" in o))
        v_descs.append(sum(json.loads(o).get("desc", 1) for e, nd, o in rows if e == "dma" and nd == pv))
    assert transposes[1] < transposes[0]
    # V read once per (sequence, KV head), one 8-row run a partition (natural tiles: 8 DMAs of 128 one-row runs),
    # and P^T read in place (no SBUF-to-SBUF DMA per 128 keys)
    assert v_descs == [2 * kv_heads * 128] * 2, v_descs


def test_batch_one_decode_step_reads_the_attention_output_right():
    # batch 1: o_proj's x^T is the attention output's 64 elements, kept in SBUF as 4 head rows of 16; it is not a
    # run of 64 partitions, so it cannot be read in place (tile_ap once took its 4 partitions x 16 for one)
    from neuron_stack.compiler.schedule import build_schedules
    from neuron_stack.isa.interp import run_program

    step, args = _decode_step(2, B=1)
    with torch.no_grad():
        want = step(*args)
    prog = fuse(partition(legalize(capture(step, args))))
    names = [n.name for n in prog.nodes if n.target == "placeholder"]
    got = run_program(prog, dict(zip(names, (a.numpy() for a in args))),
                      build_schedules(prog, {"auto_cast": "none", "target": "inf2"}))[0]
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-4, atol=1e-5)


def test_gqa_decode_layer_never_copies_the_kv_cache():
    # a decode step of a GQA layer (8 query heads over 2 KV heads, batch 4, 4096-token cache): K and V are
    # read once per KV head, and nothing cache-sized is written (a repeat_kv copy wrote 4x the cache)
    from transformers import LlamaConfig

    from neuron_stack.compiler.driver import compile_program
    from neuron_stack.frontend.flags import parse_flags
    from neuron_stack.llm.project import _program

    cfg = LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=8, num_key_value_heads=2)
    B, S = 4, 4096
    neff = compile_program(_program(cfg, 1, B, 1, S, "bfloat16", None), parse_flags(None, target="inf2"),
                           detail=False)
    (sc,) = neff.schedules.values()
    cache = 2 * B * 2 * S * 64 * 2         # K and V, bf16
    assert sc.hbm_write_bytes < cache / 4        # (the copies wrote 4x the cache, and read it 8x)
    assert sc.hbm_read_bytes < 1.5 * cache


def test_one_kv_head_broadcast_to_the_query_heads_is_read_once():
    # batch-1 decode with one KV head (the heads are the bmm's batch, K and V a stride-0 broadcast): the four
    # query heads are rows of one matmul, so K and V are loaded once, not once per head; numbers as eager
    from neuron_stack.compiler.schedule import build_schedules
    from neuron_stack.isa.interp import run_program

    def decode(q, k, v):
        k, v = k.expand(1, 4, *k.shape[2:]), v.expand(1, 4, *v.shape[2:])
        return ((q @ k.transpose(-1, -2)) / 4).softmax(-1) @ v

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 1, 1024, 16), torch.randn(1, 1, 1024, 16)
    prog = fuse(partition(legalize(capture(decode, (q, k, v)))))
    schedules = build_schedules(prog, {"auto_cast": "none", "target": "inf2"})
    names = [n.name for n in prog.nodes if n.target == "placeholder"]
    (out,) = run_program(prog, dict(zip(names, (q.numpy(), k.numpy(), v.numpy()))), schedules)
    torch.testing.assert_close(torch.from_numpy(out), decode(q, k, v), rtol=1e-4, atol=1e-5)
    kv_bytes = (k.numel() + v.numel()) * 4
    assert schedules[0].hbm_read_bytes < 1.5 * kv_bytes


def test_short_gqa_prompt_takes_the_flash_path_with_a_select_per_head_and_computes_eager_logits():
    # a 48-token prompt of a tiny GQA Llama: each KV head's two query heads are the 96 rows of one partial
    # query block (kvread.py reads K and V in place), so the causal mask is one AFFINE_SELECT per head and
    # key block; no score row leaves the chip, and the logits equal eager (at 128 tokens it fell to the roofline
    # model before: the mask, shared by the heads, has no layout over their stacked rows)
    import transformers as T

    from neuron_stack.compiler.schedule import build_schedules
    from neuron_stack.llm.prefill import context_encoding_cache

    cfg = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(cfg).eval()

    def prefill(ids):
        cache = context_encoding_cache(T.StaticCache(config=cfg, max_cache_len=ids.shape[1]))
        return model(input_ids=ids, past_key_values=cache).logits

    ids = torch.randint(0, 128, (1, 48))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    prog = fuse(partition(legalize(capture(prefill, (ids,)))))
    (sc,) = build_schedules(prog, {"auto_cast": "none", "target": "trn1"}).values()
    where = {n.name for n in prog.nodes if n.target == "aten.where.self"}
    rows = list(zip(sc.table["opcode"].to_pylist(), sc.table["node"].to_pylist()))
    assert sum(op == "AFFINE_SELECT" and node in where for op, node in rows) == 2 * 2   # 2 KV heads x 2 heads
    assert sc.hbm_write_bytes == 4 * (48 * 128 + 2 * 2 * 48 * 16)      # the logits and the cache, no scores
    got = neuron_stack.trace(prefill, (ids,), compiler_args="--auto-cast none --no_cache")(ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
