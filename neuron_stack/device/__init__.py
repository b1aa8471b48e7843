"""Stage 0, the device model every stage may import: device profiles (``profiles``), the projected
clock (``clock``) and the engine cost model (``cost``).

Imports nothing from the rest of ``neuron_stack``.
"""
