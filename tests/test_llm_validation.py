"""Issue 31: neuron-llm checks every size against its physical range before any work, in one line."""
from __future__ import annotations

import json

import pytest

from neuron_stack.llm.cli import main

BASE = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}


def llm(capsys, *argv) -> tuple[int, str]:
    code = main(["project", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("change,needle", [
    ({"num_hidden_layers": -8}, "config num_hidden_layers = -8 is outside the physical range: give an integer "
                                "from 1 to 1,260"),
    ({"num_hidden_layers": 10**15}, "config num_hidden_layers = 1000000000000000"),
    ({"intermediate_size": 10**15}, "config intermediate_size = 1000000000000000"),
    ({"vocab_size": 10**15}, "config vocab_size = 1000000000000000"),
    ({"hidden_size": 0}, "config hidden_size = 0"),
    ({"hidden_size": None}, "the model config has no hidden_size: add it to config.json"),
    ({"num_attention_heads": 8192, "hidden_size": 4096}, "config num_attention_heads = 8192"),
    ({"num_key_value_heads": 64}, "config num_key_value_heads = 64 is outside the physical range: give an "
                                  "integer from 1 to 32"),
    ({"hidden_size": 4096.5}, "config hidden_size = 4096.5"),
])
def test_config_fields_are_checked(tmp_path, capsys, change, needle):
    fields = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    code, err = llm(capsys, str(tmp_path))
    assert code == 1 and err.count("\n") == 1 and needle in err, err


@pytest.mark.parametrize("argv,needle", [
    (["--tp", str(10**15)], "--tp = 1000000000000000 is outside the physical range: give an integer from 1 to 64"),
    (["--tp", "0"], "--tp = 0"),
    (["--batch-size", "-1"], "--batch-size = -1"),
    (["--sequence-length", str(10**12)], "--sequence-length = 1000000000000"),
    (["--context-length", "4096", "--sequence-length", "2048"], "--context-length = 4096"),
    (["--tkg-buckets", "0"], "--tkg-buckets = 0"),
    (["--instance", "p5.48xlarge"], "unknown instance type 'p5.48xlarge'"),
])
def test_flags_are_checked(capsys, argv, needle):
    code, err = llm(capsys, "llama-3-8b", *argv)
    assert code == 1 and err.count("\n") == 1 and needle in err, err


@pytest.mark.real_python   # it checks what the process imports: a warm one has torch
def test_a_refusal_loads_neither_torch_nor_the_compiler(tmp_path):
    """The checks run before `neuron_stack.llm.project` (and torch) load: a bad size costs a second, not 250 MB."""
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(BASE | {"hidden_size": -1}))
    code = ("import sys; from neuron_stack.llm.cli import main; rc = main(['project', sys.argv[1]]); "
            "print(rc, 'torch' in sys.modules, 'neuron_stack.compiler' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "False", "False"], out.stderr
    assert "config hidden_size = -1" in out.stderr


# Issue 38: inconsistent fields are refused in well under a second, before transformers, torch or a compile
@pytest.mark.parametrize("change,needle", [
    ({"num_key_value_heads": 5}, "config num_key_value_heads = 5 does not divide num_attention_heads = 32: "
                                 "each key-value head serves a whole group of query heads; set "
                                 "num_key_value_heads to a divisor of 32 (e.g. 4)"),
    ({"num_attention_heads": 30, "num_key_value_heads": 5},
     "config num_attention_heads = 30 does not divide hidden_size = 4096: set num_attention_heads to a divisor "
     "of 4096 (e.g. 32)"),
    ({"num_attention_heads": 30, "num_key_value_heads": 5, "head_dim": 128},   # Llama requires it regardless
     "config num_attention_heads = 30 does not divide hidden_size = 4096"),
    ({"hidden_size": 4064, "head_dim": 127}, "config head_dim = 127 (hidden_size / num_attention_heads unless "
                                             "given) is odd: rotary position embeddings rotate pairs"),
    ({"layer_types": ["full_attention"]}, "config layer_types has 1 entries but num_hidden_layers = 2: give one "
                                          "entry per layer"),
    ({"rms_norm_eps": 0}, "config rms_norm_eps = 0 must be a positive number"),
    ({"rope_theta": -1.0}, "config rope_theta = -1.0 must be a positive number"),
    ({"sliding_window": 0}, "config sliding_window = 0 is outside the physical range"),
])
def test_inconsistent_fields_are_one_line(tmp_path, capsys, change, needle):
    (tmp_path / "config.json").write_text(json.dumps(BASE | change))
    code, err = llm(capsys, str(tmp_path))
    assert code == 1 and err.count("\n") == 1 and needle in err, err


def _fast_refusal(argv: list[str], module: str) -> tuple[int, str, list[str]]:
    """Run ``python -m module argv`` in a fresh interpreter: exit code, stderr, heavy modules it loaded."""
    import subprocess
    import sys

    code = (f"import sys, runpy; sys.argv = [{module!r}, *sys.argv[1:]]\n"
            "try:\n"
            f"    runpy.run_module({module!r}, run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    print(e.code, *[m for m in ('torch', 'transformers', 'neuron_stack.compiler') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    rc, *heavy = out.stdout.split()
    return int(rc), out.stderr, heavy


@pytest.mark.parametrize("module,argv,rc", [
    ("neuron_stack.llm", ["project", "{cfg}", "--tp", "8"], 1),
    ("neuron_stack.inference.demo", ["run", "--model-path", "{cfg}", "--tp-degree", "8"], 2),
    ("neuron_stack.inference.demo", ["serve", "--model-path", "{cfg}"], 2),
])
@pytest.mark.real_python   # it checks what the process imports: a warm one has torch
def test_every_cli_refuses_before_torch(tmp_path, module, argv, rc):
    """32 attention heads over 5 KV heads: one line from each CLI, with neither torch nor transformers loaded
    (the 8-10 s that transformers' own validator took to say nothing after its colon)."""
    (tmp_path / "config.json").write_text(json.dumps(BASE | {"num_key_value_heads": 5}))
    code, err, heavy = _fast_refusal([a.format(cfg=tmp_path) for a in argv], module)
    assert (code, heavy) == (rc, []) and err.count("\n") == 1, err
    assert "config num_key_value_heads = 5 does not divide num_attention_heads = 32" in err


def test_python_apis_refuse_before_any_compile(tmp_path):
    """project(), the Optimum-shaped from_pretrained and NxDI-shaped InferenceConfig refuse a config
    object or directory the same way (transformers' MistralConfig itself accepts 32 heads over 5)."""
    from transformers import MistralConfig

    from neuron_stack.inference import InferenceConfig, InferenceError, NeuronConfig, load_pretrained_config
    from neuron_stack.llm import ConfigError
    from neuron_stack.llm.optimum import NeuronModelForCausalLM
    from neuron_stack.llm.project import project

    bad = MistralConfig(num_attention_heads=32, num_key_value_heads=5, num_hidden_layers=2)
    with pytest.raises(ConfigError, match="config num_key_value_heads = 5 does not divide"):
        project(bad, tp_degree=8)
    (tmp_path / "config.json").write_text(json.dumps(BASE | {"num_key_value_heads": 5}))
    with pytest.raises(ConfigError, match="config num_key_value_heads = 5 does not divide"):
        NeuronModelForCausalLM.from_pretrained(str(tmp_path), num_cores=8)
    with pytest.raises(InferenceError, match="config num_key_value_heads = 5 does not divide"):
        InferenceConfig(NeuronConfig(tp_degree=8), load_pretrained_config(str(tmp_path)))


def test_transformers_refusals_are_one_line(tmp_path):
    """A field only transformers' own validators know about still comes back as one line naming it."""
    from neuron_stack.llm import ConfigError, load_config

    (tmp_path / "config.json").write_text(json.dumps(BASE | {"initializer_range": 7.0}))
    with pytest.raises(ConfigError) as exc:
        load_config(tmp_path)
    assert "initializer_range" in str(exc.value) and "\n" not in str(exc.value), exc.value


@pytest.mark.parametrize("argv,warning", [
    (["--sequence-length", "16384"], "sequence length 16384 is past the config max_position_embeddings = 8192: "
                                     "positions beyond it were not trained"),
    (["--tp", "12"], "TP degree 12 does not divide config num_attention_heads = 32: NxDI pads them to 36"),
    (["--tp", "12"], "TP degree 12 and config num_key_value_heads = 8 do not divide one another: NxDI converts "
                     "to MHA (3 KV heads a rank, not 1"),
])
def test_surprising_runs_warn_once_before_compiling(capsys, monkeypatch, argv, warning):
    """NxDI runs these (padding heads, converting to MHA, past the trained positions): a warning line
    naming the field, printed before the projection starts and not repeated by project()."""
    import importlib

    proj = importlib.import_module("neuron_stack.llm.project")  # the package exports a function of that name
    seen = []

    def project(model, **kw):  # the projection itself is not under test: record that it ran after the warning
        seen.append(capsys.readouterr().err)
        proj.warn_run(proj.load_config(model).to_dict(), tp_degree=kw["tp_degree"],
                      sequence_length=kw["sequence_length"])
        raise ConfigError("stop")

    from neuron_stack.llm.configs import ConfigError

    monkeypatch.setattr(proj, "project", project)
    code, err = llm(capsys, "llama-3-8b", *argv)
    assert code == 1 and warning in seen[0] and f"neuron-llm: warning: {warning}" in seen[0], seen
    assert err.strip() == "neuron-llm: error: stop", err


def test_nxdi_sharding_decides_the_rank_shapes():
    """rank_config shards heads as NxDI's gqa.py: 8 KV heads over TP 12 become one KV head per query head."""
    from transformers import LlamaConfig

    from neuron_stack.llm.project import rank_config

    cfg = LlamaConfig(num_attention_heads=32, num_key_value_heads=8, hidden_size=4096, intermediate_size=14336)
    shapes = {tp: (c.num_attention_heads, c.num_key_value_heads) for tp in (1, 8, 12, 32, 64)
              for c in [rank_config(cfg, tp)]}
    assert shapes == {1: (32, 8), 8: (4, 1), 12: (3, 3), 32: (1, 1), 64: (1, 1)}
