"""Sequence-parallel context encoding (NxDI's ``sequence_parallel_enabled``, ``neuron_stack/llm/parallel.py``):
its collectives are in the graph on the ``cc`` engine and not charged again; it moves no matmul work;
its norms and residual adds run on the sequence shard; token generation ignores it; the CLI flag and
``NeuronConfig`` field reach the projection; a bucket it cannot pad into the cache is one clear line."""

import importlib
import json
import math

import pytest
import transformers as T

P = importlib.import_module("neuron_stack.llm.project")


def tiny_config(layers=2, hidden=64, intermediate=128):
    return T.LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4)


def _projection_flops(neff) -> int:
    """The FLOPs of the graph's linear layers (``mm`` nodes: QKV, O, gate/up/down, LM head), 2 M K N each (the
    Tensor Engine's transposes of an operand depend on where it lives, not on the work)."""
    return sum(2 * math.prod(n.inputs[0].shape) * n.outputs[0].shape[-1]
               for n in neff.program.nodes if n.target == "aten.mm.default")


def test_collectives_are_scheduled_on_cc_and_not_charged_twice():
    from neuron_stack.device.collective_cost import collective_ns
    from neuron_stack.device.profiles import get_profile

    kw = dict(tp_degree=4, sequence_length=128, context_length=64, target="trn2")
    off, on = (P.project(tiny_config(), sequence_parallel=sp, **kw) for sp in (False, True))
    assert on.sequence_parallel and not off.sequence_parallel
    cte = on.graphs[0]
    t = next(iter(cte.compile_layers(1).schedules.values())).table.to_pydict()
    cc = [(op, d) for e, op, d in zip(t["engine"], t["opcode"], t["dur_ns"]) if e == "cc"]
    ops = [op for op, _ in cc]
    # one layer: an all-gather before attention and MLP, a reduce-scatter after each; the embeddings
    # enter by a reduce-scatter, the final norm's output is gathered for the LM head
    assert ops.count("CC_ALL_GATHER") == 3 and ops.count("CC_REDUCE_SCATTER") == 3
    shard = 64 // 4 * 64 * 2  # [s/tp, H] bf16 per rank
    assert next(d for op, d in cc if op == "CC_ALL_GATHER") == collective_ns(get_profile("trn2"), "all_gather",
                                                                              shard, 4) > 0
    # in the schedule, so only the logits' all-gather is added on top; decode is as without the flag
    logits_only = P._collectives_ns(tiny_config(), 4, 1, 64, "bfloat16", get_profile("trn2"), True)
    assert cte.collective_ns == logits_only < off.graphs[0].collective_ns
    assert on.graphs[1].device_ns == off.graphs[1].device_ns
    assert on.graphs[1].collective_ns == off.graphs[1].collective_ns
    assert "cc" in cte.layer_busy_ns and "cc" not in off.graphs[0].layer_busy_ns
    # the same matmul work: sequence parallelism moves norms and residual adds, not projections
    assert _projection_flops(cte.compile_layers(1)) == _projection_flops(off.graphs[0].compile_layers(1)) > 0


def test_norms_and_residual_adds_run_on_the_shard_and_decode_is_unchanged():
    # a wide hidden state against a small per-rank MLP: the norms and residual adds (the full [s, H] on every
    # rank without sequence parallelism) are most of the Vector and Scalar engines' work in a layer
    kw = dict(tp_degree=4, sequence_length=1026, context_length=1024, target="trn2")
    off, on = (P.project(tiny_config(hidden=2048, intermediate=1024), sequence_parallel=sp, **kw) for sp in (0, 1))
    def norm_instructions(p):
        t = next(iter(p.graphs[0].compile_layers(1).schedules.values())).table
        return sum(n.startswith("rms_norm") for n in t.column("node").to_pylist())

    # a quarter of the rows: a quarter of the row blocks (two 128-row blocks of the shard, eight of the whole),
    # beside each norm's few fixed instructions
    assert 2.5 * norm_instructions(on) <= norm_instructions(off)
    assert on.graphs[1].device_ns == off.graphs[1].device_ns


def test_cli_and_neuron_config_reach_the_projection(tmp_path, capsys, monkeypatch):
    import neuron_stack.llm
    from neuron_stack.inference import demo
    from neuron_stack.inference.config import NeuronConfig
    from neuron_stack.inference.projection import project_serving
    from neuron_stack.llm import cli

    tiny_config().save_pretrained(tmp_path)
    args = ["--tp", "4", "--target", "trn2", "--sequence-length", "512", "--context-length", "250"]
    assert cli.main(["project", str(tmp_path), *args, "--sequence-parallel-enabled", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cte = doc["graphs"][0]
    # NxDI's context bucket must be a multiple of tp: the 250-token prompt is padded to 252
    assert doc["sequence_parallel"] and cte["bucket"] == cte["active_tokens"] == 252
    nc = NeuronConfig(tp_degree=4, seq_len=512, max_context_length=250, context_encoding_buckets=[250],
                      torch_dtype="bfloat16", target="trn2", sequence_parallel_enabled=True)
    assert project_serving(str(tmp_path), nc, 250, 2)["ttft_ns"] == cte["device_ns"]

    class Asked(Exception):
        pass

    def asked(model, **kw):
        raise Asked(kw)

    monkeypatch.setattr(neuron_stack.llm, "project", asked)
    with pytest.raises(Asked) as e:
        demo.main(["run", "--model-path", str(tmp_path), "--tp-degree", "4", "--seq-len", "512",
                   "--target", "trn2", "--sequence-parallel-enabled", "--projection"])
    assert e.value.args[0]["sequence_parallel"] is True


def test_a_bucket_padded_past_the_cache_is_one_line(tmp_path, capsys):
    from neuron_stack.llm import cli

    tiny_config().save_pretrained(tmp_path)
    rc = cli.main(["project", str(tmp_path), "--tp", "4", "--sequence-length", "18", "--context-length", "18",
                   "--sequence-parallel-enabled"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1
    assert "pads the context bucket 18 to 20" in err and "multiple of 4" in err
