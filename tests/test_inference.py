"""neuron_stack.inference: NxDI-shaped config and buckets, compile/load, generate equal to eager HF, the
KV cache as its own device-memory category, continuous batching."""

import json

import pytest
import torch

from neuron_stack.inference import (
    HuggingFaceGenerationAdapter,
    InferenceError,
    NeuronConfig,
    NeuronLlamaForCausalLM,
    generate_buckets,
    get_target_bucket,
)
from neuron_stack.inference.engine import Engine
from neuron_stack.inference.tiny import save_tiny_llama, tiny_llama


def test_buckets_as_nxdi():
    assert generate_buckets(128, 640) == [128, 256, 640]
    assert generate_buckets(128, 2048) == [128, 256, 512, 1024, 2048]
    assert generate_buckets(128, 130) == [130]
    assert generate_buckets(128, 64) == [64]
    assert get_target_bucket([128, 256, 640], 128) == 128
    assert get_target_bucket([128, 256, 640], 129) == 256
    assert get_target_bucket([128, 256, 640], 129, "second_fit") == 640
    assert get_target_bucket([128, 256, 640], 1, "max") == 640
    with pytest.raises(InferenceError, match=r"Inputs supplied \(641\) are longer than max_context_length"):
        get_target_bucket([128, 256, 640], 641)


def test_neuron_config_defaults_and_errors():
    nc = NeuronConfig(batch_size=4, seq_len=640, max_context_length=256, enable_bucketing=True)
    assert nc.context_encoding_buckets == [128, 256] and nc.token_generation_buckets == [128, 256, 640]
    assert nc.ctx_batch_size == nc.tkg_batch_size == nc.max_batch_size == 4 and nc.max_new_tokens == 384
    assert NeuronConfig(batch_size=4, is_continuous_batching=True).ctx_batch_size == 1
    assert NeuronConfig(seq_len=256).context_encoding_buckets == [256]
    with pytest.raises(InferenceError, match="max_context_length"):
        NeuronConfig(seq_len=64, max_context_length=128)
    with pytest.raises(InferenceError, match="torch_dtype"):
        NeuronConfig(torch_dtype="int3")
    with pytest.raises(InferenceError, match="largest must equal 640"):
        NeuronConfig(seq_len=640, token_generation_buckets=[128, 256])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    path = save_tiny_llama(root / "model")
    nc = NeuronConfig(
        batch_size=2,
        seq_len=64,
        max_context_length=32,
        context_encoding_buckets=[16, 32],
        token_generation_buckets=[32, 64],
        is_continuous_batching=True,
    )
    m = NeuronLlamaForCausalLM(path, nc)
    m.compile(root / "compiled")
    m.load(root / "compiled")
    return m, root


def eager(prompt, n):
    hf = tiny_llama()
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None
        )
    return out[0, len(prompt) :].tolist()


def test_compile_writes_one_neff_per_submodel_and_bucket(compiled):
    m, root = compiled
    names = sorted(p.name for p in (root / "compiled").glob("*.neff"))
    assert names == [
        "context_encoding_model_16.neff",
        "context_encoding_model_32.neff",
        "token_generation_model_32.neff",
        "token_generation_model_64.neff",
    ]
    cfg = json.loads((root / "compiled" / "neuron_config.json").read_text())
    assert cfg["neuron_config"]["seq_len"] == 64
    for nm in m.models.values():  # all on the device, instruction-level timing
        assert not nm.model.has_cpu and nm.neff.program.stats["timing_model"] == "instruction"


def test_generate_equals_eager_hf(compiled):
    m, _ = compiled
    torch.manual_seed(1)
    ids = torch.randint(3, 256, (2, 20))  # 20 tokens: bucket 32; decode crosses the 32 -> 64 bucket
    out = HuggingFaceGenerationAdapter(m).generate(ids, max_new_tokens=20)
    assert out[0, 20:].tolist() == eager(ids[0].tolist(), 20)
    assert out[1, 20:].tolist() == eager(ids[1].tolist(), 20)
    with pytest.raises(InferenceError, match="batch_size=2"):
        HuggingFaceGenerationAdapter(m).generate(ids[:1], max_new_tokens=4)


def test_kv_cache_is_device_memory_of_its_own(compiled):
    from neuron_stack.runtime.session import Session

    m, _ = compiled
    kv = m.kv_cache
    assert kv.shape == (2, 2, 64, 16)  # (slots, KV heads per rank, seq_len, head_dim)
    used = Session.get("trn1").device_memory[kv.core]["kv_cache"]
    assert used >= kv.bytes_per_core == 2 * 2 * (2 * 2 * 64 * 16) * 4


def test_continuous_batching_joins_and_leaves_per_step(compiled):
    m, _ = compiled
    m.reset()
    eng = Engine(m)
    torch.manual_seed(2)
    prompts = [torch.randint(3, 256, (n,)).tolist() for n in (5, 12, 3, 20, 9)]
    reqs = [eng.add_request(p, max_tokens=k) for p, k in zip(prompts, (6, 3, 9, 4, 7))]
    phases = []
    while (st := eng.step()) is not None:
        phases.append((st.phase, st.tokens))
        assert st.kv_slots_used <= 2
    for r, p in zip(reqs, prompts):
        assert r.finish_reason == "length" and r.output == eager(p, r.max_tokens)
        assert r.arrival_ns <= r.scheduled_ns <= r.first_token_ns <= r.finish_ns
    # five prefills, interleaved with decodes of the running requests; never more than 2 rows running
    assert sum(1 for ph, _ in phases if ph == "prefill") == 5
    first_decode = phases.index(("decode", 2))
    assert first_decode == 2 and ("prefill", 1) in phases[first_decode:]


def test_bad_requests_are_one_line(compiled):
    m, _ = compiled
    eng = Engine(m)
    with pytest.raises(
        InferenceError, match=r"Inputs supplied \(40\) are longer than max_context_length \(32\)"
    ):
        eng.add_request(list(range(3, 43)), max_tokens=4)
    with pytest.raises(InferenceError, match="exceed seq_len 64"):
        eng.add_request([5] * 30, max_tokens=40)
    with pytest.raises(InferenceError, match="outside the vocabulary"):
        eng.add_request([999], max_tokens=4)
    with pytest.raises(InferenceError, match="tp_degree=3 is not a multiple of the 2 KV heads"):
        NeuronLlamaForCausalLM(tiny_llama(), NeuronConfig(tp_degree=3))


def test_benchmark_throughput_counts_the_tokens_each_run_generates(compiled, tmp_path):
    """A run of 12 new tokens on a config whose max_new_tokens is 32: the token-generation throughput counts
    12 tokens per run (issue 38 item 7: it counted the config's figure), e2e the prompt and the new tokens."""
    from neuron_stack.inference.benchmark import benchmark_sampling

    m, _ = compiled
    assert m.neuron_config.max_new_tokens == 32
    ids = torch.randint(3, 256, (2, 20), generator=torch.Generator().manual_seed(2))
    r = benchmark_sampling(m, ids, num_runs=2, max_new_tokens=12, benchmark_report_path=tmp_path / "b.json")
    tkg, e2e = r["token_generation_model"], r["e2e_model"]
    # 11 token-generation calls a run (the first token is the context encoding's), each its device time
    assert tkg["throughput"] == pytest.approx(2 * 12 * 2 / (2 * 11 * tkg["latency_ms_avg"] / 1e3))
    assert e2e["throughput"] == pytest.approx(2 * (20 + 12) * 2 / (2 * e2e["latency_ms_avg"] / 1e3))
