"""The geometry a convolution's shifted matmuls run over (used by ``conv.py``).

Every convolution is lowered as the same loop: a band of input rows, contraction dims on partitions, one
``MATMUL`` per kernel tap accumulating in PSUM. Three layouts feed it:

* **direct** — input channels on partitions, every (kh, kw) a tap.
* **patches** — a stride that equals the kernel height with no padding (ViT's 16x16 stride-16 patch
  embedding): rows of different patches never overlap, so each kernel row is its own partition row.
  The input is read as ``[B, C, KH, OH, W]`` (partition ``(c, kh)`` holds input rows ``kh, KH + kh, ...``:
  one DMA of whole rows, the im2col of the patches' rows), the taps are the KW columns only, and the
  contraction over ``C x KH`` (48 rows for RGB 16x16 patches, not 3) runs on the PE array: the weights
  are ``[C x KH, KW x O]`` (24 KiB a partition in bf16 for ViT-base, where the direct layout needed
  ``[3, 256 x 768]``, 384 KiB, past SBUF).
* **transposed** — ``conv_transpose(x, w, s, p, output_padding)`` is a stride-1 convolution of ``x`` with
  ``s - 1`` zeros inserted between its pixels, padded ``d (K - 1) - p`` on each side (plus the output
  padding at the end), with the kernel flipped and its in/out channels swapped (Dumoulin & Visin, *A guide
  to convolution arithmetic for deep learning*, §4; PyTorch's ``ConvTranspose2d`` docs). The zeros are a
  ``MEMSET`` of the band and the pixels a strided copy into it; the flip is which weight column each tap
  reads, so the weights load as stored (``[Cin, KH, KW, Cout]`` with input channels on partitions).

>>> g = direct_geometry((1, 8, 10, 10), (4, 8, 3, 3), [1, 1], [1, 1], [1, 1], 1)
>>> (g.OH, g.OW, g.Wp, g.tap_col(0, 0), len(g.cboxes))
(10, 10, 12, 0, 1)
>>> t = transposed_geometry((1, 8, 5, 5), (8, 4, 2, 2), [2, 2], [0, 0], [1, 1], [0, 0], 1)
>>> (t.OH, t.OW, t.up, t.ph, t.tap_col(0, 0))
(10, 10, (2, 2), 1, 3)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from neuron_stack.compiler.lower.tiles import PMAX, boxes


@dataclass
class ConvGeometry:
    """One convolution as the band loop runs it; x and w dims are the views built by ``views``."""

    kind: str                   # direct | patches | transposed
    G: int                      # groups
    Og: int                     # output channels per group
    cboxes: list                # partition boxes of one group's contraction dims (x view, after batch)
    KH: int
    KW: int
    sh: int
    sw: int
    dh: int
    dw: int
    ph: int                     # zero rows above the (upsampled) input
    pw: int                     # zero columns left of it
    Hin: int                    # input rows of the band's view (before upsampling)
    Win: int
    Wp: int                     # band width: left pad + upsampled width + right pad
    OH: int
    OW: int
    up: tuple = (1, 1)          # zeros inserted: (row step, column step) of the input in the band
    tap_col: Callable = None    # (kh, kw) -> tap index of the weight tile's columns (x Og)

    @property
    def wF(self) -> int:
        """Free size of one resident weight tile: every tap's Og columns."""
        return self.KH * self.KW * self.Og


def direct_geometry(xs, ws, stride, padding, dilation, groups) -> ConvGeometry:
    """Input channels on partitions, every (kh, kw) a tap (the module docstring)."""
    B, C, H, W = xs
    O, Cg, KH, KW = ws
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    OH = (H + 2 * ph - dh * (KH - 1) - 1) // sh + 1
    OW = (W + 2 * pw - dw * (KW - 1) - 1) // sw + 1
    cb = [[(c0, min(PMAX, Cg - c0))] for c0 in range(0, Cg, PMAX)]
    return ConvGeometry("direct", groups, O // groups, cb, KH, KW, sh, sw, dh, dw, ph, pw, H, W, W + 2 * pw,
                        OH, OW, tap_col=lambda kh, kw: kh * KW + kw)


def patch_geometry(xs, ws, stride, padding, dilation, groups) -> ConvGeometry | None:
    """Kernel rows on partitions beside the channels when the row stride equals the kernel height and
    nothing pads or dilates the rows (patches that do not overlap), else None."""
    B, C, H, W = xs
    O, Cg, KH, KW = ws
    if groups != 1 or KH < 2 or stride[0] != KH or padding[0] != 0 or dilation[0] != 1 or C >= PMAX \
            or H < KH:
        return None
    sw, pw, dw = stride[1], padding[1], dilation[1]
    OH = H // KH
    OW = (W + 2 * pw - dw * (KW - 1) - 1) // sw + 1
    return ConvGeometry("patches", 1, O, boxes((C, KH), PMAX), 1, KW, 1, sw, 1, dw, 0, pw, OH, W, W + 2 * pw,
                        OH, OW, tap_col=lambda kh, kw: kw)


def transposed_geometry(xs, ws, stride, padding, dilation, output_padding, groups) -> ConvGeometry | None:
    """The stride-1 convolution over the zero-upsampled input (module docstring); None when the padding
    crops more than the kernel reaches (``p > d (K - 1)``), which this layout does not express."""
    B, C, H, W = xs
    Cin, Og, KH, KW = ws
    (sh, sw), (dh, dw) = stride, dilation
    ph, pw = (d * (k - 1) - p for d, k, p in zip(dilation, (KH, KW), padding))
    oph, opw = output_padding
    if ph < 0 or pw < 0:
        return None
    Hu, Wu = (H - 1) * sh + 1, (W - 1) * sw + 1
    OH = Hu + 2 * ph + oph - dh * (KH - 1)
    OW = Wu + 2 * pw + opw - dw * (KW - 1)
    Cg = Cin // groups
    cb = [[(c0, min(PMAX, Cg - c0))] for c0 in range(0, Cg, PMAX)]
    return ConvGeometry("transposed", groups, Og, cb, KH, KW, 1, 1, dh, dw, ph, pw, H, W, Wu + 2 * pw + opw,
                        OH, OW, up=(sh, sw), tap_col=lambda kh, kw: (KH - 1 - kh) * KW + (KW - 1 - kw))


def views(g: ConvGeometry, x, w):
    """(x view, w view, x partition dims, w partition dims): x as ``[B, *partition dims, rows, W]``, w as
    ``[*partition dims, taps..., Og or O]`` (meta tensors; None for x when it cannot be viewed so)."""
    if g.kind == "patches":
        B, C, H, W = x.shape
        KH = w.shape[2]
        try:
            xm = x.narrow(2, 0, g.OH * KH).view(B, C, g.OH, KH, W).permute(0, 1, 3, 2, 4)
        except RuntimeError:            # strides that do not split: the direct layout instead
            return None, None, 0, 0
        return xm, w.permute(1, 2, 3, 0), 2, 2          # [B, C, KH, OH, W], [C, KH, KW, O]
    if g.kind == "transposed":
        return x, w.permute(0, 2, 3, 1), 1, 1           # [Cin, KH, KW, Og]
    return x, w.permute(1, 2, 3, 0), 1, 1               # [Cg, KH, KW, O]


def x_box(g: ConvGeometry, grp: int, cbox: list) -> list:
    """The partition box of group ``grp``'s block ``cbox`` in the x view."""
    if g.kind == "patches":
        return list(cbox)
    return [(grp * cbox_channels(g) + cbox[0][0], cbox[0][1])]


def w_box(g: ConvGeometry, grp: int, cbox: list) -> list:
    """The box of the weight view that block ``cbox`` of group ``grp`` multiplies: a [P, wF] tile."""
    if g.kind == "patches":
        return list(cbox) + [(0, g.KW), (0, g.Og)]
    if g.kind == "transposed":
        return [(grp * cbox_channels(g) + cbox[0][0], cbox[0][1]), (0, g.KH), (0, g.KW), (0, g.Og)]
    return [cbox[0], (0, g.KH), (0, g.KW), (grp * g.Og, g.Og)]


def cbox_channels(g: ConvGeometry) -> int:
    """Input channels per group (the last block's end)."""
    s, n = g.cboxes[-1][0]
    return s + n
