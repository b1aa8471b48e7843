"""Serving benchmark: a bounded load generator against the OpenAI-compatible server, and projected
TTFT/TPOT for AWS's published Llama rows (reference §2.12) beside AWS's numbers.

1. Tiny Llama (random weights, real numbers): ``inference_demo serve`` on 127.0.0.1 with 4 slots;
   ``--requests`` completions (default 32, 16 tokens each) from ``--concurrency`` client threads
   (default 8), every request bounded by a timeout. Prints requests/s held, generated tokens/s (both
   simulator wall clock), simulator wall time per generated token, and the server's own
   ``vllm:time_to_first_token_seconds`` / ``vllm:time_per_output_token_seconds`` means (projected clock).
   One response is checked against eager Hugging Face greedy tokens.
2. Projection mode (numbers=none, :func:`neuron_stack.inference.projection.project_serving`): each
   published row's model, instance, TP degree, batch and input/output lengths with CTE/TKG buckets
   ``generate_buckets(128, max)``; projected TTFT/TPOT beside AWS's P50 and the ratio ours/AWS. AWS's 8B
   rows use int8 weights; ours are bf16 (weights bytes double), so decode (weight-bandwidth bound) is
   expected slower on those rows.

Usage: ``.venv/bin/python bench/serving.py [--quick|--smoke] [--requests N] [--concurrency C]`` (``--smoke``,
the suite's run: ``--quick`` with the published row of the shortest sequence, 256 tokens, whose projection
compiles the fewest graphs: the first row's 4,096 tokens span six decode buckets).
"""

import argparse
import json
import os
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: AWS's published rows (reference §2.12): model, instance, TP, batch, in, out, TTFT ms, TPOT ms.
PUBLISHED = [
    ("llama-3-8b", "trn1.32xlarge", 32, 1, 128, 3968, 14.75, 5.86),
    ("llama-3-8b", "trn1.32xlarge", 32, 8, 128, 3968, 49.05, 7.65),
    ("llama-3-8b", "inf2.48xlarge", 24, 1, 128, 8064, 29.47, 7.41),
    ("llama-3-70b", "trn1.32xlarge", 32, 4, 128, 1024, 129.86, 28.38),
    ("llama-3-70b", "inf2.48xlarge", 24, 1, 128, 128, 77.81, 32.20),
    ("llama-3-70b", "trn1.32xlarge", 32, 1, 2048, 2048, 547.00, 26.20),
]
REQUEST_TIMEOUT_S = 300


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
        return json.loads(r.read())


def _histogram_mean(metrics: str, name: str) -> float:
    total = count = 0.0
    for line in metrics.splitlines():
        if line.startswith(name + "_sum"):
            total += float(line.split()[-1])
        elif line.startswith(name + "_count"):
            count += float(line.split()[-1])
    return total / count if count else float("nan")


def tiny_load(requests: int, concurrency: int, max_tokens: int) -> dict:
    import torch

    from neuron_stack.inference.config import InferenceError
    from neuron_stack.inference.server import free_port, start_server_process
    from neuron_stack.inference.tiny import save_tiny_llama, tiny_llama

    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    save_tiny_llama(work / "tiny")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), NEURON_COMPILE_CACHE_URL=str(work / "cache"))
    try:
        proc = start_server_process(
            port,
            work / "server.log",
            env=env,
            ready_timeout_s=600,
            model_path=work / "tiny",
            batch_size=4,
            max_context_length=64,
            seq_len=128,
            served_model_name="tiny",
        )
    except InferenceError as exc:  # it exited or was not ready; the message quotes its log
        raise SystemExit(f"server did not start: {exc}") from None
    base = f"http://127.0.0.1:{port}"
    try:
        g = torch.Generator().manual_seed(0)
        prompts = [
            torch.randint(3, 259, (int(n),), generator=g).tolist()
            for n in torch.randint(4, 64, (requests,), generator=g)
        ]
        first = _post(   # greedy, to compare with eager greedy (a completion samples at temperature 1 by default)
            base + "/v1/completions",
            {"prompt": prompts[0], "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0},
        )
        with torch.no_grad():
            want = (
                tiny_llama()
                .generate(
                    torch.tensor([prompts[0]]),
                    max_new_tokens=max_tokens,
                    do_sample=False,
                    pad_token_id=0,
                    eos_token_id=None,
                )[0, len(prompts[0]) :]
                .tolist()
            )
        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            out = list(
                pool.map(
                    lambda p: _post(
                        base + "/v1/completions", {"prompt": p, "max_tokens": max_tokens, "ignore_eos": True}
                    ),
                    prompts,
                )
            )
        wall = time.perf_counter() - t0
        metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    tokens = sum(o["usage"]["completion_tokens"] for o in out)
    return {
        "requests": requests,
        "concurrency": concurrency,
        "wall_s": wall,
        "requests_per_s": requests / wall,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "wall_ms_per_token": 1e3 * wall / tokens,
        "ttft_mean_ms": 1e3 * _histogram_mean(metrics, "vllm:time_to_first_token_seconds"),
        "tpot_mean_ms": 1e3 * _histogram_mean(metrics, "vllm:time_per_output_token_seconds"),
        "tokens_equal_eager": first["choices"][0]["token_ids"] == want,
    }


def projected_rows(rows) -> list[dict]:
    from neuron_stack.inference.config import NeuronConfig
    from neuron_stack.inference.projection import project_serving

    os.environ.setdefault("NEURON_COMPILE_CACHE_URL", tempfile.mkdtemp(prefix="bench-serving-proj-"))
    out = []
    for model, instance, tp, batch, n_in, n_out, ttft, tpot in rows:
        seq = n_in + n_out
        nc = NeuronConfig(
            tp_degree=tp,
            batch_size=batch,
            seq_len=seq,
            max_context_length=max(n_in, 128),
            enable_bucketing=True,
            torch_dtype="bfloat16",
            instance_type=instance,
        )
        t0 = time.perf_counter()
        r = project_serving(model, nc, n_in, n_out)
        out.append(
            {
                "model": model,
                "instance": instance,
                "tp": tp,
                "batch": batch,
                "in": n_in,
                "out": n_out,
                "ttft_ms": r["ttft_ms"],
                "aws_ttft_ms": ttft,
                "ttft_ratio": r["ttft_ms"] / ttft,
                "tpot_ms": r["tpot_ms"],
                "aws_tpot_ms": tpot,
                "tpot_ratio": r["tpot_ms"] / tpot,
                "fits": r["fits"],
                "tkg_buckets": r["tkg_buckets"],
                "wall_s": time.perf_counter() - t0,
            }
        )
        print(
            f"  {model:<12} {instance:<14} TP{tp:<3} B{batch:<2} {n_in:>5}/{n_out:<5} "
            f"TTFT {r['ttft_ms']:8.2f} ms "
            f"(AWS {ttft:7.2f}, x{r['ttft_ms'] / ttft:5.2f})  TPOT {r['tpot_ms']:7.2f} ms (AWS {tpot:6.2f}, "
            f"x{r['tpot_ms'] / tpot:5.2f})  fits={r['fits']}  [{time.perf_counter() - t0:.0f} s]",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 requests (unless --requests); the first published row")
    ap.add_argument("--smoke", action="store_true", help="--quick, projecting the shortest published row")
    ap.add_argument("--requests", type=int, help="completions to send (default 32; --quick: 8)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    # an explicit --requests holds with --quick too (the smoke run sends 2)
    n = a.requests if a.requests is not None else 8 if a.quick or a.smoke else 32
    if not (1 <= n <= 1000 and 1 <= a.concurrency <= 64 and 1 <= a.max_tokens <= 64):
        raise SystemExit("bounds: --requests 1..1000, --concurrency 1..64, --max-tokens 1..64")
    print(
        f"1. tiny Llama over HTTP: {n} requests x {a.max_tokens} tokens, {a.concurrency} clients, 4 slots",
        flush=True,
    )
    tiny = tiny_load(n, a.concurrency, a.max_tokens)
    print(
        f"  held {tiny['requests_per_s']:.2f} requests/s, {tiny['tokens_per_s']:.1f} generated tokens/s "
        f"(simulator wall); {tiny['wall_ms_per_token']:.1f} ms simulator wall per generated token; "
        f"projected TTFT mean {tiny['ttft_mean_ms']:.2f} ms, TPOT mean {tiny['tpot_mean_ms']:.3f} ms; "
        f"tokens equal eager: {tiny['tokens_equal_eager']}",
        flush=True,
    )
    print(
        "2. projected TTFT/TPOT (bf16, device time, P50 = the one value) vs AWS's published P50", flush=True
    )
    shortest = min(PUBLISHED, key=lambda r: r[4] + r[5])   # 70B on inf2, 128 in / 128 out
    rows = projected_rows([shortest] if a.smoke else PUBLISHED[:1] if a.quick else PUBLISHED)
    if a.json:
        Path(a.json).write_text(json.dumps({"tiny": tiny, "projected": rows}, indent=2))


if __name__ == "__main__":
    main()
