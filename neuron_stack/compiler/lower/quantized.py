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
- the scale multiplies the output (per output channel: ``(x @ W_q) * s == x @ (W_q * s)``) as the PSUM
  evacuation itself (the Vector Engine reads PSUM as the multiply's operand).
"""
from __future__ import annotations

from neuron_stack.compiler.lower.lowerer import QUANTIZED_DTYPES
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

