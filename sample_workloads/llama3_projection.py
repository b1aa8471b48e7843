"""Llama-3-8B projected on Trainium from its config alone: no weights, no download, no numbers.

The model is built on PyTorch's meta device (shapes only), captured and compiled by the normal
front end and compiler, and scheduled instruction by instruction by the cost model: context
encoding (the prompt) and token generation (one token over the KV cache). Decoder layers are
identical, so one and two layers are compiled and the layer repeated. The report says whether it
fits (HBM per core against the device profile's), how long a layer and the whole model take per
call, and what one layer keeps each engine busy with. Then the runtime loads the two-layer token
generation NEFF and runs it on meta tensors: it stamps the schedule on the projected clock without
executing anything, and a profile of this run (neuron-explorer inspect) says numbers=none.
"""

import argparse

import torch
from common import explain


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="a tiny Llama config instead of Llama-3-8B (tests)")
    p.add_argument(
        "--model", default="llama-3-8b", help="preset (llama-3-8b, llama-3-70b, llama-2-7b) or config dir"
    )
    p.add_argument("--tp", type=int, default=8, help="tensor-parallel degree")
    p.add_argument(
        "--instance", default="trn1.32xlarge", help="instance type (inf2.xlarge, trn1.32xlarge...)"
    )
    p.add_argument("--sequence-length", type=int, default=2048)
    p.add_argument("--steps", type=int, default=4, help="decode steps the runtime stamps")
    args = p.parse_args()
    explain(__doc__)

    from neuron_stack.llm import project

    model = args.model
    if args.small:
        from transformers import LlamaConfig

        model = LlamaConfig(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        args.sequence_length, args.tp = 64, 2
    proj = project(
        model, tp_degree=args.tp, instance_type=args.instance, sequence_length=args.sequence_length
    )
    print(proj.report())

    from neuron_stack.runtime.model import LoadedModel

    tkg = next(g for g in proj.graphs if g.name == "token_generation")
    loaded = LoadedModel(tkg.neffs[1], {"kind": "trace"})
    inputs = [torch.empty(s.shape, dtype=getattr(torch, s.dtype), device="meta") for s in loaded.input_specs]
    for _ in range(args.steps):
        outs = loaded.run(inputs)
    print(
        f"\nruntime: {args.steps} decode steps of the two-layer NEFF stamped "
        f"({loaded.static_device_ns / 1e3:.1f} us each on the projected clock), outputs on "
        f"{outs[0].device} (numbers={loaded.program.stats['numbers']})"
    )


if __name__ == "__main__":
    main()
