"""Models of the sample workloads and benchmarks, written in the repo (random init, no downloads).

>>> import torch
>>> m = BertEncoder(vocab=50, hidden=32, layers=1, heads=2, seq=8).eval()
>>> m(torch.randint(0, 50, (2, 8))).shape
torch.Size([2, 8, 32])
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def attention(q, k, v, mask=None):
    """Scaled dot-product attention written out (a helper in another file: its lines are kept)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


class MLP(nn.Module):
    def __init__(self, d_in=64, hidden=256, d_out=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        h = F.gelu(self.fc2(h))
        return self.head(h).log_softmax(dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, hidden, heads, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x, pad_mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        mask = None
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        if pad_mask is not None:
            pm = ~pad_mask[:, None, None, :].bool()
            mask = pm if mask is None else (mask | pm)
        y = attention(q, k, v, mask)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A transformer block: post-norm (BERT) or pre-norm (GPT)."""

    def __init__(self, hidden, heads, causal=False, pre_norm=False):
        super().__init__()
        self.attn = SelfAttention(hidden, heads, causal)
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.ff1, self.ff2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
        self.pre_norm = pre_norm

    def forward(self, x, pad_mask=None):
        if self.pre_norm:
            x = x + self.attn(self.ln1(x), pad_mask)
            return x + self.ff2(F.gelu(self.ff1(self.ln2(x)), approximate="tanh"))
        x = self.ln1(x + self.attn(x, pad_mask))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class BertEncoder(nn.Module):
    """BERT-style encoder: token + position embeddings, post-norm blocks, bidirectional attention."""

    def __init__(self, vocab=1000, hidden=128, layers=2, heads=4, seq=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(Block(hidden, heads) for _ in range(layers))

    def forward(self, ids, pad_mask=None):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.ln(self.tok(ids) + self.pos(pos))
        for layer in self.layers:
            x = layer(x, pad_mask)
        return x


class GPTDecoder(nn.Module):
    """GPT-style decoder: pre-norm blocks with causal attention and a tied LM head."""

    def __init__(self, vocab=1000, hidden=128, layers=2, heads=4, seq=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, causal=True, pre_norm=True) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        for layer in self.layers:
            x = layer(x)
        return self.ln_f(x) @ self.tok.weight.t()


class CNN(nn.Module):
    """conv-bn-relu-maxpool, conv-relu, adaptive average pool, linear."""

    def __init__(self, classes=10, width=16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.conv2(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Ranker(nn.Module):
    """Scores items, keeps the positive ones (boolean mask: data-dependent) and sorts the scores."""

    def __init__(self, d=32, items=16):
        super().__init__()
        self.score = nn.Linear(d, items)
        self.mix = nn.Linear(items, items)

    def forward(self, x):
        s = self.score(x)
        ranked = s.sort(dim=-1, descending=True).values       # forced to the CPU by partitioner_config
        positive = s[s > 0]                                    # data-dependent shape: CPU fallback
        gate = torch.sigmoid(positive.sum() / (positive.numel() + 1))
        return self.mix(ranked) * gate
