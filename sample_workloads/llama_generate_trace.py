"""A tiny Llama (transformers, random weights, no download) generating text through neuron_stack.trace
with a static KV cache: two graphs, as Neuron serving stacks compile them.

A NeuronCore runs static shapes, so LLM serving on Neuron compiles two sub-models: context encoding
(the prompt, padded to a bucket length) and token generation (one token, attending over a fixed-size
KV cache). Here `transformers.StaticCache` is that fixed-size cache: both graphs take it as an input,
write the new keys and values into it in place (the traced models copy those writes back into the
cache's tensors, as eager PyTorch would), and the greedy tokens must equal eager `generate()` with
`cache_implementation="static"`.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from common import check, explain, finish, parser  # noqa: E402

import neuron_stack  # noqa: E402


def tiny_llama(small: bool) -> transformers.LlamaForCausalLM:
    """A random-weight Llama: GQA (4 query heads, 2 KV heads), RoPE, RMSNorm, SiLU-gated MLP."""
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64 if small else 256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128 if small else 512,
        max_position_embeddings=256,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--new-tokens", type=int, default=8, help="tokens to generate")
    args = p.parse_args()
    explain(__doc__)
    torch.manual_seed(0)
    model = tiny_llama(args.small)
    cfg = model.config
    prompt = torch.randint(1, cfg.vocab_size, (1, 6))
    max_len = prompt.shape[1] + args.new_tokens  # the cache's fixed length (the TKG bucket)

    cache = transformers.StaticCache(config=cfg, max_cache_len=max_len)
    # export needs the cache's tensors before the first call (transformers allocates them lazily)
    cache.early_initialization(
        batch_size=1,
        num_heads=cfg.num_key_value_heads,
        head_dim=cfg.hidden_size // cfg.num_attention_heads,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    flags = f"--auto-cast {args.auto_cast}"
    n = prompt.shape[1]
    prefill = neuron_stack.trace(
        model,
        {"input_ids": prompt, "past_key_values": cache, "cache_position": torch.arange(n)},
        compiler_args=flags,
        target=args.target,
    )
    decode = neuron_stack.trace(
        model,
        {"input_ids": prompt[:, :1], "past_key_values": cache, "cache_position": torch.tensor([n])},
        compiler_args=flags,
        target=args.target,
    )

    out = prefill(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(n))
    first_logits = out.logits
    tokens = [int(out.logits[0, -1].argmax())]
    for pos in range(n, max_len - 1):
        step = torch.tensor([[tokens[-1]]])
        out = decode(input_ids=step, past_key_values=cache, cache_position=torch.tensor([pos]))
        tokens.append(int(out.logits[0, -1].argmax()))

    with torch.no_grad():
        want = model.generate(
            prompt,
            max_new_tokens=args.new_tokens,
            do_sample=False,
            cache_implementation="static",
            pad_token_id=0,
        )[0, n:].tolist()
        ref_logits = model(prompt).logits
    ok = check("llama prefill logits", first_logits, ref_logits, args.auto_cast)
    same = tokens == want
    print(f"generated {tokens}\neager     {want}\ngreedy tokens equal eager generate(): {same}")
    for name, nm in (("prefill", prefill), ("decode", decode)):
        print(
            f"{name}: {nm.neff.program.stats['timing_model']}-level timing, "
            f"{nm.model.static_device_ns / 1e3:.1f} us simulated device time per call"
        )
    finish(ok and (same or args.auto_cast != "none"))


if __name__ == "__main__":
    main()
