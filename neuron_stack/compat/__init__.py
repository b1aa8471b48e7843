"""The opt-in compat runner: run a script written for the real Neuron SDK, unchanged, on this stack.

``python -m neuron_stack.compat SCRIPT [ARGS]`` (or ``-m MODULE [ARGS]``) runs the script with the SDK's
import names resolving to this package's modules, through a meta-path finder that exists only in that
run: nothing is installed as a top-level package, and a plain ``python script.py`` is untouched.

=================================================  =================================================
the script imports                                 it gets
=================================================  =================================================
``nki``, ``nki.language``, ``nki.isa``, ...        :mod:`neuron_stack.nki` (today's names and the legacy ones)
``neuronxcc.nki`` and its submodules               :mod:`neuron_stack.nki` (the legacy form)
``torch_neuronx`` (``trace``, ``analyze``, ...)    :mod:`neuron_stack` (the torch_neuronx-shaped API)
``torch_neuronx.profiling``                        :mod:`neuron_stack.profiling`
``torch_xla``, ``torch_xla.core.xla_model``        :mod:`neuron_stack.compat.xla`: the device calls the
                                                   samples make (``xm.xla_device()``, ``torch_xla.device()``)
                                                   give the CPU device the simulator takes
=================================================  =================================================

If the real SDK is importable (any of those top-level names is installed), the runner refuses with one
line rather than shadow it.

>>> f = AliasFinder()
>>> f.target("neuronxcc.nki.language"), f.target("nki.isa.constants"), f.target("numpy")
('neuron_stack.nki.language', 'neuron_stack.nki.isa', None)
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

#: top-level SDK names -> the module that stands in for them
ROOTS = {
    "nki": "neuron_stack.nki",
    "neuronxcc": "neuron_stack.compat.neuronxcc",
    "torch_neuronx": "neuron_stack",
    "torch_xla": "neuron_stack.compat.xla",
}

#: SDK submodules whose content lives in another of our modules (the rest map name for name)
MOVED = {
    "neuronxcc.nki": "neuron_stack.nki",
    "nki.isa.constants": "neuron_stack.nki.isa",
    "nki.isa.neuron_isa": "neuron_stack.nki.isa",
    "nki.language.constants": "neuron_stack.nki.language",
    "nki.language.iterators": "neuron_stack.nki.language",
    "torch_xla.core": "neuron_stack.compat.xla",
    "torch_xla.core.xla_model": "neuron_stack.compat.xla",
    "torch_xla.runtime": "neuron_stack.compat.xla",
}


class AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves the SDK's import names to ours: the module object is ours, shared, not a copy."""

    def target(self, fullname: str) -> str | None:
        """Our module for the SDK name ``fullname`` (None: not an SDK name)."""
        name = fullname
        if name.startswith("neuronxcc.nki"):
            name = name.removeprefix("neuronxcc.")       # the legacy package is the same API here
        if name in MOVED:
            return MOVED[name]
        root, _, rest = name.partition(".")
        if root not in ROOTS:
            return None
        return ROOTS[root] + ("." + rest if rest else "")

    def find_spec(self, fullname, path=None, target=None):
        ours = self.target(fullname)
        if ours is None:
            return None
        if importlib.util.find_spec(ours.rpartition(".")[0] or ours) is None:
            return None
        try:
            if importlib.util.find_spec(ours) is None:
                return None
        except ModuleNotFoundError:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return importlib.import_module(self.target(spec.name))

    def exec_module(self, module):
        pass        # ours, already executed


def real_sdk() -> str | None:
    """The first SDK top-level name that is really installed (then the runner must not shadow it)."""
    for name in ROOTS:
        if name in sys.modules or importlib.util.find_spec(name) is not None:
            return name
    return None


def install() -> AliasFinder:
    """Put the finder first on ``sys.meta_path`` for this process (the runner's job; refuses over a real SDK)."""
    found = real_sdk()
    if found:
        raise SystemExit(f"neuron_stack.compat: the real SDK's {found!r} is importable here; the compat runner "
                         f"would shadow it, so it will not run (use a virtualenv without the Neuron SDK)")
    finder = AliasFinder()
    sys.meta_path.insert(0, finder)
    return finder
