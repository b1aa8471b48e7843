"""Real-number tensor parallelism for a decoder sub-model, sharded as NxDI shards Llama (reference §2.3):
the embedding split over the hidden dimension (``ParallelEmbedding(shard_across_embedding=True)``) then an
all-gather; per layer, attention with each rank's query heads and KV heads (``REPLICATE_TO_TP_DEGREE``,
:func:`~.kvcache.kv_heads_per_rank`) and a row-parallel ``o_proj``, then an all-reduce; the MLP with
column-parallel gate/up and row-parallel down, then an all-reduce; the norms replicated; ``lm_head`` split
over the vocabulary (padded to a multiple of the degree, as NxDI pads it) then an all-gather.

Each (part, rank) is its own NEFF on its own NeuronCore; each rank's KV cache lives on its core. A call
runs every rank's part at the projected time its core and inputs are ready, then the collective (the
runtime's algorithm for its size) once the last rank arrives, with numbers (sum or concatenation on the
host) and costed and recorded by :mod:`neuron_stack.runtime.collectives`. The call's device time is its makespan.

>>> sub = ShardedSubModel.build(hf, "token_generation", 64, tp=2)     # doctest: +SKIP
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from .config import InferenceError
from .kvcache import kv_heads_per_rank
from .modeling import attend, cache_masks, kv_geometry, rope


def _out_slice(linear: nn.Linear, idx: torch.Tensor) -> nn.Linear:
    """The output features ``idx`` of ``linear`` (column parallel), bias sliced alike."""
    s = nn.Linear(linear.in_features, len(idx), bias=linear.bias is not None)
    with torch.no_grad():
        s.weight.copy_(linear.weight[idx])
        if linear.bias is not None:
            s.bias.copy_(linear.bias[idx])
    return s


def _in_slice(linear: nn.Linear, lo: int, hi: int, bias: bool) -> nn.Linear:
    """Input features ``lo:hi`` of ``linear`` (row parallel); the bias on one rank only (``bias``)."""
    s = nn.Linear(hi - lo, linear.out_features, bias=bias and linear.bias is not None)
    with torch.no_grad():
        s.weight.copy_(linear.weight[:, lo:hi])
        if s.bias is not None:
            s.bias.copy_(linear.bias)
    return s


def check_tp(config, tp: int) -> None:
    """Refuse a degree the model's shapes do not split over, naming the dimension."""
    heads, kv, _ = kv_geometry(config)
    kv_heads_per_rank(kv, tp)
    for name, size in (("num_attention_heads", heads), ("hidden_size", config.hidden_size),
                       ("intermediate_size", config.intermediate_size)):
        if size % tp:
            raise InferenceError(f"{name}={size} does not split over tp_degree={tp}: use a degree that divides it")


class EmbedShard(nn.Module):
    """Rank ``r``'s columns of the embedding table."""

    def __init__(self, embed: nn.Embedding, r: int, tp: int):
        super().__init__()
        w = embed.weight.chunk(tp, 1)[r]
        self.weight = nn.Parameter(w.detach().clone(), requires_grad=False)

    def forward(self, input_ids):
        return nn.functional.embedding(input_ids, self.weight)


class AttentionShard(nn.Module):
    """Rank ``r``'s attention of one layer: the replicated norm, its q/k/v heads, its rows of ``o_proj``."""

    def __init__(self, hf, layer, r: int, tp: int, kind: str, bucket: int):
        super().__init__()
        heads, kv, hd = kv_geometry(hf.config)
        self.kind, self.bucket, self.hd = kind, bucket, hd
        self.heads, self.kv = heads // tp, kv_heads_per_rank(kv, tp)
        first_kv = r * self.kv if kv >= tp else r * kv // tp
        qi = torch.arange(r * self.heads * hd, (r + 1) * self.heads * hd)
        ki = torch.arange(first_kv * hd, (first_kv + self.kv) * hd)
        a = layer.self_attn
        self.norm = copy.deepcopy(layer.input_layernorm)
        self.attn = nn.Module()
        self.attn.q_proj, self.attn.k_proj, self.attn.v_proj = (
            _out_slice(a.q_proj, qi), _out_slice(a.k_proj, ki), _out_slice(a.v_proj, ki))
        self.attn.o_proj = _in_slice(a.o_proj, qi[0].item(), qi[-1].item() + 1, bias=r == 0)
        rot = hf.model.rotary_emb
        self.register_buffer("inv_freq", rot.inv_freq.detach().clone().float(), persistent=False)
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))

    def forward(self, h, position_ids, seq_ids, k_cache, v_cache):
        cos, sin = rope(self.inv_freq, self.rope_scale, position_ids)
        write, mask = cache_masks(self.kind, self.bucket, position_ids, seq_ids, k_cache.shape[0], h.shape[1])
        return attend(self.attn, self.heads, self.kv, self.hd, self.kind, self.bucket, self.norm(h), cos, sin,
                      k_cache, v_cache, write, mask)


class MlpShard(nn.Module):
    """Rank ``r``'s MLP of one layer: the replicated norm, its gate/up columns, its rows of ``down_proj``."""

    def __init__(self, layer, r: int, tp: int):
        super().__init__()
        m = layer.mlp
        n = m.gate_proj.out_features // tp
        idx = torch.arange(r * n, (r + 1) * n)
        self.norm = copy.deepcopy(layer.post_attention_layernorm)
        self.gate, self.up = _out_slice(m.gate_proj, idx), _out_slice(m.up_proj, idx)
        self.down = _in_slice(m.down_proj, r * n, (r + 1) * n, bias=r == 0)
        self.act = m.act_fn

    def forward(self, h):
        x = self.norm(h)
        return self.down(self.act(self.gate(x)) * self.up(x))


class HeadShard(nn.Module):
    """The replicated final norm (at each prompt's last token) and rank ``r``'s rows of the padded lm_head."""

    def __init__(self, hf, r: int, tp: int, kind: str):
        super().__init__()
        w = hf.lm_head.weight
        per = -(-w.shape[0] // tp)
        padded = torch.zeros(per * tp, w.shape[1])
        padded[: w.shape[0]] = w.detach()
        self.weight = nn.Parameter(padded[r * per : (r + 1) * per].clone(), requires_grad=False)
        self.norm, self.kind = copy.deepcopy(hf.model.norm), kind

    def forward(self, h, last_pos):
        if self.kind == "context_encoding":
            h = torch.gather(h, 1, last_pos[:, None, None].expand(h.shape[0], 1, h.shape[-1]))
        return self.norm(h[:, -1]) @ self.weight.T


class ShardedSubModel:
    """One sub-model × bucket over ``tp`` NeuronCores: ``parts[name][rank]`` a compiled NeuronModule.

    Part names, in execution order: ``embed``, ``layer{i}.attn``, ``layer{i}.mlp``, ``head``.
    """

    def __init__(self, parts: dict[str, list], vocab: int, tp: int):
        self.parts, self.vocab, self.tp = parts, vocab, tp

    @staticmethod
    def shards(hf, kind: str, bucket: int, tp: int) -> dict[str, list[nn.Module]]:
        """The eager shard modules of every part and rank."""
        out = {"embed": [EmbedShard(hf.model.embed_tokens, r, tp) for r in range(tp)]}
        for i, layer in enumerate(hf.model.layers):
            out[f"layer{i}.attn"] = [AttentionShard(hf, layer, r, tp, kind, bucket).eval() for r in range(tp)]
            out[f"layer{i}.mlp"] = [MlpShard(layer, r, tp).eval() for r in range(tp)]
        out["head"] = [HeadShard(hf, r, tp, kind).eval() for r in range(tp)]
        return out

    @classmethod
    def compile(cls, hf, kind: str, bucket: int, tp: int, example: tuple, caches: list, flags: str, out: Path,
                stem: str):
        """Trace every (part, rank) on the example's shapes, save ``<stem>.tp<r>.<part>.neff`` under ``out``."""
        from neuron_stack import api

        ids, pos, seq_ids, last = example[:4]
        hidden = hf.config.hidden_size
        h = torch.zeros((*ids.shape, hidden))
        parts = {}
        for name, mods in cls.shards(hf, kind, bucket, tp).items():
            nms = []
            for r, m in enumerate(mods):
                if name == "embed":
                    args = (ids,)
                elif name == "head":
                    args = (h, last)
                elif name.endswith(".attn"):
                    i = int(name[5:].split(".")[0])
                    args = (h, pos, seq_ids, caches[r][2 * i], caches[r][2 * i + 1])
                else:
                    args = (h,)
                nm = api.trace(m, args, compiler_args=flags)
                nm.save(out / f"{stem}.tp{r}.{name}.neff")
                nms.append(nm)
            parts[name] = nms
        (out / f"{stem}.tp.json").write_text(json.dumps({"parts": list(parts), "tp": tp}))
        return cls(parts, hf.config.vocab_size, tp)

    @classmethod
    def load(cls, path: Path, stem: str, vocab: int, tp: int):
        from neuron_stack import api

        meta = path / f"{stem}.tp.json"
        if not meta.is_file():
            raise InferenceError(f"{meta}: missing: compile this configuration with tp_degree={tp} first")
        names = json.loads(meta.read_text())["parts"]
        return cls({n: [api.load(path / f"{stem}.tp{r}.{n}.neff") for r in range(tp)] for n in names},
                   vocab, tp)

    def place(self, cores: list[int]) -> None:
        """Load rank r's NEFFs on ``cores[r]`` (a NEFF loads where the process's first core is)."""
        from neuron_stack.parallel import _load_on

        for nms in self.parts.values():
            for nm, core in zip(nms, cores):
                if nm.model.core != core:
                    old, nm.model = nm.model, _load_on(nm.neff, core, {**nm.model.compile_info})
                    old.unload()

    def __call__(self, session, cores: list[int], dtype: str, args, caches: list[list[torch.Tensor]]):
        """Run the sub-model; returns (logits, device makespan ns). ``caches[r]`` is rank r's K0, V0, ..."""
        from neuron_stack.device import clock
        from neuron_stack.parallel import _run_at, _set_clock
        from neuron_stack.runtime.collectives import Group, record_collective
        from neuron_stack.runtime.collectives import plan as plan_collective

        ids, pos, seq_ids, last = args
        tp, group = self.tp, Group.on_cores(cores)
        t0 = clock.now_ns()
        free, ready = [t0] * tp, t0

        def stage(name: str, inputs: list[list], collective: str):
            nonlocal ready
            partials, arrivals = [], []
            for r, nm in enumerate(self.parts[name]):
                start = max(free[r], ready)
                outs, end = _run_at(nm.model, list(inputs[r]), start)
                with torch.no_grad():  # a NEFF's in-place inputs (the KV cache) come back as leading outputs
                    for i, t in zip(nm._mutated, outs):
                        inputs[r][i].copy_(t)
                outs = outs[len(nm._mutated) :]
                free[r] = end
                partials.append(outs[0])
                arrivals.append(end)
            p = plan_collective(collective, partials[0].numel(), dtype, group, session.profile)
            cc_start = max(arrivals)
            record_collective(session, p, cores, arrivals, cc_start, tag=name)
            ready = cc_start + p.dur_ns
            return torch.stack(partials).sum(0) if collective == "all_reduce" else torch.cat(partials, -1)

        h = stage("embed", [[ids]] * tp, "all_gather")
        i = 0
        while f"layer{i}.attn" in self.parts:
            h = h + stage(f"layer{i}.attn", [[h, pos, seq_ids, c[2 * i], c[2 * i + 1]] for c in caches],
                          "all_reduce")
            h = h + stage(f"layer{i}.mlp", [[h]] * tp, "all_reduce")
            i += 1
        logits = stage("head", [[h, last]] * tp, "all_gather")[:, : self.vocab]
        end = max(ready, *free)
        _set_clock(end)
        return logits, end - t0
