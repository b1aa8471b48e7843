"""What the serving engine tells the world, one observer each (``Engine(observers=[...])``):

- :class:`VllmMetrics`: Prometheus metrics with vLLM's names (reference §2.9; histogram buckets as
  ``vllm/v1/metrics/loggers.py``), for the server's ``/metrics``.
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

# vLLM's histogram buckets (see above), in seconds; TOKEN_BUCKETS in tokens
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]


class VllmMetrics:
    """vLLM's serving metrics in a private registry; ``render()`` is the /metrics body."""

    def __init__(self, model_name: str):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        lab = ["model_name", "engine"]
        self.labels = {"model_name": model_name, "engine": "0"}

        def labelled(metric, name, doc, **kw):
            return metric(name, doc, lab, registry=r, **kw).labels(**self.labels)

        def hist(name, doc, buckets):
            return labelled(Histogram, name, doc, buckets=buckets)

        self.running = labelled(Gauge, "vllm:num_requests_running", "Requests in the running batch")
        self.waiting = labelled(Gauge, "vllm:num_requests_waiting", "Requests waiting for a slot")
        self.kv = labelled(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage (1 = full)")
        self.kv_old = labelled(
            Gauge, "vllm:gpu_cache_usage_perc", "KV-cache usage (deprecated name of kv_cache_usage_perc)"
        )
        self.prompt_tokens = labelled(Counter, "vllm:prompt_tokens", "Prefill tokens processed")
        self.generation_tokens = labelled(Counter, "vllm:generation_tokens", "Tokens generated")
        self.success = Counter(
            "vllm:request_success", "Finished requests", lab + ["finished_reason"], registry=r
        )
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token", TTFT_BUCKETS)
        self.tpot = hist("vllm:time_per_output_token_seconds", "Time per output token", TPOT_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end request latency", LATENCY_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Time waiting for a slot", LATENCY_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds", "Prefill time", LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", "Decode time", LATENCY_BUCKETS)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Prompt tokens per request", TOKEN_BUCKETS)
        self.req_gen = hist("vllm:request_generation_tokens", "Generated tokens per request", TOKEN_BUCKETS)

    def on_step(self, engine, step) -> None:
        s = engine.stats()
        self.running.set(s["num_requests_running"])
        self.waiting.set(s["num_requests_waiting"])
        self.kv.set(s["kv_cache_usage_perc"])
        self.kv_old.set(s["kv_cache_usage_perc"])
        self.generation_tokens.inc(step.tokens)
        if step.phase == "prefill":
            for rid in step.request_ids:
                r = engine.requests_by_id.get(rid)
                if r is not None:
                    self.prompt_tokens.inc(len(r.prompt))
                    self.ttft.observe((r.first_token_ns - r.arrival_ns) / 1e9)

    def on_finish(self, engine, r) -> None:
        self.success.labels(**self.labels, finished_reason=r.finish_reason).inc()
        for a, b in zip(r.token_ns, r.token_ns[1:]):
            self.tpot.observe((b - a) / 1e9)
        self.e2e.observe((r.finish_ns - r.arrival_ns) / 1e9)
        self.queue.observe((r.scheduled_ns - r.arrival_ns) / 1e9)
        self.prefill.observe((r.first_token_ns - r.scheduled_ns) / 1e9)
        self.decode.observe((r.finish_ns - r.first_token_ns) / 1e9)
        self.req_prompt.observe(len(r.prompt))
        self.req_gen.observe(len(r.output))

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


#: ``serving_steps`` / ``serving_requests`` columns that are the engine's Step / Request field as it is
STEP_COLUMNS = ("step", "phase", "bucket", "batch_size", "tokens", "waiting", "kv_slots_used", "start_ns",
                "end_ns", "device_ns", "wall_start_ns", "wall_end_ns")
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

    def on_step(self, engine, s) -> None:
        with self.lock:
            self.recent.append((s.end_ns, s.tokens))
            self.total += s.tokens
            while self.recent and self.recent[0][0] < s.end_ns - self.window_ns:
                self.recent.popleft()
            span = max(s.end_ns - self.recent[0][0], 1) if len(self.recent) > 1 else 0
            rate = sum(t for _, t in list(self.recent)[1:]) / (span / 1e9) if span else 0.0
        st = engine.stats()
        self.session.live.set_serving(
            {
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
        )

    def on_finish(self, engine, r) -> None:
        pass
