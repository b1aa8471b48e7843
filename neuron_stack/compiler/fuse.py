"""Pass 3, fuse: elementwise and activation ops that follow a matmul, convolution, normalisation or
another elementwise op in the same device partition, and are its only consumer, are fused into it
(``Node.fused_into`` names the op whose instruction stream carries them: a PSUM-evacuation
epilogue on the Scalar/Vector engine instead of a round trip through HBM).

>>> from neuron_stack.ir import Node, Program, TensorSpec
>>> t = TensorSpec((4, 4), "float32")
>>> nodes = [Node("x", "placeholder", outputs=[t]),
...          Node("mm", "aten.mm.default", [{"node": "x"}, {"node": "x"}], op_class="matmul", partition=0),
...          Node("r", "aten.relu.default", [{"node": "mm"}], op_class="activation", partition=0),
...          Node("o", "output", [[{"node": "r"}]])]
>>> fuse(Program("g", nodes, ["x"], [{"node": "r"}])).node("r").fused_into
'mm'
"""
from __future__ import annotations

from neuron_stack.compiler.partition import refs
from neuron_stack.ir import Program

_FUSABLE = ("elementwise", "activation")
_HOSTS = ("matmul", "conv", "normalization", "elementwise", "activation")


def _host_arg(n, by_name) -> str | None:
    """The argument whose tiles ``n``'s epilogue rides on: the first, except that a
    ``where(mask, -inf, scores)`` over more than one query row per head rides on the scores, not the
    mask, so that the flash-attention lowering applies it on the score tiles (lower/matmul.py
    ``Matmul.flash``); with one row (token generation) the mask's pass carries it, as before."""
    args = list(refs(n.args))
    shape = n.outputs[0].shape if n.outputs else ()
    if n.target == "aten.where.self" and len(shape) >= 2 and shape[-2] > 1:
        full = [a for a in args[1:] if by_name.get(a) is not None and by_name[a].outputs
                and by_name[a].outputs[0].numel == n.outputs[0].numel]
        if full:
            return full[0]
    return args[0] if args else None


def fuse(program: Program) -> Program:
    """Set ``Node.fused_into`` in place and log every fusion. Example: ``fuse(partition(legalize(p)))``."""
    by_name = {n.name: n for n in program.nodes}
    users: dict[str, list[str]] = {}
    for n in program.nodes:
        for r in refs([n.args, n.kwargs]):
            users.setdefault(r, []).append(n.name)
    for n in program.nodes:
        if n.op_class not in _FUSABLE or n.placement != "device":
            continue
        first = _host_arg(n, by_name)
        prod = by_name.get(first) if first else None
        # Look through metadata-only views with a single consumer (addmm -> view -> gelu), and the
        # first element of a tuple op (batch norm -> getitem 0 -> relu).
        while prod is not None and len(users.get(prod.name, [])) == 1 and (
                prod.op_class == "view" and prod.is_compute
                or prod.target == "getitem" and len(prod.args) > 1 and prod.args[1] == 0):
            nxt = next(refs(prod.args), None)
            prod = by_name.get(nxt) if nxt else None
        if (prod is None or not prod.is_compute or prod.placement != "device" or prod.partition != n.partition
                or prod.op_class not in _HOSTS or len(users.get(prod.name, [])) != 1):
            continue
        root = prod.fused_into or prod.name
        n.fused_into = root
        program.log.append(f"fuse: {n.name} {n.target} fused into {root} {by_name[root].target} "
                           f"(epilogue on the {'Scalar' if n.op_class == 'activation' else 'Vector'} engine)")
    return program
