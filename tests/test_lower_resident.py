"""SBUF residency across ops: intermediates stay on chip (HBM traffic is weights, graph inputs and
outputs), a heap that is too small spills with counted bytes, a GpSimd kernel that needs a resident
value from HBM evicts it, and the ISA interpreter still matches eager PyTorch in every case."""
import numpy as np
import pytest
import torch

import neuron_stack.compiler.lower.lowerer as lower_mod
from neuron_stack.compiler.fuse import fuse
from neuron_stack.compiler.legalize import legalize
from neuron_stack.compiler.lower.resident import Resident, row_tiling, translate
from neuron_stack.compiler.partition import partition
from neuron_stack.compiler.schedule import build_schedule
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import capture
from neuron_stack.isa.interp import run_program

_G = torch.Generator().manual_seed(3)


class Net(torch.nn.Module):
    """Linear -> GELU -> Linear -> softmax (no biases: every weight byte is read exactly once)."""

    def __init__(self, d=256, h=512):
        super().__init__()
        self.a = torch.nn.Linear(d, h, bias=False)
        self.b = torch.nn.Linear(h, d, bias=False)

    def forward(self, x):
        return torch.softmax(self.b(torch.nn.functional.gelu(self.a(x))), -1)


class Sorted(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x @ x.t())
        return torch.sort(y, -1).values * 2          # sort runs as a GpSimd kernel over HBM tensors


def _prog(model, x):
    return fuse(partition(legalize(capture(model.eval(), (x,)))))


def _check(prog, s, model, x):
    out = run_program(prog, {prog.input_names[0]: x.numpy()}, {0: s})
    np.testing.assert_allclose(out[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_intermediates_stay_in_sbuf():
    model, x = Net(), torch.randn(256, 256, generator=_G)
    prog = _prog(model, x)
    s = build_schedule(prog, 0, get_profile("trn1"), {})
    weights = (256 * 512 + 512 * 256) * 4
    assert s.hbm_read_bytes == x.numel() * 4 + weights       # each weight and the input once
    assert s.hbm_write_bytes == 256 * 256 * 4                 # only the graph output
    assert s.spill_save_bytes == 0 and s.spill_reload_bytes == 0
    _check(prog, s, model, x)


def test_heap_too_small_spills_and_counts_it(monkeypatch):
    model, x = Net(), torch.randn(256, 256, generator=_G)
    prog = _prog(model, x)
    monkeypatch.setattr(lower_mod, "RESIDENT_FRACTION", 0.0)
    s = build_schedule(prog, 0, get_profile("trn1"), {})
    # the intermediate (matmul [256, 512] with gelu fused in its epilogue) goes through HBM: written
    # once, read back at least once; the second matmul's [256, 256] scores never leave the chip
    # (the softmax runs in its PSUM evacuation: lower_attention.py)
    inter = 256 * 512 * 4
    assert s.spill_save_bytes >= inter and s.spill_reload_bytes >= inter
    assert s.hbm_read_bytes >= x.numel() * 4 + (256 * 512 * 2) * 4 + s.spill_reload_bytes
    _check(prog, s, model, x)


def test_gpsimd_kernel_evicts_a_resident_value():
    model, x = Sorted(), torch.randn(128, 64, generator=_G)
    prog = _prog(model, x)
    from neuron_stack.compiler.lower import lower
    low = lower(prog, 0, get_profile("trn1"), {})
    assert any("leaves SBUF" in line for line in low.log) or any(
        i.opcode == "CUSTOM_OP" for i in low.instrs)
    s = build_schedule(prog, 0, get_profile("trn1"), {})
    assert s.spill_save_bytes == 128 * 128 * 4                 # relu(x @ x.T) saved once for the sort
    _check(prog, s, model, x)


@pytest.mark.parametrize("shape,expect", [([2, 96, 64], (64, 96)), ([1, 256, 1024], (1024, 128)),
                                          ([2, 100], (100, 2)), ([1, 256, 16, 64], (1024, 128)), ([300], (300, 1)),
                                          ([1, 4, 64, 64], (64, 128))])   # attention scores: softmax's rows
def test_row_tiling(shape, expect):
    assert row_tiling(shape) == expect


def test_feature_maps_are_channel_rows():
    # a conv's [N, C, H, W] output: rows of H x W, one per channel
    assert row_tiling([4, 8, 16, 16], feature_map=True) == (256, 32)


def test_translate_row_blocks_by_hand():
    # 300 rows of 8 in blocks of 128: rows 128..255 are partitions 0..127 at free offset 8
    r = Resident("v", "__res.v", "float32", rows=300, C=8, T=128, psize=24, off=0)
    assert translate(r, 128 * 8, [(8, 128), (1, 8)]) == (8, [[24, 128], [1, 8]], ["p", "f"])
    # a run crossing the block boundary (rows 100..199) is not one access pattern
    assert translate(r, 100 * 8, [(8, 100), (1, 8)]) is None
    # every 128th row stays in one partition: a free-axis step of one row block
    assert translate(r, 5 * 8, [(128 * 8, 2), (1, 8)]) == (5 * 24, [[8, 2], [1, 8]], ["f", "f"])
