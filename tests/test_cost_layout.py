"""Layout changes and broadcasts cost what the real compiler makes of them (issue 18): a transposing
copy runs on the Tensor Engine instead of one DMA descriptor per element, a bias or norm weight is read
from HBM once per inference instead of once per row tile, attention scores never leave the chip, and
the ISA interpreter still computes eager PyTorch's numbers through every one of these lowerings."""

import json

import numpy as np
import torch

from neuron_stack.compiler.fuse import fuse
from neuron_stack.compiler.legalize import legalize
from neuron_stack.compiler.partition import partition
from neuron_stack.compiler.schedule import build_schedule
from neuron_stack.device.cost import dma_ns
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import capture
from neuron_stack.isa.interp import run_program

_G = torch.Generator().manual_seed(7)


def _schedule(model, *args, flags=None):
    prog = fuse(partition(legalize(capture(model.eval(), args))))
    return prog, build_schedule(prog, 0, get_profile("trn1"), flags or {})


def _check(prog, s, model, *args):
    out = run_program(prog, {n: a.numpy() for n, a in zip(prog.input_names, args)}, {0: s})
    np.testing.assert_allclose(out[0], model(*args).detach().numpy(), rtol=1e-4, atol=1e-5)


class KeyTranspose(torch.nn.Module):
    """The key transpose of attention at batch > 1: [b, h, s, d] -> [b, h, d, s], made contiguous."""

    def forward(self, k):
        return k.transpose(-2, -1).contiguous() * 2


def test_transposing_copy_runs_on_the_tensor_engine():
    k = torch.randn(2, 4, 128, 64, generator=_G)
    prog, s = _schedule(KeyTranspose(), k)
    t = s.table.to_pydict()
    dma = [i for i, e in enumerate(t["engine"]) if e == "dma"]
    descs = [json.loads(t["operands"][i]).get("desc", 0) for i in dma]
    # no DMA moves the copy element by element (there are 65536 elements; a row of 64 is one descriptor)
    assert max(descs) <= 128 * 4, max(descs)
    clone_rows = [i for i, n in enumerate(t["node"]) if n.startswith("clone")]
    assert any(t["instruction_type"][i] == "TRANSPOSE" for i in clone_rows)
    _check(prog, s, KeyTranspose(), k)


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 512)
        self.ln = torch.nn.LayerNorm(512)

    def forward(self, x):
        return self.ln(self.fc(x))


def test_bias_and_norm_weights_are_read_once_whatever_the_rows():
    model = Linear()
    reads = {}
    for rows in (128, 1024):
        x = torch.randn(rows, 256, generator=_G)
        prog, s = _schedule(model, x)
        # input, weight [512, 256], bias [512], norm weight and bias [512]: each byte read once
        want = x.numel() * 4 + 512 * 256 * 4 + 3 * 512 * 4
        assert s.hbm_read_bytes == want, (rows, s.hbm_read_bytes, want)
        reads[rows] = s.hbm_read_bytes
        _check(prog, s, model, x)


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1) @ v


def test_attention_scores_stay_on_chip():
    q, k, v = (torch.randn(2, 4, 128, 64, generator=_G) for _ in range(3))
    prog, s = _schedule(Attention(), q, k, v)
    # HBM traffic is the three inputs and the output: the [2, 4, 128, 128] scores and probabilities
    # are neither written nor read back
    assert s.hbm_read_bytes == 3 * q.numel() * 4
    assert s.hbm_write_bytes == q.numel() * 4
    assert s.spill_save_bytes == 0
    _check(prog, s, Attention(), q, k, v)


def test_auto_cast_stores_matmul_only_values_in_bf16():
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256)

        def forward(self, x):
            return self.b(torch.nn.functional.gelu(self.a(x)))

    model, x = MLP().eval(), torch.randn(512, 256, generator=_G)
    prog, s32 = _schedule(model, x)
    _, s16 = _schedule(model, x, flags={"auto_cast": "matmult"})
    assert s16.sbuf_peak_bytes < s32.sbuf_peak_bytes  # the [512, 1024] GELU output is held in bf16
    out = run_program(prog, {prog.input_names[0]: x.numpy()}, {0: s16})
    want = model(x).detach()
    assert float(torch.linalg.norm(torch.from_numpy(out[0]) - want) / torch.linalg.norm(want)) < 1e-2


class ConvBNReLU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(32)
        with torch.no_grad():  # non-trivial running statistics
            self.bn.running_mean.uniform_(-1, 1, generator=_G)
            self.bn.running_var.uniform_(0.5, 2, generator=_G)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_conv_batch_norm_and_relu_share_one_evacuation():
    model, x = ConvBNReLU().eval(), torch.randn(2, 16, 16, 16, generator=_G)
    prog, s = _schedule(model, x)
    t = s.table.to_pydict()
    bn_rows = [i for i, n in enumerate(t["node"]) if n.startswith("_native_batch_norm")]
    # only the per-channel scale/shift columns are computed for the batch norm: no tile passes
    assert bn_rows and all(t["engine"][i] in ("vector", "dma") for i in bn_rows)
    relu = [i for i, n in enumerate(t["node"]) if n == "relu"]
    # ReLU rode in the conv's evacuation: its only DMAs are the output stores (no reload of a BN output)
    assert {t["opcode"][i] for i in relu} == {"ACTIVATE", "DMA_DIRECT2D"}
    assert all(json.loads(t["operands"][i])["dst"][0]["m"] == "hbm" for i in relu if t["engine"][i] == "dma")
    assert s.hbm_write_bytes == 2 * 32 * 16 * 16 * 4  # the output only
    _check(prog, s, model, x)


class Reduce(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def test_a_sum_over_rows_reads_whole_rows():
    """A Linear's bias gradient, ``grad.sum(0)`` of a [32, 128] fp32 gradient (issue 36): its 16 KiB were
    loaded transposed, 4096 descriptors of 4 bytes (62.6 us on one queue). Now the 32 rows are loaded whole
    (one 512-byte descriptor each) and summed over partitions on the Tensor Engine."""
    p = get_profile("trn1")
    f = Reduce(lambda g: g.sum(0))
    g = torch.randn(32, 128, generator=_G)
    prog, s = _schedule(f, g)
    t = s.table.to_pydict()
    dma = [i for i, e in enumerate(t["engine"]) if e == "dma"]
    load = next(i for i in dma if t["bytes_read"][i] == 16384)
    assert json.loads(t["operands"][load])["desc"] == 32
    # the DMA guide's cost: ~1.3 us fixed, then (16384 B + 32 descriptors x 256 B) at 17 B/ns = 1446 ns
    assert t["dur_ns"][load] == round(dma_ns(p, 16384, 32) - p.dma_fixed_ns) == 1446
    assert "MATMUL" in t["opcode"] and "REDUCE" not in t["opcode"]
    # two transfers' fixed costs, their bytes and a few hundred ns of compute: 4.4 us, was 67 us
    assert s.device_ns < 2 * p.dma_fixed_ns + 2000
    _check(prog, s, f, g)


def test_partition_sums_cover_blocks_chunks_and_middle_dims():
    """Row blocks over 128 accumulate in PSUM, kept dims over a PSUM bank are chunked, a middle dim
    is reduced with its neighbours kept; every load reads rows, never single elements."""
    for shape, fn in (((300, 700), lambda x: x.mean(0, keepdim=True)), ((4, 8, 64), lambda x: x.sum(1)),
                      ((4, 8, 64), lambda x: x.sum([0, 1]))):
        f, x = Reduce(fn), torch.randn(*shape, generator=_G)
        prog, s = _schedule(f, x)
        t = s.table.to_pydict()
        for i, e in enumerate(t["engine"]):
            if e == "dma":
                ops = json.loads(t["operands"][i])
                assert ops["desc"] * 4 < max(t["bytes_read"][i], t["bytes_written"][i]), (shape, ops)
        _check(prog, s, f, x)
