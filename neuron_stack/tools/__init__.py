"""Stage 5, the command-line tools: ``neuron_cc`` (``neuron-cc``), ``neuron_ls`` (``neuron-ls``),
``capture`` (``python -m neuron_stack.tools.capture``, run by ``neuron-explorer capture``) and
``parallel_compile`` (``neuron_parallel_compile``).

May import every earlier stage; nothing before imports a tool.
"""
