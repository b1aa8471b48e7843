"""The lowering and the scheduler, pinned: every instruction table of a fixed set of models,
on each target and cast, hashed and compared with ``tests/data/lowering_golden.json``.

A refactor of ``compiler/lower`` or ``compiler/schedule`` must leave these unchanged; a change that means to move
a schedule (a new tiling, a cost-model fix) re-pins them with ``python tests/test_lowering_golden.py --update``
and says why in its commit.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_workloads"))
from models import CNN, MLP, BertEncoder, GPTDecoder  # noqa: E402

from neuron_stack.compiler.fuse import fuse  # noqa: E402
from neuron_stack.compiler.legalize import legalize  # noqa: E402
from neuron_stack.compiler.lower.attention import FLASH_MIN_KEYS  # noqa: E402
from neuron_stack.compiler.partition import partition  # noqa: E402
from neuron_stack.compiler.schedule import build_schedules  # noqa: E402
from neuron_stack.frontend.export import capture  # noqa: E402
from neuron_stack.llm.kernels import fuse_rms_norms  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "lowering_golden.json"


class Wide(torch.nn.Module):
    """A large-M matmul, a row reduction over a long free axis, and a transpose: the tiling paths small models miss."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(512, 1536), torch.nn.Linear(1536, 384)

    def forward(self, x):
        h = torch.nn.functional.silu(self.up(x))
        return self.down(h).softmax(-1).transpose(0, 1) * x[:, :384].sum(-1)


class Decode(torch.nn.Module):
    """One token's grouped-query attention over a KV cache, as Hugging Face writes it (repeat_kv, then matmuls)."""

    def forward(self, q, k, v):
        b, kvh, s, d = k.shape
        k, v = (t[:, :, None].expand(b, kvh, 2, s, d).reshape(b, 2 * kvh, s, d) for t in (k, v))
        return ((q @ k.transpose(-2, -1)) * d**-0.5).softmax(-1) @ v


class Flash(torch.nn.Module):
    """Masked attention over more keys than one softmax row holds: the flash path."""

    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _llama():
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    fuse_rms_norms(model)
    return model


def _models():
    torch.manual_seed(0)
    return {
        "mlp": (MLP(), (torch.randn(32, 64),)),
        "bert": (BertEncoder(vocab=200, hidden=64, layers=1, heads=4, seq=24),
                 (torch.randint(0, 200, (2, 24)), torch.ones(2, 24, dtype=torch.long))),
        "gpt": (GPTDecoder(vocab=200, hidden=64, layers=1, heads=2, seq=40), (torch.randint(0, 200, (1, 40)),)),
        "cnn": (CNN(), (torch.randn(2, 3, 16, 16),)),
        "wide": (Wide(), (torch.randn(640, 512),)),
        "decode": (Decode(), (torch.randn(1, 4, 1, 16), torch.randn(1, 2, 96, 16), torch.randn(1, 2, 96, 16))),
        "flash": (Flash(), (torch.randn(1, 2, 160, 16), torch.randn(1, 2, FLASH_MIN_KEYS + 72, 16),
                            torch.randn(1, 2, FLASH_MIN_KEYS + 72, 16), torch.rand(160, FLASH_MIN_KEYS + 72) > 0.3)),
        "llama": (_llama(), (torch.randint(0, 100, (1, 12)),)),
    }


CASES = [("trn1", {}), ("trn1", {"auto_cast": "matmult"}), ("inf2", {"auto_cast": "all", "auto_cast_type": "fp16"}),
         ("trn2", {})]


def _digest(table) -> str:
    h = hashlib.sha256()
    for name in sorted(table.column_names):
        h.update(name.encode() + repr(table[name].to_pylist()).encode())
    return h.hexdigest()[:16]


def fingerprints() -> dict[str, dict]:
    """``{"model/target/flags": {"schedules": {part: digest}, "device_ns": [...]}}``.

    A digest covers every column, ``operands`` included: the same instructions on the same operands in the same
    order compute the same numbers, so the interpreter need not run them again."""
    out = {}
    for name, (model, inputs) in _models().items():
        prog = fuse(partition(legalize(capture(model.eval(), inputs))))
        for target, flags in CASES:
            flags = {**flags, "target": target}
            scheds = build_schedules(prog, flags)
            key = f"{name}/{target}/{flags.get('auto_cast', 'none')}"
            out[key] = {"schedules": {str(p): _digest(s.table) for p, s in scheds.items()},
                        "device_ns": [s.device_ns for s in scheds.values()]}
    return out


@pytest.fixture(scope="module")
def now():
    return fingerprints()


def test_every_schedule_and_output_is_as_pinned(now):
    pinned = json.loads(GOLDEN.read_text())
    changed = {k: (pinned.get(k), v) for k, v in now.items() if pinned.get(k) != v}
    assert not changed, f"lowering changed (re-pin with --update only if meant): {changed}"
    assert set(pinned) == set(now)


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        GOLDEN.write_text(json.dumps(fingerprints(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN}")
