"""Long attention rows take the flash path (issue 24): scores of more keys than one PSUM bank never
go to HBM, and the numbers equal eager PyTorch, masked rows and partial blocks included."""
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
