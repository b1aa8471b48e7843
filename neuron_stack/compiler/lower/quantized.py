"""Weight-only quantization in the matmul lowering (NxDI's ``quantized``; ``neuron_stack.llm.quantize``): where the
int8/fp8 weight becomes the matmul dtype, and where its per-output-channel scale is applied.

NxDI dequantizes in the traced graph (neuronx_distributed ``quantization/dequantize.py``: ``scale_dequantize``
upcasts the weight and multiplies it by its scale) and leaves the engines to the compiler. Here:

- the conversion is the weight's own DMA: the DMA engines cast when source and destination dtypes differ
  (``nki.isa.dma_copy``, Inf2/Trn1/Trn2: "A cast will happen if the src and dst have different dtype"), and
  NeuronCore-v2's ``nc_matmul`` takes fp8/bf16/fp16/tf32/fp32, not int8, so a conversion is needed somewhere;
  in the DMA it puts no ScalarE or VectorE copy per K-tile on a decode step's critical path (those in-order
  queues also carry its attention and norms). The DMA reads the stored bytes (HBM read counts int8) and writes
  the matmul dtype's; a DMA is charged its larger side, so the queues move what bf16's would;
- the scale multiplies the output (per output channel: ``(x @ W_q) * s == x @ (W_q * s)``): in a decode step
  (few, long output rows) once the output is in the lane layout, one short Vector Engine pass over all 128
  partitions after bf16's ScalarE evacuation (:func:`scale_after_lanes`); elsewhere as the PSUM evacuation
  itself (the Vector Engine reads PSUM as the multiply's operand, :func:`scale_on_evacuation`).
"""
from __future__ import annotations

from neuron_stack.compiler.lower.lowerer import QUANTIZED_DTYPES
from neuron_stack.compiler.lower.resident import lane_layout
from neuron_stack.compiler.lower.tiles import View, packet_name


def casts_in_flight(mm, v: View) -> bool:
    """Whether the load of ``v`` for matmul ``mm`` (a ``matmul.Matmul``) converts in the DMA: a quantized
    weight not held in SBUF."""
    return v.dtype in QUANTIZED_DTYPES and v.dtype != mm.mm_dt and v.buf not in mm.low.res


def scale_on_evacuation(mm) -> bool:
    """Whether ``mm``'s epilogue opens with a multiply by another tensor (a quantized linear's scale), which
    can read the PSUM bank itself instead of a copy out of it first."""
    m = mm.members[0] if mm.members else None
    return bool(m is not None and mm.alpha == 1 and mm.n.name not in mm.out3 and m.extras
                and packet_name(m.node.target) == "mul" and set(m.extras) | {m.idx} == {0, 1})



def scale_after_lanes(low, n, w: View, members) -> bool:
    """Whether matmul ``n`` (weight ``w``) is a quantized linear of a decode step whose per-channel scale is
    applied after its output reaches the lane layout, not in its PSUM evacuation.

    A decode step's ``[batch, hidden]`` output has its channels along the free axis of ``batch`` PSUM rows (x
    is the stationary operand), so the scale cannot be the per-partition ``scale`` operand that ScalarE's
    ``activation`` and VectorE's ``tensor_scalar`` apply for free; multiplying the evacuation by it is a
    ``tensor_tensor`` pass over ``hidden`` elements on one partition (~0.9 ns an element on VectorE, the
    bf16 copy's ScalarE pass 0.7), on the layer's critical chain for every 512-column bank. Across the 128
    lanes (:func:`.resident.lane_layout`: ``hidden / 128`` elements a partition) the same multiply is one
    short instruction, and the evacuation stays bf16's ScalarE copy. Example: true for Llama-3-8B's int8
    ``down_proj`` at batch 1 (``[1, 4096]`` out, ``scale`` ``[4096]``), false for the same in a prefill."""
    m = members[0]
    if w.dtype not in QUANTIZED_DTYPES or lane_layout(tuple(n.outputs[0].shape)) is None \
            or packet_name(m.node.target) != "mul" or set(m.extras) | {m.idx} != {0, 1}:
        return False
    scale = low.value(m.node.args[1 - m.idx])
    return tuple(scale.shape) == (n.outputs[0].shape[-1],)
