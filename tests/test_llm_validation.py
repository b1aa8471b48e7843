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
