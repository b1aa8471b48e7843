"""Convolution (shifted matmuls on the Tensor Engine), pooling and inference batch norm (Vector
engine): the ISA interpreter runs the lowered instructions and must match eager PyTorch, and no
instruction of these ops may fall back to a GpSimd CUSTOM_OP."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from neuron_stack.compiler.fuse import fuse
from neuron_stack.compiler.legalize import legalize
from neuron_stack.compiler.partition import partition
from neuron_stack.compiler.schedule import build_schedule
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import capture
from neuron_stack.isa.interp import run_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sample_workloads import models  # noqa: E402

_G = torch.Generator().manual_seed(0)


def r(*shape):
    return torch.randn(*shape, generator=_G)


def _bn():
    bn = torch.nn.BatchNorm2d(6)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1, generator=_G)
        bn.running_var.uniform_(0.5, 2, generator=_G)
        bn.weight.uniform_(0.5, 2, generator=_G)
        bn.bias.uniform_(-1, 1, generator=_G)
    return bn


CASES = {
    "conv_pad": lambda: (torch.nn.Conv2d(3, 8, 3, padding=1), r(2, 3, 10, 10)),
    "conv_stride_dilation": lambda: (torch.nn.Conv2d(5, 7, 3, stride=2, padding=2, dilation=2), r(1, 5, 13, 11)),
    "conv_groups_no_bias": lambda: (torch.nn.Conv2d(8, 12, (3, 1), groups=4, bias=False, padding=(1, 0)),
                                    r(2, 8, 9, 9)),
    "conv1d": lambda: (torch.nn.Conv1d(4, 6, 5, stride=2, padding=2), r(2, 4, 33)),
    "conv_channels_over_128": lambda: (torch.nn.Conv2d(160, 140, 1), r(1, 160, 6, 6)),
    "conv_rows_over_512": lambda: (torch.nn.Conv2d(2, 3, 3, padding=1), r(1, 2, 3, 600)),
    "conv_relu_bands": lambda: (torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()), r(2, 3, 40, 40)),
    "maxpool_pad_stride": lambda: (torch.nn.MaxPool2d(3, 2, padding=1), r(2, 5, 11, 11)),
    "avgpool": lambda: (torch.nn.AvgPool2d(2), r(2, 5, 8, 8)),
    "avgpool_pad": lambda: (torch.nn.AvgPool2d(3, 2, padding=1), r(2, 5, 9, 9)),
    "batch_norm_eval": lambda: (_bn(), r(2, 6, 5, 5)),
    "cnn_sample": lambda: (models.CNN(), r(2, 3, 16, 16)),
    # ViT-style patch embedding (stride = kernel): kernel rows on partitions; 17 rows leave one unread
    "conv_patches": lambda: (torch.nn.Conv2d(3, 20, 4, stride=4), r(2, 3, 17, 16)),
    "conv_patches_wide": lambda: (torch.nn.Conv2d(40, 6, (4, 2), stride=(4, 2)), r(1, 40, 8, 10)),
    # transposed: a UNet's 2x2 stride-2 up-sampling, overlapping windows, groups, output padding, 1-D
    "conv_transposed_up2": lambda: (torch.nn.ConvTranspose2d(3, 4, 2, stride=2), r(2, 3, 5, 5)),
    "conv_transposed_overlap": lambda: (torch.nn.ConvTranspose2d(5, 6, 4, stride=2, padding=1, output_padding=1),
                                        r(1, 5, 6, 7)),
    "conv_transposed_groups": lambda: (torch.nn.ConvTranspose2d(4, 6, 3, stride=(1, 2), groups=2, bias=False),
                                       r(2, 4, 4, 5)),
    "conv_transposed_1d": lambda: (torch.nn.ConvTranspose1d(3, 5, 3, stride=3, dilation=2), r(1, 3, 9)),
}


def _compile(model, x):
    model.eval()
    return fuse(partition(legalize(capture(model, (x,)))))


@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_pool_bn_match_eager_without_gpsimd_fallback(name):
    model, x = CASES[name]()
    prog = _compile(model, x)
    s = build_schedule(prog, 0, get_profile("trn1"), {})
    opcodes = set(s.table.column("opcode").to_pylist())
    assert "CUSTOM_OP" not in opcodes
    if name.startswith("conv") or name == "cnn_sample":
        assert {"LDWEIGHTS", "MATMUL"} <= opcodes
    out = run_program(prog, {prog.input_names[0]: x.numpy()}, {0: s})
    np.testing.assert_allclose(out[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_conv_auto_cast_bf16_weights_and_inputs():
    model, x = CASES["conv_stride_dilation"]()
    prog = _compile(model, x)
    s = build_schedule(prog, 0, get_profile("trn1"), {"auto_cast": "matmult"})
    mm = s.table.filter(np.array(s.table.column("opcode").to_pylist()) == "MATMUL")
    assert {'"dt":"bfloat16"' in o for o in mm.column("operands").to_pylist()} == {True}
    out = run_program(prog, {prog.input_names[0]: x.numpy()}, {0: s})
    ref = model(x).detach().numpy()
    assert np.linalg.norm(out[0] - ref) / np.linalg.norm(ref) < 1e-2


def test_conv_tap_matmuls_and_flops_by_hand():
    # 3x3 conv, C=4 -> O=8 on 6x6 (padding 1): 9 taps, one PSUM bank of 36 positions per image
    model, x = torch.nn.Conv2d(4, 8, 3, padding=1), r(2, 4, 6, 6)
    s = build_schedule(_compile(model, x), 0, get_profile("trn1"), {})
    ops = s.table.column("opcode").to_pylist()
    assert ops.count("MATMUL") == 2 * 9 and ops.count("LDWEIGHTS") == 2 * 9
    assert s.tensor_flops == 2 * 4 * 8 * 9 * 36 * 2        # 2 * C * O * taps * positions * images
    # fp32 MATMUL, moving 36 columns, stationary 8: max(min(64, 8), 36) cycles x4 (fp32) at 2.8 GHz
    durs = {d for d, o in zip(s.table.column("dur_ns").to_pylist(), ops) if o == "MATMUL"}
    assert durs == {math.ceil(36 * 4 / 2.8)}


def test_transposed_and_patch_convs_run_on_the_tensor_engine_and_say_so():
    """Both ran as one GpSimd kernel before (docs/compiler.md); now a log line names the layout."""
    from neuron_stack.compiler.lower import lower
    for (model, x), kind in ((CASES["conv_transposed_up2"](), "transposed"), (CASES["conv_patches"](), "patches")):
        low = lower(_compile(model, x), 0, get_profile("trn1"), {})
        assert "CUSTOM_OP" not in {i.opcode for i in low.instrs}
        assert any(f"{kind} convolution on the Tensor Engine" in line for line in low.log), low.log


def test_patch_conv_contracts_kernel_rows_on_partitions():
    """A 4x4 stride-4 conv of 3 channels: 12 contraction rows (3 channels x 4 kernel rows) and 4 taps, not
    3 rows and 16 taps; the flops are the convolution's."""
    model, x = torch.nn.Conv2d(3, 8, 4, stride=4), r(1, 3, 8, 8)
    s = build_schedule(_compile(model, x), 0, get_profile("trn1"), {})
    ops = s.table.column("opcode").to_pylist()
    assert ops.count("MATMUL") == 4
    assert s.tensor_flops == 2 * 3 * 16 * 8 * 4


def test_vit_base_patch_embedding_bf16_on_tensor_engine():
    """ViT-base's patch embedding at full size (3 x 224 x 224, 16x16 stride 16, 768 channels) on the meta
    device: no GpSimd kernel, and the Tensor Engine does the 2 x 768 x 768 x 196 flops."""
    with torch.device("meta"):
        model, x = torch.nn.Conv2d(3, 768, 16, stride=16), torch.empty(1, 3, 224, 224)
    s = build_schedule(_compile(model, x), 0, get_profile("trn1"), {"auto_cast": "matmult"})
    assert "CUSTOM_OP" not in set(s.table.column("opcode").to_pylist())
    assert s.tensor_flops == 2 * 768 * 768 * 196


@pytest.mark.parametrize("name", ["conv_patches", "conv_transposed_overlap"])
def test_patch_and_transposed_conv_bf16(name):
    model, x = CASES[name]()
    prog = _compile(model, x)
    s = build_schedule(prog, 0, get_profile("trn1"), {"auto_cast": "matmult"})
    out = run_program(prog, {prog.input_names[0]: x.numpy()}, {0: s})
    ref = model(x).detach().numpy()
    assert np.linalg.norm(out[0] - ref) / np.linalg.norm(ref) < 1e-2
