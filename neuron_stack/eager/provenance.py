"""Where an eager op comes from: the user's line, the ``nn.Module`` whose forward is running, and for a
backward op the ``backward()`` call that runs it and the forward line it differentiates.

The same two facts a compiled graph carries (``stack_trace`` and ``nn_module_stack``), so an op reads
the same line and module path eager and compiled:

- Forward: one walk up the Python stack gives the innermost user frame (the line) and the modules of
  the ``Module._call_impl`` frames on it. The op's module path is the innermost one's name in the
  outermost (``fc1`` in ``model``), as dynamo names it when that outermost module is compiled. No
  module hooks: dynamo would trace them into every compiled graph.
- Autograd numbers every node it creates (``seq_nr``: what aot_autograd uses to tie a backward node
  to its forward op), before the op reaches ``__torch_dispatch__``. An op whose call advanced this
  thread's number made node ``number - 1``; its site is remembered under that number.
- Backward: autograd's worker thread runs the node (``torch._C._current_autograd_node()``); the op's
  line is the ``backward()`` call, its forward line and module path those remembered for the node.

>>> import torch
>>> s = site()
>>> s.backward, s.module_path
(False, '')
"""
from __future__ import annotations

import sys
import threading
import weakref
from typing import NamedTuple

import torch

from neuron_stack.eager.memory import _state, where
from neuron_stack.frontend.export import backward_source, frame_source, is_user_file
from neuron_stack.ir import Source

_CALL_IMPL = torch.nn.Module._call_impl.__code__
_KEEP = 1 << 18             # forward nodes remembered; a backward past that many loses its forward lines
_forward: dict[int, "Site"] = {}
_paths: dict[int, tuple] = {}      # id(root module) -> (weakref to it, {id(module): name})
_type_names: dict[type, str] = {}  # a module class -> its name as nn_module_stack spells it
_local = threading.local()
_lock = threading.Lock()


class Site(NamedTuple):        # a tuple: made for every op, where a dataclass costs microseconds
    """An op's user line (a backward op: the ``backward()`` line), module path and class, and for a
    backward op the forward line it came from."""

    source: Source | None
    module_path: str = ""
    module_type: str = ""
    fwd_source: Source | None = None
    backward: bool = False

    def key(self) -> tuple:
        """What of the site a compiled op carries into profiles (part of the eager op's signature)."""
        s, f = self.source, self.fwd_source
        return (s and (s.file, s.line)), self.module_path, (f and (f.file, f.line)), self.backward


def enter() -> None:
    """Start one op's dispatch: remember its site if autograd made a node for it."""
    _local.site = None
    seq = torch._C._autograd._get_sequence_nr()
    if seq != getattr(_local, "seq", 0):
        _local.seq = seq
        s = site()
        if s.backward:     # a node made during backward (create_graph): numbered on the worker's own counter
            return
        with _lock:
            _forward[seq - 1] = s
            if len(_forward) > _KEEP:
                del _forward[next(iter(_forward))]


def site() -> Site:
    """The site of the op being dispatched on this thread (computed once per op)."""
    s = getattr(_local, "site", None)
    if s is None:
        s = _local.site = _backward_site() or _forward_site()
    return s


def _backward_site() -> Site | None:
    node = torch._C._current_autograd_node()
    if node is None:
        return None
    fwd = _forward.get(node._sequence_nr())
    # one backward() call per graph task: its line is looked up (every thread's stack) once per task
    task = torch._C._current_graph_task_id()
    cached = getattr(_local, "backward", None)
    if cached is not None and cached[0] == task:
        line = cached[1]
    else:
        line = backward_source() or where()
        _local.backward = (task, line)
    if fwd is None:
        return Site(line, backward=True)
    return Site(line, fwd.module_path, fwd.module_type, fwd.source, backward=True)


def _forward_site() -> Site:
    src, inner, outer = None, None, None
    f = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if code is _CALL_IMPL:
            inner, outer = inner or f, f
        elif src is None and is_user_file(code.co_filename):
            src = frame_source(f)
        f = f.f_back
    if src is not None:
        _state["source"] = src          # the last user line seen, as memory.where() keeps it
    else:
        src = where()
    if inner is None:
        return Site(src)
    # only two frames' locals: reading f_locals costs microseconds a frame
    return Site(src, *_path(outer.f_locals["self"], inner.f_locals["self"]))


def _path(root: torch.nn.Module, m: torch.nn.Module) -> tuple[str, str]:
    """``m``'s name in ``root`` and its class, as ``nn_module_stack`` spells them."""
    ref, names = _paths.get(id(root), (None, None))
    if ref is None or ref() is not root or id(m) not in names:   # first call, or the model changed since
        names = {id(x): n for n, x in root.named_modules()}
        _paths[id(root)] = (weakref.ref(root, lambda _, k=id(root): _paths.pop(k, None)), names)
    cls = type(m)
    name = _type_names.get(cls)
    if name is None:
        name = _type_names[cls] = f"{cls.__module__}.{cls.__qualname__}"
    return names.get(id(m), ""), name
