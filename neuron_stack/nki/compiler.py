"""``nki.compiler`` (``ncc``): the compiler hints a kernel may carry. The simulator keeps the kernel's
program order and places tiles itself, so each hint is accepted and changes nothing.

>>> sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,))
'sbuf'
>>> @skip_middle_end_transformations
... def k(): return 1
>>> k()
1
>>> enable_stack_allocator(log_level=10)(k)()
1
"""
from __future__ import annotations

from .language import no_reorder  # noqa: F401


def skip_middle_end_transformations(fn):
    """The compiler's middle end is not simulated: the kernel runs as written."""
    return fn


def enable_stack_allocator(func=None, log_level=50):
    """The SDK's stack allocator (used with ``skip_middle_end_transformations``): here every tile is
    placed by the simulator's liveness allocator either way, so the kernel runs as written."""
    return func if func is not None else (lambda fn: fn)


force_auto_alloc = enable_stack_allocator


class _Buffer:
    def __init__(self, name: str):
        self.name = name

    def mod_alloc(self, *args, **kwargs) -> str:
        """A placement hint: the tile is placed by the simulator's own allocator in this buffer."""
        return self.name

    alloc = auto_alloc = mod_alloc


sbuf, psum = _Buffer("sbuf"), _Buffer("psum")
