"""Encoder and vision projections: device time per sequence against the batch size (issue 38 item 6).

Hugging Face BERT-base, DistilBERT-base and ViT-base (224x224 images: 197 tokens) built on the meta
device from their default configs (no weights, no download) and compiled as a user's ``trace`` would,
with bf16 matmuls (``--auto-cast matmult``, neuronx-cc's default for inference). As the LLM projection
does (docs/llm.md), each model is compiled with one and with two encoder layers and the whole model is
``t1 + (L - 1) * (t2 - t1)``: the layers are identical. ``unet`` is a UNet-style convolutional
encoder-decoder (two 2x down-samplings by max pooling, two 2x2 stride-2 transposed convolutions up, skip
connections; 3 x 128 x 128 images), compiled whole. Its up-sampling and ViT's patch embedding
run in the layouts of ``compiler/lower/convgeom.py``.

For each model and batch it prints the whole model's device time, the time per sequence, and that time
as a multiple of batch 1's (the baseline of the same invocation): twice the work should never take more
than twice the time, so the multiple should stay at or under 1. ``x per doubling`` is the cost of doubling
the batch (2.00 = linear): the held-out rows of issue 38 saw BERT-base's batch 4 -> 8 cost 2.93x.

Usage: ``.venv/bin/python bench/encoders.py [--target trn1] [--batches 1,4,8,16] [--small]``
(``--small``: tiny configs, batches 1 and 2, seconds: the smoke run).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import transformers  # noqa: E402

from neuron_stack.compiler.driver import compile_program  # noqa: E402
from neuron_stack.frontend.export import capture  # noqa: E402
from neuron_stack.frontend.flags import parse_flags  # noqa: E402

TINY = {"hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128}
#: the published models' encoder layers (their config.json: bert-base-uncased, distilbert-base-uncased, vit-base)
LAYERS = {"bert-base": 12, "distilbert-base": 6, "vit-base": 12}


class UNet(torch.nn.Module):
    """A two-level UNet: 3x3 conv blocks, max pooling down, 2x2 stride-2 transposed convolutions up, skips."""

    def __init__(self, w: int = 32):
        super().__init__()
        nn = torch.nn

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.ReLU(), nn.Conv2d(o, o, 3, padding=1), nn.ReLU())
        self.e1, self.e2, self.mid = block(3, w), block(w, 2 * w), block(2 * w, 4 * w)
        self.up2, self.d2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2), block(4 * w, 2 * w)
        self.up1, self.d1 = nn.ConvTranspose2d(2 * w, w, 2, stride=2), block(2 * w, w)
        self.out = nn.Conv2d(w, 2, 1)

    def forward(self, x):
        s1 = self.e1(x)
        s2 = self.e2(torch.nn.functional.max_pool2d(s1, 2))
        m = self.mid(torch.nn.functional.max_pool2d(s2, 2))
        y = self.d2(torch.cat([self.up2(m), s2], 1))
        return self.out(self.d1(torch.cat([self.up1(y), s1], 1)))


def _model(kind: str, layers: int, batch: int, small: bool):
    """(model on the meta device, its inputs, sequence length) of one encoder with ``layers`` layers."""
    if kind == "unet":
        side = 32 if small else 128
        with torch.device("meta"):
            return UNet(8 if small else 32).eval(), (torch.empty(batch, 3, side, side),), side * side
    if kind == "bert-base":
        cfg = transformers.BertConfig(num_hidden_layers=layers, **(TINY if small else {}))
        cls, seq = transformers.BertModel, 32 if small else 128
    elif kind == "distilbert-base":
        tiny = {"dim": 64, "n_heads": 2, "hidden_dim": 128} if small else {}
        cfg = transformers.DistilBertConfig(n_layers=layers, **tiny)
        cls, seq = transformers.DistilBertModel, 32 if small else 128
    else:
        cfg = transformers.ViTConfig(num_hidden_layers=layers, **(TINY | {"image_size": 64} if small else {}))
        cls, seq = (lambda c: transformers.ViTModel(c, add_pooling_layer=False)), (cfg.image_size // 16) ** 2 + 1
    with torch.device("meta"):
        model = cls(cfg).eval()
        if kind == "vit-base":
            x = {"pixel_values": torch.empty(batch, 3, cfg.image_size, cfg.image_size)}
        else:
            x = {"input_ids": torch.zeros((batch, seq), dtype=torch.long)}
    return model, x, seq


def device_ns(kind: str, batch: int, target: str, small: bool) -> tuple[int, int]:
    """(whole-model device ns, sequence length) from the 1- and 2-layer compiles (UNet: one compile)."""
    flags = parse_flags("--auto-cast matmult --auto-cast-type bf16", target=target)
    t = []
    for layers in ((1,) if kind == "unet" else (1, 2)):
        model, x, seq = _model(kind, layers, batch, small)
        neff = compile_program(capture(model, x, name=f"{kind}_{layers}layer"), flags, detail=False)
        t.append(sum(sc.device_ns for sc in neff.schedules.values()))
    if kind == "unet":
        return t[0], seq
    full = 2 if small else LAYERS[kind]
    return t[0] + (full - 1) * max(0, t[1] - t[0]), seq


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="trn1", choices=("trn1", "inf2", "trn2"))
    ap.add_argument("--batches", default="1,4,8,16")
    ap.add_argument("--models", default="bert-base,distilbert-base,vit-base,unet")
    ap.add_argument("--small", action="store_true", help="tiny configs, batches 1 and 2 (the smoke run)")
    args = ap.parse_args(argv)
    batches = [1, 2] if args.small else [int(b) for b in args.batches.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (figures are simulated device time)")
    print(f"target {args.target}, bf16 matmuls; per sequence relative to batch {batches[0]} of the same model")
    print(f"{'model':<16} {'seq':>4} {'batch':>5} {'device ms':>10} {'per seq ms':>11} {'x batch 1':>10} "
          f"{'x per doubling':>15}")
    for kind in args.models.split(","):
        base = prev = None
        for b in batches:
            t0 = time.perf_counter()
            ns, seq = device_ns(kind, b, args.target, args.small)
            per = ns / b
            base = base or per
            step = "" if prev is None else f"{(ns / prev[1]) / (b / prev[0]) * 2:.2f}"
            print(f"{kind:<16} {seq:>4} {b:>5} {ns / 1e6:>10.3f} {per / 1e6:>11.4f} {per / base:>10.2f} {step:>15}"
                  f"   ({time.perf_counter() - t0:.0f} s to compile)", flush=True)
            prev = (b, ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
