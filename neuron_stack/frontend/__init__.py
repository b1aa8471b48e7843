"""Stage 2, the front end: capture with ``torch.export`` into :class:`neuron_stack.ir.Program`
(``export``) and the ``neuronx-cc`` flags (``flags``).

May import :mod:`neuron_stack.ir`, ``device`` and ``isa``.
"""
