"""``neuronxcc`` under the compat runner: the compiler package the legacy NKI lived in (``neuronxcc.nki``).
Only its NKI is simulated; ``neuronxcc.nki`` and its submodules resolve to :mod:`neuron_stack.nki`."""
from __future__ import annotations

from neuron_stack import nki  # noqa: F401  (``from neuronxcc import nki``)

__version__ = "0+neuron_stack"     # not a real neuronxcc release: this stack stands in for it
