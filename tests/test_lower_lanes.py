"""A decode step's [batch, hidden] activations in the lane layout (lower/resident.lane_layout): the residual add,
RMSNorm and the casts run on all 128 partitions instead of ``batch`` of them, RMSNorm's mean of squares adds
its per-partition partial sums on the Tensor Engine, and the projection after it reads x^T in place; the numbers
still match eager PyTorch."""
import json

import numpy as np
import pytest
import torch

import neuron_stack
import neuron_stack.compiler.lower.resident as resident
from neuron_stack.compiler.fuse import fuse
from neuron_stack.compiler.legalize import legalize
from neuron_stack.compiler.lower import lower
from neuron_stack.compiler.partition import partition
from neuron_stack.compiler.schedule import build_schedule
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import capture

H = 2048


class RMSNorm(torch.nn.Module):
    """Llama's RMSNorm, as transformers writes it (fp32 statistics, the weight applied in the input dtype)."""

    def __init__(self, h):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(h, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        dt = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x.to(dt)


class DecodeBlock(torch.nn.Module):
    """One decode step's residual add, post-attention norm and MLP for ``batch`` tokens of ``H`` hidden."""

    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(H)
        self.up = torch.nn.Linear(H, 256, bias=False)
        self.down = torch.nn.Linear(256, H, bias=False)

    def forward(self, x, attn):
        h = x + attn
        return h + self.down(torch.nn.functional.silu(self.up(self.norm(h))))


def _block(dtype):
    torch.manual_seed(0)
    return DecodeBlock().eval().to(dtype)


def _lowered(model, args, target="trn1"):
    prog = fuse(partition(legalize(capture(model, args))))
    return prog, lower(prog, 0, get_profile(target), {}), build_schedule(prog, 0, get_profile(target), {})


def _partitions(low, node_prefix):
    """The most partitions any Vector/Scalar instruction of the nodes named ``node_prefix*`` writes."""
    return max(i.operands["dst"][0]["ap"][0][1] for i in low.instrs
               if i.node.startswith(node_prefix) and i.engine in ("vector", "scalar") and i.operands.get("dst"))


@pytest.mark.parametrize("batch", [1, 4])
def test_decode_block_runs_on_all_lanes_and_matches_eager(batch):
    """As a user would: trace the block, run it, compare with eager; the norm's instructions span >= 64
    partitions (not ``batch``) and the device time falls against the old layout (rows on partitions)."""
    model = _block(torch.float32)
    x, attn = torch.randn(batch, 1, H), torch.randn(batch, 1, H)
    nm = neuron_stack.trace(model, (x, attn))
    np.testing.assert_allclose(nm(x, attn).numpy(), model(x, attn).detach().numpy(), rtol=1e-4, atol=1e-4)
    table = nm.neff.schedules[0].table.to_pydict()
    parts = [json.loads(o)["dst"][0]["ap"][0][1] for o, node, e in
             zip(table["operands"], table["node"], table["engine"])
             if node in ("pow_1", "mean", "mul_1") and e in ("vector", "scalar") and json.loads(o)["dst"]]
    assert parts and max(parts) >= 64
    lanes = _lowered(model, (x, attn))
    assert _partitions(lanes[1], "pow") >= 64
    # the projection after the norm reads x^T in place: no transposes, no DMA of its activations
    up = [i for i in lanes[1].instrs if i.node == "mm"]
    assert not any(i.itype == "TRANSPOSE" for i in up)
    assert not any(i.engine == "dma" and i.operands["src"][0]["m"] == "sbuf" for i in up)
    old = resident.LANE_ROWS
    try:
        resident.LANE_ROWS = 0          # the old layout: the batch rows on partitions
        rows = _lowered(model, (x, attn))
    finally:
        resident.LANE_ROWS = old
    assert _partitions(rows[1], "pow") == batch
    assert lanes[2].device_ns < rows[2].device_ns


def test_bf16_decode_block_matches_eager():
    model = _block(torch.bfloat16)
    x, attn = torch.randn(2, 1, H, dtype=torch.bfloat16), torch.randn(2, 1, H, dtype=torch.bfloat16)
    got = neuron_stack.trace(model, (x, attn))(x, attn).float()
    ref = model(x, attn).detach().float()
    assert float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref)) < 1e-2


def test_lane_layout_is_for_few_long_rows():
    assert resident.lane_layout([1, 1, 4096]) == (32, 128)
    assert resident.lane_layout([8, 1, 4096]) == (32, 128)
    assert resident.lane_layout([128, 4096]) is None          # a prefill: rows already fill the partitions
    assert resident.lane_layout([4, 512]) is None             # a row's piece per partition would be 4 elements
    assert resident.lane_layout([4, 600]) is None             # not a multiple of 128
