"""Stage 3, the compiler: ``driver`` runs the passes in order: ``legalize`` (over the ``operators``
table) -> ``partition`` -> ``fuse`` -> ``lower`` (a package; per-op lowerings found through its
registry) -> ``schedule`` (or ``roofline``) -> the NEFF; ``cache`` is the persistent compile cache.

May import ``ir``, ``device``, ``isa``, ``frontend`` and ``traces``; never a tool: a tool that
wants to see every graph registers a hook in ``hooks``.
"""
