"""``inference_demo``: NxDI's demo CLI (reference §2.6), on the simulated NeuronCore.

    inference_demo --model-type llama --task-type causal-lm run --model-path DIR \\
        --compiled-model-path OUT --tp-degree 1 --batch-size 2 --max-context-length 64 --seq-len 128 \\
        --prompt "hello" --benchmark
    inference_demo tiny-model DIR          # ours: write a random-weight tiny Llama to try it with
    inference_demo serve --model-path DIR  # ours: the OpenAI-compatible server (inference.server)

``run`` compiles (unless ``--skip-compile``), loads, generates for the prompts and, with
``--benchmark``, writes ``benchmark_report.json``. With weights, ``--tp-degree N`` shards the model over
N NeuronCores with real numbers (:mod:`.tp`). A model directory without weights, a preset, or
``--projection`` runs in projection mode: the sub-models are compiled from the config with no numbers
(:mod:`neuron_stack.llm.project`), and the report holds their projected latencies. The first line of
output says which.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

from .config import InferenceError

MODEL_TYPES = ("llama", "mistral", "qwen2")


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", required=True, help="model directory (config.json + weights), or a preset")
    p.add_argument("--compiled-model-path", help="where the NEFFs go (default: <model-path>/neuron-compiled)")
    p.add_argument("--tp-degree", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--ctx-batch-size", type=int)
    p.add_argument("--tkg-batch-size", type=int)
    p.add_argument("--max-context-length", type=int)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument(
        "--torch-dtype", default="float32", help="bfloat16 | float16 | float32 (matmuls auto-cast)"
    )
    p.add_argument("--pad-token-id", type=int, default=0)
    p.add_argument("--enable-bucketing", action="store_true")
    p.add_argument("--context-encoding-buckets", type=int, nargs="+")
    p.add_argument("--token-generation-buckets", type=int, nargs="+")
    p.add_argument("--is-continuous-batching", action="store_true")
    p.add_argument("--on-device-sampling", action="store_true")
    p.add_argument("--do-sample", action="store_true")
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--target", default="trn1", help="trn1 | inf2 | trn2 (ours: the simulated device)")
    p.add_argument("--instance-type", help="projection mode: e.g. trn1.32xlarge, inf2.48xlarge")
    p.add_argument("--sequence-parallel-enabled", action="store_true",
                   help="context encoding sequence-parallel over the TP ranks (projection mode)")


def neuron_config(args):
    """The :class:`NeuronConfig` the flags describe."""
    from .config import NeuronConfig

    sampling = None
    if args.on_device_sampling or args.do_sample:
        sampling = {
            "do_sample": args.do_sample,
            "top_k": args.top_k,
            "top_p": args.top_p,
            "temperature": args.temperature,
        }
    return NeuronConfig(
        tp_degree=args.tp_degree,
        batch_size=args.batch_size,
        ctx_batch_size=args.ctx_batch_size,
        tkg_batch_size=args.tkg_batch_size,
        seq_len=args.seq_len,
        max_context_length=args.max_context_length,
        max_new_tokens=args.max_new_tokens,
        torch_dtype=args.torch_dtype,
        enable_bucketing=args.enable_bucketing,
        context_encoding_buckets=args.context_encoding_buckets,
        token_generation_buckets=args.token_generation_buckets,
        is_continuous_batching=args.is_continuous_batching,
        on_device_sampling_config=sampling,
        speculation_length=getattr(args, "speculation_length", 0) or 0,
        sequence_parallel_enabled=args.sequence_parallel_enabled,
        target=args.target,
        instance_type=args.instance_type,
    )


def _projection_mode(args) -> str:
    """Why this run is a projection ("" when it computes real numbers)."""
    from neuron_stack.llm.configs import PRESETS, has_weights

    if getattr(args, "projection", False):
        return "asked (--projection)"
    if str(args.model_path).lower() in PRESETS:
        return f"{args.model_path} is a preset config"
    if not has_weights(args.model_path):
        return f"{args.model_path} has no weights"
    return ""


def load_model(args, nc, out=print):
    """Compile (unless --skip-compile) and load the model the flags name; prints NxDI's timing lines."""
    from .application import NeuronLlamaForCausalLM

    model = NeuronLlamaForCausalLM(args.model_path, nc)
    compiled = Path(args.compiled_model_path or Path(args.model_path) / "neuron-compiled")
    if not getattr(args, "skip_compile", False):
        t0 = time.perf_counter()
        model.compile(compiled)
        out(f"Compiling and tracing time: {time.perf_counter() - t0:.2f} seconds")
    t0 = time.perf_counter()
    model.load(compiled, skip_warmup=getattr(args, "skip_warmup", False))
    out(f"Total model loading time: {time.perf_counter() - t0:.2f} seconds")
    return model


def load_draft(args, nc, out=print):
    """The draft model of speculative decoding (``--draft-model-path``), compiled beside the target's NEFFs."""
    from dataclasses import replace

    from .application import NeuronLlamaForCausalLM

    if not args.draft_model_path:
        return None
    dnc = replace(nc, speculation_length=0, extra=dict(nc.extra))
    draft = NeuronLlamaForCausalLM(args.draft_model_path, dnc)
    compiled = Path(args.compiled_model_path or Path(args.model_path) / "neuron-compiled") / "draft"
    if not args.skip_compile:
        draft.compile(compiled)
    draft.load(compiled, skip_warmup=args.skip_warmup)
    out(f"draft model loaded: {args.draft_model_path} (speculation_length={nc.speculation_length})")
    return draft


def run(args) -> int:
    import torch

    from neuron_stack.llm.configs import load_config

    from .benchmark import benchmark_sampling, write_report
    from .tokenizer import load_tokenizer

    nc = neuron_config(args)
    why = _projection_mode(args)
    if why:
        print(f"mode: projection (numbers=none, tp_degree={nc.tp_degree}): {why}", flush=True)
    else:
        cores = "NeuronCores" if nc.tp_degree > 1 else "NeuronCore"
        print(f"mode: real numbers (tp_degree={nc.tp_degree} over {nc.tp_degree} {cores})", flush=True)
    if why:
        from .projection import project_serving

        load_config(args.model_path)  # a missing or bad config is one line before any compile
        # a prompt of max_context_length (half the cache when that is all of it), the rest generated
        n_in = nc.max_context_length if nc.max_context_length < nc.seq_len else nc.seq_len // 2
        report = project_serving(
            args.model_path,
            nc,
            input_len=n_in,
            output_len=min(nc.max_new_tokens or nc.seq_len, nc.seq_len - n_in + 1),
        )
        print(report["text"])
        if args.benchmark:
            write_report(report["benchmark"], args.benchmark_report_path)
            print(f"benchmark report (projection, numbers=none): {args.benchmark_report_path}")
        return 0
    if bool(args.speculation_length) != bool(args.draft_model_path):
        raise InferenceError("speculative decoding needs both --speculation-length K and --draft-model-path DIR")
    model = load_model(args, nc)
    draft = load_draft(args, nc)
    if args.compile_only:
        return 0
    tok = load_tokenizer(args.model_path, model.config.hf_config.vocab_size)
    prompts = (args.prompt or ["I believe the meaning of life is"]) * nc.batch_size
    prompts = prompts[: nc.batch_size]
    enc = [tok.encode(p)[: nc.max_context_length] for p in prompts]
    n = min(len(e) for e in enc)
    ids = torch.tensor([e[:n] for e in enc])
    from .application import HuggingFaceGenerationAdapter

    new = args.max_new_tokens or nc.seq_len - n
    adapter = HuggingFaceGenerationAdapter(model)
    outputs = adapter.generate(ids, max_new_tokens=new, assistant_model=draft)
    if draft is not None:
        sp = adapter.speculation
        print(
            f"speculation: acceptance rate {sp['acceptance_rate']:.3f} ({sp['accepted']}/{sp['proposed']} "
            f"draft tokens), {sp['target_calls']} target calls for {outputs.shape[1] - n} tokens"
        )
    print("Generated outputs:")
    for i, row in enumerate(outputs.tolist()):
        print(f"Output {i}: {json.dumps(tok.decode(row))}  ids={row[n:]}")
    if args.check_accuracy_mode == "token-matching":
        hf = model._hf_model()
        with torch.no_grad():
            want = hf.generate(
                ids, max_new_tokens=new, do_sample=False, pad_token_id=args.pad_token_id, eos_token_id=None
            )
        same = want.tolist() == outputs.tolist()
        print(f"token matching against eager Hugging Face generate: {'passed' if same else 'FAILED'}")
        if not same:
            return 1
    if args.benchmark:
        from .benchmark import REPORT_KEYS

        report = benchmark_sampling(  # NxDI's inputs (random prompts of max_context_length), not --prompt
            model, num_runs=args.num_runs, benchmark_report_path=args.benchmark_report_path, draft_model=draft
        )
        print(json.dumps({k: report[k] for k in REPORT_KEYS if k in report}, indent=4))
        if draft is not None:
            sp = report["speculation"]
            print(
                f"speculation: acceptance rate {sp['acceptance_rate']:.3f}, TPOT {sp['tpot_ms']:.4f} ms "
                f"(without speculation {sp['tpot_ms_without_speculation']:.4f} ms, simulated device time)"
            )
        print(f"benchmark report: {args.benchmark_report_path}")
    return 0


def tiny_model(args) -> int:
    from .tiny import save_tiny_llama

    print(f"tiny Llama written to {save_tiny_llama(args.dir, args.seed)}")
    return 0


def serve(args) -> int:
    """Compile/load with vLLM's NxDI defaults (continuous batching, one prompt per prefill), then serve."""
    from neuron_stack.llm.configs import has_weights

    from .server import serve as run_server

    nc = neuron_config(args)
    nc.is_continuous_batching, nc.ctx_batch_size = True, 1
    if not has_weights(args.model_path):
        raise InferenceError(
            f"{args.model_path}: serving computes tokens and needs weights (save_pretrained); "
            "project a config's TTFT/TPOT with: inference_demo run --model-path CONFIG --tp-degree N"
        )
    model = load_model(args, nc, out=lambda line: print(line, file=sys.stderr))
    return run_server(
        model,
        args.served_model_name or str(args.model_path),
        args.host,
        args.port,
        log_stats=not args.disable_log_stats,
        access_log=not args.disable_uvicorn_access_log,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inference_demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-type", default="llama", choices=MODEL_TYPES)
    p.add_argument("--task-type", default="causal-lm", choices=("causal-lm",))
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="compile, load, generate (and --benchmark)")
    _add_config_flags(r)
    r.add_argument("--prompt", action="append", help="a prompt (repeat for a batch)")
    r.add_argument("--skip-compile", action="store_true")
    r.add_argument("--compile-only", action="store_true")
    r.add_argument("--skip-warmup", action="store_true")
    r.add_argument(
        "--check-accuracy-mode",
        default="skip-accuracy-check",
        choices=("skip-accuracy-check", "token-matching"),
    )
    r.add_argument("--projection", action="store_true", help="ours: project from the config (no numbers)")
    r.add_argument("--speculation-length", type=int, default=0, help="draft tokens per target check")
    r.add_argument("--draft-model-path", help="the draft model of speculative decoding (with weights)")
    r.add_argument("--benchmark", action="store_true")
    r.add_argument("--benchmark-report-path", default="./benchmark_report.json")
    r.add_argument("--num-runs", type=int, default=20, help="timed runs of the benchmark (NxDI: 20)")
    r.set_defaults(fn=run)
    t = sub.add_parser("tiny-model", help="write a random-weight tiny Llama (no download) to DIR")
    t.add_argument("dir")
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(fn=tiny_model)
    s = sub.add_parser("serve", help="the OpenAI-compatible server (vLLM's endpoints and metric names)")
    _add_config_flags(s)
    s.add_argument("--skip-compile", action="store_true")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--served-model-name")
    s.add_argument("--disable-log-stats", action="store_true", help="no periodic stats line (vLLM's flag)")
    s.add_argument("--disable-uvicorn-access-log", action="store_true", help="no access log (vLLM's flag)")
    s.set_defaults(fn=serve)
    return p


def _check_config(args) -> None:
    """The model config's fields and the run's sizes, in a fraction of a second: a bad field is one
    error line, a surprising run (past max_position_embeddings, heads NxDI pads) one warning line each."""
    from neuron_stack.llm.configs import check_model

    nc = neuron_config(args)
    for line in check_model(args.model_path, tp_degree=nc.tp_degree, sequence_length=nc.seq_len):
        print(f"inference_demo: warning: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point (``inference_demo``): one line, non-zero exit, on any bad input."""
    from neuron_stack.llm.configs import ConfigError, ConfigWarning

    args = build_parser().parse_args(argv)
    try:
        if hasattr(args, "model_path"):  # run, serve: the config checked before torch or any compile
            _check_config(args)
        with warnings.catch_warnings():  # printed above, once
            warnings.simplefilter("ignore", ConfigWarning)
            return int(args.fn(args) or 0)
    except (InferenceError, ConfigError, FileNotFoundError) as exc:
        print(f"inference_demo: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a compile or runtime failure: one line naming it
        from neuron_stack.runtime.cores import CoreAllocationError
        from neuron_stack.runtime.errors import NeuronRuntimeError

        if isinstance(exc, (NeuronRuntimeError, CoreAllocationError, ValueError, OSError)):
            print(
                f"inference_demo: error: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}",
                file=sys.stderr,
            )
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
