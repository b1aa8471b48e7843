"""An Optimum-Neuron-shaped on-ramp for Hugging Face models. These classes are ours: they take the
arguments of Optimum Neuron's legacy ``from_pretrained(..., export=True, batch_size=, sequence_length=,
num_cores=, auto_cast_type=)`` (reference §2.10) so its examples read the same, and run on neuron_stack.

- weights given (a ``PreTrainedModel``, or a local directory with weight files): the model is traced
  into static-shape graphs on a simulated NeuronCore and runs real numbers. A causal LM gets a context
  encoding graph per prompt bucket and one token generation graph over a static KV cache of
  ``sequence_length``; ``generate()`` is greedy.
- a config only (a ``transformers`` config, a directory with just ``config.json``, or a preset name such
  as ``"llama-3-8b"``): projection mode (:mod:`neuron_stack.llm.project`), numbers=none. ``projection``
  answers latency and fit; ``generate()`` refuses (there are no weights).

>>> m = NeuronModelForCausalLM.from_pretrained("llama-3-8b", export=True, batch_size=1,    # doctest: +SKIP
...                                            sequence_length=2048, num_cores=8, auto_cast_type="bf16")
>>> print(m.projection.verdict())                                                          # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from neuron_stack.llm.configs import DTYPES, PRESETS, ConfigError, has_weights, load_config, require_positive


def _bool_mask_free(attention_mask) -> bool:
    return attention_mask is None or bool(attention_mask.bool().all())


def context_buckets(sequence_length: int, smallest: int = 128) -> list[int]:
    """Prompt buckets as NxDI's ``generate_buckets(128, max)``: powers of two from 128, then the maximum.

    >>> context_buckets(640)
    [128, 256, 640]
    >>> context_buckets(32)
    [32]
    """
    lo = min(smallest, sequence_length)
    if lo == sequence_length:
        return [sequence_length]
    return [2**i for i in range(int(math.log2(lo)), round(math.log2(sequence_length)))] + [sequence_length]


def _flags(auto_cast_type: str | None, target: str) -> str:
    if auto_cast_type is not None and auto_cast_type not in DTYPES:
        raise ConfigError(f"auto_cast_type {auto_cast_type!r} is not one of bf16, fp16, fp32")
    cast = {"bfloat16": "bf16", "float16": "fp16"}.get(DTYPES.get(auto_cast_type))  # fp32: no auto-cast
    return f"--target {target}" + (f" --auto-cast matmult --auto-cast-type {cast}" if cast else "")


def _refuse_precompiled(export: bool) -> None:
    """Optimum's ``export=False`` loads a precompiled artifact; here every model is compiled."""
    if not export:
        raise ConfigError(
            "export=False loads a precompiled Optimum artifact, which neuron_stack does not "
            "read: pass export=True (compiles go through the persistent cache)"
        )


def _resolve(model_or_path, auto_cls):
    """(model or None, config): a model when weights are given, else the config alone."""
    import transformers

    if isinstance(model_or_path, transformers.PreTrainedModel):
        return model_or_path.eval(), model_or_path.config
    if isinstance(model_or_path, transformers.PretrainedConfig) or str(model_or_path).lower() in PRESETS:
        return None, load_config(model_or_path)
    path = Path(model_or_path)
    if not path.exists():
        raise ConfigError(
            f"{model_or_path}: no such model directory (nothing downloads: save the model with "
            f"save_pretrained() first, or give a config or a preset: {', '.join(PRESETS)})"
        )
    if has_weights(path):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        return auto_cls.from_pretrained(path, local_files_only=True).eval(), None
    return None, load_config(path)


class NeuronModelForCausalLM:
    """A causal LM compiled for the simulated NeuronCore (ours, shaped like Optimum Neuron's class).

    Use :meth:`from_pretrained`. ``projection`` is set in projection mode (no weights).
    """

    def __init__(
        self,
        model,
        config,
        *,
        batch_size: int,
        sequence_length: int,
        num_cores: int,
        auto_cast_type: str | None,
        target: str,
        projection=None,
    ):
        self.model, self.config = model, config if config is not None else model.config
        self.batch_size, self.sequence_length, self.num_cores = batch_size, sequence_length, num_cores
        self.auto_cast_type, self.target = auto_cast_type, target
        self.projection = projection
        self.graphs: dict[tuple[str, int], object] = {}  # (kind, bucket) -> NeuronModule
        self._cache = None

    @classmethod
    def from_pretrained(
        cls,
        model_id,
        export: bool = True,
        *,
        batch_size: int = 1,
        sequence_length: int = 128,
        num_cores: int = 1,
        auto_cast_type: str | None = None,
        target: str = "trn1",
        instance_type: str | None = None,
    ):
        """Compile ``model_id`` (a model, a local directory, a config or a preset) for fixed shapes.

        ``num_cores`` is the tensor-parallel degree of a projection; real-number execution runs on one
        core. Example: ``NeuronModelForCausalLM.from_pretrained(model, batch_size=1, sequence_length=64)``.
        """
        import transformers

        _refuse_precompiled(export)
        require_positive(batch_size=batch_size, sequence_length=sequence_length, num_cores=num_cores)
        model, config = _resolve(model_id, transformers.AutoModelForCausalLM)
        projection = None
        if model is None:
            from neuron_stack.llm.project import project

            projection = project(
                config,
                batch_size=batch_size,
                sequence_length=sequence_length,
                tp_degree=num_cores,
                dtype=auto_cast_type or "bf16",
                instance_type=instance_type,
                target=target,
            )
            projection.model = (
                model_id if isinstance(model_id, str) else type(config).__name__.removesuffix("Config")
            )
        elif num_cores != 1:
            raise ConfigError(
                f"num_cores={num_cores}: a model with weights runs its real numbers on one "
                "NeuronCore here; project tensor parallelism from the config instead "
                "(from_pretrained(model.config, num_cores=N))"
            )
        else:
            _flags(auto_cast_type, target)  # refuse a bad auto_cast_type before any compile
        return cls(
            model,
            config,
            batch_size=batch_size,
            sequence_length=sequence_length,
            num_cores=num_cores,
            auto_cast_type=auto_cast_type,
            target=target,
            projection=projection,
        )

    # -- real-number mode -------------------------------------------------------------------------
    def _new_cache(self):
        import torch
        import transformers

        cfg = self.config
        heads = cfg.num_attention_heads
        cache = transformers.StaticCache(config=cfg, max_cache_len=self.sequence_length)
        cache.early_initialization(
            batch_size=self.batch_size,
            num_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            dtype=torch.float32,
            device=torch.device("cpu"),
        )
        return cache

    def _graph(self, kind: str, bucket: int, inputs: dict):
        """The traced graph for ``(kind, bucket)``, compiled on first use (through the persistent cache)."""
        from neuron_stack import api

        key = (kind, bucket)
        if key not in self.graphs:
            self.graphs[key] = api.trace(
                self.model, inputs, compiler_args=_flags(self.auto_cast_type, self.target)
            )
        return self.graphs[key]

    def generate(
        self,
        input_ids,
        attention_mask=None,
        max_new_tokens: int = 16,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 50,
        top_p: float = 1.0,
        **_ignored,
    ):
        """Greedy decoding, or sampling with ``do_sample`` (``temperature``, ``top_k``, ``top_p``, the
        Hugging Face defaults; the global torch generator, so ``torch.manual_seed`` reproduces it): the
        prompt through the context-encoding graph of the smallest bucket that holds it (right-padded),
        then one token-generation call per new token. Returns prompt + tokens.
        Example: ``m.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=8)``.
        """
        import torch

        from neuron_stack.llm.sampling import SamplingParams, sample_rows

        params = SamplingParams(temperature=temperature if do_sample else 0.0, top_k=top_k, top_p=top_p)

        def pick(logits):
            return torch.tensor(sample_rows(logits, params))

        if self.model is None:
            raise ConfigError(
                "this model was compiled from a config alone (projection mode, numbers=none): "
                "there are no weights to generate with; read .projection, or pass a model "
                "with weights"
            )
        b, n = input_ids.shape
        if b != self.batch_size:
            raise ConfigError(
                f"generate() got {b} prompts but the model was compiled for batch_size="
                f"{self.batch_size}: pass exactly that many (as Neuron requires)"
            )
        if not _bool_mask_free(attention_mask):
            raise ConfigError(
                "padded prompts (attention_mask with zeros) are not supported: pass prompts of one length"
            )
        if n + max_new_tokens > self.sequence_length:
            raise ConfigError(
                f"prompt ({n}) + max_new_tokens ({max_new_tokens}) exceed sequence_length "
                f"{self.sequence_length}: compile with a larger sequence_length"
            )
        bucket = next(c for c in context_buckets(self.sequence_length) if c >= n)
        cache = self._cache = self._new_cache()
        ids = torch.zeros((b, bucket), dtype=input_ids.dtype)
        ids[:, :n] = input_ids  # right padding: the cache rows past n are masked, then overwritten
        inputs = {"input_ids": ids, "past_key_values": cache, "cache_position": torch.arange(bucket)}
        out = self._graph("context_encoding", bucket, inputs)(**inputs)
        for layer in cache.layers:  # the padding does not count: decoding continues at position n
            layer.cumulative_length.fill_(n)
        tokens = [pick(out.logits[:, n - 1])]
        for pos in range(n, n + max_new_tokens - 1):
            step = {
                "input_ids": tokens[-1][:, None],
                "past_key_values": cache,
                "cache_position": torch.tensor([pos]),
            }
            out = self._graph("token_generation", self.sequence_length, step)(**step)
            tokens.append(pick(out.logits[:, -1]))
        return torch.cat([input_ids, torch.stack(tokens, 1).to(input_ids.dtype)], 1)


class NeuronModelForSequenceClassification:
    """A sequence classifier traced for fixed ``(batch_size, sequence_length)`` (ours, Optimum-shaped):
    calls are padded up to that shape, as Neuron's static shapes require.
    Example: ``NeuronModelForSequenceClassification.from_pretrained(bert, batch_size=1, sequence_length=32)``.
    """

    def __init__(self, model, neuron_module, batch_size: int, sequence_length: int):
        self.model, self.neuron_module = model, neuron_module
        self.config = model.config
        self.batch_size, self.sequence_length = batch_size, sequence_length

    @classmethod
    def from_pretrained(
        cls,
        model_id,
        export: bool = True,
        *,
        batch_size: int = 1,
        sequence_length: int = 128,
        auto_cast_type: str | None = None,
        target: str = "trn1",
    ):
        """Trace a sequence-classification model (a model or a local directory with weights)."""
        import torch
        import transformers

        from neuron_stack import api

        _refuse_precompiled(export)
        model, config = _resolve(model_id, transformers.AutoModelForSequenceClassification)
        if model is None:
            raise ConfigError(
                "sequence classification runs real numbers: give a model with weights (projection "
                "mode is for decoder LLMs: NeuronModelForCausalLM)"
            )
        ids = torch.zeros((batch_size, sequence_length), dtype=torch.long)
        nm = api.trace(
            model,
            {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
            compiler_args=_flags(auto_cast_type, target),
        )
        return cls(model, nm, batch_size, sequence_length)

    def __call__(self, input_ids, attention_mask=None):
        """Logits for ``input_ids`` (padded to the compiled shape, then cut back to the real batch)."""
        import torch

        b, n = input_ids.shape
        if b > self.batch_size or n > self.sequence_length:
            raise ConfigError(
                f"inputs {tuple(input_ids.shape)} exceed the compiled shape "
                f"({self.batch_size}, {self.sequence_length}): recompile with larger sizes"
            )
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        ids = torch.zeros((self.batch_size, self.sequence_length), dtype=torch.long)
        am = torch.zeros_like(ids)
        ids[:b, :n], am[:b, :n] = input_ids, mask
        out = self.neuron_module(input_ids=ids, attention_mask=am)
        return _classifier_output(out.logits[:b])


def _classifier_output(logits):
    """The ``SequenceClassifierOutput`` a transformers model returns."""
    from transformers.modeling_outputs import SequenceClassifierOutput

    return SequenceClassifierOutput(logits=logits)
