"""PartitionerConfig with the semantics of torch_neuronx.PartitionerConfig: the support threshold,
min_subgraph_size, max_subgraph_count, analyze_parameters and trace_kwargs, each enforced with
a one-line error, on fresh compiles and on cache hits alike."""
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_workloads"))

import neuron_stack  # noqa: E402
from neuron_stack import PartitionerConfig  # noqa: E402
from neuron_stack.compiler.support import PartitionerError  # noqa: E402

SORT = {"aten::sort"}


@pytest.fixture(scope="module")
def ranker():
    """Linear, sort (forced), mask, boolean index + sum (data-dependent: CPU), linear: 5 subgraphs,
    9 of 11 ATen ops supported (81.82%)."""
    from models import Ranker
    torch.manual_seed(0)
    return Ranker(16, 8).eval(), torch.randn(2, 16)


def bessel_chain(x):
    # three ops without a NeuronCore lowering around one supported op: 25% supported
    return torch.relu(torch.special.bessel_j0(torch.special.bessel_j0(torch.special.bessel_j0(x))))


def one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_default_config_partitions_and_matches_eager(ranker):
    model, x = ranker
    nm = neuron_stack.trace(model, x, partitioner_config=PartitionerConfig(ops_to_partition=SORT))
    with torch.no_grad():
        torch.testing.assert_close(nm(x), model(x), rtol=1e-4, atol=1e-5)
    kinds = [p.kind for p in nm.neff.program.partitions]
    assert kinds == ["device", "cpu", "device", "cpu", "device"]
    assert "81.82%" in nm.compile_log and "partitioner:" in nm.compile_log


def test_support_threshold_names_the_share(ranker):
    model, x = ranker
    with pytest.raises(PartitionerError) as e:
        neuron_stack.trace(model, x, partitioner_config=PartitionerConfig(
            ops_to_partition=SORT, model_support_percentage_threshold=0.9))
    msg = one_line(e)
    assert "model support percentage of 81.82% (9 of 11 ops supported" in msg
    assert "aten::index" in msg and "below partitioner_config.model_support_percentage_threshold of 90.00%" in msg


def test_threshold_on_a_mostly_unsupported_model():
    x = torch.randn(4, 8)
    with pytest.raises(PartitionerError) as e:
        neuron_stack.trace(bessel_chain, x, partitioner_config=PartitionerConfig())
    assert "25.00% (1 of 4 ops supported; unsupported: aten::special_bessel_j0 x3)" in one_line(e)
    # a lower threshold accepts it, and it still computes the right numbers
    nm = neuron_stack.trace(bessel_chain, x,
                            partitioner_config=PartitionerConfig(model_support_percentage_threshold=0.2))
    torch.testing.assert_close(nm(x), bessel_chain(x), rtol=1e-4, atol=1e-6)
    with pytest.raises(PartitionerError) as e:   # nothing on the device at all
        neuron_stack.trace(torch.special.bessel_j0, x, partitioner_config=PartitionerConfig(
            model_support_percentage_threshold=0.0))
    assert "0.00%" in one_line(e) and "very close to 0%" in one_line(e)


def test_min_subgraph_size(ranker):
    model, x = ranker
    with pytest.raises(PartitionerError) as e:
        neuron_stack.trace(model, x, partitioner_config=PartitionerConfig(ops_to_partition=SORT, min_subgraph_size=2))
    assert "created a CPU subgraph (#1) with 1 operators, less than partitioner_config.min_subgraph_size of 2" \
        in one_line(e)
    neuron_stack.trace(model, x, partitioner_config=PartitionerConfig(ops_to_partition=SORT, min_subgraph_size=1))


def test_max_subgraph_count_is_checked_on_cache_hits_too(ranker):
    model, x = ranker
    cfg = PartitionerConfig(ops_to_partition=SORT, max_subgraph_count=5)
    assert neuron_stack.trace(model, x, partitioner_config=cfg).cache_hit     # compiled by the first test
    with pytest.raises(PartitionerError) as e:
        neuron_stack.trace(model, x, partitioner_config=PartitionerConfig(ops_to_partition=SORT, max_subgraph_count=3))
    assert "found 5 subgraphs (NEURON | CPU | NEURON | CPU | NEURON), more than " \
           "partitioner_config.max_subgraph_count of 3" in one_line(e)


def test_fully_supported_model_is_one_graph_whatever_the_limits():
    from models import MLP
    m, x = MLP(16, 32, 4).eval(), torch.randn(3, 16)
    nm = neuron_stack.trace(m, x, partitioner_config=PartitionerConfig(min_subgraph_size=1000, max_subgraph_count=1))
    assert len(nm.neff.program.partitions) == 1


def test_analyze_parameters_and_trace_kwargs(ranker, tmp_path):
    model, x = ranker
    cfg = PartitionerConfig(ops_to_partition=SORT, model_support_percentage_threshold=0.99,
                            analyze_parameters={"compiler_workdir": str(tmp_path / "analyze"), "max_workers": 2,
                                                "additional_ignored_ops": {"aten::index", "aten::sum"}},
                            trace_kwargs={"compiler_args": "--auto-cast matmult",
                                          "compiler_workdir": str(tmp_path / "wd")})
    nm = neuron_stack.trace(model, x, partitioner_config=cfg)   # 100% once the ignored ops are left out
    report = json.loads((tmp_path / "analyze" / "analyze.json").read_text())
    assert report["support_percentage"] == "100.00%" and report["supported_operators"]["aten::sort"] == 1
    assert nm.neff.header["flags"]["auto_cast"] == "matmult" and (tmp_path / "wd" / "model.neff").exists()
    # trace's own arguments win over trace_kwargs
    nm2 = neuron_stack.trace(model, x, compiler_args="--auto-cast none", partitioner_config=cfg)
    assert nm2.neff.header["flags"]["auto_cast"] == "none"


@pytest.mark.parametrize("kwargs,needle", [
    ({"model_support_percentage_threshold": 50}, "between 0 and 1"),
    ({"min_subgraph_size": 0}, "min_subgraph_size must be -1 (no minimum) or >= 1, not 0"),
    ({"max_subgraph_count": -5}, "max_subgraph_count must be -1 (no maximum) or >= 1, not -5"),
    ({"analyze_parameters": {"is_hf_transformers": True}}, "key 'is_hf_transformers' is not supported"),
    ({"analyze_parameters": {"max_workers": 0}}, "max_workers must be an integer >= 1"),
    ({"trace_kwargs": {"target": "inf2"}}, "trace_kwargs key 'target' is not supported"),
    ({"ops_to_partition": {"sort"}}, "spell it like 'aten::sort'"),
])
def test_bad_config_is_one_line(kwargs, needle):
    with pytest.raises(PartitionerError) as e:
        PartitionerConfig(**kwargs)
    assert needle in one_line(e)
    assert isinstance(e.value, ValueError)        # what torch_neuronx raises


def test_positional_arguments_are_refused():
    with pytest.raises(TypeError):
        PartitionerConfig(0.5)
