"""The KV cache of a context-encoding (prefill) graph, as NxDI's is: the prompt is written at positions
``[0, bucket)`` of a fresh cache row and attends causally from position 0. Hugging Face's ``StaticCache``
computes positions and the causal mask as sums with the cache's length, a graph input, so the compiler
could not know the mask; here they are the graph's constants, and the compiler skips the key blocks
above the diagonal (``compiler/lower/attention.py``, ``ConstMask``). The cache's inputs and outputs are
unchanged: a graph captured with it runs on a fresh ``StaticCache``.
"""

from __future__ import annotations

from transformers.cache_utils import StaticLayer


class ContextEncodingLayer(StaticLayer):
    """A ``StaticLayer`` whose writes start at position 0 (a prompt into a fresh cache row)."""

    def get_seq_length(self) -> int:
        return 0

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        self.cumulative_length.add_(n)      # as StaticLayer: the cache then holds n tokens
        self.keys[:, :, :n].copy_(key_states)
        self.values[:, :, :n].copy_(value_states)
        return self.keys, self.values


def context_encoding_cache(cache):
    """Make a fresh ``transformers.StaticCache`` a context-encoding cache (see the module doc); returns it.

    >>> import transformers
    >>> cfg = transformers.LlamaConfig(num_hidden_layers=1)
    >>> context_encoding_cache(transformers.StaticCache(config=cfg, max_cache_len=8)).get_seq_length()
    0
    """
    for layer in cache.layers:
        if type(layer) is StaticLayer:  # sliding-window layers keep their own positions (data: no block skipped)
            layer.__class__ = ContextEncodingLayer
    return cache
