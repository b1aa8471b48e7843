"""The ISA interpreter against eager PyTorch, per op class and on small models: the tiles,
partitions, PSUM accumulation and epilogues of the lowering produce the right numbers
(fp32: rtol 1e-4; bf16 auto-cast: relative norm < 1e-2)."""
import numpy as np
import pytest
import torch

from neuron_stack.compiler.fuse import fuse
from neuron_stack.compiler.legalize import legalize
from neuron_stack.compiler.partition import partition
from neuron_stack.compiler.schedule import build_schedule, build_schedules
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import capture
from neuron_stack.isa.interp import InterpError, run, run_program


class F(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *a):
        return self.fn(*a)


_GEN = torch.Generator().manual_seed(0)


def r(*shape):
    return torch.randn(*shape, generator=_GEN)


CASES = {
    # op class: matmul
    "mm_ragged": (F(lambda a, b: a @ b), (r(130, 300), r(300, 600))),
    "addmm_linear_gelu": (torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU()), (r(200, 64),)),
    "bmm": (F(lambda a, b: torch.bmm(a, b)), (r(3, 40, 70), r(3, 70, 50))),
    "matmul_broadcast": (F(lambda a, b: a @ b), (r(2, 5, 33, 20), r(20, 9))),
    # conv
    "conv2d": (torch.nn.Conv2d(3, 8, 3, padding=1), (r(2, 3, 10, 10),)),
    # elementwise (broadcasts, scalars, chains through views)
    "elementwise_chain": (F(lambda a, b: torch.relu(a * 2 + b) - a / 3), (r(4, 50, 33), r(50, 1))),
    "where_compare": (F(lambda a, b: torch.where(a > 0, a, b)), (r(4, 5), r(4, 5))),
    "clamp_pow": (F(lambda a: torch.clamp(a, -0.5, 0.5) + a.pow(2) * 0.1), (r(300, 7),)),
    # activation
    "activations": (F(lambda a: torch.sigmoid(a) * torch.tanh(a) + torch.nn.functional.silu(a).exp()), (r(300, 7),)),
    "hardswish_generic": (F(lambda a: torch.nn.functional.hardswish(a)), (r(9, 130),)),
    # reduction
    "sum_mean": (F(lambda a: a.sum(1) + a.mean(-1, keepdim=True).sum(1)), (r(6, 300, 10),)),
    "amax_dim0": (F(lambda a: a.amax(0)), (r(70, 20),)),
    "var": (F(lambda a: a.var(-1)), (r(5, 100),)),
    "cumsum": (F(lambda a: a.cumsum(-1)), (r(4, 9),)),
    # softmax
    "softmax_dim0": (F(lambda a: torch.softmax(a, 0)), (r(33, 17),)),
    "log_softmax": (F(lambda a: torch.log_softmax(a, -1)), (r(5, 100),)),
    "softmax_spilled": (F(lambda a: torch.softmax(a, -1)), (r(2, 60_000),)),
    # normalization
    "layer_norm": (torch.nn.LayerNorm(96), (r(3, 50, 96),)),
    "layer_norm_chunked": (torch.nn.LayerNorm(40_000), (r(2, 40_000),)),
    "group_norm": (torch.nn.GroupNorm(2, 6), (r(2, 6, 5, 5),)),
    # gather
    "embedding": (torch.nn.Embedding(50, 16), (torch.randint(0, 50, (3, 7), generator=_GEN),)),
    "arange_add": (F(lambda a: a + torch.arange(7)), (r(3, 7),)),
    # data movement
    "cat": (F(lambda a, b: torch.cat([a, b * 2], 1)), (r(4, 5), r(4, 3))),
    "pad": (F(lambda a: torch.nn.functional.pad(a, (1, 2))), (r(4, 5),)),
    "permute_contiguous": (F(lambda a: a.permute(1, 0, 2).contiguous() * 1.5), (r(4, 5, 6),)),
    "to_dtype": (F(lambda a: a.to(torch.bfloat16).float() + 1), (r(4, 300),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreter_matches_eager_fp32(name):
    torch.manual_seed(0)
    model, args = CASES[name]
    model.eval()
    prog = fuse(partition(legalize(capture(model, args))))
    out = run_program(prog, dict(zip(prog.input_names, [a.numpy() for a in args])), build_schedules(prog))
    ref = model(*args)
    ref = ref if isinstance(ref, (list, tuple)) else [ref]
    for o, e in zip(out, ref):
        # atol covers fp32 sums whose terms cancel (the engines accumulate in a different order)
        np.testing.assert_allclose(o, e.detach().numpy(), rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def bert():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                     vocab_size=100)
    m = BertModel(cfg).eval()
    ids = torch.randint(0, 100, (2, 16))
    return m, ids, fuse(partition(legalize(capture(m, (ids,)))))


def test_small_bert_fp32_and_bf16(bert):
    m, ids, prog = bert
    ref = m(ids).last_hidden_state.detach().numpy()
    out = run_program(prog, {prog.input_names[0]: ids.numpy()}, build_schedules(prog))
    np.testing.assert_allclose(out[0], ref, rtol=1e-4, atol=1e-4)
    bf = run_program(prog, {prog.input_names[0]: ids.numpy()}, build_schedules(prog, {"auto_cast": "matmult"}))
    assert np.linalg.norm(bf[0] - ref) / np.linalg.norm(ref) < 1e-2


def test_trn2_schedule_computes_the_same_numbers(bert):
    m, ids, prog = bert
    s = build_schedule(prog, 0, get_profile("trn2"), {})
    vals = run(prog, 0, s, {prog.input_names[0]: ids.numpy()})
    out_name = prog.output_names[0]["node"] if isinstance(prog.output_names[0], dict) else None
    if out_name:
        np.testing.assert_allclose(vals[out_name], m(ids).last_hidden_state.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_missing_input_is_a_clear_error():
    model, args = CASES["cat"]
    prog = fuse(partition(legalize(capture(model, args))))
    s = build_schedule(prog, 0, get_profile("trn1"), {})
    with pytest.raises(InterpError, match="was not given"):
        run(prog, 0, s, {})
