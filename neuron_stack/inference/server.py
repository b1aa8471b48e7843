"""An OpenAI-compatible server over the continuous-batching engine, with vLLM's endpoints, request
fields, defaults, error messages and metric names (reference §2.9): ``POST /v1/completions``,
``POST /v1/chat/completions`` (``"stream": true`` sends server-sent events ending ``data: [DONE]``;
``stream_options.include_usage`` adds a usage chunk), ``GET /v1/models``, ``GET /v1/models/{id}``,
``POST /tokenize``, ``POST /detokenize``, ``GET /version``, ``GET|POST /ping``, ``GET /health``,
``GET /metrics``.

Sampling is vLLM's (:mod:`neuron_stack.llm.sampling`): ``temperature`` (default 1.0, as vLLM), ``top_p``, ``top_k``,
``min_p``, ``seed``, ``stop``, ``stop_token_ids``, the three penalties, ``n``, ``logprobs``
(``top_logprobs`` in chat), ``min_tokens``, ``ignore_eos``; a completion's ``prompt`` may be several
prompts (choices are ``prompt × n``), a chat message's ``content`` text parts. Default ``max_tokens``: 16
for completions, the rest of the context for chat (vLLM's).

FastAPI + uvicorn, bound to 127.0.0.1 unless ``--host`` says otherwise. Bounds: request bodies over
``MAX_BODY_BYTES`` get 413 whatever their transfer encoding (the body is read, bounded, before the app
sees it); ``max_tokens`` must fit the compiled ``seq_len``, prompts ``max_context_length``; a request
waits at most ``completions.REQUEST_TIMEOUT_S``; a client that disconnects aborts its requests at once, streamed or not
(slots free for the next step; ``vllm:request_success_total{finished_reason="abort"}``). Bad requests get a
4xx with the error body ``{"error": {"message", "type", "param", "code"}}``.

Prompts are text (the model's own tokenizer and chat template when its directory has them, else the
offline byte tokenizer: :mod:`.tokenizer`) or lists of token ids; every choice
also carries ``token_ids`` (ours) so a random-weight model's output can be checked by id.

    inference_demo serve --model-path ./tiny --batch-size 4 --max-context-length 64 --seq-len 128
    curl -s 127.0.0.1:8000/v1/completions -d '{"prompt": "Hello", "max_tokens": 8}'
"""

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from .config import InferenceError
from .openai_requests import Requests, error

MAX_BODY_BYTES = 1 << 20


class _BodyLimit:
    """ASGI middleware: read the request body (declared length or chunked) up to ``limit`` bytes before the
    app runs; over it, answer 413 (and never start the app, so no half-sent response can follow)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = error(413, f"request body over {self.limit} bytes")
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


def create_app(engine, tokenizer, model_name: str, metrics=None, on_shutdown=None, stat_logger=None,
               stats_interval_s: float = 10.0):
    """The FastAPI app serving ``engine`` (an :class:`~.engine.Engine` whose thread the app starts);
    ``on_shutdown()`` runs after the engine thread stopped; ``stat_logger`` (:class:`~.observe.StatLogger`)
    prints vLLM's stats line every ``stats_interval_s``. The routes: the generating ones in
    :mod:`.completions`, request parsing in :mod:`.openai_requests`, the rest here."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    from .completions import Completions

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
    requests = Requests(tokenizer, nc.seq_len, model_name)
    completions = Completions(engine, tokenizer, requests, model_name, metrics)

    @app.post("/v1/completions")
    async def completions_route(request: Request):
        return await completions.handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await completions.handle(request, chat=True)

    _model_routes(app, requests, tokenizer, model_name, nc.seq_len)

    @app.get("/metrics")
    async def prom():
        if metrics is None:
            return error(404, "metrics are off")
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return _BodyLimit(app, MAX_BODY_BYTES)


def _model_routes(app, requests: Requests, tokenizer, model_name: str, seq_len: int) -> None:
    """The model card, tokenizer and liveness routes (``/v1/models``, ``/tokenize``, ``/detokenize``,
    ``/version``, ``/ping``, ``/health``)."""
    from fastapi import Request
    from fastapi.responses import Response

    def card() -> dict:
        return {"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "neuron_stack",
                "root": model_name, "parent": None, "max_model_len": seq_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != model_name:
            return error(404, f"The model `{model_id}` does not exist.", "model")
        return card()

    @app.post("/tokenize")
    async def tokenize(request: Request):
        try:
            body = await requests.parse(request)
            if "messages" in body:
                ids = requests.chat_ids(body["messages"])
            else:
                ids = requests.one_prompt(body.get("prompt"))
        except LookupError as exc:
            return error(404, str(exc), "model")
        except InferenceError as exc:
            return error(400, str(exc))
        return {"count": len(ids), "max_model_len": seq_len, "tokens": ids, "token_strs": None}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        try:
            body = await requests.parse(request)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise InferenceError("tokens must be a list of token ids")
        except LookupError as exc:
            return error(404, str(exc), "model")
        except InferenceError as exc:
            return error(400, str(exc))
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
