"""Tiny Hugging Face BertModel and LlamaForCausalLM (configs, random weights, no download) through
neuron_stack.trace and torch.compile(backend="neuron"): eager-equal outputs."""
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

import neuron_stack  # noqa: E402


def bert():
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=32)
    return transformers.BertModel(cfg).eval()


def llama():
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128, max_position_embeddings=32,
                                   use_cache=False)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("factory", [bert, llama])
def test_trace(factory):
    torch.manual_seed(0)
    model = factory()
    ids = torch.randint(0, 100, (2, 16))
    nm = neuron_stack.trace(model, {"input_ids": ids})
    with torch.no_grad():
        want = model(input_ids=ids)
    got = nm(input_ids=ids)
    key = "last_hidden_state" if factory is bert else "logits"
    torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-4)
    files = {os.path.basename(n.source.file) for n in nm.neff.program.nodes if n.source}
    assert f"modeling_{factory.__name__}.py" in files


@pytest.mark.parametrize("factory", [bert, llama])
def test_torch_compile(factory):
    torch.manual_seed(0)
    model = factory()
    ids = torch.randint(0, 100, (2, 16))
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        got = compiled(input_ids=ids)
        want = model(input_ids=ids)
    key = "last_hidden_state" if factory is bert else "logits"
    torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-4)
