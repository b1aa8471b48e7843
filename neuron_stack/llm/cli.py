"""``neuron-llm``: project a decoder LLM from its config (no weights, numbers=none).

``neuron-llm project llama-3-8b --tp 8 --instance trn1.32xlarge`` prints whether it fits (HBM per core
against the device profile's), the per-layer and whole-model device latency of the context-encoding
and token-generation graphs, and one layer's schedule per engine; ``--json`` prints the same as JSON,
``--neff-dir`` writes the compiled one- and two-layer NEFFs (loadable with ``neuron_stack.load``).
Exit status 0 when it fits, 2 when it does not, 1 on an error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    from neuron_stack.device.collective_cost import RELEASES
    from neuron_stack.llm.configs import PRESETS

    p = argparse.ArgumentParser(prog="neuron-llm", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("project", help="latency and HBM fit of a decoder LLM from its config")
    pr.add_argument("model", help=f"a preset ({', '.join(PRESETS)}), a model directory or a config.json")
    pr.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (cores per model copy)")
    pr.add_argument("--instance", default=None, help="instance type, e.g. inf2.xlarge, trn1.32xlarge")
    pr.add_argument(
        "--target",
        choices=("trn1", "inf2", "trn2"),
        default="trn1",
        help="device generation when --instance is not given",
    )
    pr.add_argument("--batch-size", type=int, default=1)
    pr.add_argument("--sequence-length", type=int, default=2048, help="KV cache length (prompt + output)")
    pr.add_argument("--context-length", type=int, default=None, help="prompt bucket (default min(128, seq))")
    pr.add_argument(
        "--tkg-buckets",
        type=int,
        nargs="+",
        default=None,
        help="KV lengths of the token-generation graphs (default: the sequence length)",
    )
    pr.add_argument("--dtype", default="bf16", help="bf16 (default), fp16 or fp32")
    pr.add_argument(
        "--quantization-dtype",
        default=None,
        help="weight-only quantization of the decoder layers: int8, or fp8 on trn2 (NxDI quantization_dtype)",
    )
    pr.add_argument(
        "--sequence-parallel-enabled",
        action="store_true",
        help="context encoding sequence-parallel over the TP ranks (NxDI sequence_parallel_enabled)",
    )
    pr.add_argument(
        "--neuron-release",
        choices=RELEASES,
        default="latest",
        help="the Neuron runtime release whose collective algorithms cost the TP collectives: latest (Mesh, RDH, "
        "KangaRing by size) or 2.18 (Ring; the runtime of AWS's transformers-neuronx figures)",
    )
    pr.add_argument("--json", action="store_true", help="print JSON")
    pr.add_argument("--neff-dir", default=None, help="write the compiled 1- and 2-layer NEFFs here")
    return p


def _project(args) -> int:
    from neuron_stack.device.profiles import get_profile
    from neuron_stack.llm.configs import validate_projection
    from neuron_stack.runtime.cores import INSTANCE_TYPES

    # every size checked against its physical range before transformers or any compile runs; a TP degree
    # is bounded by the largest instance (a larger one than the chosen instance is a "does NOT fit" answer)
    most_cores = max(chips * get_profile(prof).cores_per_chip for prof, chips, *_ in INSTANCE_TYPES.values())
    notes = validate_projection(args.model, tp_degree=args.tp, batch_size=args.batch_size,
                                sequence_length=args.sequence_length, context_length=args.context_length,
                                token_generation_buckets=args.tkg_buckets, max_cores=most_cores)
    for line in notes:  # before any compile, one line each; project() would repeat them as warnings
        print(f"neuron-llm: warning: {line}", file=sys.stderr, flush=True)
    import warnings

    from neuron_stack.llm.configs import ConfigWarning
    from neuron_stack.llm.project import project

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        p = project(
            args.model,
            batch_size=args.batch_size,
            sequence_length=args.sequence_length,
            context_length=args.context_length,
            tp_degree=args.tp,
            dtype=args.dtype,
            instance_type=args.instance,
            target=args.target,
            token_generation_buckets=args.tkg_buckets,
            quantization_dtype=args.quantization_dtype,
            sequence_parallel=args.sequence_parallel_enabled,
            neuron_release=args.neuron_release,
        )
    if args.neff_dir:
        out = Path(args.neff_dir)
        out.mkdir(parents=True, exist_ok=True)
        for g in p.graphs:
            for layers, neff in zip((1, 2), g.neffs):
                neff.save(out / f"{g.name}_{g.bucket}_{layers}layer.neff")
    print(json.dumps(p.to_json(), indent=2) if args.json else p.report())
    return 0 if p.fits else 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``neuron-llm``. Example: ``main(["project", "llama-3-8b", "--tp", "8"])``."""
    from traces.errors import run_guarded

    args = parser().parse_args(argv)
    return run_guarded("neuron-llm", lambda: _project(args))


if __name__ == "__main__":
    sys.exit(main())
