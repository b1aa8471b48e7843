"""The roofline fallback of the compiler is a loud safety net: when instruction-level lowering
fails on a partition, the compile still succeeds with the same numbers, says so in the compile log
and on stderr, and the graph's timing_model is roofline even if its other partitions lowered."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_workloads"))

from neuron_stack import PartitionerConfig  # noqa: E402
from neuron_stack.compiler.driver import compile_program  # noqa: E402
from neuron_stack.frontend.export import capture  # noqa: E402
from neuron_stack.frontend.flags import parse_flags  # noqa: E402
from neuron_stack.runtime.model import LoadedModel  # noqa: E402


def test_lowering_failure_is_loud_and_marks_the_graph_roofline(monkeypatch, capfd):
    from models import Ranker

    import neuron_stack.compiler.schedule as schedule

    real = schedule.build_schedule

    def fails_on_first_partition(program, part, profile, flags, **kw):
        if part == 0:
            raise NotImplementedError("no lowering for this tile shape\nsecond line")
        return real(program, part, profile, flags, **kw)

    monkeypatch.setattr(schedule, "build_schedule", fails_on_first_partition)
    torch.manual_seed(0)
    model, x = Ranker(16, 8).eval(), torch.randn(2, 16)
    neff = compile_program(capture(model, (x,)), parse_flags(env=""),
                           partitioner_config=PartitionerConfig(ops_to_partition={"aten::sort"}))
    err = capfd.readouterr().err
    line = ("warning: instruction-level lowering failed on partition #0 (NotImplementedError: no lowering "
            "for this tile shape); timed with the roofline model instead")
    assert f"neuron_stack: {line}" in err and "second line" not in err
    assert f"schedule: {line}" in neff.log
    assert "(instruction timing)" in neff.log          # the other device partitions did lower
    assert neff.program.stats["timing_model"] == "roofline" and neff.header["timing_model"] == "roofline"
    with torch.no_grad():                              # numbers do not depend on timing
        torch.testing.assert_close(LoadedModel(neff).run([x])[0], model(x), rtol=1e-4, atol=1e-5)
