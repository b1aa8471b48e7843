"""Hugging Face causal LMs as users write them (tiny random-weight configs, no download): trace with the
KV cache, torch.compile + generate() with eager-equal tokens, instruction-level timing on every model,
the recompile-limit error, projection mode (meta device, numbers=none) from the API and the CLI, and
the Optimum-shaped on-ramp."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

import neuron_stack  # noqa: E402
import neuron_stack.dynamo  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_workloads"
T = transformers
COMMON = dict(vocab_size=100, max_position_embeddings=64)
GQA = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128
)
ARCHS = {  # default configs but tiny; only sizes are set
    "gpt2": lambda: T.GPT2LMHeadModel(
        T.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0, vocab_size=100
        )
    ),
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**GQA, **COMMON)),
    "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(**GQA, **COMMON)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**GQA, **COMMON)),
    "phi": lambda: T.PhiForCausalLM(
        T.PhiConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, **COMMON
        )
    ),
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**GQA, head_dim=16, **COMMON)),
    "falcon": lambda: T.FalconForCausalLM(
        T.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, **COMMON)
    ),
}

MORE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, **COMMON)
OTHERS = {  # what else a user would try: traced with the cache (generation is covered by the seven above)
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(num_key_value_heads=2, head_dim=16, **MORE)),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(num_key_value_heads=2, head_dim=16, **MORE)),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(num_key_value_heads=2, pad_token_id=0, **MORE)),
    "stablelm": lambda: T.StableLmForCausalLM(T.StableLmConfig(num_key_value_heads=2, **MORE)),
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**MORE)),
    "opt": lambda: T.OPTForCausalLM(
        T.OPTConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=128,
            word_embed_proj_dim=64,
            **COMMON,
        )
    ),
    "bloom": lambda: T.BloomForCausalLM(T.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=100)),
}


def build(arch, **overrides):
    torch.manual_seed(0)
    model = {**ARCHS, **OTHERS}[arch]().eval()
    for k, v in overrides.items():
        setattr(model.config, k, v)
    return model


def assert_device_only(program):
    assert program.stats["timing_model"] == "instruction"
    assert program.stats["num_fallbacks"] == 0, [
        n.target for n in program.nodes if n.placement == "cpu_fallback"
    ]


@pytest.mark.parametrize("arch", sorted(ARCHS) + sorted(OTHERS))
def test_trace_default_config_with_kv_cache(arch):
    model = build(arch)
    ids = torch.randint(0, 100, (2, 8))
    nm = neuron_stack.trace(model, {"input_ids": ids})
    got = nm(input_ids=ids)
    with torch.no_grad():
        want = model(input_ids=ids)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
    # the KV cache came back as what it is: a cache object holding every layer's keys and values
    assert type(got.past_key_values) is type(want.past_key_values)
    for g, w in zip(got.past_key_values.layers, want.past_key_values.layers):
        torch.testing.assert_close(g.keys, w.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(g.values, w.values, rtol=1e-4, atol=1e-5)
    assert_device_only(nm.neff.program)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_compile_generate_static_cache_compiles_once_per_shape(arch):
    # Mistral's sliding-window cache layer keeps a Python counter that dynamo guards on (a recompile per
    # token); with the window off (same results below the window length) its cache is static too.
    model = build(arch, **({"sliding_window": None} if arch == "mistral" else {}))
    prompt = torch.randint(1, 100, (1, 5))
    gen = dict(max_new_tokens=6, do_sample=False, cache_implementation="static", pad_token_id=0)
    with torch.no_grad():
        want = model.generate(prompt, **gen)
    torch._dynamo.reset()
    before = len(neuron_stack.dynamo.compile_events())
    model.forward = torch.compile(model.forward, backend="neuron")
    with torch.no_grad():
        got = model.generate(prompt, **gen)
    events = neuron_stack.dynamo.compile_events()[before:]
    assert torch.equal(got, want)
    assert len(events) == 2  # the prompt, then one graph for every decode step
    cls = type(model).__name__
    assert [e["name"] for e in events] == [f"{cls}.forward_inference"] * 2
    assert "tensor 'input_ids' dim 1: 5 -> 1" in events[1]["reason"] and "L['" not in events[1]["reason"]
    for e in events:
        assert_device_only(e["model"].program)


def test_compile_generate_dynamic_cache_and_recompile_limit_names_the_fix():
    model = build("llama")
    prompt = torch.randint(1, 100, (1, 5))
    with torch.no_grad():
        want = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="neuron")
    with torch.no_grad():
        got = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)
    old = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 3
    try:
        torch._dynamo.reset()
        with pytest.raises(neuron_stack.dynamo.RecompileLimitHit) as err, torch.no_grad():
            model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)  # the user's line
    finally:
        torch._dynamo.config.recompile_limit = old
    msg = str(err.value)
    assert "LlamaForCausalLM.forward was compiled 3 times" in msg
    assert "past_key_values.layers[0].keys" in msg  # the input that kept changing shape
    assert 'cache_implementation="static"' in msg and "buckets" in msg
    assert "test_llm.py:" in msg and "model.generate(prompt, max_new_tokens=8" in msg


def test_compile_without_cache_broadcast_masks_lower_to_instructions():
    model = build("llama")
    ids = torch.randint(0, 100, (2, 24))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="neuron", options={"compiler_args": "--no_cache"})
    with torch.no_grad():
        got = compiled(input_ids=ids, use_cache=False)
        want = model(input_ids=ids, use_cache=False)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
    assert_device_only(neuron_stack.dynamo.compile_events()[-1]["model"].program)


def run_sample(name, *argv, env=None):
    r = subprocess.run(
        [sys.executable, str(SAMPLES / name), *argv],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=SAMPLES,
        env=dict(os.environ, **(env or {})),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout


def test_sample_trace_static_cache_generates_eager_tokens():
    out = run_sample("llama_generate_trace.py", "--small")
    assert "greedy tokens equal eager generate(): True" in out and "OK vs eager PyTorch" in out
    assert out.count("instruction-level timing") == 2


def test_sample_torch_compile_generates_with_two_graphs():
    out = run_sample("llama_generate_compile.py", "--small")
    assert "greedy tokens equal eager generate(): True" in out and "2 graphs compiled for 12 tokens" in out


# -- projection mode -------------------------------------------------------------------------------
def tiny_config(layers=4, hidden=64):
    return T.LlamaConfig(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


def test_projection_repeats_one_layer_like_the_whole_model():
    from neuron_stack.frontend.flags import parse_flags
    from neuron_stack.llm import project
    from neuron_stack.llm.project import _compile_graph

    cfg = tiny_config(layers=4)
    p = project(cfg, sequence_length=64, context_length=16)
    assert [(g.name, g.bucket, g.active_tokens) for g in p.graphs] == [
        ("context_encoding", 16, 16),
        ("token_generation", 64, 1),
    ]
    for g in p.graphs:
        assert g.layer_ns > 0 and g.device_ns == g.base_ns + 4 * g.layer_ns and g.collective_ns == 0
        assert all(n.program.stats["numbers"] == "none" for n in g.neffs)
        whole = _compile_graph(cfg, 4, 1, g.active_tokens, g.bucket, "bfloat16", parse_flags(None))
        full_ns = sum(s.device_ns for s in whole.schedules.values())
        assert abs(g.device_ns - full_ns) / full_ns < 0.15  # measured 1-7% on these shapes
        assert abs(g.instructions - whole.program.stats["num_instructions"]) <= 0.05 * g.instructions
    kv = 2 * 4 * 1 * 2 * 64 * 16 * 2  # K and V, layers, batch, KV heads, length, head dim, bf16
    assert p.memory["kv_cache"] == kv
    assert p.memory["weights"] == sum(t.numel() for t in T.LlamaForCausalLM(cfg).parameters()) * 2


def test_projection_tensor_parallel_shards_and_adds_collectives():
    from neuron_stack.llm import project, rank_config

    cfg = tiny_config(layers=2)
    one = project(cfg, sequence_length=32, context_length=16, instance_type="trn1.32xlarge")
    four = project(cfg, tp_degree=4, sequence_length=32, context_length=16, instance_type="trn1.32xlarge")
    r = rank_config(cfg, 4)
    assert (r.num_attention_heads, r.num_key_value_heads, r.head_dim, r.intermediate_size) == (1, 1, 16, 32)
    assert four.memory["weights"] < one.memory["weights"] / 2
    assert all(g.collective_ns > 0 for g in four.graphs) and four.fits
    too_many = project(cfg, tp_degree=4, sequence_length=32, context_length=16, instance_type="inf2.xlarge")
    assert not too_many.fits and "needs more than the 2 cores" in too_many.verdict()


def test_bad_dtype_size_or_export_is_refused_naming_it():
    from neuron_stack.llm import (
        ConfigError,
        NeuronModelForCausalLM,
        NeuronModelForSequenceClassification,
        project,
    )

    with pytest.raises(ConfigError, match="dtype 'int8' is not one of bf16, fp16, fp32"):
        project("llama-3-8b", dtype="int8")
    with pytest.raises(ConfigError, match="tp_degree must be a positive integer, not 0"):
        project("llama-3-8b", tp_degree=0)
    with pytest.raises(ConfigError, match="batch_size must be a positive integer, not True"):
        NeuronModelForCausalLM.from_pretrained("llama-3-8b", batch_size=True)
    for cls in (NeuronModelForCausalLM, NeuronModelForSequenceClassification):
        with pytest.raises(ConfigError, match="export=False loads a precompiled Optimum artifact"):
            cls.from_pretrained("llama-3-8b", export=False)


def test_cli_project_json_exit_status_and_bad_input(tmp_path):
    cfgdir = tmp_path / "tiny"
    tiny_config(layers=2).save_pretrained(cfgdir)
    cmd = [
        sys.executable,
        "-m",
        "neuron_stack.llm",
        "project",
        str(cfgdir),
        "--sequence-length",
        "32",
        "--context-length",
        "16",
    ]
    r = subprocess.run(
        cmd + ["--tp", "2", "--instance", "inf2.xlarge", "--json", "--neff-dir", str(tmp_path / "n")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["fits"] and doc["instance_type"] == "inf2.xlarge" and doc["hbm_per_core"] == 16 * 2**30
    assert {g["name"] for g in doc["graphs"]} == {"context_encoding", "token_generation"}
    neff = neuron_stack.load(tmp_path / "n" / "token_generation_32_2layer.neff")
    assert neff.neff.program.stats["numbers"] == "none"
    r = subprocess.run(
        cmd + ["--tp", "8", "--instance", "inf2.xlarge"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2 and "does NOT fit" in r.stdout
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    for bad in (str(tmp_path / "bad"), str(tmp_path / "missing")):
        r = subprocess.run(
            [sys.executable, "-m", "neuron_stack.llm", "project", bad],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("neuron-llm: error: ") and "Traceback" not in r.stderr


def test_projection_sample_profile_says_numbers_none(tmp_path):
    import traces

    env = {"NEURON_RT_INSPECT_ENABLE": "1",
           "NEURON_RT_INSPECT_DEVICE_PROFILE": "session", "NEURON_RT_INSPECT_OUTPUT_DIR": str(tmp_path / "out")}
    out = run_sample("llama3_projection.py", "--small", env=env)
    assert "fits" in out and "numbers=none" in out and "outputs on meta" in out
    path = traces.finalize(tmp_path / "out")
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    meta = dict(con.sql("SELECT key, value FROM metadata").fetchall())
    [(n,)] = con.sql("SELECT count(*) FROM executions").fetchall()
    con.close()
    assert meta["numbers"] == "none" and meta["timing_model"] == "instruction" and n == 4


# -- the Optimum-shaped on-ramp --------------------------------------------------------------------
def test_neuron_model_for_causal_lm_generates_eager_tokens_and_projects_configs():
    from neuron_stack.llm import ConfigError, NeuronModelForCausalLM

    model = build("llama")
    nm = NeuronModelForCausalLM.from_pretrained(model, export=True, batch_size=1, sequence_length=32)
    prompt = torch.randint(1, 100, (1, 5))
    with torch.no_grad():
        want = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(nm.generate(prompt, max_new_tokens=10), want)
    assert sorted(nm.graphs) == [("context_encoding", 32), ("token_generation", 32)]
    with pytest.raises(ConfigError, match="batch_size=1"):
        nm.generate(torch.ones((2, 3), dtype=torch.long))
    pm = NeuronModelForCausalLM.from_pretrained(
        tiny_config(layers=2),
        export=True,
        batch_size=1,
        sequence_length=32,
        num_cores=2,
        auto_cast_type="bf16",
    )
    assert pm.projection.fits and pm.projection.tp_degree == 2
    with pytest.raises(ConfigError, match="projection mode"):
        pm.generate(prompt)
    with pytest.raises(ConfigError, match="auto_cast_type"):
        NeuronModelForCausalLM.from_pretrained(model, auto_cast_type="int4")


def test_neuron_model_for_sequence_classification_pads_to_the_compiled_shape(tmp_path):
    from neuron_stack.llm import NeuronModelForSequenceClassification

    torch.manual_seed(0)
    cfg = T.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
    )
    T.BertForSequenceClassification(cfg).eval().save_pretrained(tmp_path / "bert")
    model = T.BertForSequenceClassification.from_pretrained(tmp_path / "bert").eval()
    nm = NeuronModelForSequenceClassification.from_pretrained(
        str(tmp_path / "bert"), export=True, batch_size=2, sequence_length=16
    )
    x = torch.randint(1, 100, (2, 9))
    with torch.no_grad():
        want = model(x).logits
    torch.testing.assert_close(nm(x).logits, want, rtol=1e-4, atol=1e-5)
