"""A tiny Llama (transformers, random weights, no download) generating through
torch.compile(backend="neuron") with a static KV cache: one compile per shape, not one per token.

`model.generate()` calls the model once for the prompt and once per new token. With the default
dynamic cache the cache grows every step, so every token is a new shape and a new compile (dynamo
stops at its recompile limit with an error that says to bucket). With
`cache_implementation="static"` the cache has one fixed length: the prompt compiles once (context
encoding) and every decode step reuses one graph (token generation). The greedy tokens must equal
eager `generate()`, and the compile log below shows the two graphs and why the second was compiled.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from common import explain, finish, parser  # noqa: E402
from llama_generate_trace import tiny_llama  # noqa: E402

import neuron_stack.dynamo  # noqa: E402  (compile_events: the graphs the backend compiled)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--new-tokens", type=int, default=12, help="tokens to generate")
    args = p.parse_args()
    explain(__doc__)
    torch.manual_seed(0)
    model = tiny_llama(args.small)
    prompt = torch.randint(1, model.config.vocab_size, (1, 6))
    gen = dict(max_new_tokens=args.new_tokens, do_sample=False, cache_implementation="static", pad_token_id=0)
    with torch.no_grad():
        want = model.generate(prompt, **gen)
    before = len(neuron_stack.dynamo.compile_events())
    model.forward = torch.compile(
        model.forward,
        backend="neuron",
        options={"compiler_args": f"--auto-cast {args.auto_cast} --target {args.target}"},
    )
    with torch.no_grad():
        got = model.generate(prompt, **gen)
    events = neuron_stack.dynamo.compile_events()[before:]
    same = torch.equal(got, want)
    print(f"generated {got[0, prompt.shape[1] :].tolist()}\ngreedy tokens equal eager generate(): {same}")
    print(f"{len(events)} graphs compiled for {args.new_tokens} tokens")
    for e in events:
        timing = e["model"].neff.program.stats["timing_model"]
        what = f"recompile: {e['reason'][:100]}" if e["recompile"] else "first compile"
        print(f"  {e['name']}: {what} ({timing}-level timing)")
    finish(same and len(events) <= 2)


if __name__ == "__main__":
    main()
