"""The two generating endpoints, ``/v1/completions`` and ``/v1/chat/completions``, as vLLM serves them: a
request's choices (prompts × ``n``) submitted to the engine, their tokens awaited, and the answer as one JSON
body or as server-sent events. A client that goes away aborts every choice at once, streamed or not.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi.responses import JSONResponse, Response, StreamingResponse

from neuron_stack.llm.sampling import SamplingParams

from .config import InferenceError
from .openai_requests import MAX_PROMPTS, Requests, error

REQUEST_TIMEOUT_S = 300.0


class _Stream(StreamingResponse):
    """Server-sent events that abort their requests however the response ends (a client gone before the
    first byte makes Starlette skip the stream, whose own ``finally`` would have aborted them)."""

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


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


class Completions:
    """The completion handlers of one served model: ``engine`` generates, ``requests`` parses, ``metrics``
    (vLLM's, optional) counts each parent request when its choices finish.
    Example: ``await Completions(engine, tokenizer, requests, "tiny").handle(request, chat=False)``."""

    def __init__(self, engine, tokenizer, requests: Requests, model_name: str, metrics=None):
        self.engine, self.tokenizer, self.requests = engine, tokenizer, requests
        self.model_name, self.metrics = model_name, metrics

    def submit(self, body: dict, chat: bool, loop, queue) -> tuple[list[_Choice], list[list[int]]]:
        ids = self.requests.prompts(body, chat)
        p0 = self.requests.params(body, chat, max(len(x) for x in ids))
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
                    req = self.engine.add_request(prompt, p.max_tokens, eos_token_id=self.tokenizer.eos_token_id,
                                             on_token=on_token_of(len(choices)), request_id=f"{rid}-{i}-{j}",
                                             params=p)
                    choices.append(_Choice(len(choices), req, self.tokenizer))
        except InferenceError:
            for c in choices:
                self.engine.abort(c.req.request_id)
            raise
        return choices, ids

    def abort_all(self, choices):
        for c in choices:
            self.engine.abort(c.req.request_id)

    def finished_parent(self, choices, n):
        if self.metrics is not None:
            for k in range(0, len(choices), n):
                self.metrics.on_parent_finished(n, max(len(c.req.output) for c in choices[k : k + n]))

    def token_str(self, t: int) -> str:
        # one token's bytes; a byte that is not UTF-8 on its own reads as \\xNN (distinct keys in top_logprobs)
        return self.tokenizer.decode_token(t).decode("utf-8", "backslashreplace")

    def logprobs_json(self, chat: bool, reqs_lp, tokens, start=0, offset0=0):
        if chat:
            def entry(t, lp):
                s = self.token_str(t)
                return {"token": s, "logprob": lp, "bytes": list(s.encode())}

            return {"content": [{**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
                                for t, (lp, top) in zip(tokens, reqs_lp)]}
        offsets, pos = [], offset0
        for t in tokens:
            offsets.append(pos)
            pos += len(self.token_str(t))
        return {
            "text_offset": offsets,
            "token_logprobs": [lp for lp, _ in reqs_lp],
            "tokens": [self.token_str(t) for t in tokens],
            "top_logprobs": [{self.token_str(i): v for i, v in [(t, lp), *top]}
                             for t, (lp, top) in zip(tokens, reqs_lp)],
        }

    def usage(self, choices, ids) -> dict:
        done = sum(len(c.req.output) for c in choices)
        prompt = sum(len(x) for x in ids)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}

    async def watch(self, request, choices, queue):
        """On the client's ``http.disconnect`` (after the body), abort every choice at once; wake :func:`wait`."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.abort_all(choices)
        queue.put_nowait((None, True))

    async def wait(self, request, choices, queue):
        """Yield (choice index, finished) per token until every choice finished; abort all when the client
        disconnects (ConnectionAbortedError), at the timeout, or when the caller stops (a failed send)."""
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        left = len(choices)
        watcher = asyncio.create_task(self.watch(request, choices, queue))
        try:
            while left:
                item = await asyncio.wait_for(queue.get(), max(deadline - time.monotonic(), 0.0))
                if item[0] is None:
                    raise ConnectionAbortedError
                left -= bool(item[1])
                yield item
        finally:
            watcher.cancel()
            self.abort_all(choices)  # a no-op for finished requests; frees the slots of the rest

    async def handle(self, request, chat: bool):
        try:
            body = await self.requests.parse(request)
            loop, queue = asyncio.get_running_loop(), asyncio.Queue()
            choices, ids = self.submit(body, chat, loop, queue)
        except LookupError as exc:
            return error(404, str(exc), "model")
        except InferenceError as exc:
            return error(400, str(exc))
        n = len(choices) // len(ids)
        base = {"id": choices[0].req.request_id.rsplit("-", 2)[0], "created": int(time.time()),
                "model": self.model_name}
        echo = bool(body.get("echo")) and not chat
        if body.get("stream"):
            gen = self.stream(request, choices, ids, queue, base, chat, body, echo, n)
            resp = _Stream(gen, media_type="text/event-stream")
            resp.on_close = lambda: self.abort_all(choices)
            return resp
        try:
            async for _ in self.wait(request, choices, queue):
                pass
        except TimeoutError:
            return error(504, f"the request did not finish within {REQUEST_TIMEOUT_S:.0f} s")
        except ConnectionAbortedError:
            return Response(status_code=499)  # nobody reads it: the client is gone
        self.finished_parent(choices, n)
        out = []
        for c in choices:
            r = c.req
            text = c.text()
            lp = None
            if r.params.logprobs is not None:
                lp = self.logprobs_json(chat, r.logprobs, r.output)
            choice = {"index": c.index, "finish_reason": r.finish_reason, "stop_reason": r.stop_reason,
                      "token_ids": r.output, "logprobs": lp}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                prefix = self.tokenizer.decode(r.prompt) if echo else ""
                choice["text"] = prefix + text
            out.append(choice)
        kind = "chat.completion" if chat else "text_completion"
        return JSONResponse({**base, "object": kind, "choices": out, "usage": self.usage(choices, ids)})

    async def stream(self, request, choices, ids, queue, base, chat, body, echo, n):
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
                yield event(c.index, self.tokenizer.decode(c.req.prompt))
        try:
            async for index, finished in self.wait(request, choices, queue):
                c = choices[index]
                r = c.req
                piece = c.delta()
                if not (piece or finished or not chat):
                    continue  # a chat chunk carries text; its tokens go with the next one
                new = r.output[shown[index] :]
                shown[index] = len(r.output)
                lp = None
                if r.params.logprobs is not None and new:
                    lp = self.logprobs_json(chat, r.logprobs[-len(new) :], new, offset0=c.sent - len(piece))
                reason = r.finish_reason if finished else None
                yield event(index, piece, reason, new, lp, stop_reason=r.stop_reason)
        except TimeoutError:
            yield f"data: {json.dumps({'error': {'message': 'request timed out', 'code': 504}})}\n\n"
        except ConnectionAbortedError:
            return
        self.finished_parent(choices, n)
        if include_usage:
            yield f"data: {json.dumps({**base, 'object': kind, 'choices': [], 'usage': self.usage(choices, ids)})}\n\n"
        yield "data: [DONE]\n\n"
