"""Serving figures for full-size models from their config alone (projection mode, numbers=none).

:func:`neuron_stack.llm.project` compiles each sub-model per rank (TP-sharded as NxDI shards it, the
collectives costed by :mod:`neuron_stack.collectives`) with no weights. From its per-call device times
we derive what a request of ``input_len`` prompt tokens and ``output_len`` generated tokens sees:

- TTFT = one context-encoding call of the first-fit CTE bucket;
- TPOT = mean of the token-generation calls, each at the first-fit TKG bucket for its position;
- E2E = TTFT + TPOT × (output_len − 1); output tokens/s = batch × output_len / E2E.

Each twice: device time (the graphs' schedules) and request time (device time plus what each call waits for
on the instance: the runtime's launch, input and output copies over the host link, the logits to the host
where the host samples: :mod:`neuron_stack.llm.request`). AWS's tables report request time at P50 with one
concurrent request; neither includes network time. Example:
``project_serving("llama-3-8b", NeuronConfig(tp_degree=32, seq_len=4096), 128, 3968)["ttft_request_ms"]``.
"""

from __future__ import annotations

from .config import NeuronConfig, get_target_bucket


def project_serving(
    model,
    nc: NeuronConfig,
    input_len: int,
    output_len: int,
    *,
    instance_type: str | None = None,
    dtype: str | None = None,
    quantization_dtype: str | None = None,
    neuron_release: str = "latest",
) -> dict:
    """Projected TTFT / TPOT / E2E / tok/s of ``model`` (preset, config directory or config) under ``nc``
    (``quantization_dtype``: int8 or fp8 weight-only quantization; ``neuron_release``: the runtime release
    whose collective algorithms cost the collectives, ``latest`` or ``2.18``: as :func:`neuron_stack.llm.project`)."""
    from neuron_stack.llm import project

    from .config import InferenceError

    if output_len < 2 or input_len < 1 or input_len + output_len - 1 > nc.seq_len:
        raise InferenceError(
            f"projection of {input_len} tokens in / {output_len} out: need at least 2 output tokens "
            f"and input + output - 1 <= seq_len ({nc.seq_len})"
        )
    seq = input_len + output_len
    cte = get_target_bucket(nc.context_encoding_buckets, input_len, nc.bucket_strategy)
    steps = [
        get_target_bucket(nc.token_generation_buckets, pos + 1, nc.bucket_strategy, what="seq_len")
        for pos in range(input_len, seq - 1)
    ]
    used = sorted(set(steps))
    p = project(
        model,
        batch_size=nc.batch_size,
        sequence_length=nc.seq_len,
        context_length=cte,
        tp_degree=nc.tp_degree,
        dtype=dtype or nc.torch_dtype,
        instance_type=instance_type or nc.instance_type,
        target=nc.target,
        token_generation_buckets=used,
        quantization_dtype=quantization_dtype,
        sequence_parallel=nc.sequence_parallel_enabled,
        on_device_sampling=nc.on_device_sampling_config is not None,
        neuron_release=neuron_release,
    )
    cte_graph = next(g for g in p.graphs if g.name == "context_encoding")
    cte_ns = cte_graph.device_ns
    tkg = {g.bucket: g for g in p.graphs if g.name == "token_generation"}
    tpot_ns = sum(tkg[b].device_ns for b in steps) / len(steps)
    e2e_ns = cte_ns + tpot_ns * (output_len - 1)
    ttft_req = cte_graph.request_ns
    tpot_req = sum(tkg[b].request_ns for b in steps) / len(steps)
    out = {
        "model": p.model,
        "instance_type": p.instance_type,
        "tp_degree": nc.tp_degree,
        "batch_size": nc.batch_size,
        "input_len": input_len,
        "output_len": output_len,
        "ttft_ms": cte_ns / 1e6,
        "tpot_ms": tpot_ns / 1e6,
        "ttft_ns": cte_ns,  # the context-encoding graph's device_ns, exactly as neuron-llm prints it
        "tpot_ns": tpot_ns,
        # request time: device time + the launch, copies and logits of each call (llm/request.py)
        "ttft_request_ms": ttft_req / 1e6,
        "tpot_request_ms": tpot_req / 1e6,
        "ttft_request_ns": ttft_req,
        "tpot_request_ns": tpot_req,
        "e2e_request_ms": (ttft_req + tpot_req * (output_len - 1)) / 1e6,
        "ttft_collective_ns": cte_graph.collective_ns,
        # how much of a context-encoding layer's time some DMA queue is busy (the calibration's "why")
        "ttft_layer_dma_share": cte_graph.layer_busy_ns.get("dma", 0) / max(1, cte_graph.layer_ns),
        # sequence parallel: the layer's collectives are in its graph, on the cc engine
        "ttft_layer_cc_share": cte_graph.layer_busy_ns.get("cc", 0) / max(1, cte_graph.layer_ns),
        "tpot_collective_ns": sum(tkg[b].collective_ns for b in steps) / len(steps),
        "e2e_ms": e2e_ns / 1e6,
        "output_tokens_per_s": nc.batch_size * output_len / (e2e_ns / 1e9) if e2e_ns else 0.0,
        "fits": p.fits,
        "verdict": p.verdict(),
        "hbm_per_core": p.memory,
        "cte_bucket": cte,
        "tkg_buckets": used,
        "compile_s": p.compile_s,
        "numbers": "none",
    }
    lat = {
        "context_encoding_model": cte_ns / 1e6,
        "token_generation_model": tpot_ns / 1e6,
        "e2e_model": e2e_ns / 1e6,
    }
    toks = {"context_encoding_model": nc.max_context_length, "token_generation_model": 1, "e2e_model": seq}
    out["benchmark"] = {
        k: {
            **{f"latency_ms_p{q}": v for q in (50, 90, 95, 99, 100)},
            "latency_ms_avg": v,
            "throughput": toks[k] * nc.max_batch_size / (v / 1e3) if v else 0.0,
        }
        for k, v in lat.items()
    }
    out["benchmark"]["clock"] = "projection (device time only, numbers=none)"
    out["text"] = "\n".join(
        [
            p.report(),
            "",
            f"serving {input_len} in / {output_len} out, batch {nc.batch_size}: "
            f"TTFT {out['ttft_ms']:.2f} ms (CTE bucket {cte}), TPOT {out['tpot_ms']:.2f} ms "
            f"(TKG buckets {used}), E2E {out['e2e_ms']:.0f} ms, "
            f"{out['output_tokens_per_s']:.1f} output tokens/s (device time); as a request: TTFT "
            f"{out['ttft_request_ms']:.2f} ms, TPOT {out['tpot_request_ms']:.2f} ms, "
            f"E2E {out['e2e_request_ms']:.0f} ms",
        ]
    )
    return out
