"""Ctrl-C in a profiled workload: one line saying where it stopped, instead of a traceback through torch.

Under ``neuron-explorer inspect`` (``NEURON_RT_INSPECT_ENABLE=1``) a Ctrl-C during a compile printed a
50-line traceback of torch's internals before inspect said what it kept. Only an *uncaught*
``KeyboardInterrupt`` is shortened (``sys.excepthook``), so a script's own ``except KeyboardInterrupt``
still runs, atexit still flushes the profile, and Python still exits by SIGINT.
``NEURON_STACK_DEBUG=1`` keeps the traceback.

>>> install({"NEURON_RT_INSPECT_ENABLE": "0"})
False
"""
from __future__ import annotations

import os
import sys
import traceback


def install(env=None) -> bool:
    """Shorten an uncaught ``KeyboardInterrupt`` when profiling is on; True when installed."""
    env = os.environ if env is None else env
    if env.get("NEURON_RT_INSPECT_ENABLE", "").strip() != "1" or env.get("NEURON_STACK_DEBUG"):
        return False
    previous = sys.excepthook
    if getattr(previous, "_neuron_stack", False):
        return True

    def hook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            return previous(kind, value, tb)
        print(f"neuron_stack: interrupted (Ctrl-C){_user_frame(tb)} (NEURON_STACK_DEBUG=1 shows the traceback)",
              file=sys.stderr)

    hook._neuron_stack = True
    sys.excepthook = hook
    return True


def _user_frame(tb) -> str:
    """`` at script.py:12``: the innermost frame outside the libraries, where the user's code was. Code we
    generate (``<neuron_stack partition forward>``, runtime/graph.py) and frozen modules are not the user's.

    >>> try:
    ...     exec(compile("raise KeyboardInterrupt", "<neuron_stack partition forward>", "exec"))
    ... except KeyboardInterrupt as e:
    ...     _user_frame(e.__traceback__).startswith(" at <doctest")
    True
    """
    ours = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))     # beside neuron_stack/: traces/...
    libs = (os.path.dirname(os.__file__), *(os.path.join(ours, p) + os.sep for p in ("neuron_stack", "traces")),
            "<neuron_stack ", "<frozen ")
    user = [f for f in traceback.extract_tb(tb) if not f.filename.startswith(libs) and "-packages" not in f.filename]
    return f" at {os.path.basename(user[-1].filename)}:{user[-1].lineno}" if user else ""
