"""Stage 1, the device contract: the ISA as data (``instructions``), the interpreter that specifies
each opcode (``interp``) and the NEFF archive format (``neff``).

May import :mod:`neuron_stack.ir` and :mod:`neuron_stack.device`.
"""
