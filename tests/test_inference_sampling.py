"""Sampling as vLLM does it, in the engine and in ``generate``: vLLM's validation messages, seeded draws
reproducible and different from greedy, greedy equal to eager, penalties equal to Hugging Face's, stop ids,
min_tokens and logprobs."""

import pytest
import torch

from neuron_stack.inference import InferenceError, NeuronConfig, NeuronLlamaForCausalLM
from neuron_stack.inference.engine import Engine
from neuron_stack.inference.tiny import save_tiny_llama, tiny_llama
from neuron_stack.inference.tokenizer import ByteTokenizer
from neuron_stack.llm.sampling import SamplingParams, sample


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"temperature": -1}, "temperature must be non-negative, got -1."),
        ({"temperature": 3}, "temperature must be in [0, 2], got 3."),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0."),
        ({"top_k": -2}, "top_k must be 0 (disable), or at least 1, got -2."),
        ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5."),
        ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2], got 3."),
        ({"repetition_penalty": 0}, "repetition_penalty must be greater than zero, got 0."),
        ({"temperature": 0, "n": 2}, "n must be 1 when using greedy sampling, got 2."),
        ({"stop": [""]}, "stop cannot contain an empty string."),
        ({"logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens must be less than or equal to max_tokens=4, got 5."),
    ],
)
def test_sampling_params_refuse_as_vllm(kw, message):
    with pytest.raises(InferenceError) as err:
        SamplingParams(**kw)
    assert str(err.value) == message


def test_filters_keep_only_the_allowed_tokens():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    draws = lambda p: {sample(logits, p, [], [], g) for g in [torch.Generator().manual_seed(s) for s in range(200)]}  # noqa: E731
    assert draws(SamplingParams(temperature=1.0, top_k=2)) == {0, 1}
    assert draws(SamplingParams(temperature=1.0, top_p=0.5)) == {0}  # p(0) = 0.64 reaches 0.5 alone
    assert draws(SamplingParams(temperature=1.0, min_p=0.3)) == {0, 1}  # e^-1 > 0.3 > e^-2
    assert len(draws(SamplingParams(temperature=2.0))) == 5
    # frequency and presence penalties lower the tokens already generated
    p = SamplingParams(temperature=0, frequency_penalty=2.0, presence_penalty=0.5)
    assert sample(logits, p, [], [0, 0], None) == 1  # 4 - 2*2 - 0.5 < 3


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampling")
    nc = NeuronConfig(batch_size=2, seq_len=48, max_context_length=16, is_continuous_batching=True)
    m = NeuronLlamaForCausalLM(save_tiny_llama(root / "tiny"), nc)
    m.compile(root / "compiled")
    m.load(root / "compiled")
    return m


def hf(prompt, n, **kw):
    with torch.no_grad():
        out = tiny_llama().generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None, **kw
        )
    return out[0, len(prompt) :].tolist()


def test_engine_samples_per_request(model):
    eng = Engine(model, decode=ByteTokenizer(259).decode)
    prompt = [40, 41, 42, 43, 44]

    def run(n=12, **kw):
        r = eng.add_request(prompt, max_tokens=n, params=SamplingParams(**kw))
        eng.run_until_done()
        return r

    greedy = run(temperature=0)
    assert greedy.output == hf(prompt, 12) and greedy.finish_reason == "length"
    a, b, c = run(temperature=0.8, seed=11), run(temperature=0.8, seed=11), run(temperature=0.8, seed=12)
    assert a.output == b.output and a.output != greedy.output and c.output != a.output
    # two seeded requests in one batch draw what they draw alone
    r1 = eng.add_request(prompt, max_tokens=12, params=SamplingParams(temperature=0.8, seed=11))
    r2 = eng.add_request([7, 8], max_tokens=12, params=SamplingParams(temperature=1.5, seed=3))
    eng.run_until_done()
    assert r1.output == a.output and r2.output != r1.output
    # HF's repetition penalty is vLLM's (divide positive logits, multiply negative ones, prompt + output)
    assert run(temperature=0, repetition_penalty=1.8).output == hf(prompt, 12, repetition_penalty=1.8)
    # a stop id ends the request at its first appearance, and stays in the output (vLLM)
    tok = greedy.output[3]
    k = greedy.output.index(tok)
    s = run(temperature=0, stop_token_ids=[tok])
    assert s.output == greedy.output[: k + 1] and s.finish_reason == "stop" and s.stop_reason == tok
    assert len(run(temperature=0, stop_token_ids=[tok], min_tokens=k + 2).output) > k + 1
    # logprobs of the raw logits: greedy picks the top one
    lp = run(temperature=0, logprobs=3).logprobs
    assert len(lp) == 12 and all(len(top) == 3 and top[0][1] == chosen for chosen, top in lp)
    assert all(chosen <= 0 for chosen, _ in lp)


def test_stop_strings_end_the_request(model):
    tok = ByteTokenizer(259)
    eng = Engine(model, decode=tok.decode)
    greedy = eng.add_request([40, 41, 42], max_tokens=20, params=SamplingParams(temperature=0))
    eng.run_until_done()
    text = tok.decode(greedy.output)
    needle = text[4:6]
    r = eng.add_request([40, 41, 42], max_tokens=20, params=SamplingParams(temperature=0, stop=[needle]))
    eng.run_until_done()
    assert r.finish_reason == "stop" and r.stop_reason == needle
    assert tok.decode(r.output).endswith(needle) and needle not in tok.decode(r.output[:-1])
    with pytest.raises(InferenceError, match="stop strings need a tokenizer"):
        Engine(model).add_request([5], max_tokens=2, params=SamplingParams(stop=["x"]))
    with pytest.raises(InferenceError, match=r"token_id\(s\) \[999\] in stop_token_ids"):
        eng.add_request([5], max_tokens=2, params=SamplingParams(stop_token_ids=[999]))


def test_optimum_generate_do_sample():
    from neuron_stack.llm import NeuronModelForCausalLM

    nm = NeuronModelForCausalLM.from_pretrained(tiny_llama(), export=True, batch_size=1, sequence_length=32)
    prompt = torch.tensor([[40, 41, 42]])

    def sampled(seed):
        torch.manual_seed(seed)
        return nm.generate(prompt, max_new_tokens=10, do_sample=True, temperature=0.9)

    greedy = nm.generate(prompt, max_new_tokens=10)
    assert greedy[0, 3:].tolist() == hf([40, 41, 42], 10)
    assert torch.equal(sampled(5), sampled(5)) and not torch.equal(sampled(5), greedy)


def test_a_client_that_disconnects_is_aborted_and_counted(model):
    """A non-streamed request whose client goes away is aborted (its slot freed) and counted as vLLM counts
    it: request_success_total{finished_reason="abort"}. In process, with no engine thread, so the request
    is certainly still waiting when the disconnect is seen."""
    import asyncio
    import json

    from neuron_stack.inference.observe import VllmMetrics
    from neuron_stack.inference.server import create_app

    tok = ByteTokenizer(259)
    metrics = VllmMetrics("tiny", 48)
    eng = Engine(model, observers=[metrics], decode=tok.decode)
    app = create_app(eng, tok, "tiny", metrics)  # called without its lifespan: nothing steps the engine
    body = json.dumps({"prompt": "Hi", "max_tokens": 4}).encode()
    inbox = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():  # the body, then the client is gone
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions",
        "headers": [(b"content-type", b"application/json")], "query_string": b"", "http_version": "1.1",
        "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "root_path": "",
    }
    asyncio.run(app(scope, receive, send))
    assert not eng.has_work() and eng.requests_by_id == {}
    line = next(
        x for x in metrics.render().decode().splitlines()
        if x.startswith("vllm:request_success_total") and 'finished_reason="abort"' in x
    )
    assert float(line.split()[-1]) == 1.0
