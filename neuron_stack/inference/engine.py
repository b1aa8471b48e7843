"""Continuous batching over a compiled :class:`~.application.NeuronCausalLM`, as vLLM schedules
Neuron models (reference §2.9): ``max_num_seqs`` = the compiled ``batch_size`` slots, each slot one KV
cache row (a block of ``max_model_len``); requests join and leave the running batch at every step.

Each :meth:`Engine.step` is one sub-model call. Prefill first: while a request waits and a slot is
free, the step is a context encoding of up to ``ctx_batch_size`` waiting requests (written into their
slots; vLLM's default for NxDI is one prompt per call); otherwise it is one token-generation call for
every slot (the rows of free slots compute and are ignored). Each request's token is chosen from its
row of logits with its own :class:`~.sampling.SamplingParams` (penalties, temperature, top-k/p, min-p,
its seeded generator). A request leaves at ``max_tokens``, its EOS token, a stop token or stop string,
or the cache's ``seq_len``; its slot is free for the next step.

Times are on the projected clock (:mod:`neuron_stack.device.clock`: simulated device time plus real host
time), so TTFT and TPOT are what the request would see on hardware; wall times are kept beside them.

>>> eng = Engine(model)                                                   # doctest: +SKIP
>>> r = eng.add_request([1, 2, 3], max_tokens=8); eng.run_until_done(); r.output   # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from neuron_stack.device import clock
from neuron_stack.llm.sampling import SamplingParams, logprobs, sample

from .application import CTE, NeuronCausalLM, _greedy_on_device
from .config import InferenceError

_ids = itertools.count()


@dataclass
class Request:
    """One generation request and what happened to it (projected-clock ``*_ns``, wall ``wall_*``)."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    eos_token_id: int | None = None
    on_token: Callable | None = None  # on_token(request, token_or_None, finished: bool)
    slot: int | None = None
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    output: list[int] = field(default_factory=list)
    logprobs: list[tuple[float, list]] = field(default_factory=list)  # per token, when params.logprobs is set
    cte_bucket: int = 0
    finish_reason: str = ""
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it (vLLM's field)
    generator: object = None  # the request's torch.Generator when seeded
    arrival_ns: int = 0
    scheduled_ns: int = 0
    first_token_ns: int = 0
    finish_ns: int = 0
    token_ns: list[int] = field(default_factory=list)  # projected time each output token was produced
    wall_arrival_ns: int = 0
    wall_finish_ns: int = 0

    @property
    def finished(self) -> bool:
        return bool(self.finish_reason)


@dataclass
class Step:
    """One engine step (one sub-model call)."""

    step: int
    phase: str  # prefill | decode
    bucket: int
    batch_size: int
    slots: list[int]
    request_ids: list[str]
    tokens: int
    waiting: int
    kv_slots_used: int
    start_ns: int
    end_ns: int
    device_ns: int
    wall_start_ns: int
    wall_end_ns: int
    request_ns: int = 0  # device time + each call's launch and host-link copies (neuron_stack.llm.request)


class Engine:
    """The scheduler: ``add_request`` (any thread), ``step`` / ``run_until_done`` (one thread).

    ``observers``: objects with ``on_step(engine, Step)`` and ``on_finish(engine, Request)``
    (the trace recorder, the live snapshot, Prometheus metrics: :mod:`.observe`).
    """

    def __init__(
        self,
        model: NeuronCausalLM,
        observers: list | None = None,
        model_name: str = "model",
        decode: Callable[[list[int]], str] | None = None,
    ):
        if model.kv_cache is None:
            raise InferenceError("the model is not loaded: call model.load(compiled_path) before serving")
        self.model, self.nc = model, model.neuron_config
        self.model_name = model_name
        self.decode = decode  # ids -> text, for stop strings
        self.slots: list[Request | None] = [None] * self.nc.kv_cache_batch_size
        self.waiting: deque[Request] = deque()
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self.steps = 0
        self.observers = list(observers or [])
        self.requests_by_id: dict[str, Request] = {}  # queued or running
        self._device_ns = self._request_ns = 0
        self._added: dict[tuple[str, int], int] = {}
        model.hooks.append(self._on_call)

    def _on_call(self, tag, bucket, secs, proj_ns, device_ns) -> None:
        self._device_ns += device_ns
        self._request_ns += device_ns + self._call_added_ns(tag, bucket)

    def _call_added_ns(self, tag: str, bucket: int) -> int:
        """What one call of ``tag``'s ``bucket`` NEFF adds to its device time for the request: the runtime's
        launch and the copies over the host link (``neuron_stack.llm.request``; collectives are in device time)."""
        key = (tag, bucket)
        if key not in self._added:
            from neuron_stack.device.profiles import get_profile
            from neuron_stack.llm.request import added_ns, call_components

            nc = self.nc
            cte = tag == CTE
            comps = call_components(
                get_profile(nc.target), batch=nc.ctx_batch_size if cte else nc.tkg_batch_size,
                tokens=bucket if cte else max(1, nc.speculation_length), bucket=bucket,
                vocab=int(self.model.config.hf_config.vocab_size),
                dtype_bytes={"bfloat16": 2, "float16": 2}.get(str(nc.torch_dtype).removeprefix("torch."), 4),
                on_device_sampling=nc.on_device_sampling_config is not None, collective_ns=0)
            self._added[key] = added_ns(comps)
        return self._added[key]

    # -- requests ---------------------------------------------------------------------------------
    def validate(self, prompt: list[int], max_tokens: int, params: SamplingParams | None = None) -> None:
        """Refuse a request the compiled shapes cannot hold, in one line naming the limit."""
        nc = self.nc
        if params is not None:
            params.verify_vocab(self.model.config.hf_config.vocab_size)
            if params.stop and self.decode is None:
                raise InferenceError("stop strings need a tokenizer: Engine(..., decode=tokenizer.decode)")
            if not params.plain_greedy and _greedy_on_device(nc):
                raise InferenceError(
                    "this model was compiled with greedy on-device sampling (top_k=1): it returns token "
                    "ids, not logits; send temperature=0, or compile without on_device_sampling_config"
                )
        if not prompt:
            raise InferenceError("the prompt is empty: give at least one token")
        if len(prompt) > nc.max_context_length and not nc.allow_input_truncation:
            raise InferenceError(
                f"Inputs supplied ({len(prompt)}) are longer than max_context_length "
                f"({nc.max_context_length}): shorten the prompt or compile with a larger "
                "max_context_length"
            )
        if max_tokens < 1 or min(len(prompt), nc.max_context_length) + max_tokens > nc.seq_len:
            raise InferenceError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceed seq_len "
                f"{nc.seq_len}: ask for fewer tokens or compile with a larger seq_len"
            )
        vocab = self.model.config.hf_config.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise InferenceError(f"token id {bad} is outside the vocabulary (0..{vocab - 1})")

    def add_request(
        self,
        prompt: list[int],
        max_tokens: int,
        eos_token_id: int | None = None,
        on_token: Callable | None = None,
        request_id: str | None = None,
        params: SamplingParams | None = None,
    ) -> Request:
        """Queue a request (thread-safe); it joins the running batch at the next step with a free slot.
        ``params`` default: greedy; ``params.ignore_eos`` drops ``eos_token_id``."""
        self.validate(prompt, max_tokens, params)
        params = params or SamplingParams(temperature=0.0)
        if params.ignore_eos:
            eos_token_id = None
        params._stops = set(params.stop_token_ids) | ({eos_token_id} - {None})
        req = Request(
            request_id or f"req-{next(_ids)}",
            list(prompt),
            int(max_tokens),
            eos_token_id,
            on_token,
            params=params,
            arrival_ns=clock.now_ns(),
            wall_arrival_ns=clock.wall_ns(),
        )
        req.generator = params.generator()
        with self.wakeup:
            self.waiting.append(req)
            self.requests_by_id[req.request_id] = req
            self.wakeup.notify_all()
        return req

    def abort(self, request_id: str) -> None:
        """Drop a queued or running request (a client went away); its slot is free for the next step.
        Observers see it finish with ``finish_reason="abort"``."""
        with self.lock:
            r = self.requests_by_id.pop(request_id, None)
            if r is None or r.finished:
                return
            r.finish_reason, r.finish_ns, r.wall_finish_ns = "abort", clock.now_ns(), clock.wall_ns()
            if r in self.waiting:
                self.waiting.remove(r)
            elif r.slot is not None and self.slots[r.slot] is r:
                self.slots[r.slot] = None
        for obs in self.observers:
            obs.on_finish(self, r)

    @property
    def running(self) -> list[Request]:
        return [r for r in self.slots if r is not None]

    def has_work(self) -> bool:
        with self.lock:
            return bool(self.waiting) or any(r is not None for r in self.slots)

    # -- stepping ---------------------------------------------------------------------------------
    def step(self) -> Step | None:
        """Run one prefill or decode call; None when there is nothing to do."""
        with self.lock:
            free = [i for i, r in enumerate(self.slots) if r is None]
            admit = []
            while self.waiting and free and len(admit) < self.nc.ctx_batch_size:
                req = self.waiting.popleft()
                req.slot = free.pop(0)
                self.slots[req.slot] = req
                admit.append(req)
            running = self.running
        if not admit and not running:
            return None
        t0, w0 = clock.now_ns(), clock.wall_ns()
        self._device_ns = self._request_ns = 0
        if admit:
            for r in admit:
                # A request that arrived while the simulator ran a step was stamped with the clock offset
                # before that step's device time replaced its (longer) simulation time; on the projected
                # timeline it arrived no later than this step's start.
                r.arrival_ns = min(r.arrival_ns, t0)
                r.scheduled_ns = t0
            out, bucket = self.model.context_encoding([r.prompt for r in admit], [r.slot for r in admit])
            batch, phase, members = self.nc.ctx_batch_size, "prefill", admit
            for r in admit:
                r.cte_bucket = bucket
        else:
            tokens = [0] * len(self.slots)
            positions = [0] * len(self.slots)
            for r in running:
                tokens[r.slot] = r.output[-1]
                positions[r.slot] = min(len(r.prompt), self.nc.max_context_length) + len(r.output) - 1
            out, bucket = self.model.token_generation(tokens, positions)
            batch, phase, members = len(self.slots), "decode", running
        t1, w1 = clock.now_ns(), clock.wall_ns()
        finished = []
        delivered = 0   # tokens of requests still there: an abort during the step discards its token
        for i, r in enumerate(members):
            if r.finished:  # aborted while this step ran
                continue
            delivered += 1
            row = out[i] if phase == "prefill" else out[r.slot]
            tok = int(row) if row.dim() == 0 else sample(row, r.params, r.prompt, r.output, r.generator)
            r.output.append(tok)
            r.token_ns.append(t1)
            if r.params.logprobs is not None and row.dim() == 1:
                r.logprobs.append(logprobs(row, tok, r.params.logprobs))
            if len(r.output) == 1:
                r.first_token_ns = t1
            reason = self._stop(r, tok)
            if reason:
                r.finish_reason, r.finish_ns, r.wall_finish_ns = reason, t1, w1
                finished.append(r)
            if r.on_token is not None:
                r.on_token(r, tok, bool(reason))
        with self.lock:
            for r in finished:
                self.slots[r.slot] = None
            used = sum(s is not None for s in self.slots)
            waiting = len(self.waiting)
        st = Step(
            self.steps,
            phase,
            bucket,
            batch,
            [r.slot for r in members],
            [r.request_id for r in members],
            delivered,
            waiting,
            used,
            t0,
            t1,
            self._device_ns,
            w0,
            w1,
            self._request_ns,
        )
        self.steps += 1
        for obs in self.observers:
            obs.on_step(self, st)
            for r in finished:
                obs.on_finish(self, r)
        with self.lock:
            for r in finished:
                self.requests_by_id.pop(r.request_id, None)
        return st

    def _stop(self, r: Request, tok: int) -> str:
        """The finish reason after ``tok`` ("" to go on), as vLLM's stop checker: stop ids and EOS (after
        ``min_tokens``), then stop strings in the text, then ``max_tokens``."""
        p = r.params
        if len(r.output) >= p.min_tokens:
            if tok in p._stops:
                r.stop_reason = None if tok == r.eos_token_id else tok
                return "stop"
            if p.stop:
                text = self.decode(r.output)
                hit = next((s for s in p.stop if s in text), None)
                if hit is not None:
                    r.stop_reason = hit
                    return "stop"
        return "length" if len(r.output) >= r.max_tokens else ""

    def run_until_done(self, max_steps: int = 1_000_000) -> int:
        """Step until no request waits or runs; returns the number of steps."""
        n = 0
        while n < max_steps and self.step() is not None:
            n += 1
        return n

    def serve_forever(self, stop: threading.Event, idle_s: float = 0.05) -> None:
        """Step while there is work; sleep on the condition otherwise (the server's engine thread)."""
        while not stop.is_set():
            if self.step() is None:
                with self.wakeup:
                    if not self.waiting:
                        self.wakeup.wait(idle_s)

    def stats(self) -> dict:
        """Running / waiting requests and KV-cache use now (what /metrics and the live snapshot show)."""
        with self.lock:
            running = sum(r is not None for r in self.slots)
            return {
                "num_requests_running": running,
                "num_requests_waiting": len(self.waiting),
                "kv_cache_usage_perc": self.model.kv_cache.usage(running),
                "kv_cache_bytes": self.model.kv_cache.bytes_per_core,
            }


__all__ = ["Engine", "Request", "Step", "CTE"]
