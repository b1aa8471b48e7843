"""Shared helpers of the sample workloads: the ``--small`` flag, the explanation paragraph, and the
eager-vs-compiled check (DESIGN.md §7 tolerances: fp32 rtol 1e-4; bf16 auto-cast rel-norm < 1e-2).

>>> import torch
>>> check("demo", torch.ones(3), torch.ones(3) * (1 + 1e-6))
demo: OK vs eager PyTorch (max relative error 9.54e-07)
True
"""
from __future__ import annotations

import argparse
import sys
import textwrap

import torch


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


def check(name: str, got, want, auto_cast: str = "none") -> bool:
    """Compare compiled and eager outputs; print the verdict. fp32: rtol 1e-4; bf16: rel-norm < 1e-2."""
    got_l = [t for t in torch.utils._pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
    want_l = [t for t in torch.utils._pytree.tree_leaves(want) if isinstance(t, torch.Tensor)]
    ok = len(got_l) == len(want_l) and len(got_l) > 0
    worst = 0.0
    for g, w in zip(got_l, want_l):
        g, w = g.detach().float(), w.detach().float()
        if g.shape != w.shape:
            ok = False
            continue
        if auto_cast != "none":
            err = ((g - w).norm() / w.norm().clamp_min(1e-12)).item()
            ok &= err < 1e-2
        else:
            err = ((g - w).abs() / (w.abs() + 1e-5)).max().item() if g.numel() else 0.0
            ok &= torch.allclose(g, w, rtol=1e-4, atol=1e-5)
        worst = max(worst, err)
    metric = "rel-norm error" if auto_cast != "none" else "max relative error"
    print(f"{name}: {'OK' if ok else 'MISMATCH'} vs eager PyTorch ({metric} {worst:.2e})")
    return ok


def finish(ok: bool) -> None:
    """Exit non-zero when the compiled outputs differ from eager PyTorch."""
    if not ok:
        print("error: compiled outputs differ from eager PyTorch", file=sys.stderr)
        sys.exit(1)
