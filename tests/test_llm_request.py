"""Request time beside device time (issue 38 item 1): each graph of a projection reports what a request waits
for around the call (the runtime's launch, the copies over the host link, the logits to the host where the
host samples), each component a formula over the device profile's cited constants; the CLI prints both."""

import pytest
import transformers as T


def tiny_config():
    return T.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def projections():
    from neuron_stack.llm import project

    kw = dict(batch_size=2, sequence_length=64, context_length=16, token_generation_buckets=[32, 64],
              tp_degree=2, instance_type="trn1.32xlarge")
    return project(tiny_config(), **kw), project(tiny_config(), on_device_sampling=True, **kw)


def test_request_time_is_device_time_plus_cited_components(projections):
    from neuron_stack.device.cost import pcie_ns
    from neuron_stack.device.profiles import get_profile

    host, device = projections
    p = get_profile("trn1")
    for g in host.graphs:
        c = {x.name: x for x in g.request_components}
        assert list(c) == ["nrt_launch", "inputs_to_device", "outputs_to_host", "collectives"]
        assert all(x.source for x in c.values())
        assert c["nrt_launch"].ns == p.dma_fixed_ns
        # the last position's logits, batch x vocab in bf16, over the host link
        assert c["outputs_to_host"].ns == pcie_ns(p, 2 * 512 * 2)
        # the collectives are already device time: shown, not added twice
        assert c["collectives"].in_device_time and c["collectives"].ns == g.collective_ns > 0
        assert g.request_ns == g.device_ns + sum(x.ns for x in c.values() if not x.in_device_time)
    # the decode mask is padded to the bucket: a longer bucket copies more
    tkg = [g for g in host.graphs if g.name == "token_generation"]
    inputs = [next(x.ns for x in g.request_components if x.name == "inputs_to_device") for g in tkg]
    assert inputs[0] < inputs[1]
    # on-device sampling: the sampled ids come back, not the logits; the device graphs are the same
    for a, b in zip(host.graphs, device.graphs):
        assert a.device_ns == b.device_ns and b.request_ns < a.request_ns


def test_cli_prints_request_and_device_time_with_sources(tmp_path, capsys):
    from neuron_stack.llm import cli

    tiny_config().save_pretrained(tmp_path)
    assert cli.main(["project", str(tmp_path), "--tp", "2", "--instance", "trn1.32xlarge", "--sequence-length",
                     "64", "--context-length", "16", "--tkg-buckets", "32", "64", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert " device " in out and " request " in out
    for name in ("nrt_launch", "inputs_to_device", "outputs_to_host", "collectives"):
        assert name in out
    assert "NKI DMA guide" in out and "not modelled: host CPU sampling" in out


def test_neuron_2_18_costs_the_collectives_as_rings(tmp_path, capsys):
    # the runtime that ran AWS's transformers-neuronx rows had only the Ring for these groups: the same
    # graphs, the TP collectives costed as 2(N - 1)-hop rings (device/collective_cost.py), in device time
    from neuron_stack.device.profiles import get_profile
    from neuron_stack.llm import cli, project
    from neuron_stack.llm.configs import ConfigError
    from neuron_stack.llm.project import _collectives_ns
    from neuron_stack.runtime.collectives import Group, plan

    kw = dict(batch_size=1, sequence_length=64, context_length=16, token_generation_buckets=[64], tp_degree=4,
              instance_type="inf2.48xlarge")
    new, old = project(tiny_config(), **kw), project(tiny_config(), neuron_release="2.18", **kw)
    p, c = get_profile("inf2"), tiny_config()
    for a, b in zip(new.graphs, old.graphs):
        assert b.device_ns - a.device_ns == b.collective_ns - a.collective_ns > 0
        ring = 2 * c.num_hidden_layers * plan("all_reduce", b.active_tokens * c.hidden_size, "bfloat16",
                                              Group.on_cores(range(4)), p, "2.18").dur_ns
        assert ring == b.collective_ns - plan("all_gather", 128, "bfloat16", Group.on_cores(range(4)), p,
                                              "2.18").dur_ns
        assert b.collective_ns == _collectives_ns(c, 4, 1, b.active_tokens, "bfloat16", p, release="2.18")
    assert old.neuron_release == "2.18" and "Neuron 2.18 runtime's collectives" in old.report()
    with pytest.raises(ConfigError, match="neuron release '2.5' is not one of latest, 2.18"):
        project(tiny_config(), neuron_release="2.5", **kw)
    tiny_config().save_pretrained(tmp_path)
    assert cli.main(["project", str(tmp_path), "--tp", "4", "--instance", "inf2.48xlarge", "--sequence-length",
                     "64", "--context-length", "16", "--neuron-release", "2.18"]) == 0
    assert "Neuron 2.18 runtime's collectives" in capsys.readouterr().out
