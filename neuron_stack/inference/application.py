"""The NxD-Inference-shaped causal LM (ours): ``NeuronCausalLM`` / ``NeuronLlamaForCausalLM``,
``compile(path)`` → one NEFF per sub-model × bucket, ``load(path)``, ``forward``, ``reset``, and the
``HuggingFaceGenerationAdapter`` (reference §2.2). The KV cache is :class:`KVCacheManager`, device
memory the model owns (one row per batch slot).

>>> nc = NeuronConfig(batch_size=1, seq_len=64)                                          # doctest: +SKIP
>>> cfg = InferenceConfig(nc, load_pretrained_config("./tiny-llama"))                     # doctest: +SKIP
>>> m = NeuronLlamaForCausalLM("./tiny-llama", cfg)                                       # doctest: +SKIP
>>> m.compile("./compiled"); m.load("./compiled")                                        # doctest: +SKIP
>>> HuggingFaceGenerationAdapter(m).generate(ids, max_length=32)                         # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from neuron_stack.device import clock

from .config import InferenceConfig, InferenceError, NeuronConfig, get_target_bucket, load_pretrained_config
from .kvcache import KVCacheManager
from .modeling import DecoderGraph, check_supported

CTE, TKG, SPEC = "context_encoding_model", "token_generation_model", "speculation_model"
KINDS = {CTE: "context_encoding", TKG: "token_generation", SPEC: "speculation"}
MAX_NEFF_BYTES = 4 << 30  # a compiled artifact bigger than this is not one of ours


def _flags(nc: NeuronConfig) -> str:
    cast = {
        "float32": "",
        "bfloat16": " --auto-cast matmult --auto-cast-type bf16",
        "float16": " --auto-cast matmult --auto-cast-type fp16",
    }[nc.torch_dtype]
    return f"--target {nc.target}{cast}"


class NeuronCausalLM:
    """A Llama-family causal LM compiled into context-encoding and token-generation sub-models.

    ``model_path``: a directory with ``config.json`` and weights (``save_pretrained``), or a
    ``transformers`` model with weights. ``config``: an :class:`InferenceConfig` (or a bare
    :class:`NeuronConfig`). Real numbers run on one NeuronCore with ``tp_degree=1``, or sharded over
    ``tp_degree`` NeuronCores as NxDI shards them (:mod:`.tp`: one NEFF per part and rank, collectives
    executed and costed, each rank's KV cache on its core). Projection without weights:
    :func:`neuron_stack.llm.project`.
    """

    def __init__(self, model_path, config: InferenceConfig | NeuronConfig | None = None):
        import transformers

        if isinstance(config, NeuronConfig) or config is None:
            nc = config or NeuronConfig()
            if isinstance(model_path, transformers.PreTrainedModel):
                config = InferenceConfig(nc, hf_config=model_path.config)
            else:
                config = InferenceConfig(nc, load_pretrained_config(model_path))
        self.config, self.neuron_config = config, config.neuron_config
        nc = self.neuron_config
        check_supported(config.hf_config)
        window = getattr(config.hf_config, "_ns_window", None)
        if window and window < nc.seq_len:
            raise InferenceError(
                f"sliding_window {window} < seq_len {nc.seq_len}: compile with seq_len <= {window}"
            )
        if nc.tp_degree != 1 and nc.speculation_length:
            raise InferenceError("speculation_length with tp_degree > 1 is not supported here: use tp_degree=1")
        if nc.tp_degree != 1:
            from .tp import check_tp

            check_tp(config.hf_config, nc.tp_degree)
        self.model_path = model_path
        self._hf = model_path if isinstance(model_path, transformers.PreTrainedModel) else None
        self.models: dict[tuple[str, int], object] = {}  # (tag, bucket) -> NeuronModule
        self.kv_cache: KVCacheManager | None = None  # rank 0's (the only one at tp_degree=1)
        self.rank_caches: list[KVCacheManager] = []  # every rank's, tp_degree > 1
        self.cores: list[int] = []
        self.compile_s = self.load_s = 0.0
        self.hooks: list = []  # hook(tag, bucket, wall_s, projected_ns, device_ns) after each sub-model call

    # -- compile / load ---------------------------------------------------------------------------
    def _hf_model(self):
        if self._hf is None:
            import transformers

            path = Path(self.model_path)
            if not path.is_dir():
                raise InferenceError(f"{path}: no such model directory (save the model with save_pretrained)")
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            try:
                self._hf = transformers.AutoModelForCausalLM.from_pretrained(
                    path, local_files_only=True, dtype=torch.float32
                )
            except OSError as exc:
                raise InferenceError(
                    f"{path}: no weights to load ({str(exc).splitlines()[0][:100]}); save the "
                    "model with save_pretrained(), or project it from its config"
                ) from None
        return self._hf.eval()

    def _plans(self):
        nc = self.neuron_config
        spec = [(SPEC, b, nc.tkg_batch_size) for b in nc.token_generation_buckets] if nc.speculation_length else []
        return [(CTE, b, nc.ctx_batch_size) for b in nc.context_encoding_buckets] + [
            (TKG, b, nc.tkg_batch_size) for b in nc.token_generation_buckets
        ] + spec

    def _example(self, tag: str, bucket: int, batch: int, caches: list):
        t = {CTE: bucket, TKG: 1, SPEC: self.neuron_config.speculation_length + 1}[tag]
        ids = torch.zeros((batch, t), dtype=torch.long)
        pos = torch.arange(t).repeat(batch, 1) if tag != TKG else torch.zeros((batch, 1), dtype=torch.long)
        return (ids, pos, torch.arange(batch), torch.zeros(batch, dtype=torch.long), *caches)

    def compile(self, compiled_model_path, debug: bool = False) -> Path:
        """Trace and compile every sub-model × bucket into ``compiled_model_path`` (one NEFF each).

        Example: ``model.compile("compiled/")`` writes ``context_encoding_model_128.neff``, ...
        """
        from neuron_stack import api

        t0 = time.perf_counter()
        out = Path(compiled_model_path)
        out.mkdir(parents=True, exist_ok=True)
        hf = self._hf_model()
        nc = self.neuron_config
        caches = KVCacheManager(self.config.hf_config, nc, allocate_on=None).tensors
        greedy = _greedy_on_device(nc)
        if nc.tp_degree > 1:
            from .tp import ShardedSubModel

            for tag, bucket, batch in self._plans():
                self.models[(tag, bucket)] = ShardedSubModel.compile(
                    hf, KINDS[tag], bucket, nc.tp_degree, self._example(tag, bucket, batch, []),
                    [caches] * nc.tp_degree, _flags(nc), out, f"{tag}_{bucket}",
                )
        for tag, bucket, batch in ([] if nc.tp_degree > 1 else self._plans()):
            graph = DecoderGraph(hf, KINDS[tag], bucket, greedy_on_device=greedy and tag == TKG)
            nm = api.trace(
                graph, self._example(tag, bucket, batch, caches), compiler_args=_flags(nc)
            )
            nm.save(out / f"{tag}_{bucket}.neff")
            self.models[(tag, bucket)] = nm
        (out / "neuron_config.json").write_text(
            json.dumps(
                {
                    "neuron_config": nc.to_json(),
                    "model_type": self.config.hf_config.model_type,
                    "hf_config": self.config.hf_config.to_dict(),
                },
                indent=2,
                default=str,
            )
        )
        self.compile_s = time.perf_counter() - t0
        return out

    def load(self, compiled_model_path, skip_warmup: bool = False) -> None:
        """Load the NEFFs written by :meth:`compile` onto the NeuronCore and allocate the KV cache."""
        from neuron_stack import api

        t0 = time.perf_counter()
        path = Path(compiled_model_path)
        if self.neuron_config.tp_degree > 1:
            self._load_tp(path)
        for tag, bucket, _ in ([] if self.neuron_config.tp_degree > 1 else self._plans()):
            f = path / f"{tag}_{bucket}.neff"
            if not f.is_file():
                raise InferenceError(
                    f"{f}: missing: compile this configuration first (model.compile({str(path)!r}))"
                )
            if f.stat().st_size > MAX_NEFF_BYTES:
                raise InferenceError(
                    f"{f}: {f.stat().st_size} bytes is larger than any compiled sub-model; recompile"
                )
            if (tag, bucket) not in self.models:
                self.models[(tag, bucket)] = api.load(f)
        if self.neuron_config.tp_degree == 1:
            core = self.models[self._plans()[0][:2]].model.core
            self.kv_cache = KVCacheManager(self.config.hf_config, self.neuron_config, allocate_on=core)
        if not skip_warmup:
            self._warmup()
        self.load_s = time.perf_counter() - t0

    def _load_tp(self, path: Path) -> None:
        """Reserve ``tp_degree`` cores, put rank r's NEFFs and KV cache on core r."""
        from neuron_stack.parallel import _adopt
        from neuron_stack.runtime import cores as _cores
        from neuron_stack.runtime.session import Session

        from .tp import ShardedSubModel

        nc = self.neuron_config
        session = Session.get(nc.target)
        self._lease = _cores.acquire(session.profile, num_cores=nc.tp_degree)  # the held core first
        self.cores = list(self._lease.cores)
        _adopt(session, self.cores)
        for tag, bucket, _ in self._plans():
            sub = self.models.get((tag, bucket)) or ShardedSubModel.load(
                path, f"{tag}_{bucket}", self.config.hf_config.vocab_size, nc.tp_degree
            )
            sub.place(self.cores)
            self.models[(tag, bucket)] = sub
        self.rank_caches = [KVCacheManager(self.config.hf_config, nc, allocate_on=c) for c in self.cores]
        self.kv_cache = self.rank_caches[0]

    def _warmup(self) -> None:
        # one call per NEFF, as NxDI's load() does, so the first request pays no first-execution cost
        for tag, bucket, batch in self._plans():
            self._call(tag, bucket, self._example(tag, bucket, batch, []))
        self.reset()

    def reset(self) -> None:
        """Forget every sequence (the KV cache rows become free)."""
        for kv in self.rank_caches or [self.kv_cache] * (self.kv_cache is not None):
            kv.reset()

    # -- execution --------------------------------------------------------------------------------
    def _call(self, tag: str, bucket: int, args) -> torch.Tensor:
        nm = self.models.get((tag, bucket))
        if nm is None or self.kv_cache is None:
            raise InferenceError("the model is not loaded: call model.load(compiled_path) first")
        t0, p0 = time.perf_counter(), clock.now_ns()
        if self.rank_caches:
            nc = self.neuron_config
            out, device_ns = nm(self.kv_cache.session, self.cores, nc.torch_dtype, args,
                                [kv.tensors for kv in self.rank_caches])
        else:
            out, device_ns = nm(*args, *self.kv_cache.tensors), nm.model.static_device_ns
        secs, proj_ns = time.perf_counter() - t0, clock.now_ns() - p0
        for hook in self.hooks:
            hook(tag, bucket, secs, proj_ns, device_ns)
        return out

    def context_encoding(self, prompts: list[list[int]], seq_ids: list[int]) -> tuple[torch.Tensor, int]:
        """Prefill ``prompts`` into cache rows ``seq_ids``; returns (last-token logits or tokens, bucket)."""
        nc = self.neuron_config
        if len(prompts) > nc.ctx_batch_size:
            raise InferenceError(
                f"{len(prompts)} prompts in one context encoding, compiled for "
                f"ctx_batch_size={nc.ctx_batch_size}"
            )
        longest = max(len(p) for p in prompts)
        if not nc.allow_input_truncation or longest <= nc.max_context_length:
            bucket = get_target_bucket(nc.context_encoding_buckets, longest, nc.bucket_strategy)
        else:
            bucket = nc.max_context_length
            prompts = [p[-bucket:] for p in prompts]
        b = nc.ctx_batch_size
        ids = torch.zeros((b, bucket), dtype=torch.long)
        last = torch.zeros(b, dtype=torch.long)
        rows = list(seq_ids) + [seq_ids[-1]] * (b - len(seq_ids))  # padding prompts rewrite the last row
        for i, p in enumerate(prompts + [prompts[-1]] * (b - len(prompts))):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
            last[i] = len(p) - 1
        pos = torch.arange(bucket).repeat(b, 1)
        out = self._call(CTE, bucket, (ids, pos, torch.tensor(rows, dtype=torch.long), last))
        return out[: len(prompts)], bucket

    def token_generation(self, tokens: list[int], positions: list[int]) -> tuple[torch.Tensor, int]:
        """One decode step for every cache row: ``tokens[r]`` at ``positions[r]`` (inactive rows: any
        token at position 0). Returns (logits or tokens per row, bucket)."""
        nc = self.neuron_config
        bucket = get_target_bucket(
            nc.token_generation_buckets, max(positions) + 1, nc.bucket_strategy, what="seq_len"
        )
        ids = torch.tensor(tokens, dtype=torch.long)[:, None]
        pos = torch.tensor(positions, dtype=torch.long)[:, None]
        b = ids.shape[0]
        out = self._call(TKG, bucket, (ids, pos, torch.arange(b), torch.zeros(b, dtype=torch.long)))
        return out, bucket

    def speculate(self, tokens: list[list[int]], positions: list[int]) -> tuple[torch.Tensor, int]:
        """Verification: row r's ``speculation_length + 1`` tokens at ``positions[r]`` onwards, written to the
        cache; returns (logits of every one ``(rows, k + 1, vocab)``, bucket)."""
        nc = self.neuron_config
        k1 = nc.speculation_length + 1
        bucket = get_target_bucket(
            nc.token_generation_buckets, max(positions) + k1, nc.bucket_strategy, what="seq_len"
        )
        ids = torch.tensor(tokens, dtype=torch.long)
        pos = torch.tensor(positions, dtype=torch.long)[:, None] + torch.arange(k1)
        b = ids.shape[0]
        return self._call(SPEC, bucket, (ids, pos, torch.arange(b), torch.zeros(b, dtype=torch.long))), bucket


def _greedy_on_device(nc: NeuronConfig) -> bool:
    s = nc.on_device_sampling_config
    return s is not None and not s.do_sample and s.top_k == 1


def select_tokens(out: torch.Tensor, nc: NeuronConfig, generator: torch.Generator | None = None) -> list[int]:
    """Token ids from a sub-model's output: already tokens (greedy on device), else greedy or sampled on
    the host with the sampling config (``top_k``, ``top_p``, ``temperature``; :mod:`.sampling`)."""
    from neuron_stack.llm.sampling import SamplingParams, sample_rows

    if out.dim() == 1:
        return out.tolist()
    s = nc.on_device_sampling_config
    if s is None or not s.do_sample:
        return out.argmax(-1).tolist()
    return sample_rows(out, SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p), generator)


class NeuronLlamaForCausalLM(NeuronCausalLM):
    """Llama (and its Mistral / Qwen2 siblings) on the simulated NeuronCore: NxDI's class name."""


class HuggingFaceGenerationAdapter:
    """``generate`` as NxDI's adapter: exactly ``batch_size`` prompts, greedy (or sampling with the
    on-device sampling config), prefill then one token-generation call per token.

    Example: ``HuggingFaceGenerationAdapter(model).generate(input_ids, max_new_tokens=16)``.
    """

    def __init__(self, model: NeuronCausalLM):
        self.model = model

    def generate(
        self,
        input_ids,
        attention_mask=None,
        generation_config=None,
        max_length: int | None = None,
        max_new_tokens: int | None = None,
        eos_token_id: int | None = None,
        assistant_model: NeuronCausalLM | None = None,
        **_ignored,
    ):
        """Greedy (or on-device-config sampling) generation; with ``assistant_model`` (a loaded draft model)
        and the target compiled with ``speculation_length`` k, greedy speculative decoding (:meth:`_assisted`).
        """
        nc = self.model.neuron_config
        b, n = input_ids.shape
        if b != nc.batch_size:
            raise InferenceError(
                f"generate() got {b} prompts but the model was compiled for batch_size="
                f"{nc.batch_size}: pass exactly that many"
            )
        if generation_config is not None:
            max_new_tokens = max_new_tokens or getattr(generation_config, "max_new_tokens", None)
            max_length = max_length or getattr(generation_config, "max_length", None)
            eos_token_id = eos_token_id if eos_token_id is not None else generation_config.eos_token_id
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        lengths = [int(x) for x in mask.sum(1)]
        prompts = [input_ids[i, : lengths[i]].tolist() for i in range(b)]
        if max_new_tokens is None:
            max_new_tokens = (max_length or nc.seq_len) - n
        if n + max_new_tokens > nc.seq_len:
            raise InferenceError(
                f"prompt ({n}) + max_new_tokens ({max_new_tokens}) exceed seq_len {nc.seq_len}: "
                "compile with a larger seq_len"
            )
        model = self.model
        if assistant_model is not None:
            return self._assisted(assistant_model, input_ids, prompts, max_new_tokens, eos_token_id)
        model.reset()
        firsts = []
        for start in range(0, b, nc.ctx_batch_size):
            chunk = list(range(start, min(b, start + nc.ctx_batch_size)))
            out, _ = model.context_encoding([prompts[i] for i in chunk], chunk)
            firsts += select_tokens(out, nc)
        generated = [[t] for t in firsts]
        positions = list(lengths)
        done = [eos_token_id is not None and t == eos_token_id for t in firsts]
        for _ in range(max_new_tokens - 1):
            if all(done):
                break
            out, _ = model.token_generation([g[-1] for g in generated], positions)
            for i, t in enumerate(select_tokens(out, nc)):
                if not done[i]:
                    generated[i].append(t)
                    positions[i] += 1
                    done[i] = eos_token_id is not None and t == eos_token_id
        return _pad(input_ids, prompts, lengths, generated, eos_token_id)

    def _assisted(self, draft: NeuronCausalLM, input_ids, prompts, max_new_tokens: int, eos) -> torch.Tensor:
        """Greedy speculative decoding, one sequence: the draft proposes k tokens (k token-generation calls),
        the target checks them in one speculation call; the agreeing prefix and the target's own next token
        are kept, so the tokens are the target's greedy tokens. ``self.speculation`` counts proposals."""
        target, nc = self.model, self.model.neuron_config
        k = nc.speculation_length
        if not k:
            raise InferenceError("assistant_model needs a target compiled with speculation_length > 0")
        if len(prompts) != 1:
            raise InferenceError(f"speculative decoding runs one sequence here; got {len(prompts)} (batch_size=1)")
        target.reset()
        draft.reset()
        prompt = prompts[0]
        first = select_tokens(target.context_encoding([prompt], [0])[0], nc)[0]
        draft.context_encoding([prompt], [0])
        gen, pos = [first], len(prompt)  # pos: where gen[-1] goes in the caches
        stats = {"proposed": 0, "accepted": 0, "target_calls": 1}

        def done():
            return len(gen) >= max_new_tokens or (eos is not None and eos in gen)

        while not done():
            if pos + k >= nc.seq_len:  # no room for a speculation window: plain decoding to the end
                out, _ = target.token_generation([gen[-1]], [pos])
                gen.append(select_tokens(out, nc)[0])
                pos += 1
                stats["target_calls"] += 1
                continue
            drafts, x = [], gen[-1]
            for i in range(k):
                out, _ = draft.token_generation([x], [pos + i])
                x = int(out[0].argmax()) if out.dim() == 2 else int(out[0])
                drafts.append(x)
            logits, _ = target.speculate([[gen[-1], *drafts]], [pos])
            want = logits[0].argmax(-1).tolist()
            n = 0
            while n < k and drafts[n] == want[n]:
                n += 1
            if n == k:  # the draft has not seen its own last proposal: it goes into its cache now
                draft.token_generation([drafts[-1]], [pos + k])
            gen += want[: n + 1]
            pos += n + 1
            stats["proposed"] += k
            stats["accepted"] += n
            stats["target_calls"] += 1
        gen = gen[:max_new_tokens]
        if eos is not None and eos in gen:
            gen = gen[: gen.index(eos) + 1]
        stats["acceptance_rate"] = stats["accepted"] / stats["proposed"] if stats["proposed"] else 0.0
        self.speculation = stats
        return _pad(input_ids, prompts, [len(prompts[0])], [gen], eos)


def _pad(input_ids, prompts, lengths, generated, eos_token_id) -> torch.Tensor:
    """Prompt + generated tokens per row, padded to one width (with EOS, else 0) as ``generate`` returns."""
    n = input_ids.shape[1]
    pad = eos_token_id if eos_token_id is not None else 0
    width = max(len(g) for g in generated)
    rows = [
        prompts[i] + [pad] * (n - lengths[i]) + generated[i] + [pad] * (width - len(generated[i]))
        for i in range(len(prompts))
    ]
    return torch.tensor(rows, dtype=input_ids.dtype)
