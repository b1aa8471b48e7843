"""Pass 4, lower and tile: a device partition's graph nodes become NeuronCore instructions.

Every graph value lives in HBM (inputs, weights, intermediates, outputs), as a flat buffer. An op
loads tiles of its inputs into SBUF with DMA (any view - permute, slice, broadcast - is an access
pattern, so view ops cost nothing), computes on the engines, and stores its result tiles back with
DMA. Fused elementwise nodes (``Node.fused_into``) are applied to the host's output tiles while they
are still in SBUF/PSUM (the PSUM-evacuation epilogue), never as separate loads.

Tiling obeys the NeuronCore rules (reference §5.3): at most 128 partitions, Tensor Engine stationary
<=128x128 and moving <=512 free elements accumulating in one 2 KiB PSUM bank, ``bn_stats`` free size
<=512. SBUF tiles come from rotating pools (``bufs=2`` is double buffering: the next tile's DMA runs
while the current one is computed); the pools are carved out of a ring over SBUF, and PSUM banks
out of a ring over the 8 banks, with write-after-read dependencies when a region is reused. When an
op's resident working set does not fit in SBUF, it spills to HBM and the traffic is counted as
``spill_save_bytes`` / ``spill_reload_bytes`` on the ``qSyncSpillReload`` queues.

>>> from neuron_stack.ir import Node, Program, TensorSpec
>>> t = TensorSpec((256, 256), "float32")
>>> prog = Program("g", [Node("x", "placeholder", outputs=[t]),
...     Node("mm", "aten.mm.default", [{"node": "x"}, {"node": "x"}], inputs=[t, t], outputs=[t],
...          op_class="matmul", partition=0)], ["x"], [{"node": "mm"}])
>>> from neuron_stack.device.profiles import get_profile
>>> low = lower(prog, 0, get_profile("trn1"), {})
>>> sorted({i.opcode for i in low.instrs})
['ACTIVATE', 'AFFINE_SELECT', 'DMA_DIRECT2D', 'LDWEIGHTS', 'MATMUL', 'TENSOR_COPY']

Modules, in dependency order: ``tiles`` (instructions, views, tiles, pools, limits) -> ``placement``
(stored dtypes, hoisted broadcast rows, eager layout copies) -> ``resident`` (SBUF residency data) ->
``registry`` (op -> lowering table) -> ``residency`` + ``lowerer`` (the per-partition state and driver)
-> ``common`` -> the op lowerings, each registering itself: ``custom`` (the GpSimd fallback), ``chain``
(elementwise and fused epilogues), ``attention`` (softmax in a matmul's evacuation), ``matmul``,
``convbn``, ``convgeom`` and ``conv`` (convolution in its layouts, with batch norm in its evacuation,
pooling, batch norm),
``rowwise``, ``layout`` (transposing and lane-local copies), ``data``; ``constants`` lays weights out
before lowering.
"""
from __future__ import annotations

# importing the lowering modules registers them (registry.lowering); nothing else imports them
from neuron_stack.compiler.lower import chain, constants, conv, custom, data, matmul, rowwise  # noqa: F401
from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.tiles import Lowered
from neuron_stack.device.profiles import DeviceProfile
from neuron_stack.ir import Program


def lower(program: Program, partition: int, profile: DeviceProfile, flags: dict | None = None,
          detail: bool = True) -> Lowered:
    """Lower the device nodes of ``partition`` to instructions (unscheduled; ``detail=False``: without
    their operands, for a timings-only schedule).

    Example: ``lower(prog, 0, get_profile("trn1"), {"auto_cast": "matmult"}).instrs[0].opcode``.
    """
    return Lowerer(program, partition, profile, flags or {}, detail).run()
