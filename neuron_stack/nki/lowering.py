"""The lowering of an NKI kernel op inside a compiled model: the kernel's own instructions.

Registered in the compiler's lowering registry for op class ``nki`` (``legalize`` gives it to
``torch.ops.nki.*`` nodes). The kernel is traced for the node's input shapes (timing only), and its
instructions are emitted through the compiler's :class:`Lowerer` with the kernel's HBM tensors
renamed to the node's input values and output buffer, and its SBUF/PSUM tiles prefixed with the
node name. DMAs go through the lowerer's DMA path, so an input that stayed resident in SBUF is read
from there, exactly as for a compiled op; engine instructions keep the kernel's costs.

>>> from neuron_stack.compiler.lower.registry import lowering_name
>>> lowering_name("nki.rmsnorm_0123456789.default", "nki")
'nki'
"""
from __future__ import annotations

import copy
import math

from neuron_stack.compiler.lower.registry import lowering
from neuron_stack.compiler.lower.tiles import LoweringError

from .kernel import Spec, run_kernel
from .torch_op import KERNELS


def _kernel_of(target: str):
    name = target.split(".")[1] if target.count(".") >= 2 else target
    if name not in KERNELS:
        raise LoweringError(f"{target}: NKI kernel not registered in this process (import the module that "
                            f"defines it before compiling)")
    return KERNELS[name]


@lowering("nki", op_classes=("nki",))
def lower_nki(low, n) -> None:
    """Emit the kernel's instructions for graph node ``n`` (see the module docstring)."""
    kernel, grid = _kernel_of(n.target)
    k = kernel[grid] if grid != (1,) else kernel
    specs = tuple(Spec(tuple(s.shape), s.dtype) for s in n.inputs)
    run = run_kernel(k, specs, execute=False, target=low.p.name)
    tr = run.trace
    if getattr(tr, "constants", 0):
        raise LoweringError(f"{n.name}: NKI kernel {k.__name__} uses nl.shared_constant, which a captured model "
                            f"cannot carry yet; call the kernel outside the model or pass the constant as an input")
    rename: dict[str, tuple[str, int]] = {}
    params = [name for name, m in tr.hbm.items() if m["role"] == "input"]
    for name, arg in zip(params, n.args):
        v = low.value(arg)
        if not v.meta.is_contiguous():
            raise LoweringError(f"{n.name}: NKI kernel input {name} is a non-contiguous view; make it "
                                f"contiguous (.contiguous()) before the kernel call")
        rename[name] = (v.buf, int(v.meta.storage_offset()))
    outs = run.schedule.outputs
    for i, (name, spec) in enumerate(zip(outs, n.outputs)):
        v = low.out_view(n.name if i == 0 else f"{n.name}:{i}", spec)
        rename[name] = (v.buf, 0)
    for name, m in tr.hbm.items():
        if name not in rename:            # kernel scratch in HBM (private_hbm, unreturned outputs)
            rename[name] = (low.new_scratch(m["dtype"], math.prod(m["shape"]), m["shape"]), 0)

    def operand(o: dict) -> dict:
        o = copy.deepcopy(o)
        if o["m"] == "hbm":
            o["b"], off = rename[o["b"]]
            o["o"] += off
        else:
            o["b"] = f"{n.name}/{o['b']}"
        return o

    # what the runtime needs to compute the op's numbers without this process's kernel registry
    n.kernel = {"inputs": params, "outputs": list(outs), "hbm": {k: {"shape": m["shape"], "dtype": m["dtype"]}
                                                                for k, m in tr.hbm.items()},
                "inits": [[i, op, fill] for i, op, fill in tr.inits],
                "instrs": [[ins.opcode, ins.operands] for ins in tr.instrs]}
    for ins in tr.instrs:
        ops = ins.operands
        dst, src = [operand(o) for o in ops["dst"]], [operand(o) for o in ops["src"]]
        attrs = {k: v for k, v in ops.items() if k not in ("dst", "src")}
        attrs["nki_loc"] = ins.node       # the kernel line, kept with the instruction
        if ins.opcode == "DMA_DIRECT2D" and "rmw" in attrs:
            raise LoweringError(f"{ins.node}: a read-modify-write DMA (nl.atomic_rmw, dma_copy(dst_rmw_op=)) cannot be "
                                f"carried in a captured model yet; call the kernel outside the model")
        if ins.opcode == "DMA_DIRECT2D" and "side" not in attrs:     # (a dynamic start is issued whole, below)
            first = len(low.instrs)
            low.dma(n.name, dst[0], src[0])
            for j in range(first, len(low.instrs)):     # the DMA's pieces and reloads
                low.instrs[j].operands["nki_loc"] = ins.node
                if "nki_iv" in attrs:
                    low.instrs[j].operands["nki_iv"] = attrs["nki_iv"]
        else:
            low.emit(ins.opcode, n.name, dst, src, attrs, dur=ins.dur, flops=ins.flops, itype=ins.itype,
                     small=False)
