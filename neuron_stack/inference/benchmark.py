"""``benchmark_sampling`` as NxDI's ``utils/benchmark.py`` (reference §2.7): one warm-up generate, then
``num_runs`` timed runs; each sub-model call is timed by a hook, and ``benchmark_report.json`` gets the
real keys: ``e2e_model``, ``context_encoding_model``, ``token_generation_model``, each with
``latency_ms_p50/p90/p95/p99/p100/avg`` and ``throughput`` = runs × tokens × max_batch_size / Σlatency
(tokens per run: prompt + generated e2e, ``max_context_length`` CTE, the tokens each run generates TKG: NxDI
takes the last from the config, ``max_new_tokens``, which miscounts when a run generates another number).

The report holds exactly NxDI's keys (code that loops over its sub-reports works unchanged); ours
(``simulator_wall_ms``, the clock, run and token counts) go to the sibling ``<name>.extras.json``
(:func:`write_report`). Inputs, as NxDI's: ``batch_size`` random prompts of ``max_context_length`` tokens
(half of it when the prompt would fill the cache), generating up to ``seq_len``.

Latencies are simulated device time (the NEFF's schedule on the cost model): a sub-model call is its
device time, an e2e run the sum of its calls'. Host time is never mixed in (on this simulator it is
Python overhead, not what a Neuron host would spend); the simulator's own wall time per call is kept
apart under ``simulator_wall_ms`` in the extras.

>>> report = benchmark_sampling(model, num_runs=5,                                  # doctest: +SKIP
...                             benchmark_report_path="benchmark_report.json")
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from .application import CTE, SPEC, TKG, HuggingFaceGenerationAdapter, NeuronCausalLM

PERCENTILES = (50, 90, 95, 99, 100)
#: NxDI's ``benchmark_report.json`` keys (``utils/constants.py``); anything else is ours, in the extras file
REPORT_KEYS = ("e2e_model", "context_encoding_model", "token_generation_model", "speculation_model")


def extras_path(report_path) -> Path:
    """Where our extra figures go, beside NxDI's report.

    >>> extras_path("out/benchmark_report.json").as_posix()
    'out/benchmark_report.extras.json'
    """
    p = Path(report_path)
    return p.with_name(p.stem + ".extras.json")


def write_report(report: dict, report_path) -> None:
    """NxDI's keys to ``report_path``, the rest to :func:`extras_path` (not written when there is none)."""
    Path(report_path).write_text(json.dumps({k: report[k] for k in REPORT_KEYS if k in report}, indent=4))
    extras = {k: v for k, v in report.items() if k not in REPORT_KEYS}
    if extras:
        extras_path(report_path).write_text(json.dumps(extras, indent=4))


def sample_inputs(model: NeuronCausalLM, seed: int = 0) -> torch.Tensor:
    """NxDI's benchmark inputs: ``batch_size`` random prompts of ``max_context_length`` tokens, or half of
    it when that would leave no room to generate."""
    nc = model.neuron_config
    n = nc.max_context_length if nc.max_context_length < nc.seq_len else nc.max_context_length // 2
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.hf_config.vocab_size, (nc.batch_size, max(n, 1)), generator=g)


def _summary(lat_ms: list[float], tokens: int, runs: int, batch: int) -> dict:
    arr = np.asarray(lat_ms, dtype=float)
    out = {f"latency_ms_p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}
    out["latency_ms_avg"] = float(arr.mean())
    out["throughput"] = runs * tokens * batch / (arr.sum() / 1e3) if arr.sum() else 0.0
    return out


def benchmark_sampling(
    model: NeuronCausalLM,
    input_ids=None,
    num_runs: int = 20,
    max_new_tokens: int | None = None,
    benchmark_report_path: str | Path = "./benchmark_report.json",
    draft_model: NeuronCausalLM | None = None,
) -> dict:
    """Time ``num_runs`` generates of ``input_ids`` (default: :func:`sample_inputs`) and write the report
    (:func:`write_report`). Returns the whole report dict, extras included.

    With ``draft_model`` (speculative decoding): ``speculation_model`` is the target's verification calls,
    ``token_generation_model`` every token-generation call (the draft's proposals and any plain target
    steps), e2e every call of both models; the extras add the acceptance rate and the TPOT with and
    without speculation (the latter from one plain greedy generate after the timed runs)."""
    nc = model.neuron_config
    if input_ids is None:
        input_ids = sample_inputs(model)
    new = max_new_tokens or nc.seq_len - input_ids.shape[1]
    calls: dict[str, list[float]] = {CTE: [], TKG: [], SPEC: []}
    wall: dict[str, list[float]] = {"e2e_model": [], CTE: [], TKG: [], SPEC: []}

    every: list[float] = []  # device ms of every call, in order (a run's e2e is the sum of its calls)

    def hook(tag, bucket, secs, proj_ns, device_ns):
        calls[tag].append(device_ns / 1e6)
        every.append(device_ns / 1e6)
        wall[tag].append(secs * 1e3)

    def draft_hook(tag, bucket, secs, proj_ns, device_ns):
        every.append(device_ns / 1e6)  # the draft's prefill counts in e2e only
        if tag == TKG:
            calls[TKG].append(device_ns / 1e6)

    adapter = HuggingFaceGenerationAdapter(model)
    kw = {"assistant_model": draft_model} if draft_model is not None else {}
    adapter.generate(input_ids, max_new_tokens=new, **kw)  # warm-up, not measured
    model.hooks.append(hook)
    if draft_model is not None:
        draft_model.hooks.append(draft_hook)
    e2e, accepted = [], []
    try:
        for _ in range(num_runs):
            before, w0 = len(every), time.perf_counter()
            adapter.generate(input_ids, max_new_tokens=new, **kw)
            e2e.append(sum(every[before:]))
            wall["e2e_model"].append((time.perf_counter() - w0) * 1e3)
            if draft_model is not None:
                accepted.append(adapter.speculation["acceptance_rate"])
    finally:
        model.hooks.remove(hook)
        if draft_model is not None:
            draft_model.hooks.remove(draft_hook)
    batch = nc.max_batch_size
    # the tokens each run actually generates and processes (NxDI's formula takes them from the config,
    # max_new_tokens or max_length - max_context_length // 2, which miscounts a run of another length)
    tkg_tokens, e2e_tokens = new, input_ids.shape[1] + new
    report = {
        "e2e_model": _summary(e2e, e2e_tokens, num_runs, batch),
        "context_encoding_model": _summary(calls[CTE], nc.max_context_length, num_runs, batch),
        "token_generation_model": _summary(calls[TKG], tkg_tokens, num_runs, batch),
        **({SPEC: _summary(calls[SPEC], tkg_tokens, num_runs, batch)} if calls[SPEC] else {}),
        "simulator_wall_ms": {k: float(np.mean(v)) if v else 0.0 for k, v in wall.items()},
        "clock": "simulated device time",
        "num_runs": num_runs,
        "generated_tokens_per_run": new,
    }
    if draft_model is not None:
        plain: list[float] = []

        def plain_hook(tag, bucket, secs, proj_ns, device_ns):
            if tag == TKG:
                plain.append(device_ns / 1e6)

        model.hooks.append(plain_hook)
        try:
            adapter.generate(input_ids, max_new_tokens=new)
        finally:
            model.hooks.remove(plain_hook)
        cte_ms = float(np.mean(calls[CTE])) if calls[CTE] else 0.0
        report["speculation"] = {
            "speculation_length": nc.speculation_length,
            "acceptance_rate": float(np.mean(accepted)),
            "tpot_ms": (float(np.mean(e2e)) - cte_ms) / max(new - 1, 1),
            "tpot_ms_without_speculation": float(np.mean(plain)) if plain else 0.0,
        }
    write_report(report, benchmark_report_path)
    return report
