"""A long decode cache's K kept transposed, as NxDI's ``k_cache_transposed`` keeps it:
``[batch, kv_heads, head_dim, seq]`` (its token-generation kernel's ``K_cache_transposed``), V as Hugging
Face's ``[batch, kv_heads, seq, head_dim]``.

A decode step's scores ``q @ K^T`` contract over ``head_dim``, the partition axis of both matmul operands, so the
keys are needed with ``head_dim`` on the partitions: stored ``[seq, head_dim]`` each 128-token block is loaded as
it lies (256 B a partition for a 128-wide bf16 head) and transposed on the Tensor Engine, then copied out of PSUM;
stored transposed, each partition (one ``head_dim`` lane) reads one run of ``seq`` keys and the Tensor Engine
takes it as it lands. V is contracted over ``seq`` and is read as stored, ``seq`` on the partitions. What it
costs: each new token's key is written as a column (``head_dim`` elements, one per partition row of the store).
The attention's numbers are those of the untransposed cache (the same products, summed in the same order).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import StaticLayer

from neuron_stack.compiler.lower.resident import LANE_MIN_RUN, PMAX

#: the shortest decode cache kept so: as long as a row of scores takes the lane layout (``LANE_MIN_RUN`` keys a
#: partition; ``llm.project.kv_length`` pads such buckets to whole partitions), where P @ V reads V in the lane
#: order too (``compiler/lower/kvread.lane_batches``). A shorter cache is a few 128-key tiles a head.
LONG_CACHE = PMAX * LANE_MIN_RUN


class TransposedKLayer(StaticLayer):
    """A ``StaticLayer`` whose ``keys`` are stored ``[batch, kv_heads, head_dim, seq]``; ``update`` returns them
    as the ``[batch, kv_heads, seq, head_dim]`` view the attention expects."""

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self.keys = self.keys.transpose(-1, -2).contiguous()

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        pos = torch.arange(n, device=self.device) + self.cumulative_length
        self.cumulative_length.add_(n)      # as StaticLayer: the cache then holds n more tokens
        self.keys.index_copy_(3, pos, key_states.transpose(-1, -2))
        self.values.index_copy_(2, pos, value_states)
        return self.keys.transpose(-1, -2), self.values


def transposed_k_cache(cache):
    """Make an initialized ``transformers.StaticCache`` keep its keys transposed (module doc); returns it.

    >>> import torch, transformers
    >>> cfg = transformers.LlamaConfig(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
    ...                                hidden_size=256)
    >>> c = transformers.StaticCache(config=cfg, max_cache_len=32)
    >>> c.early_initialization(batch_size=1, num_heads=2, head_dim=64, dtype=torch.float32,
    ...                        device=torch.device("cpu"))
    >>> tuple(transposed_k_cache(c).layers[0].keys.shape)
    (1, 2, 64, 32)
    """
    for layer in cache.layers:
        if type(layer) is StaticLayer:  # sliding-window layers keep their own layout
            layer.__class__ = TransposedKLayer
            if layer.is_initialized:
                layer.keys = layer.keys.transpose(-1, -2).contiguous()
    return cache
