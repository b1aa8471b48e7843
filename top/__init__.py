"""neuron-top: the Textual TUI over neuron-monitor's report (see docs/top.md).

Layout: ``keymap`` (the key table), ``snapshot`` (monitor document -> frozen view data),
``render`` (view data -> text per panel), ``widgets``, ``sources`` (live / replay), ``app``.
"""
