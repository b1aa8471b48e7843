"""An OpenAI-compatible server over the continuous-batching engine, with vLLM's endpoints, request
fields, defaults, error messages and metric names (reference §2.9): ``POST /v1/completions``,
``POST /v1/chat/completions`` (``"stream": true`` sends server-sent events ending ``data: [DONE]``;
``stream_options.include_usage`` adds a usage chunk), ``GET /v1/models``, ``GET /v1/models/{id}``,
``POST /tokenize``, ``POST /detokenize``, ``GET /version``, ``GET|POST /ping``, ``GET /health``,
``GET /metrics``.

Sampling is vLLM's (:mod:`.sampling`): ``temperature`` (default 1.0, as vLLM), ``top_p``, ``top_k``,
``min_p``, ``seed``, ``stop``, ``stop_token_ids``, the three penalties, ``n``, ``logprobs``
(``top_logprobs`` in chat), ``min_tokens``, ``ignore_eos``; a completion's ``prompt`` may be several
prompts (choices are ``prompt × n``), a chat message's ``content`` text parts. Default ``max_tokens``: 16
for completions, the rest of the context for chat (vLLM's).

FastAPI + uvicorn, bound to 127.0.0.1 unless ``--host`` says otherwise. Bounds: request bodies over
``MAX_BODY_BYTES`` get 413 whatever their transfer encoding (the body is read, bounded, before the app
sees it); ``max_tokens`` must fit the compiled ``seq_len``, prompts ``max_context_length``; a request
waits at most ``REQUEST_TIMEOUT_S``; a client that disconnects aborts its requests at once, streamed or not
(slots free for the next step; ``vllm:request_success_total{finished_reason="abort"}``). Bad requests get a
4xx with the error body ``{"error": {"message", "type", "param", "code"}}``.

Prompts are text (the model's own tokenizer and chat template when its directory has them, else the
offline byte tokenizer: :mod:`.tokenizer`) or lists of token ids; every choice
also carries ``token_ids`` (ours) so a random-weight model's output can be checked by id.

    inference_demo serve --model-path ./tiny --batch-size 4 --max-context-length 64 --seq-len 128
    curl -s 127.0.0.1:8000/v1/completions -d '{"prompt": "Hello", "max_tokens": 8}'
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from .config import InferenceError

MAX_BODY_BYTES = 1 << 20
REQUEST_TIMEOUT_S = 300.0
MAX_MESSAGES = 256
MAX_PROMPTS = 64  # prompts × n per completion request
ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 413: "RequestEntityTooLarge", 504: "TimeoutError"}


def _error(status: int, message: str, param: str | None = None):
    from fastapi.responses import JSONResponse

    kind = ERROR_TYPES.get(status, "InternalServerError")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


class _BodyLimit:
    """ASGI middleware: read the request body (declared length or chunked) up to ``limit`` bytes before the
    app runs; over it, answer 413 (and never start the app, so no half-sent response can follow)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = _error(413, f"request body over {self.limit} bytes")
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await too_big(scope, receive, send)
        chunks, seen = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client left while sending
                return
            chunks.append(msg.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                return await too_big(scope, receive, send)
            if not msg.get("more_body"):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: http.disconnect when the client goes away

        await self.app(scope, replay, send)


def _int(body: dict, key: str, default, lo: int, hi: int):
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InferenceError(f"{key} must be an integer from {lo} to {hi}, not {v!r}")
    return v


def _num(body: dict, key: str, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InferenceError(f"{key} must be a number, not {v!r}")
    return float(v)


def _text(content) -> str:
    """A message's content: a string, or text parts joined by newlines (vLLM's rendering)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str) for c in content
    ):
        return "\n".join(c["text"] for c in content)
    raise InferenceError("message content must be a string or a list of {'type': 'text', 'text': ...} parts")


class _Choice:
    """One choice's text as it streams: the engine request, the text already sent, and the stop-string
    hold-back (vLLM's ``output_text_buffer_length``: a stop string is never sent, even in part)."""

    def __init__(self, index: int, req, tokenizer):
        self.index, self.req, self.tok = index, req, tokenizer
        self.sent = 0
        p = req.params
        self.hold = max(len(s) for s in p.stop) - 1 if p.stop and not p.include_stop_str_in_output else 0

    def text(self) -> str:
        r, p = self.req, self.req.params
        text = self.tok.decode(r.output)
        if r.finished:
            if isinstance(r.stop_reason, str):
                cut = text.find(r.stop_reason)
                text = text[: cut + len(r.stop_reason) if p.include_stop_str_in_output else cut]
            return text
        text = text[: len(text) - self.hold] if self.hold else text
        return text.rstrip("\ufffd")  # an incomplete UTF-8 character waits for its next byte

    def delta(self) -> str:
        text = self.text()
        piece = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return piece


def create_app(engine, tokenizer, model_name: str, metrics=None, on_shutdown=None, stat_logger=None,
               stats_interval_s: float = 10.0):
    """The FastAPI app serving ``engine`` (an :class:`~.engine.Engine` whose thread the app starts);
    ``on_shutdown()`` runs after the engine thread stopped; ``stat_logger`` (:class:`~.observe.StatLogger`)
    prints vLLM's stats line every ``stats_interval_s``."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    from neuron_stack.llm.sampling import SamplingParams

    class _Stream(StreamingResponse):
        """Server-sent events that abort their requests however the response ends (a client gone before the
        first byte makes Starlette skip the stream, whose own ``finally`` would have aborted them)."""

        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                self.on_close()

    nc = engine.nc
    stop = threading.Event()

    def log_stats():
        while not stop.wait(stats_interval_s):
            print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [loggers] {stat_logger.line()}", file=sys.stderr,
                  flush=True)

    @asynccontextmanager
    async def lifespan(app):
        t = threading.Thread(target=engine.serve_forever, args=(stop,), name="neuron-engine", daemon=True)
        t.start()
        if stat_logger is not None:
            threading.Thread(target=log_stats, name="neuron-stats", daemon=True).start()
        yield
        stop.set()
        t.join(timeout=10)
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="neuron_stack OpenAI-compatible server", lifespan=lifespan)

    async def parse(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InferenceError(f"the request body is not JSON ({exc})") from None
        if not isinstance(body, dict):
            raise InferenceError("the request body must be a JSON object")
        name = body.get("model")
        if name is not None and name != model_name:
            raise LookupError(f"The model `{name}` does not exist.")
        return body

    def chat_ids(msgs) -> list[int]:
        if not isinstance(msgs, list) or not msgs or len(msgs) > MAX_MESSAGES or not all(
            isinstance(m, dict) for m in msgs
        ):
            raise InferenceError(f"messages must be a list of 1 to {MAX_MESSAGES} message objects")
        return tokenizer.chat([{"role": m.get("role", "user"), "content": _text(m.get("content", ""))} for m in msgs])

    def one_prompt(p) -> list[int]:
        if isinstance(p, str) and p:
            return tokenizer.encode(p)
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            return p
        raise InferenceError("prompt must be a non-empty string or a list of token ids (or a list of those)")

    def prompts(body: dict, chat: bool) -> list[list[int]]:
        if chat:
            return [chat_ids(body.get("messages"))]
        p = body.get("prompt")
        many = isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p)
        out = [one_prompt(x) for x in p] if many else [one_prompt(p)]
        return out

    def params(body: dict, chat: bool, n_prompt: int) -> SamplingParams:
        if body.get("stream_options") is not None and not body.get("stream"):
            raise InferenceError("Stream options can only be defined when `stream=True`.")
        if body.get("suffix") is not None:
            raise InferenceError("suffix is not currently supported")
        if chat:
            top = _int(body, "top_logprobs", None, 0, 20)
            if top is not None and not body.get("logprobs"):
                raise InferenceError("when using `top_logprobs`, `logprobs` must be set to true.")
            logprobs = (top or 0) if body.get("logprobs") else None
            key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
            default = nc.seq_len - n_prompt  # vLLM: the rest of the context
        else:
            logprobs, key, default = _int(body, "logprobs", None, 0, 20), "max_tokens", 16
        stop_ = body.get("stop")
        if stop_ is not None and not isinstance(stop_, (str, list)):
            raise InferenceError("stop must be a string or a list of strings")
        return SamplingParams(
            n=_int(body, "n", 1, 1, MAX_PROMPTS),
            presence_penalty=_num(body, "presence_penalty", 0.0),
            frequency_penalty=_num(body, "frequency_penalty", 0.0),
            repetition_penalty=_num(body, "repetition_penalty", 1.0),
            temperature=_num(body, "temperature", 1.0),
            top_p=_num(body, "top_p", 1.0),
            top_k=_int(body, "top_k", 0, -1, 1 << 30),
            min_p=_num(body, "min_p", 0.0),
            seed=_int(body, "seed", None, -(1 << 63), (1 << 63) - 1),
            stop=stop_,
            stop_token_ids=body.get("stop_token_ids"),
            ignore_eos=bool(body.get("ignore_eos")),
            max_tokens=_int(body, key, max(default, 1), 1, nc.seq_len),
            min_tokens=_int(body, "min_tokens", 0, 0, nc.seq_len),
            logprobs=logprobs,
            include_stop_str_in_output=bool(body.get("include_stop_str_in_output")),
        )

    def submit(body: dict, chat: bool, loop, queue) -> tuple[list[_Choice], list[list[int]]]:
        ids = prompts(body, chat)
        p0 = params(body, chat, max(len(x) for x in ids))
        if len(ids) * p0.n > MAX_PROMPTS:
            raise InferenceError(f"{len(ids)} prompts × n={p0.n} choices is over {MAX_PROMPTS}")
        kind = "chatcmpl" if chat else "cmpl"
        rid = f"{kind}-{uuid.uuid4().hex[:24]}"
        choices: list[_Choice] = []

        def on_token_of(k: int):
            return lambda req, tok, finished: loop.call_soon_threadsafe(queue.put_nowait, (k, finished))

        try:
            for i, prompt in enumerate(ids):
                for j in range(p0.n):
                    # vLLM's parallel sampling: child j of a seeded request draws with seed + j
                    p = SamplingParams(**{**p0.__dict__, "n": 1, "_stops": set(),
                                          "seed": None if p0.seed is None else p0.seed + j})
                    req = engine.add_request(prompt, p.max_tokens, eos_token_id=tokenizer.eos_token_id,
                                             on_token=on_token_of(len(choices)), request_id=f"{rid}-{i}-{j}",
                                             params=p)
                    choices.append(_Choice(len(choices), req, tokenizer))
        except InferenceError:
            for c in choices:
                engine.abort(c.req.request_id)
            raise
        return choices, ids

    def abort_all(choices):
        for c in choices:
            engine.abort(c.req.request_id)

    def finished_parent(choices, n):
        if metrics is not None:
            for k in range(0, len(choices), n):
                metrics.on_parent_finished(n, max(len(c.req.output) for c in choices[k : k + n]))

    def token_str(t: int) -> str:
        # one token's bytes; a byte that is not UTF-8 on its own reads as \\xNN (distinct keys in top_logprobs)
        return tokenizer.decode_token(t).decode("utf-8", "backslashreplace")

    def logprobs_json(chat: bool, reqs_lp, tokens, start=0, offset0=0):
        if chat:
            def entry(t, lp):
                s = token_str(t)
                return {"token": s, "logprob": lp, "bytes": list(s.encode())}

            return {"content": [{**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
                                for t, (lp, top) in zip(tokens, reqs_lp)]}
        offsets, pos = [], offset0
        for t in tokens:
            offsets.append(pos)
            pos += len(token_str(t))
        return {
            "text_offset": offsets,
            "token_logprobs": [lp for lp, _ in reqs_lp],
            "tokens": [token_str(t) for t in tokens],
            "top_logprobs": [{token_str(i): v for i, v in [(t, lp), *top]} for t, (lp, top) in zip(tokens, reqs_lp)],
        }

    def usage(choices, ids) -> dict:
        done = sum(len(c.req.output) for c in choices)
        prompt = sum(len(x) for x in ids)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}

    async def watch(request: Request, choices, queue):
        """On the client's ``http.disconnect`` (after the body), abort every choice at once; wake :func:`wait`."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        abort_all(choices)
        queue.put_nowait((None, True))

    async def wait(request: Request, choices, queue):
        """Yield (choice index, finished) per token until every choice finished; abort all when the client
        disconnects (ConnectionAbortedError), at the timeout, or when the caller stops (a failed send)."""
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        left = len(choices)
        watcher = asyncio.create_task(watch(request, choices, queue))
        try:
            while left:
                item = await asyncio.wait_for(queue.get(), max(deadline - time.monotonic(), 0.0))
                if item[0] is None:
                    raise ConnectionAbortedError
                left -= bool(item[1])
                yield item
        finally:
            watcher.cancel()
            abort_all(choices)  # a no-op for finished requests; frees the slots of the rest

    async def handle(request: Request, chat: bool):
        try:
            body = await parse(request)
            loop, queue = asyncio.get_running_loop(), asyncio.Queue()
            choices, ids = submit(body, chat, loop, queue)
        except LookupError as exc:
            return _error(404, str(exc), "model")
        except InferenceError as exc:
            return _error(400, str(exc))
        n = len(choices) // len(ids)
        base = {"id": choices[0].req.request_id.rsplit("-", 2)[0], "created": int(time.time()), "model": model_name}
        echo = bool(body.get("echo")) and not chat
        if body.get("stream"):
            gen = stream(request, choices, ids, queue, base, chat, body, echo, n)
            resp = _Stream(gen, media_type="text/event-stream")
            resp.on_close = lambda: abort_all(choices)
            return resp
        try:
            async for _ in wait(request, choices, queue):
                pass
        except TimeoutError:
            return _error(504, f"the request did not finish within {REQUEST_TIMEOUT_S:.0f} s")
        except ConnectionAbortedError:
            return Response(status_code=499)  # nobody reads it: the client is gone
        finished_parent(choices, n)
        out = []
        for c in choices:
            r = c.req
            text = c.text()
            lp = None
            if r.params.logprobs is not None:
                lp = logprobs_json(chat, r.logprobs, r.output)
            choice = {"index": c.index, "finish_reason": r.finish_reason, "stop_reason": r.stop_reason,
                      "token_ids": r.output, "logprobs": lp}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                prefix = tokenizer.decode(r.prompt) if echo else ""
                choice["text"] = prefix + text
            out.append(choice)
        kind = "chat.completion" if chat else "text_completion"
        return JSONResponse({**base, "object": kind, "choices": out, "usage": usage(choices, ids)})

    async def stream(request, choices, ids, queue, base, chat, body, echo, n):
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(index, piece, reason=None, tokens=(), lp=None, role=False, stop_reason=None):
            if chat:
                delta = {"role": "assistant", "content": ""} if role else {"content": piece}
                choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason}
            else:
                choice = {"index": index, "text": piece, "logprobs": lp, "finish_reason": reason}
            if reason:
                choice["stop_reason"] = stop_reason
            choice["token_ids"] = list(tokens)
            return f"data: {json.dumps({**base, 'object': kind, 'choices': [choice]})}\n\n"

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        shown = [0] * len(choices)  # tokens already sent per choice
        if chat:  # vLLM: the role comes first, alone
            for c in choices:
                yield event(c.index, "", role=True)
        elif echo:
            for c in choices:
                yield event(c.index, tokenizer.decode(c.req.prompt))
        try:
            async for index, finished in wait(request, choices, queue):
                c = choices[index]
                r = c.req
                piece = c.delta()
                if not (piece or finished or not chat):
                    continue  # a chat chunk carries text; its tokens go with the next one
                new = r.output[shown[index] :]
                shown[index] = len(r.output)
                lp = None
                if r.params.logprobs is not None and new:
                    lp = logprobs_json(chat, r.logprobs[-len(new) :], new, offset0=c.sent - len(piece))
                reason = r.finish_reason if finished else None
                yield event(index, piece, reason, new, lp, stop_reason=r.stop_reason)
        except TimeoutError:
            yield f"data: {json.dumps({'error': {'message': 'request timed out', 'code': 504}})}\n\n"
        except ConnectionAbortedError:
            return
        finished_parent(choices, n)
        if include_usage:
            yield f"data: {json.dumps({**base, 'object': kind, 'choices': [], 'usage': usage(choices, ids)})}\n\n"
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    def card() -> dict:
        return {"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "neuron_stack",
                "root": model_name, "parent": None, "max_model_len": nc.seq_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != model_name:
            return _error(404, f"The model `{model_id}` does not exist.", "model")
        return card()

    @app.post("/tokenize")
    async def tokenize(request: Request):
        try:
            body = await parse(request)
            if "messages" in body:
                ids = chat_ids(body["messages"])
            else:
                ids = one_prompt(body.get("prompt"))
        except LookupError as exc:
            return _error(404, str(exc), "model")
        except InferenceError as exc:
            return _error(400, str(exc))
        return {"count": len(ids), "max_model_len": nc.seq_len, "tokens": ids, "token_strs": None}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        try:
            body = await parse(request)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise InferenceError("tokens must be a list of token ids")
        except LookupError as exc:
            return _error(404, str(exc), "model")
        except InferenceError as exc:
            return _error(400, str(exc))
        return {"prompt": tokenizer.decode(ids)}

    @app.get("/version")
    async def version():
        from importlib.metadata import version as v

        return {"version": v("neuron_stack")}

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping():
        return Response(status_code=200)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/metrics")
    async def prom():
        if metrics is None:
            return _error(404, "metrics are off")
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return _BodyLimit(app, MAX_BODY_BYTES)


def build(model, model_name: str, log_stats: bool = True):
    """(asgi app, engine) serving a loaded model: the engine with every observer (metrics, trace, live)."""
    from .engine import Engine
    from .observe import LiveObserver, StatLogger, TraceObserver, VllmMetrics
    from .tokenizer import load_tokenizer

    nc = model.neuron_config
    # vLLM on Neuron: one block of max_model_len per sequence, num_gpu_blocks = max_num_seqs + 1
    cache_info = {"block_size": str(nc.seq_len), "cache_dtype": nc.torch_dtype, "enable_prefix_caching": "False",
                  "num_gpu_blocks": str(nc.kv_cache_batch_size + 1), "num_cpu_blocks": "None"}
    metrics = VllmMetrics(model_name, nc.seq_len, cache_info)
    trace = TraceObserver(model_name, nc.target)
    stats = None if not log_stats else StatLogger()
    tokenizer = load_tokenizer(model.model_path, model.config.hf_config.vocab_size)
    observers = [metrics, trace, LiveObserver(nc.target)] + ([stats] if stats else [])
    engine = Engine(model, observers=observers, model_name=model_name, decode=tokenizer.decode)
    # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown, so atexit never runs: close the runtime
    # session (trace segments, run status, live snapshot, core lease) while shutting down
    app = create_app(engine, tokenizer, model_name, metrics, on_shutdown=trace.session.close, stat_logger=stats,
                     stats_interval_s=_stats_interval())
    return app, engine


def _stats_interval() -> float:
    """vLLM's ``VLLM_LOG_STATS_INTERVAL`` (seconds, default 10), bounded to 0.1 .. 3600."""
    raw = os.environ.get("VLLM_LOG_STATS_INTERVAL", "10")[:32]
    try:
        return min(max(float(raw), 0.1), 3600.0)
    except ValueError:
        raise InferenceError(f"VLLM_LOG_STATS_INTERVAL={raw!r} is not a number of seconds") from None


def serve(model, model_name: str, host: str = "127.0.0.1", port: int = 8000, *, log_stats: bool = True,
          access_log: bool = True) -> int:
    """Serve ``model`` with uvicorn until interrupted (``inference_demo serve``): uvicorn's access log
    (one line per request) and vLLM's stats line unless turned off."""
    import uvicorn

    app, _ = build(model, model_name, log_stats)
    print(
        f"serving {model_name} on http://{host}:{port} (OpenAI-compatible: /v1/completions, "
        "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /version, /ping, /health, /metrics)",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=access_log)
    return 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now. Example: ``port = free_port()``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server_process(port: int, log_path, *, env=None, ready_timeout_s: float = 300.0, **flags):
    """``inference_demo serve --port PORT`` with ``flags`` in a child process (output to ``log_path``),
    returned once ``GET /health`` answers on 127.0.0.1; the caller stops it (``proc.terminate()``).

    ``model_path="./tiny"`` becomes ``--model-path ./tiny``. A child that exits, or is not ready within
    ``ready_timeout_s``, is stopped and raises :class:`InferenceError` quoting the end of its log.
    Example: ``proc = start_server_process(free_port(), "serve.log", model_path="./tiny", seq_len=128)``.
    """
    cmd = [sys.executable, "-m", "neuron_stack.inference.demo", "serve", "--port", str(port)]
    for name, value in flags.items():
        cmd += ["--" + name.replace("_", "-"), str(value)]
    with open(log_path, "w") as log:  # the child keeps its own handle
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + ready_timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    if proc.poll() is None:
        why = f"was not ready in {ready_timeout_s} s"
        proc.kill()
        proc.wait()
    else:
        why = f"exited with status {proc.returncode}"
    tail = " | ".join(Path(log_path).read_text(errors="replace").strip().splitlines()[-5:])
    raise InferenceError(f"inference_demo serve on port {port} {why}; its log {log_path} ends: {tail}")
