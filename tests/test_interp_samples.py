"""The sample workloads' models through the ISA interpreter, against eager PyTorch."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from neuron_stack.compiler.fuse import fuse
from neuron_stack.compiler.legalize import legalize
from neuron_stack.compiler.partition import partition
from neuron_stack.compiler.schedule import build_schedules
from neuron_stack.frontend.export import capture
from neuron_stack.isa.interp import run_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sample_workloads import models  # noqa: E402

g = torch.Generator().manual_seed(1)
SAMPLES = {
    "mlp": (lambda: models.MLP(), lambda: (torch.randn(8, 64, generator=g),)),
    "bert_encoder": (lambda: models.BertEncoder(vocab=100, hidden=64, layers=1, heads=4, seq=32),
                     lambda: (torch.randint(0, 100, (2, 32), generator=g),)),
    "gpt_decoder": (lambda: models.GPTDecoder(vocab=100, hidden=64, layers=1, heads=4, seq=32),
                    lambda: (torch.randint(0, 100, (2, 32), generator=g),)),
    "cnn": (lambda: models.CNN(), lambda: (torch.randn(2, 3, 16, 16, generator=g),)),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
@pytest.mark.parametrize("auto_cast", ["none", "matmult"])
def test_sample_model_through_interpreter(name, auto_cast):
    torch.manual_seed(0)
    make, inputs = SAMPLES[name]
    model, args = make().eval(), inputs()
    prog = fuse(partition(legalize(capture(model, args))))
    out = run_program(prog, dict(zip(prog.input_names, [a.numpy() for a in args])),
                      build_schedules(prog, {"auto_cast": auto_cast}))
    ref = model(*args)
    ref = ref if isinstance(ref, (list, tuple)) else [ref]
    for o, e in zip(out, ref):
        e = e.detach().numpy()
        if auto_cast == "none":
            np.testing.assert_allclose(o, e, rtol=1e-4, atol=1e-4)
        else:
            assert np.linalg.norm(o - e) / max(np.linalg.norm(e), 1e-12) < 1e-2
