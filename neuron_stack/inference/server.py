"""An OpenAI-compatible server over the continuous-batching engine, with vLLM's endpoints and metric
names (reference §2.9): ``POST /v1/completions``, ``POST /v1/chat/completions`` (``"stream": true`` sends
server-sent events ending ``data: [DONE]``), ``GET /v1/models``, ``GET /health``, ``GET /metrics``.

FastAPI + uvicorn, bound to 127.0.0.1 unless ``--host`` says otherwise. Bounds: request bodies over
``MAX_BODY_BYTES`` get 413; ``max_tokens`` must fit the compiled ``seq_len``, prompts
``max_context_length``; a request waits at most ``REQUEST_TIMEOUT_S``. Bad requests get a 4xx with
OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``.

Prompts are text (the offline byte tokenizer, :mod:`.tokenizer`) or lists of token ids; every choice
also carries ``token_ids`` (ours) so a random-weight model's output can be checked by id.

    inference_demo serve --model-path ./tiny --batch-size 4 --max-context-length 64 --seq-len 128
    curl -s 127.0.0.1:8000/v1/completions -d '{"prompt": "Hello", "max_tokens": 8}'
"""

import asyncio
import codecs
import json
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


def _error(status: int, message: str, param: str | None = None):
    from fastapi.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


class _BodyLimit:
    """ASGI middleware: refuse a request body over ``limit`` bytes (declared or streamed) with 413."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await _error(413, f"request body over {self.limit} bytes")(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > self.limit:
                raise _TooLarge()
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await _error(413, f"request body over {self.limit} bytes")(scope, receive, send)


class _TooLarge(Exception):
    pass


def _int(body: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = body.get(key, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InferenceError(f"{key} must be an integer from {lo} to {hi}, not {v!r}")
    return v


def create_app(engine, tokenizer, model_name: str, metrics=None, on_shutdown=None):
    """The FastAPI app serving ``engine`` (an :class:`~.engine.Engine` whose thread the app starts);
    ``on_shutdown()`` runs after the engine thread stopped."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    nc = engine.nc
    stop = threading.Event()

    @asynccontextmanager
    async def lifespan(app):
        t = threading.Thread(target=engine.serve_forever, args=(stop,), name="neuron-engine", daemon=True)
        t.start()
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
            raise LookupError(f"The model `{name}` does not exist (this server serves `{model_name}`)")
        if body.get("n", 1) != 1 or body.get("best_of", 1) != 1:
            raise InferenceError("n and best_of must be 1")
        if body.get("echo") or body.get("logprobs") or body.get("suffix"):
            raise InferenceError("echo, logprobs and suffix are not supported")
        return body

    def prompt_ids(body: dict, chat: bool) -> list[int]:
        if chat:
            msgs = body.get("messages")
            if (
                not isinstance(msgs, list)
                or not msgs
                or len(msgs) > MAX_MESSAGES
                or not all(isinstance(m, dict) and isinstance(m.get("content", ""), str) for m in msgs)
            ):
                raise InferenceError(
                    f"messages must be a list of 1 to {MAX_MESSAGES} objects with string content"
                )
            return tokenizer.chat(msgs)
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]  # one prompt in a batch of one
        if isinstance(p, str) and p:
            return tokenizer.encode(p)
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            return p
        raise InferenceError("prompt must be a non-empty string or a list of token ids")

    def submit(body: dict, chat: bool, loop, queue):
        ids = prompt_ids(body, chat)
        limit = nc.seq_len
        max_tokens = _int(
            body,
            "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens",
            16,
            1,
            limit,
        )

        def on_token(req, tok, finished):
            loop.call_soon_threadsafe(queue.put_nowait, (tok, req.finish_reason if finished else None))

        eos = None if body.get("ignore_eos") else tokenizer.eos_token_id
        return engine.add_request(
            ids,
            max_tokens,
            eos_token_id=eos,
            on_token=on_token,
            request_id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
        )

    async def tokens(req, queue):
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while True:
            tok, reason = await asyncio.wait_for(queue.get(), max(deadline - time.monotonic(), 0.001))
            yield tok, reason
            if reason:
                return

    async def handle(request: Request, chat: bool):
        try:
            body = await parse(request)
            loop, queue = asyncio.get_running_loop(), asyncio.Queue()
            req = submit(body, chat, loop, queue)
        except LookupError as exc:
            return _error(404, str(exc), "model")
        except InferenceError as exc:
            return _error(400, str(exc))
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        base = {"id": req.request_id, "created": created, "model": model_name}
        if body.get("stream"):
            return StreamingResponse(stream(req, queue, base, chat), media_type="text/event-stream")
        ids, reason = [], None
        try:
            async for tok, reason in tokens(req, queue):
                ids.append(tok)
        except TimeoutError:
            engine.abort(req.request_id)
            return _error(504, f"the request did not finish within {REQUEST_TIMEOUT_S:.0f} s")
        text = tokenizer.decode(ids)
        choice = {"index": 0, "finish_reason": reason, "token_ids": ids}
        choice.update(
            {"message": {"role": "assistant", "content": text}} if chat else {"text": text, "logprobs": None}
        )
        usage = {
            "prompt_tokens": len(req.prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(req.prompt) + len(ids),
        }
        return JSONResponse({**base, "object": kind, "choices": [choice], "usage": usage})

    async def stream(req, queue, base, chat):
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(piece: str, tok, reason, first=False):
            if chat:
                delta = {"role": "assistant", "content": piece} if first else {"content": piece}
                choice = {"index": 0, "delta": delta, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}
            choice["token_ids"] = [tok] if tok is not None else []
            return f"data: {json.dumps({**base, 'object': kind, 'choices': [choice]})}\n\n"

        first = True
        try:
            async for tok, reason in tokens(req, queue):
                piece = decoder.decode(tokenizer.decode_token(tok), final=bool(reason))
                yield event(piece, tok, reason, first)
                first = False
        except TimeoutError:
            yield f"data: {json.dumps({'error': {'message': 'request timed out', 'code': 504}})}\n\n"
        finally:
            engine.abort(req.request_id)  # a no-op when it finished; frees the slot if the client left
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {"id": model_name, "object": "model", "owned_by": "neuron_stack", "max_model_len": nc.seq_len}
            ],
        }

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/metrics")
    async def prom():
        if metrics is None:
            return _error(404, "metrics are off")
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return _BodyLimit(app, MAX_BODY_BYTES)


def build(model, model_name: str):
    """(asgi app, engine) serving a loaded model: the engine with every observer (metrics, trace, live)."""
    from .engine import Engine
    from .observe import LiveObserver, TraceObserver, VllmMetrics
    from .tokenizer import ByteTokenizer

    target = model.neuron_config.target
    metrics = VllmMetrics(model_name)
    trace = TraceObserver(model_name, target)
    engine = Engine(model, observers=[metrics, trace, LiveObserver(target)], model_name=model_name)
    # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown, so atexit never runs: close the runtime
    # session (trace segments, run status, live snapshot, core lease) while shutting down
    app = create_app(
        engine,
        ByteTokenizer(model.config.hf_config.vocab_size),
        model_name,
        metrics,
        on_shutdown=trace.session.close,
    )
    return app, engine


def serve(model, model_name: str, host: str = "127.0.0.1", port: int = 8000) -> int:
    """Serve ``model`` with uvicorn until interrupted (``inference_demo serve``)."""
    import uvicorn

    app, _ = build(model, model_name)
    print(
        f"serving {model_name} on http://{host}:{port} (OpenAI-compatible: /v1/completions, "
        "/v1/chat/completions, /health, /metrics)",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")
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
