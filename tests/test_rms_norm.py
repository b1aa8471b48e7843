"""RMSNorm as one op: the front end keeps ``aten.rms_norm`` whole, the compiler lowers it in one row-wise pass
(x loaded once, sum of squares on the Scalar engine, rstd and the scale on the Vector engine, y stored once),
and ``neuron_stack.llm.kernels.fuse_rms_norms`` puts it in a Hugging Face decoder as NxDI's CustomRMSNorm.
Compiled models match eager PyTorch (fp32: rtol 1e-4; bf16: relative norm error < 1e-2)."""
import importlib
import json
import math

import pytest
import torch
import transformers

import neuron_stack
from neuron_stack.compiler.fuse import fuse
from neuron_stack.compiler.legalize import legalize
from neuron_stack.compiler.operators import lookup
from neuron_stack.compiler.partition import partition
from neuron_stack.compiler.schedule import build_schedule
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import capture
from neuron_stack.llm.kernels import RMS_NORMS, FusedRMSNorm, fuse_rms_norms

_GEN = torch.Generator().manual_seed(0)


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=_GEN).to(dtype)


def rms(shape, affine=True, eps=None, dtype=torch.float32):
    m = torch.nn.RMSNorm(shape, eps=eps, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            m.weight.copy_(r(*m.weight.shape))
    return m.to(dtype).eval()


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *a):
        return self.fn(*a)


W96 = r(96)
CASES = {
    # 150 rows: a full 128-row block and a partial one
    "weight": (rms(96), r(3, 50, 96)),
    # normalized_shape over two trailing dims, no weight, eps None (fp32 machine epsilon), 130 rows
    "no_weight_two_dims": (rms((4, 24), affine=False), r(130, 4, 24)),
    # rows longer than SBUF holds: chunked over the free axis, x loaded twice
    "chunked": (rms(40_000, eps=1e-5), r(3, 40_000)),
    # the functional form with an elementwise epilogue fused into the norm's pass
    "functional_epilogue": (Fn(lambda x: torch.nn.functional.rms_norm(x, (96,), W96, 1e-6) * 2 + 1), r(200, 96)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_traced_rms_norm_matches_eager_fp32(name):
    model, x = CASES[name]
    nm = neuron_stack.trace(model, x)
    assert [n.target for n in nm.neff.program.nodes if n.op_class == "normalization"] == ["aten.rms_norm.default"]
    with torch.no_grad():
        torch.testing.assert_close(nm(x), model(x), rtol=1e-4, atol=1e-4)


def test_traced_rms_norm_matches_eager_bf16():
    model, x = rms(256, eps=1e-6, dtype=torch.bfloat16), r(300, 256, dtype=torch.bfloat16)
    got = neuron_stack.trace(model, x, target="trn2")(x)
    with torch.no_grad():
        want = model(x)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2


def _schedule(model, x):
    return _schedule_args(model, (x,))


def _schedule_args(model, args):
    prog = fuse(partition(legalize(capture(model, args))))
    return build_schedule(prog, 0, get_profile("trn2"), {})


def _column(s, name):
    return s.table[name].to_pylist()


def test_one_pass_over_hbm_per_row_block():
    x = r(300, 2048, dtype=torch.bfloat16)
    s = _schedule(rms(2048, dtype=torch.bfloat16), x)
    ops = _column(s, "opcode")
    funcs = [json.loads(o).get("func") for op, o in zip(ops, _column(s, "operands")) if op == "ACTIVATE"]
    # 3 row blocks (128, 128, 44): one square-and-sum and one scale each, nothing else per element
    assert funcs.count("square") == 3 and ops.count("SCALAR_TENSOR_TENSOR") == 3
    assert "BN_STATS" not in ops and "TENSOR_TENSOR" not in ops and "REDUCE" not in ops
    xb = x.numel() * 2
    # x once; the weight once per block height (128, 44), broadcast over the partitions on chip
    assert sum(_column(s, "hbm_read_bytes")) == xb + 2 * 2048 * 2
    assert sum(_column(s, "hbm_write_bytes")) == xb                # y once, in bf16
    assert s.spill_save_bytes == 0 and s.spill_reload_bytes == 0


def test_long_rows_are_chunked_and_read_twice():
    x = r(2, 60_000)
    s = _schedule(rms(60_000, affine=False), x)
    assert sum(_column(s, "hbm_read_bytes")) == 2 * x.numel() * 4   # the sum pass, then the scale pass
    assert sum(_column(s, "hbm_write_bytes")) == x.numel() * 4


class _DecodeBlock(torch.nn.Module):
    """A decode step's residual add, norm and projection: [batch, hidden] kept in the lane layout."""

    def __init__(self, hidden, affine):
        super().__init__()
        self.norm, self.proj = rms(hidden, affine=affine, eps=1e-6), torch.nn.Linear(hidden, 256)

    def forward(self, x, res):
        h = x + res         # kept on chip: read by the norm and by the next residual add
        return self.proj(self.norm(h)), h * 2


@pytest.mark.parametrize("hidden, rows, affine", [(1024, (4,), True), (2048, (2, 1), False)])
def test_decode_rows_normalise_on_all_128_lanes(hidden, rows, affine):
    model, args = _DecodeBlock(hidden, affine).eval(), (r(*rows, hidden), r(*rows, hidden))
    nm = neuron_stack.trace(model, args)
    with torch.no_grad():
        for got, want in zip(nm(*args), model(*args)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    s = _schedule_args(model, args)
    ops = [(op, json.loads(o).get("func")) for op, o, node in zip(_column(s, "opcode"), _column(s, "operands"),
                                                                  _column(s, "node")) if node == "rms_norm"]
    # one square-and-sum per row over 128 lanes, one matmul adding the partials of every row
    assert ops.count(("ACTIVATE", "square")) == math.prod(rows) and ops.count(("MATMUL", None)) == 1
    assert all(json.loads(o)["dst"][0]["ap"][0][1] == 128 for op, o, node in
               zip(_column(s, "opcode"), _column(s, "operands"), _column(s, "node"))
               if node == "rms_norm" and op in ("ACTIVATE", "SCALAR_TENSOR_TENSOR", "TENSOR_SCALAR"))


def test_export_keeps_rms_norm_whole_as_normalization():
    for model, x in (CASES["weight"], CASES["no_weight_two_dims"]):
        prog = legalize(capture(model, (x,)))
        assert [n.target for n in prog.nodes if n.is_op] == ["aten.rms_norm.default"]
    assert lookup("aten.rms_norm.default")[0] == "normalization"


_MODULES = {"Llama": "llama", "Mistral": "mistral", "Mixtral": "mixtral", "Qwen2": "qwen2", "Qwen2Moe": "qwen2_moe",
            "Qwen3": "qwen3", "Qwen3Moe": "qwen3_moe", "Phi3": "phi3", "Granite": "granite", "Olmo2": "olmo2",
            "DeepseekV3": "deepseek_v3", "Gemma": "gemma", "Gemma2": "gemma2", "Gemma3": "gemma3"}


@pytest.mark.parametrize("cls_name", sorted(RMS_NORMS))
def test_fused_module_computes_each_hf_rms_norm(cls_name):
    mod = _MODULES[cls_name.removesuffix("RMSNorm")]
    cls = getattr(importlib.import_module(f"transformers.models.{mod}.modeling_{mod}"), cls_name)
    for dtype in (torch.float32, torch.bfloat16):
        hf = cls(64, 1e-6)
        with torch.no_grad():
            hf.weight.copy_(r(64) * 0.5)
        hf = hf.to(dtype)
        fused = FusedRMSNorm(hf.weight, 1e-6, RMS_NORMS[cls_name])
        x = r(5, 7, 64, dtype=dtype)
        with torch.no_grad():
            got, want = fused(x), hf(x)
        assert got.dtype == want.dtype == dtype
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        else:   # HF rounds to bf16 before the weight, the fused op after it
            assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2


def test_fused_llama_traces_with_one_op_per_norm_and_matches_eager():
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
    assert fuse_rms_norms(model) == 2 * 2 + 1
    nm = neuron_stack.trace(model, {"input_ids": ids, "use_cache": False})
    targets = [n.target for n in nm.neff.program.nodes]
    assert targets.count("aten.rms_norm.default") == 5 and "aten.rsqrt.default" not in targets
    torch.testing.assert_close(nm(input_ids=ids, use_cache=False).logits, want, rtol=1e-4, atol=1e-4)


def test_projection_meta_model_uses_the_fused_norm():
    from neuron_stack.llm.project import _meta_model

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                   vocab_size=100)
    m = _meta_model(cfg, "bfloat16")
    norms = [type(x).__name__ for x in m.modules() if "RMSNorm" in type(x).__name__]
    assert norms == ["FusedRMSNorm"] * 3
