"""The two sub-models of a Llama-family causal LM, written as NxDI writes them (reference §2.3, §2.5):
the KV cache is an input each NEFF updates in place, one row per batch slot, laid out BHSD
``(kv_cache_batch_size, kv_heads_per_rank, max_length, head_dim)``.

- context encoding (CTE, prefill): ``input_ids (ctx_batch, bucket)`` right-padded, ``seq_ids`` naming the
  cache row each prompt is written to (continuous batching), ``last_pos`` the last real token. Writes
  positions ``[0, bucket)`` of those rows; attends within the prompt (causal).
- token generation (TKG, decode): ``input_ids (tkg_batch, 1)``, one position per row (rows decode at
  different lengths under continuous batching). Writes the new key/value at that position and attends
  over the first ``bucket`` positions of the cache, masked past each row's position.
- speculation (NxDI's ``speculation_model``, speculative decoding's verification): ``input_ids (tkg_batch,
  k + 1)`` at consecutive positions per row; writes them all and returns the logits of every one, each
  attending over the cache up to its own position.

Positions past a row's length hold stale or padding keys; attention never reads them (the mask), and
decoding overwrites them in order, so a slot needs no clearing between requests.

The layer's projections, norms and MLP are the Hugging Face model's own modules (same weights, same
numbers); only attention, rotary embedding and the cache are ours, so rows can sit at different positions.

>>> g = DecoderGraph(hf_model, "token_generation", bucket=128)          # doctest: +SKIP
"""

from __future__ import annotations

import torch
from torch import nn

from .config import InferenceError

SUPPORTED = ("llama", "mistral", "qwen2")


def check_supported(config) -> None:
    """Refuse a config our decoder graph does not implement, naming what is supported."""
    kind = getattr(config, "model_type", "?")
    if kind not in SUPPORTED:
        raise InferenceError(
            f"model_type {kind!r} is not supported by neuron_stack.inference (supported: "
            f"{', '.join(SUPPORTED)}); project other decoders with neuron_stack.llm.project"
        )
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", kind == "mistral") and window:
        config._ns_window = window  # checked against seq_len by the application


def kv_geometry(config) -> tuple[int, int, int]:
    """(query heads, KV heads, head_dim) of an HF decoder config."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return heads, kv, getattr(config, "head_dim", None) or config.hidden_size // heads


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(inv_freq, rope_scale: float, position_ids):
    """(cos, sin) of the rotary embedding at ``position_ids``, shaped to broadcast over heads."""
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * rope_scale)[:, None], (emb.sin() * rope_scale)[:, None]


def cache_masks(kind: str, bucket: int, position_ids, seq_ids, rows: int, t: int):
    """(where each row writes the cache, the attention mask) of one sub-model call (see the module doc)."""
    if kind == "context_encoding":
        match = torch.arange(rows)[:, None] == seq_ids[None, :]  # (cache rows, prompts)
        write = (match.to(torch.int64).argmax(dim=1), match.any(dim=1)[:, None, None, None])
        idx = torch.arange(t)
        return write, (idx[None, :] > idx[:, None])[None, None]  # causal
    span = torch.arange(bucket)
    if kind == "speculation":  # (B, t, bucket): which cache position each new token writes; past each one's
        at = (span[None, None, :] == position_ids[:, :, None]).to(torch.float32)
        return at, (span[None, None, :] > position_ids[:, :, None])[:, None]
    pos = position_ids[:, :1]  # (B, 1)
    return (span[None, :] == pos)[:, None, :, None], (span[None, :] > pos)[:, None, None, :]


def attend(attn, heads: int, kv_heads: int, head_dim: int, kind: str, bucket: int, h, cos, sin, k_cache, v_cache,
           write_rows, mask):
    """Self-attention of ``h`` with ``attn``'s q/k/v/o projections (``heads`` query and ``kv_heads`` KV heads:
    all of them, or one tensor-parallel rank's), reading and updating the cache in place."""
    b, t, _ = h.shape
    q = attn.q_proj(h).view(b, t, heads, head_dim).transpose(1, 2)
    k = attn.k_proj(h).view(b, t, kv_heads, head_dim).transpose(1, 2)
    v = attn.v_proj(h).view(b, t, kv_heads, head_dim).transpose(1, 2)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    if kind == "context_encoding":
        rows_src, has = write_rows
        span = k_cache[:, :, :t]
        k_cache[:, :, :t].copy_(torch.where(has, k.index_select(0, rows_src), span))
        v_cache[:, :, :t].copy_(torch.where(has, v.index_select(0, rows_src), v_cache[:, :, :t]))
        keys, values = k, v  # the prompt attends to itself
    elif kind == "speculation":
        at = write_rows  # (B, t, bucket) one-hot
        hit = at.sum(1)[:, None, :, None] > 0  # (B, 1, bucket, 1)
        keys = torch.where(hit, torch.einsum("bts,bhtd->bhsd", at, k), k_cache[:, :, :bucket])
        values = torch.where(hit, torch.einsum("bts,bhtd->bhsd", at, v), v_cache[:, :, :bucket])
        k_cache[:, :, :bucket].copy_(keys)
        v_cache[:, :, :bucket].copy_(values)
    else:
        at = write_rows  # (B, 1, bucket, 1): this step's position per row
        keys = torch.where(at, k, k_cache[:, :, :bucket])
        values = torch.where(at, v, v_cache[:, :, :bucket])
        k_cache[:, :, :bucket].copy_(keys)
        v_cache[:, :, :bucket].copy_(values)
    groups = heads // kv_heads
    if groups > 1:
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, keys.transpose(2, 3)) * head_dim**-0.5
    scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, values).transpose(1, 2).reshape(b, t, -1)
    return attn.o_proj(out)


class DecoderGraph(nn.Module):
    """One sub-model (``kind`` = context_encoding | token_generation) of ``model`` for one ``bucket``.

    forward(input_ids, position_ids, seq_ids, last_pos, *caches) -> logits (B, vocab) or greedy tokens (B,);
    ``caches`` are K0, V0, K1, V1, ... and are updated in place.
    """

    def __init__(self, model, kind: str, bucket: int, greedy_on_device: bool = False):
        super().__init__()
        self.model = model
        self.kind, self.bucket, self.greedy = kind, bucket, greedy_on_device
        cfg = model.config
        self.heads, self.kv_heads, self.head_dim = kv_geometry(cfg)
        rot = model.model.rotary_emb
        self.register_buffer("inv_freq", rot.inv_freq.detach().clone().float(), persistent=False)
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))

    def forward(self, input_ids, position_ids, seq_ids, last_pos, *caches):
        inner = self.model.model
        h = inner.embed_tokens(input_ids)
        cos, sin = rope(self.inv_freq, self.rope_scale, position_ids)
        b, t = input_ids.shape
        write, mask = cache_masks(self.kind, self.bucket, position_ids, seq_ids, caches[0].shape[0], t)
        for i, layer in enumerate(inner.layers):
            a = attend(layer.self_attn, self.heads, self.kv_heads, self.head_dim, self.kind, self.bucket,
                       layer.input_layernorm(h), cos, sin, caches[2 * i], caches[2 * i + 1], write, mask)
            h = h + a
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        if self.kind == "speculation":  # every position's logits (B, k + 1, vocab)
            return self.model.lm_head(inner.norm(h))
        if self.kind == "context_encoding":
            h = torch.gather(h, 1, last_pos[:, None, None].expand(b, 1, h.shape[-1]))
        h = inner.norm(h[:, -1])
        logits = self.model.lm_head(h)
        return logits.argmax(dim=-1) if self.greedy else logits
