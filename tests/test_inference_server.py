"""The OpenAI-compatible server as a user runs it: `inference_demo serve` on 127.0.0.1, completions and chat
(streamed and not) equal to eager HF greedy tokens, concurrent requests through continuous batching,
vLLM's metric names on /metrics, bounded bad requests as 4xx."""

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from neuron_stack.inference.server import free_port, start_server_process
from neuron_stack.inference.tiny import save_tiny_llama, tiny_llama
from neuron_stack.inference.tokenizer import ByteTokenizer

pytestmark = pytest.mark.real_python   # the test needs its processes' own pids (tests/warm_python.py)

ROOT = Path(__file__).resolve().parents[1]
server_proc: list = []  # the running server (the last test stops it to read its profile)


@pytest.fixture(scope="module")
def server(tmp_path_factory, compile_cache):
    root = tmp_path_factory.mktemp("serve")
    save_tiny_llama(root / "tiny", with_tokenizer=True)  # its own tokenizer files and chat template
    port = free_port()
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        HF_HUB_OFFLINE="1",
        NEURON_RT_INSPECT_ENABLE="1", NEURON_RT_INSPECT_DEVICE_PROFILE="session",
        NEURON_RT_INSPECT_OUTPUT_DIR=str(root / "output"),
        VLLM_LOG_STATS_INTERVAL="0.5",
    )
    proc = start_server_process(
        port,
        root / "server.log",
        env=env,
        model_path=root / "tiny",
        compiled_model_path=root / "compiled",
        batch_size=2,
        max_context_length=32,
        seq_len=64,
        served_model_name="tiny",
    )
    server_proc[:] = [proc]
    (root / "server.pid").write_text(str(proc.pid))
    yield f"http://127.0.0.1:{port}", root
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_server_that_cannot_start_is_reported_with_its_log(tmp_path):
    from neuron_stack.inference.config import InferenceError

    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    ends = r"exited with status 2; its log .* ends: inference_demo: error: .*missing"
    with pytest.raises(InferenceError, match=ends):
        start_server_process(free_port(), tmp_path / "server.log", env=env, model_path=tmp_path / "missing")


def post(url, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def chat_ids(messages) -> list[int]:
    """The tiny model's chat template (tiny.CHAT_TEMPLATE) rendered by hand; its tokens are UTF-8 bytes + 3."""
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"
    return ByteTokenizer(259).encode(text)


def eager(ids, n):
    with torch.no_grad():
        out = tiny_llama().generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None
        )
    return out[0, len(ids) :].tolist()


def test_completion_equals_eager(server):
    base, _ = server
    status, text = post(
        base + "/v1/completions",
        {"model": "tiny", "prompt": "Hello Neuron", "max_tokens": 12, "ignore_eos": True, "temperature": 0},
    )
    assert status == 200, text
    body = json.loads(text)
    ids = ByteTokenizer(259).encode("Hello Neuron")
    choice = body["choices"][0]
    assert choice["token_ids"] == eager(ids, 12) and choice["finish_reason"] == "length"
    assert body["object"] == "text_completion" and body["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": 12,
        "total_tokens": len(ids) + 12,
    }


def test_chat_streams_tokens_equal_to_eager(server):
    base, _ = server
    req = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps(
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 10,
                "stream": True,
                "ignore_eos": True,
                "temperature": 0,
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    events = []
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    # vLLM: the role first, alone; then the text
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    toks = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert toks == eager(chat_ids([{"role": "user", "content": "Hi"}]), 10)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and len(chunks) <= 11


def test_concurrent_requests_batch_continuously(server):
    base, _ = server
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 259, (n,), generator=g).tolist() for n in (4, 9, 15, 6, 20)]
    with ThreadPoolExecutor(5) as pool:
        results = list(
            pool.map(
                lambda p: post(
                    base + "/v1/completions", {"prompt": p, "max_tokens": 8, "ignore_eos": True, "temperature": 0}
                ),
                prompts,
            )
        )
    for p, (status, text) in zip(prompts, results):
        assert status == 200, text
        assert json.loads(text)["choices"][0]["token_ids"] == eager(p, 8)


def test_metrics_carry_vllm_names(server):
    base, _ = server
    post(base + "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3})
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_per_output_token_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:request_queue_time_seconds",
    ):
        assert name in text, name
    line = next(x for x in text.splitlines() if x.startswith("vllm:e2e_request_latency_seconds_count"))
    assert 'model_name="tiny"' in line and float(line.split()[-1]) >= 1


def test_bad_requests_are_4xx(server):
    base, _ = server
    cases = [
        ({"prompt": ""}, 400, "prompt"),
        ({"prompt": "x", "max_tokens": 10_000}, 400, "max_tokens"),
        ({"prompt": "x" * 40}, 400, "max_context_length"),
        ({"prompt": [1, 2, 9999]}, 400, "vocabulary"),
        ({"prompt": "x", "model": "other"}, 404, "The model `other` does not exist."),
        ({"prompt": "x", "n": 2, "temperature": 0}, 400, "n must be 1 when using greedy sampling, got 2."),
        ({"prompt": "x", "temperature": -1}, 400, "temperature must be non-negative, got -1."),
        ({"prompt": "x", "top_p": 1.5}, 400, "top_p must be in (0, 1], got 1.5."),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "only be defined when `stream=True`"),
    ]
    for body, code, words in cases:
        status, text = post(base + "/v1/completions", body)
        assert status == code and words in json.loads(text)["error"]["message"], (body, text)
    status, text = post(base + "/v1/completions", None, raw=b"{not json")
    assert status == 400 and "not JSON" in text
    # a declared body over the 1 MiB bound is refused before it is read
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=30)
    conn.putrequest("POST", "/v1/completions")
    conn.putheader("Content-Length", str(2 << 20))
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()
    assert urllib.request.urlopen(base + "/health", timeout=5).status == 200


def text_of(completion, n: int) -> str:
    return ByteTokenizer(259).decode(completion.choices[0].model_extra["token_ids"][:n])


def test_openai_client_sampling_streams_and_usage(server):
    """The official client, as a vLLM user calls it: seeded sampling reproducible and not greedy, vLLM's 400,
    include_usage's usage chunk, several prompts × n, logprobs, stop strings, content parts."""
    import openai

    base, _ = server
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)

    def complete(**kw):
        kw = {"model": "tiny", "prompt": "Hello", "max_tokens": 12, "extra_body": {"ignore_eos": True}, **kw}
        return client.completions.create(**kw)

    a, b = complete(temperature=0.8, seed=7), complete(temperature=0.8, seed=7)
    greedy = complete(temperature=0)
    ids = lambda r, i=0: r.choices[i].model_extra["token_ids"]  # noqa: E731
    assert greedy.choices[0].model_extra["token_ids"] == eager(ByteTokenizer(259).encode("Hello"), 12)
    assert a.choices[0].text == b.choices[0].text and ids(a) == ids(b) != ids(greedy)
    with pytest.raises(openai.BadRequestError, match="temperature must be non-negative, got -1.0"):
        complete(temperature=-1)
    # several prompts, n choices each (index = prompt × n + choice), usage over all of them
    many = complete(prompt=["Hi", [5, 6, 7]], n=2, temperature=1.0, seed=3, max_tokens=4)
    assert [c.index for c in many.choices] == [0, 1, 2, 3] and many.usage.prompt_tokens == 2 + 3
    assert many.usage.completion_tokens == 16 and ids(many, 0) != ids(many, 1)
    assert complete(temperature=0, echo=True, max_tokens=3).choices[0].text == "Hello" + text_of(greedy, 3)
    # logprobs of the chosen token and the top ones
    lp = complete(temperature=0, logprobs=2, max_tokens=5).choices[0].logprobs
    assert len(lp.token_logprobs) == 5 and all(len(t) >= 2 for t in lp.top_logprobs)
    assert all(max(t.values()) == chosen for t, chosen in zip(lp.top_logprobs, lp.token_logprobs))
    # a stop string ends the text before it
    text = greedy.choices[0].text
    needle = text[3:5]
    stopped = complete(temperature=0, stop=[needle]).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == text[: text.index(needle)]
    # streaming with include_usage: the last chunk before [DONE] has no choices and the usage
    chunks = list(complete(temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert "".join(c.choices[0].text for c in chunks[:-1]) == text
    # chat: role first, content parts, vLLM's default max_tokens (the rest of the context)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]
    stream = client.chat.completions.create(
        model="tiny", messages=messages, stream=True, temperature=0, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    prompt = chat_ids([{"role": "user", "content": "Hi\nthere"}])
    assert chunks[-1].usage.prompt_tokens == len(prompt)
    assert chunks[-1].usage.completion_tokens == 64 - len(prompt)
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_tokenize_version_ping(server):
    base, _ = server
    status, text = post(base + "/tokenize", {"prompt": "Hello é"})
    tokens = json.loads(text)
    assert status == 200 and tokens["tokens"] == ByteTokenizer(259).encode("Hello é") and tokens["count"] == 8
    status, text = post(base + "/detokenize", {"tokens": tokens["tokens"]})
    assert status == 200 and json.loads(text) == {"prompt": "Hello é"}
    status, text = post(base + "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]})
    assert json.loads(text)["tokens"] == chat_ids([{"role": "user", "content": "Hi"}])  # the model's template
    assert json.loads(urllib.request.urlopen(base + "/version", timeout=10).read())["version"]
    assert urllib.request.urlopen(base + "/ping", timeout=10).status == 200
    assert post(base + "/ping", {})[0] == 200


def test_bodies_over_the_limit_get_413_plain_or_chunked(server):
    base, _ = server
    host = base.removeprefix("http://")
    big = b'{"prompt": "' + b"x" * (2 << 20) + b'"}'

    def send(chunked: bool) -> int:
        conn = http.client.HTTPConnection(host, timeout=60)
        try:
            if chunked:
                pieces = (big[i : i + 65536] for i in range(0, len(big), 65536))
                conn.request("POST", "/v1/completions", body=pieces, encode_chunked=True,
                             headers={"Content-Type": "application/json"})
            else:
                conn.request("POST", "/v1/completions", body=big, headers={"Content-Type": "application/json"})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the whole body went out
        try:
            r = conn.getresponse()
            return r.status, json.loads(r.read())["error"]["message"]
        finally:
            conn.close()

    for chunked in (False, True):
        status, message = send(chunked)
        assert status == 413 and "over 1048576 bytes" in message, chunked
    assert urllib.request.urlopen(base + "/health", timeout=5).status == 200


def test_metric_list_is_vllms(server):
    """Every vLLM v1 metric, with vLLM's name, type and labels (tests/vllm_metrics.txt, copied from vLLM's
    loggers.py), and no other; finished reasons pre-created; token buckets 1-2-5 up to max_model_len."""
    from prometheus_client.parser import text_string_to_metric_families

    base, _ = server
    post(base + "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3, "n": 2})
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    ours = {  # prometheus_client's *_created series (a counter's creation time) are not metrics of their own
        f.name: f
        for f in text_string_to_metric_families(text)
        if f.name.startswith("vllm:") and not f.name.endswith("_created")
    }
    want = {}
    for line in (ROOT / "tests" / "vllm_metrics.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, kind = line.split()
            want[name] = kind
    assert {n: f.type for n, f in ours.items()} == want
    labels = {s.labels.get("finished_reason") for s in ours["vllm:request_success"].samples}
    assert {"stop", "length", "abort"} <= labels
    samples = ours["vllm:prompt_tokens"].samples
    assert all(s.labels["model_name"] == "tiny" and s.labels["engine"] == "0" for s in samples)
    les = [s.labels["le"] for s in ours["vllm:request_prompt_tokens"].samples if s.name.endswith("_bucket")]
    assert les == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "+Inf"]  # max_model_len 64
    n_count = next(s for s in ours["vllm:request_params_n"].samples if s.name.endswith("_count"))
    assert n_count.value >= 1


def test_access_log_and_stats_line(server):
    base, root = server
    post(base + "/v1/completions", {"prompt": [5, 6], "max_tokens": 2})
    deadline = time.monotonic() + 30
    while "Avg generation throughput" not in (log := (root / "server.log").read_text()):
        assert time.monotonic() < deadline, log[-2000:]
        time.sleep(0.2)
    assert '"POST /v1/completions HTTP/1.1" 200' in log  # uvicorn's access log, as vLLM's
    line = next(x for x in log.splitlines() if "Avg generation throughput" in x)
    assert "Engine 000: Avg prompt throughput:" in line and "GPU KV cache usage:" in line


def test_monitor_and_top_show_serving(server):
    """neuron-monitor's document carries the engine's serving figures; neuron-top renders them."""
    import jsonschema

    from monitor.collect import Collector
    from top.render import counters_panel
    from top.snapshot import build_snapshot

    base, root = server
    post(base + "/v1/completions", {"prompt": [5, 6, 7, 8], "max_tokens": 4})
    pid = int((root / "server.pid").read_text())
    deadline = time.monotonic() + 30
    while True:
        doc = Collector().collect()
        ours = [r for r in doc["neuron_runtime_data"] if r["pid"] == pid]
        serving = ours and ours[0]["report"]["neuron_stack"].get("serving")
        # the snapshot is published at most every 0.25 s: wait for the one after the request finished
        if (serving and serving["num_requests_running"] == 0) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert (
        serving and serving["model"] == "tiny" and serving["kv_cache_bytes"] == 2 * 2 * (2 * 2 * 64 * 16) * 4
    )
    assert serving["num_requests_waiting"] == 0 and 0 <= serving["kv_cache_usage_perc"] <= 1
    schema = json.loads((ROOT / "monitor" / "schema.json").read_text())
    jsonschema.validate(doc, schema)
    # the KV cache is device memory on the core (counted as runtime tensors in the real document's categories)
    mem = ours[0]["report"]["memory_used"]["neuron_runtime_used_bytes"]["usage_breakdown"][
        "neuroncore_memory_usage"
    ]
    assert sum(m["tensors"] for m in mem.values()) >= serving["kv_cache_bytes"]
    snap = build_snapshot({**doc, "neuron_runtime_data": ours})
    text = counters_panel(snap.app(0), 200).plain
    assert "serving tiny:" in text and "KV cache" in text and "running 0  waiting 0" in text


def test_profile_and_explorer_show_serving(server):
    """Every request and step lands in the trace store; the query layer and the Explorer page read them."""
    import traces
    from explorer import data
    from explorer.figures import fmt_ns
    from explorer.pages import serving as page

    base, root = server
    # its own load (under xdist this module's tests may run in different workers, each with a server):
    # five concurrent requests over two slots, so some wait
    def one(n):
        return post(base + "/v1/completions", {"prompt": [7] * n, "max_tokens": 5, "ignore_eos": True})

    with ThreadPoolExecutor(5) as pool:
        done = list(pool.map(one, (3, 5, 7, 9, 11)))
    assert all(status == 200 for status, _ in done)
    proc = server_proc[0]
    proc.terminate()
    proc.wait(timeout=60)
    path = traces.finalize(root / "output")
    with traces.open(path) as p:
        s = p.serving_summary()
        reqs = p.serving_requests().to_pylist()
        buckets = p.serving_buckets().to_pylist()
        steps = p.serving_steps().to_pylist()
        kv_rows = p.sql("SELECT max(bytes) AS b FROM memory WHERE category = ?", ["kv_cache"]).to_pylist()
    # every request this server finished is a row (the five above and any earlier test's)
    assert s["requests"] == len(reqs) >= 5 and s["output_tokens"] == sum(r["output_tokens"] for r in reqs)
    assert sum(1 for r in reqs if r["prompt_tokens"] in (3, 5, 7, 9, 11) and r["output_tokens"] == 5) >= 5
    assert s["ttft_p50_ns"] > 0 and s["tpot_p50_ns"] > 0 and s["output_tokens_per_s"] > 0
    assert s["prefill_steps"] == s["requests"] and {b["phase"] for b in buckets} == {"prefill", "decode"}
    assert {b["bucket"] for b in buckets if b["phase"] == "prefill"} <= {32}
    assert kv_rows[0]["b"] == 2 * 2 * (2 * 2 * 64 * 16) * 4
    assert all(r["arrival_ns"] <= r["scheduled_ns"] <= r["first_token_ns"] <= r["finish_ns"] for r in reqs)
    assert max(st["kv_slots_used"] for st in steps) <= 2 and any(st["waiting"] > 0 for st in steps)
    # request time beside device time (issue 38): every step's calls add their launch and host-link copies
    assert all(st["request_ns"] > st["device_ns"] > 0 for st in steps)
    with traces.open(path) as p:
        rt = p.serving_request_time()
    assert [r["phase"] for r in rt] == ["prefill", "decode"] and all(r["added_ns"] > 0 for r in rt)
    # one number, one function: the CLI's summary and the page show the query layer's figures
    cli = subprocess.run([sys.executable, "-m", "explorer.cli", "summary", str(path), "--json"],
                         env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["serving_request_time"] == json.loads(json.dumps(rt, default=str))
    data.set_registry(data.Registry([path]))
    html = str(page.layout(profile=None))
    for r in rt:
        assert f"serving-{r['phase']}-time" in html and f"request {fmt_ns(r['request_ns'])}" in html
    for needle in (
        "serving-waterfall",
        "serving-ttft-hist",
        "serving-tpot-hist",
        "serving-buckets",
        f"Serving · {s['requests']}",
    ):
        assert needle in html, needle
