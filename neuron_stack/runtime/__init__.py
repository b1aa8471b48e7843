"""Stage 4, the runtime: load a NEFF on a simulated core and execute it (``model``), the process
session and trace recorder, core reservation (``cores``), data/tensor parallelism (``parallel``),
collectives by the runtime's algorithms (``collectives``) and torchrun (``distributed``).

May import every earlier stage and ``traces``.
"""
