"""What the serving engine tells the world, one observer each (``Engine(observers=[...])``):

- :class:`VllmMetrics`: Prometheus metrics with vLLM's names, types, labels and buckets (reference §2.9;
  ``vllm/v1/metrics/loggers.py``), for the server's ``/metrics``; :class:`StatLogger`, vLLM's periodic
  stats line.
- :class:`TraceObserver`: one ``serving_steps`` row per step and one ``serving_requests`` row per finished
  request into the trace store (profiling on: ``NEURON_RT_INSPECT_ENABLE=1`` / ``neuron-explorer inspect``).
- :class:`LiveObserver`: tokens/s, running/waiting requests and KV-cache use in this process's live
  snapshot, which neuron-monitor and neuron-top read.

Request times are on the projected clock (see :mod:`.engine`).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque

# vLLM's histogram buckets (see above), in seconds
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0]
PREFILL_TOKEN_BUCKETS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
N_BUCKETS = [1, 2, 5, 10, 20]
FINISH_REASONS = ("stop", "length", "abort")  # vLLM v1's FinishReason, every one pre-created


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's token-count buckets: 1, 2, 5 times powers of ten up to ``max_value``.

    >>> build_1_2_5_buckets(100)
    [1, 2, 5, 10, 20, 50, 100]
    """
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            if m * 10**exp > max_value:
                return out
            out.append(m * 10**exp)
        exp += 1


class VllmMetrics:
    """vLLM v1's serving metrics (``PrometheusStatLogger``: names, types, labels, buckets) in a private
    registry; ``render()`` is the /metrics body. Preemptions and prefix-cache hits stay 0: a slot holds a
    request until it finishes and there is no prefix cache (queries are counted)."""

    def __init__(self, model_name: str, max_model_len: int = 2048, cache_info: dict | None = None):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        lab = ["model_name", "engine"]
        self.labels = {"model_name": model_name, "engine": "0"}
        tokens = build_1_2_5_buckets(max_model_len)

        def labelled(metric, name, doc, **kw):
            return metric(name, doc, lab, registry=r, **kw).labels(**self.labels)

        def hist(name, doc, buckets):
            return labelled(Histogram, name, doc, buckets=buckets)

        self.running = labelled(Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = labelled(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_old = labelled(
            Gauge, "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
        )
        self.prefix_queries_old = labelled(Counter, "vllm:gpu_prefix_cache_queries", "DEPRECATED prefix cache queries")
        self.prefix_hits_old = labelled(Counter, "vllm:gpu_prefix_cache_hits", "DEPRECATED prefix cache hits")
        self.kv = labelled(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = labelled(
            Counter, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = labelled(
            Counter, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = labelled(Counter, "vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = labelled(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = labelled(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", lab + ["finished_reason"], registry=r
        )
        self.success = {why: success.labels(**self.labels, finished_reason=why) for why in FINISH_REASONS}
        self.req_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.req_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tokens)
        self.iteration = hist(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS
        )
        self.max_gen = hist(
            "vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.params_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens
        )
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         TTFT_BUCKETS)
        self.tpot = hist("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                         TPOT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        TPOT_BUCKETS)
        self.req_tpot = hist("vllm:request_time_per_output_token_seconds",
                             "Histogram of time_per_output_token_seconds per request.", TPOT_BUCKETS)
        self.prefill_token = hist(
            "vllm:time_per_prefill_token_request_seconds", "Time spent per token during prefill  phase in seconds",
            PREFILL_TOKEN_BUCKETS,
        )
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        LATENCY_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                          LATENCY_BUCKETS)
        self.inference = hist("vllm:request_inference_time_seconds",
                              "Histogram of time spent in RUNNING phase for request.", LATENCY_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds",
                            "Histogram of time spent in PREFILL phase for request.", LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                           LATENCY_BUCKETS)
        info = {**(cache_info or {}), "engine": "0"}
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info), registry=r).labels(
            **info
        ).set(1)

    def on_parent_finished(self, n: int, max_generated: int) -> None:
        """One API request with ``n`` choices finished: vLLM's per-parent ``n`` and the most tokens any
        of its choices generated."""
        self.params_n.observe(n)
        self.max_gen.observe(max_generated)

    def on_step(self, engine, step) -> None:
        s = engine.stats()
        self.running.set(s["num_requests_running"])
        self.waiting.set(s["num_requests_waiting"])
        self.kv.set(s["kv_cache_usage_perc"])
        self.kv_old.set(s["kv_cache_usage_perc"])
        self.generation_tokens.inc(step.tokens)
        prompt = 0
        if step.phase == "prefill":
            for rid in step.request_ids:
                r = engine.requests_by_id.get(rid)
                if r is not None:
                    prompt += len(r.prompt)
                    self.ttft.observe((r.first_token_ns - r.arrival_ns) / 1e9)
            self.prompt_tokens.inc(prompt)
            self.prefix_queries.inc(prompt)
            self.prefix_queries_old.inc(prompt)
        self.iteration.observe(prompt + step.tokens)

    def on_finish(self, engine, r) -> None:
        if r.finish_reason == "abort":   # between steps: the gauges must not keep the aborted request
            s = engine.stats()
            self.running.set(s["num_requests_running"])
            self.waiting.set(s["num_requests_waiting"])
        self.success[r.finish_reason].inc()
        self.e2e.observe((r.finish_ns - r.arrival_ns) / 1e9)
        self.req_prompt.observe(len(r.prompt))
        self.req_gen.observe(len(r.output))
        self.params_max_tokens.observe(r.max_tokens)
        if not r.first_token_ns:  # aborted before its prefill: no phase times
            return
        for a, b in zip(r.token_ns, r.token_ns[1:]):
            self.tpot.observe((b - a) / 1e9)
            self.itl.observe((b - a) / 1e9)
        self.queue.observe((r.scheduled_ns - r.arrival_ns) / 1e9)
        self.inference.observe((r.finish_ns - r.scheduled_ns) / 1e9)
        self.prefill.observe((r.first_token_ns - r.scheduled_ns) / 1e9)
        self.prefill_token.observe((r.first_token_ns - r.scheduled_ns) / 1e9 / max(len(r.prompt), 1))
        self.decode.observe((r.finish_ns - r.first_token_ns) / 1e9)
        # vLLM: the request's decode time over its tokens after the first (0 for a single token)
        n = len(r.output)
        self.req_tpot.observe((r.finish_ns - r.first_token_ns) / 1e9 / (n - 1) if n > 1 else 0.0)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class StatLogger:
    """vLLM's periodic stats line (``LoggingStatLogger``): prompt and generation throughput since the last
    line (projected clock), running and waiting requests, KV-cache use, prefix-cache hit rate."""

    def __init__(self):
        from neuron_stack.device import clock

        self.clock = clock
        self.prompt = self.generated = 0
        self.last_ns = clock.now_ns()
        self.stats = {"num_requests_running": 0, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.0}
        self.lock = threading.Lock()

    def on_step(self, engine, step) -> None:
        with self.lock:
            self.generated += step.tokens
            if step.phase == "prefill":
                self.prompt += sum(len(r.prompt) for r in map(engine.requests_by_id.get, step.request_ids) if r)
        self.stats = engine.stats()

    def on_finish(self, engine, r) -> None:
        pass

    def line(self) -> str:
        """The line for the interval since the previous call (and reset)."""
        now = self.clock.now_ns()
        with self.lock:
            secs = max(now - self.last_ns, 1) / 1e9
            prompt, gen = self.prompt / secs, self.generated / secs
            self.prompt = self.generated = 0
            self.last_ns = now
        s = self.stats
        return (
            f"Engine 000: Avg prompt throughput: {prompt:.1f} tokens/s, Avg generation throughput: {gen:.1f} "
            f"tokens/s, Running: {s['num_requests_running']} reqs, Waiting: {s['num_requests_waiting']} reqs, "
            f"GPU KV cache usage: {s['kv_cache_usage_perc'] * 100:.1f}%, Prefix cache hit rate: 0.0%"
        )


#: ``serving_steps`` / ``serving_requests`` columns that are the engine's Step / Request field as it is
STEP_COLUMNS = ("step", "phase", "bucket", "batch_size", "tokens", "waiting", "kv_slots_used", "start_ns",
                "end_ns", "device_ns", "wall_start_ns", "wall_end_ns", "request_ns")
REQUEST_COLUMNS = ("request_id", "slot", "cte_bucket", "finish_reason", "arrival_ns", "scheduled_ns",
                   "first_token_ns", "finish_ns", "wall_arrival_ns", "wall_finish_ns")


class TraceObserver:
    """Serving rows into the trace store of this process's runtime session (when profiling is on)."""

    def __init__(self, model_name: str, target: str):
        from neuron_stack.runtime.session import Session

        self.session = Session.get(target)
        self.model_name = model_name

    def _append(self, table: str, record, copied: tuple[str, ...], **computed) -> None:
        """One row: the ``copied`` fields of the engine's ``record`` as they are, and ``computed``."""
        row = {"run_id": self.session.run_id, **{c: getattr(record, c) for c in copied}, **computed}
        with self.session.record_lock:
            rec = self.session.recorder
            if rec is not None:
                rec.append(table, {k: [v] for k, v in row.items()})

    def on_step(self, engine, s) -> None:
        self._append("serving_steps", s, STEP_COLUMNS, active=len(s.slots), slots=json.dumps(s.slots),
                     request_ids=json.dumps(s.request_ids))

    def on_finish(self, engine, r) -> None:
        if not r.first_token_ns:  # aborted before its prefill: it has no timeline to draw
            return
        self._append("serving_requests", r, REQUEST_COLUMNS, model=self.model_name,
                     prompt_tokens=len(r.prompt), output_tokens=len(r.output))


class LiveObserver:
    """Serving figures in the live snapshot: generated tokens/s over the last ``window_s`` (projected
    clock), running and waiting requests, KV-cache slots in use and the cache's bytes per core."""

    def __init__(self, target: str, window_s: float = 5.0):
        from neuron_stack.runtime.session import Session

        self.session = Session.get(target)
        self.window_ns = int(window_s * 1e9)
        self.recent: deque[tuple[int, int]] = deque()  # (end_ns, tokens)
        self.total = 0
        self.lock = threading.Lock()
        self.last: dict | None = None   # the serving figures last published

    def on_step(self, engine, s) -> None:
        with self.lock:
            self.recent.append((s.end_ns, s.tokens))
            self.total += s.tokens
            while self.recent and self.recent[0][0] < s.end_ns - self.window_ns:
                self.recent.popleft()
            span = max(s.end_ns - self.recent[0][0], 1) if len(self.recent) > 1 else 0
            rate = sum(t for _, t in list(self.recent)[1:]) / (span / 1e9) if span else 0.0
        st = engine.stats()
        self.last = {
                "model": engine.model_name,
                "tokens_per_s": round(rate, 3),
                "generated_tokens": self.total,
                "num_requests_running": st["num_requests_running"],
                "num_requests_waiting": st["num_requests_waiting"],
                "kv_cache_usage_perc": st["kv_cache_usage_perc"],
                "kv_cache_bytes": st["kv_cache_bytes"],
                "steps": s.step + 1,
                "updated": time.time(),
            }
        self.session.live.set_serving(self.last)

    def on_finish(self, engine, r) -> None:
        if r.finish_reason == "abort" and self.last is not None:   # between steps: no stale running request
            st = engine.stats()
            self.last = {**self.last, "num_requests_running": st["num_requests_running"],
                         "num_requests_waiting": st["num_requests_waiting"],
                         "kv_cache_usage_perc": st["kv_cache_usage_perc"], "updated": time.time()}
            self.session.live.set_serving(self.last)
