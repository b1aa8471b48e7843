"""The lowering registry: which function lowers which op, as a table filled by a decorator.

Each op lowering registers itself with :func:`lowering`, naming the ATen packets (``"mm"`` for
``aten.mm.default``) and/or the op classes (``legalize`` assigns them) it handles. Finding an op's
lowering is a table lookup, most specific key first: (packet, class), then (packet, any class),
then (any packet, class); ops with no entry run as the generic GpSimd kernel (the fallback,
registered with neither). Registering the same key twice is an error.

>>> sorted(e.name for e in set(LOWERINGS.values()))[:3]        # doctest: +SKIP
['batch_norm', 'collective', 'conv']
>>> lowering_name("aten.addmm.default", "matmul"), lowering_name("aten.sort.default", "data_movement")
('matmul', 'custom')
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: ``(lowerer, node) -> None``: emits the node's instructions through the lowerer.
LowerFn = Callable[[Any, Any], None]


@dataclass(frozen=True)
class Lowering:
    name: str                                  # short name, e.g. "matmul" (logs, tests)
    fn: LowerFn
    alone: LowerFn | None = None               # how to lower the op outside a fused chain (default: fn)


#: (packet or None, op class or None) -> Lowering. None matches anything.
LOWERINGS: dict[tuple[str | None, str | None], Lowering] = {}
#: Passes run over a partition before any node is lowered (weight layouts), in registration order.
PREPARE_PASSES: list[Callable[[Any], None]] = []


def lowering(name: str, *, ops: Iterable[str] | None = None, op_classes: Iterable[str] | None = None,
             alone: LowerFn | None = None) -> Callable[[LowerFn], LowerFn]:
    """Register the decorated function as the lowering of ``ops`` (ATen packets) x ``op_classes``.

    Example: ``@lowering("matmul", ops=("mm", "addmm"), op_classes=("matmul",))``.
    """
    def register(fn: LowerFn) -> LowerFn:
        keys = [(op, cls) for op in (list(ops) if ops is not None else [None])
                for cls in (list(op_classes) if op_classes is not None else [None])]
        for key in keys:       # all or nothing: a refused registration leaves the table as it was
            if key in LOWERINGS:
                raise ValueError(f"lowering {name!r}: {key} is already lowered by {LOWERINGS[key].name!r}")
        entry = Lowering(name, fn, alone)
        LOWERINGS.update(dict.fromkeys(keys, entry))
        return fn
    return register


def prepare_pass(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    """Register ``fn(lowerer)`` to run before a partition's nodes are lowered."""
    PREPARE_PASSES.append(fn)
    return fn


def packet_of(target: str) -> str:
    """``aten.addmm.default`` -> ``addmm`` (non-ATen targets stay whole)."""
    parts = target.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else target


def lookup(target: str, op_class: str) -> Lowering:
    """The lowering of an op, most specific key first (see the module docstring)."""
    op = packet_of(target)
    for key in ((op, op_class), (op, None), (None, op_class), (None, None)):
        entry = LOWERINGS.get(key)
        if entry is not None:
            return entry
    raise LookupError(f"no lowering for {target} ({op_class}) and no fallback registered: "
                      "import neuron_stack.compiler.lower, which registers every lowering")


def lowering_name(target: str, op_class: str) -> str:
    """The name of the lowering an op gets. Example in the module docstring."""
    return lookup(target, op_class).name


def named(name: str) -> Lowering:
    """The registered lowering called ``name`` (e.g. ``"copy"``)."""
    for entry in LOWERINGS.values():
        if entry.name == name:
            return entry
    raise LookupError(f"no lowering named {name!r}")


def lower_node_alone(low, node) -> None:
    """Lower ``node`` on its own (a fused node whose host could not take it as an epilogue)."""
    entry = lookup(node.target, node.op_class)
    (entry.alone or entry.fn)(low, node)


def lower_alone(low, nodes) -> None:
    """:func:`lower_node_alone` for each of ``nodes``, in order."""
    for n in nodes:
        lower_node_alone(low, n)
