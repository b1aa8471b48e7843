"""Shared helpers of the sample workloads: the ``--small`` flag, the explanation paragraph, and the
eager-vs-compiled check (DESIGN.md §7 tolerances: fp32 rtol 1e-4; bf16 auto-cast rel-norm < 1e-2).

Each verdict names the comparison it made, so a reader knows what "OK" means:

>>> import torch
>>> check("demo", torch.ones(3), torch.ones(3) * (1 + 1e-6))
demo: OK vs eager PyTorch (fp32, element-wise rtol 1e-4 atol 1e-5: max relative error 8.67e-07)
True
>>> check("demo", torch.ones(3), torch.ones(3) * 1.002, "matmult")
demo: OK vs eager PyTorch (bf16 auto-cast, relative norm error < 1e-2: 2.00e-03)
True
>>> check("weights", torch.tensor([1.0, 1e-3]), torch.tensor([1.0, 1.04e-3]), measure="norm")
weights: OK vs eager PyTorch (fp32, relative norm error < 1e-4: 4.00e-05)
True
"""
from __future__ import annotations

import argparse
import sys
import textwrap

import torch

#: fp32: element-wise ``allclose(rtol=1e-4, atol=1e-5)``; a whole tensor (``measure="norm"``): ||g-w|| / ||w||.
FP32_RTOL, FP32_ATOL, FP32_NORM = 1e-4, 1e-5, 1e-4
#: bf16 auto-cast: ||g-w|| / ||w|| per tensor (element-wise bounds mean nothing at 8 mantissa bits).
BF16_NORM = 1e-2


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with ``--small`` (the quick mode the tests use) and ``--auto-cast``."""
    p = argparse.ArgumentParser(description=description.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="tiny sizes for a quick run (used by the tests)")
    p.add_argument("--auto-cast", choices=("none", "matmult", "all"), default="none",
                   help="neuronx-cc --auto-cast: matmul inputs in bf16 with fp32 accumulation")
    p.add_argument("--target", choices=("trn1", "inf2", "trn2"), default="trn1")
    return p


def explain(doc: str) -> None:
    """Print the workload's explanation: its docstring after the first paragraph (the ``--help`` line)."""
    print(textwrap.fill(" ".join(doc.split("\n\n", 1)[1].split()), width=100))
    print()


def _short(bound: float) -> str:
    return f"{bound:.0e}".replace("e-0", "e-")     # 1e-4, as the docs write it


def _norm_error(g: torch.Tensor, w: torch.Tensor) -> float:
    return ((g - w).norm() / w.norm().clamp_min(1e-12)).item()


def check(name: str, got, want, auto_cast: str = "none", measure: str = "elementwise") -> bool:
    """Compare compiled and eager tensors (any pytree of them); print the verdict and the comparison made.

    fp32, ``measure="elementwise"`` (outputs of a compiled graph): ``allclose(rtol=1e-4, atol=1e-5)``.
    fp32, ``measure="norm"`` (values an eager step computed from compiled outputs, e.g. weights after an
    optimizer): relative norm error per tensor < 1e-4. bf16 auto-cast: relative norm error < 1e-2.
    Examples in the module docstring.
    """
    got_l = [t for t in torch.utils._pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
    want_l = [t for t in torch.utils._pytree.tree_leaves(want) if isinstance(t, torch.Tensor)]
    ok = len(got_l) == len(want_l) and len(got_l) > 0
    by_norm = auto_cast != "none" or measure == "norm"
    bound = BF16_NORM if auto_cast != "none" else FP32_NORM
    worst = 0.0
    for g, w in zip(got_l, want_l):
        g, w = g.detach().float(), w.detach().float()
        if g.shape != w.shape:
            ok = False
            continue
        if by_norm:
            err = _norm_error(g, w) if g.numel() else 0.0
            ok &= err < bound
        else:
            # |g-w| / (|w| + atol/rtol) < rtol is exactly allclose's test, so the figure printed decides
            err = ((g - w).abs() / (w.abs() + FP32_ATOL / FP32_RTOL)).max().item() if g.numel() else 0.0
            ok &= err < FP32_RTOL
        worst = max(worst, err)
    precision = "bf16 auto-cast" if auto_cast != "none" else "fp32"
    how = (f"relative norm error < {_short(bound)}: {worst:.2e}" if by_norm
           else f"element-wise rtol {_short(FP32_RTOL)} atol {_short(FP32_ATOL)}: max relative error {worst:.2e}")
    # flushed: a run logged to a file (the walkthrough's live.log) shows each verdict as it is made
    print(f"{name}: {'OK' if ok else 'MISMATCH'} vs eager PyTorch ({precision}, {how})", flush=True)
    return ok


def finish(ok: bool) -> None:
    """Exit non-zero when the compiled outputs differ from eager PyTorch."""
    if not ok:
        print("error: compiled outputs differ from eager PyTorch", file=sys.stderr)
        sys.exit(1)
