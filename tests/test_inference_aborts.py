"""Aborts that abort (issue 42 item 3): a client that goes away frees its slot at once, streamed or not, queued,
in prefill or decoding, and is counted as vLLM counts it (``vllm:request_success_total{finished_reason="abort"}``).
Each kind of request (completion and chat, streamed and not) is dropped at several points; after each drop the
abort is counted, nothing runs and no token is generated any more."""
import http.client
import json
import os
import socket
import time
from pathlib import Path

import pytest

from neuron_stack.inference.server import free_port, start_server_process
from neuron_stack.inference.tiny import save_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
CHOICES = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory, compile_cache):
    root = tmp_path_factory.mktemp("aborts")
    save_tiny_llama(root / "tiny", with_tokenizer=True)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    env.pop("NEURON_RT_INSPECT_ENABLE", None)
    proc = start_server_process(port, root / "server.log", env=env, model_path=root / "tiny",
                                compiled_model_path=root / "compiled", batch_size=2, max_context_length=32,
                                seq_len=256, served_model_name="tiny")
    yield port
    proc.terminate()
    proc.wait(timeout=30)


def metrics(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:request_success_total":
                out[f"success_{s.labels['finished_reason']}"] = s.value
            elif s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total"):
                out[s.name.split(":")[1]] = s.value
    return out


def drop(port: int, chat: bool, stream: bool, point: int, tokens: float) -> None:
    """Send one long request and go away once the engine has it (the stream's headers; a plain request's first
    tokens, past ``tokens`` generated before): ``point`` 0 at once, else after ``point`` streamed events
    (streamed) or ``point`` × 20 ms (not streamed)."""
    # two choices of 200 tokens: long enough to be caught in the engine on a loaded machine; a fast one finished
    # them within the 0.3 s the latest plain drop used to wait: it now comes 60 ms in
    body = {"max_tokens": 200, "ignore_eos": True, "seed": 0, "stream": stream, "n": CHOICES}
    if chat:
        path, body = "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "hi"}]}
    else:
        path, body = "/v1/completions", {**body, "prompt": [5, 6, 7]}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    if stream:
        resp = conn.getresponse()   # the headers come once the engine has the request
    else:   # the engine's first step (prefill) has it: nothing else runs on this server
        deadline = time.monotonic() + 60
        while metrics(port)["generation_tokens_total"] <= tokens:
            assert time.monotonic() < deadline, "the request never reached the engine"
            time.sleep(0.01)
    if point and stream:
        seen = 0
        while seen < point:
            line = resp.fp.readline()
            assert line, "the stream ended before the drop"
            seen += line.startswith(b"data: ")
    elif point:
        time.sleep(0.02 * point)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_dropped_request_is_aborted_at_once(server, chat, stream):
    for point in (0, 1, 3):
        before = metrics(server)
        drop(server, chat, stream, point, before["generation_tokens_total"])
        deadline = time.monotonic() + 60
        while (now := metrics(server))["success_abort"] < before["success_abort"] + CHOICES:
            assert time.monotonic() < deadline, f"not aborted: point {point}, {now}"
            time.sleep(0.05)
        assert now["success_abort"] == before["success_abort"] + CHOICES, (point, now)
        assert now["success_length"] == before["success_length"], (point, now)   # it never ran to the end
        # the step in flight when the abort came may still deliver its token (one per choice), no step after it
        time.sleep(0.5)   # several decode steps of the tiny model
        settled = metrics(server)
        assert settled["generation_tokens_total"] - now["generation_tokens_total"] <= CHOICES, (point, now, settled)
        time.sleep(0.5)
        after = metrics(server)
        assert after["num_requests_running"] == 0 and after["num_requests_waiting"] == 0, (point, after)
        assert after["generation_tokens_total"] == settled["generation_tokens_total"], (point, settled, after)
