"""Sequence parallelism of a context-encoding graph, as NxDI runs it (``sequence_parallel_enabled``).

With it on, each tensor-parallel rank of a context-encoding call keeps the hidden state sharded on the
sequence, ``[b, s/tp, H]``, between layers: the norms and residual adds run on the shard, an all-gather
to ``[b, s, H]`` comes before the QKV and gate/up projections, and the row-parallel O and down
projections end in a reduce-scatter back to the shard instead of an all-reduce. Sources: NxDI
``models/llama/modeling_llama.py`` (``NeuronLlamaMLP.forward``: ``gather_from_sequence_parallel_region(x,
sequence_dimension=1)`` before gate/up, ``RowParallelLinear(..., sequence_parallel_enabled=True)`` for
down; ``NeuronLlamaAttention`` the same around QKV and O), ``models/model_base.py``
(``process_sequence_parallel_hidden_states``: the embeddings enter the sequence-parallel region by a
``_reduce_scatter_along_dim(..., REDUCE_MAX)``, the final norm runs on the shard, and only the last
position's hidden state reaches the LM head; ``validate_sequence_parallel``:
the context length must be a multiple of the TP degree) and neuronx_distributed
``parallel_layers/mappings.py`` (``gather_from_sequence_parallel_region``,
``reduce_scatter_to_sequence_parallel_region``). Token generation never uses it (one token per sequence).

Here the collectives are PyTorch's functional ones (``torch.ops._c10d_functional.all_gather_into_tensor``,
``reduce_scatter_tensor``, ``wait_tensor``): ``torch.export`` captures them on the meta device with no
process group, and the compiler lowers them on the ``cc`` engine, timed for the compile's ``world_size``
flag, where the schedule overlaps them with compute that does not depend on them. The wrapped model is
for capture (projection, numbers=none): it needs a process group to run with real tensors.

>>> import torch, transformers
>>> cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=128,
...                                num_attention_heads=4, num_key_value_heads=4, vocab_size=100)
>>> with torch.device("meta"):
...     model = sequence_parallel(transformers.LlamaForCausalLM(cfg), 4)
>>> model(torch.zeros((1, 16), dtype=torch.long, device="meta"), logits_to_keep=1).logits.shape
torch.Size([1, 1, 100])
"""

from __future__ import annotations

import torch

from neuron_stack.llm.configs import ConfigError

_C10D = torch.ops._c10d_functional
GROUP = "tp"  # the group name the captured collectives carry (the compiler times them over world_size)


def _seq_major(x: torch.Tensor) -> torch.Tensor:
    """[b, s, H] -> [s, b*H]: the functional collectives gather and scatter dim 0 (NxD's
    ``_gather_along_dim`` likewise moves the sequence first; with b = 1 this is a view)."""
    b, s = x.shape[:2]
    return x.reshape(s, -1) if b == 1 else x.transpose(0, 1).reshape(s, -1)


def _batch_major(x: torch.Tensor, b: int) -> torch.Tensor:
    s = x.shape[0]
    return x.reshape(1, s, -1) if b == 1 else x.reshape(s, b, -1).transpose(0, 1)


def gather(x: torch.Tensor, tp: int) -> torch.Tensor:
    """All-gather ``[b, s/tp, H]`` to ``[b, s, H]`` (``gather_from_sequence_parallel_region``).

    >>> gather(torch.zeros((1, 4, 8), device="meta"), 4).shape
    torch.Size([1, 16, 8])
    """
    y = _C10D.wait_tensor(_C10D.all_gather_into_tensor(_seq_major(x), tp, GROUP))
    return _batch_major(y, x.shape[0])


def reduce_scatter(x: torch.Tensor, tp: int, op: str = "sum") -> torch.Tensor:
    """Reduce-scatter ``[b, s, H]`` to ``[b, s/tp, H]`` (``reduce_scatter_to_sequence_parallel_region``).

    >>> reduce_scatter(torch.zeros((2, 16, 8), device="meta"), 4).shape
    torch.Size([2, 4, 8])
    """
    y = _C10D.wait_tensor(_C10D.reduce_scatter_tensor(_seq_major(x), op, tp, GROUP))
    return _batch_major(y, x.shape[0])


def _gather_input(tp):
    def hook(module, args, kwargs):
        if args:
            return (gather(args[0], tp), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": gather(kwargs["hidden_states"], tp)}
    return hook


def _scatter_output(tp):
    def hook(module, args, out):
        if isinstance(out, tuple):  # attention: (output, weights)
            return (reduce_scatter(out[0], tp), *out[1:])
        return reduce_scatter(out, tp)
    return hook


def sequence_parallel(model: torch.nn.Module, tp: int) -> torch.nn.Module:
    """Make a transformers causal LM (one rank of it) run its decoder layers sequence-parallel over
    ``tp`` ranks, as NxDI's context-encoding model does (see the module doc); returns ``model``.

    The embeddings enter the sharded region before the first layer (NxDI's reduce-scatter with
    ``REDUCE_MAX`` of the replicated embeddings); each attention and MLP gathers its input and
    reduce-scatters its output; the final norm runs on the shard, and each rank's last position is
    gathered: ``[b, tp, H]``, whose last row is the prompt's last token, the one a context-encoding call
    computes logits for (call the model with ``logits_to_keep=1``, as :mod:`neuron_stack.llm.project`
    does). The sequence length must be a multiple of ``tp``."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or getattr(inner, "norm", None) is None or not all(
        hasattr(la, "self_attn") and hasattr(la, "mlp") for la in layers
    ):
        raise ConfigError(
            f"sequence parallelism needs decoder layers with self_attn and mlp and a final norm "
            f"({type(model).__name__} has not): project it without sequence parallelism"
        )
    if tp == 1:
        return model

    def enter(module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        if h.shape[1] % tp:
            raise ConfigError(f"sequence parallelism: the context length ({h.shape[1]}) must be a multiple of "
                              f"the TP degree ({tp})")
        h = reduce_scatter(h, tp, "max")  # the replicated embeddings: max is their shard (NxDI's REDUCE_MAX)
        return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})

    layers[0].register_forward_pre_hook(enter, with_kwargs=True)
    for layer in layers:
        for sub in (layer.self_attn, layer.mlp):
            sub.register_forward_pre_hook(_gather_input(tp), with_kwargs=True)
            sub.register_forward_hook(_scatter_output(tp))
    inner.norm.register_forward_hook(lambda module, args, out: gather(out[:, -1:], tp))
    return model
