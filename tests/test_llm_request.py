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
