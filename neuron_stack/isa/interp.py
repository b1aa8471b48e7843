"""The ISA interpreter: executes a scheduled partition's instructions on numpy SBUF/PSUM/HBM memory.

It is the specification of the ISA (:mod:`neuron_stack.isa.instructions`): each opcode's meaning is the
function registered for it here. Memory is flat per buffer; an operand's access pattern
(``{"m", "b", "dt", "o", "ap"}``) becomes a strided numpy view, so the interpreter sees exactly
the tiles, partitions and PSUM accumulations the lowering produced; a tiling bug changes the
numbers. Floating-point buffers are held in fp32 and rounded to bf16/fp16 when written with that
dtype (the engines compute in fp32); PSUM is fp32.

>>> import numpy as np, torch
>>> from neuron_stack.frontend.export import capture
>>> from neuron_stack.compiler.legalize import legalize
>>> from neuron_stack.compiler.partition import partition
>>> from neuron_stack.compiler.fuse import fuse
>>> from neuron_stack.compiler.schedule import build_schedule
>>> from neuron_stack.device.profiles import get_profile
>>> m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
>>> x = torch.randn(3, 8)
>>> prog = fuse(partition(legalize(capture(m, (x,)))))
>>> s = build_schedule(prog, 0, get_profile("trn1"), {})
>>> out = run_program(prog, {"input": x.numpy()}, {0: s})
>>> bool(np.allclose(out[0], m(x).detach().numpy(), rtol=1e-4, atol=1e-5))
True
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from neuron_stack.ir import Partition, Program
from neuron_stack.isa.functions import InterpError, activation, alu, as_tensor, aten_call
from neuron_stack.isa.memory import _ROUNDED, Memory

#: fp32 ALU ops a TENSOR_TENSOR may write straight into its destination (same dst or a disjoint one)
_INTO = {"add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "maximum": torch.maximum,
         "minimum": torch.minimum}

def _p2(a: np.ndarray) -> np.ndarray:
    """An operand value as [partitions, free]."""
    return a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)


def _scalar(ops: dict, key: str, srcs: list[np.ndarray]):
    v = ops.get(key)
    if isinstance(v, dict) and "src" in v:
        return as_tensor(_p2(srcs[v["src"]])[:, :1].astype(np.float32))
    return v


# ---------------------------------------------------------------------------------------------

class Machine:
    """One NeuronCore's memories plus the Tensor Engine's loaded stationary tile."""

    def __init__(self):
        self.mem = Memory()
        self.vacc = None                                        # Vector Engine accumulator registers, one per lane
        self.rng = np.random.Generator(np.random.PCG64(0))      # Vector Engine PRNG (reseeded by RNG_SEED)

    def step(self, opcode: str, ops: dict) -> None:
        fn = getattr(self, "op_" + opcode, None)
        if fn is None:
            raise InterpError(f"no semantics for opcode {opcode}")
        fn(ops)

    # DMA
    def _copy(self, dst: dict, src: dict) -> bool:
        """``dst = src`` view to view when nothing needs rounding on the way (numpy copes with overlap)."""
        if src["dt"] != dst["dt"] and dst["dt"] in _ROUNDED:
            return False
        d, s = self.mem.view(dst), self.mem.view(src)
        if s.size != d.size:
            raise InterpError(f"write of {s.size} elements into an operand of {d.size}")
        np.copyto(d, s.reshape(d.shape), casting="unsafe")
        return True

    def op_DMA_DIRECT2D(self, o):
        src, dst = o["src"][0], o["dst"][0]
        if o.get("side"):       # a dynamic start address (hardware/software DGE): the offset is read now
            src, dst = self._moved(o, src, dst)
        if not o.get("rmw") and self._copy(dst, src):
            return
        val = self.mem.read(src).reshape(-1)
        if o.get("rmw"):        # read-modify-write of dst by the DMA engine (fp32 math, nl.atomic_rmw)
            old = self.mem.read(dst).reshape(-1)
            val = alu(o["rmw"], as_tensor(old.astype(np.float32)), as_tensor(val.astype(np.float32))).numpy()
        self.mem.write(dst, val)

    def _moved(self, o, src, dst):
        """(src, dst) with the ``side`` operand's offset moved by ``stride`` x the value in ``src[1]``, read when
        the instruction runs and checked against 0..``limit``."""
        v = int(_p2(self.mem.read(o["src"][1])).reshape(-1)[0])
        if not 0 <= v <= o["limit"]:
            raise InterpError(f"dynamic offset {v} read from SBUF is outside 0..{o['limit']} of the tensor")
        moved = dict(src if o["side"] == "src" else dst)
        moved["o"] += v * o["stride"]
        return (moved, dst) if o["side"] == "src" else (src, moved)

    def op_DMA_COMPUTE(self, o):
        self.mem.write(o["dst"][0], sum(self.mem.read(s).reshape(-1).astype(np.float32) for s in o["src"]))

    def op_DMA_INDIRECT(self, o):
        table, idx = self.mem.read(o["src"][0]), self.mem.read(o["src"][1]).reshape(-1).astype(np.int64)
        if len(idx) and not 0 <= int(idx.min()) <= int(idx.max()) < len(table):
            raise InterpError(f"indirect DMA row {int(idx.max()) if idx.max() >= len(table) else int(idx.min())} "
                              f"read from SBUF is outside 0..{len(table) - 1} of the table")
        self.mem.write(o["dst"][0], table[idx])

    def op_GATHER(self, o):
        pass  # descriptor generation for the following DMA_INDIRECT: no data of its own

    def op_EVENT_SEMAPHORE(self, o):
        pass

    # Tensor Engine
    def op_LDWEIGHTS(self, o):
        self.stationary = o["src"][0]     # MATMUL names its stationary operand again: nothing to copy here

    def op_MATMUL(self, o):
        if o.get("transpose"):      # the PE array's transpose mode moves data, no multiply: lanes a mask left unwritten
            self.mem.write(o["dst"][0], np.ascontiguousarray(_p2(self.mem.read(o["src"][0])).T).astype(np.float32))
            return                  # (NaN here) stay in their own column instead of spreading through a product
        stat = as_tensor(_p2(self.mem.view(o["src"][0])).astype(np.float32, copy=False))
        mov = as_tensor(_p2(self.mem.view(o["src"][1])).astype(np.float32, copy=False))
        dst = o["dst"][0]
        start = o.get("start", True)
        if dst["dt"] not in _ROUNDED:       # PSUM is fp32: the product lands in (or adds into) it directly
            d = self.mem.view(dst)
            if d.dtype == np.float32 and d.ndim == 2 and d.shape == (stat.shape[1], mov.shape[1]):
                acc = torch.from_numpy(d)
                # torch, not numpy: one BLAS thread pool (numpy's OpenBLAS and torch's pool spin against each other)
                torch.mm(stat.T, mov, out=acc) if start else acc.addmm_(stat.T, mov)
                return
        res = (stat.T @ mov).numpy()
        if not start:
            res = res + _p2(self.mem.read(dst))
        self.mem.write(dst, res)

    # Vector Engine
    def op_TENSOR_TENSOR(self, o):
        if "aten" in o:     # an aten op may return a view of its input: copies
            srcs = [self.mem.read(s) for s in o["src"]]
            shape = _p2(srcs[0]).shape
            res = aten_call(o["aten"], o["args"], o.get("kwargs"), [as_tensor(_p2(s)) for s in srcs])
            self.mem.write(o["dst"][0], res.numpy().reshape(shape) if hasattr(res, "numpy") else res)
            return
        # views, not copies: the ALU's result is a new tensor before it is written
        a, b = (as_tensor(_p2(self.mem.view(s))) for s in o["src"][:2])
        dst = o["dst"][0]
        if (o["op"] in _INTO and dst["dt"] == "float32" and a.dtype == b.dtype == torch.float32
                and all(s["b"] != dst["b"] or (s["o"], s["ap"]) == (dst["o"], dst["ap"]) for s in o["src"])):
            d = self.mem.view(dst)
            if d.dtype == np.float32 and d.shape == tuple(a.shape) == tuple(b.shape):
                _INTO[o["op"]](a, b, out=torch.from_numpy(d))     # straight into dst (fp32: nothing to round)
                return
        self.mem.write(dst, alu(o["op"], a, b).numpy())

    def op_TENSOR_SCALAR(self, o):
        srcs = [self.mem.read(s) for s in o["src"]]
        x = as_tensor(_p2(srcs[0]))
        x = alu(o["op0"], x, _scalar(o, "scalar0", srcs))
        if o.get("op1"):
            x = alu(o["op1"], x, _scalar(o, "scalar1", srcs))
        self.mem.write(o["dst"][0], x.numpy())
        if len(o["dst"]) > 1:       # tensor_scalar_reduce: the result also reduced along free
            self._accumulate(o, x)

    def op_TENSOR_COPY(self, o):
        if not self._copy(o["dst"][0], o["src"][0]):
            self.mem.write(o["dst"][0], self.mem.read(o["src"][0]))

    def op_TENSOR_COPY_DYNAMIC(self, o):
        src, dst = self._moved(o, o["src"][0], o["dst"][0])
        self.mem.write(dst, self.mem.read(src))

    def op_REDUCE(self, o):
        x = as_tensor(_p2(self.mem.read(o["src"][0])))
        if o.get("inner"):      # only the innermost axes of the access pattern: one result per outer index
            x = x.reshape(-1, o["inner"])
        op = o["op"]
        if op == "add":
            r = x.sum(dim=1, keepdim=True,
                      dtype=torch.float32 if x.is_floating_point() or x.dtype == torch.bool else None)
        elif op == "max":
            r = x.amax(dim=1, keepdim=True)
        elif op == "min":
            r = x.amin(dim=1, keepdim=True)
        elif op == "multiply":
            r = x.prod(dim=1, keepdim=True)
        elif op in ("logical_and", "logical_or"):
            r = (x != 0).all(dim=1, keepdim=True) if op == "logical_and" else (x != 0).any(dim=1, keepdim=True)
        else:
            raise InterpError(f"unknown reduce op {op!r}")
        self.mem.write(o["dst"][0], r.numpy())

    def op_BN_STATS(self, o):
        x = _p2(self.mem.read(o["src"][0])).astype(np.float64)
        # a 6-wide destination gets the NKI form: one record for the even, one for the odd elements
        parts = [x[:, 0::2], x[:, 1::2]] if np.prod([n for _, n in o["dst"][0]["ap"][1:]]) == 6 else [x]
        recs = []
        for part in parts:
            n = part.shape[1]
            mean = part.mean(axis=1) if n else np.zeros(len(part))
            recs += [np.full_like(mean, n), mean, ((part - mean[:, None]) ** 2).sum(axis=1)]
        self.mem.write(o["dst"][0], np.stack(recs, axis=1))

    def op_TRANSPOSE(self, o):
        self.mem.write(o["dst"][0], _p2(self.mem.read(o["src"][0])).T)

    def op_BN_AGGR(self, o):
        s = _p2(self.mem.read(o["src"][0])).astype(np.float64).reshape(-1, o["src"][0]["ap"][-1][1] // 3, 3)
        n, mean, m2 = s[..., 0], s[..., 1], s[..., 2]
        N = n.sum(axis=1)
        mu = (n * mean).sum(axis=1) / N
        M2 = m2.sum(axis=1) + (n * (mean - mu[:, None]) ** 2).sum(axis=1)
        self.mem.write(o["dst"][0], np.stack([mu, M2 / N], axis=1))

    def op_RECIPROCAL(self, o):
        self.mem.write(o["dst"][0], 1.0 / self.mem.read(o["src"][0]).astype(np.float32))

    def op_MEMSET(self, o):
        d = self.mem.view(o["dst"][0])
        if o["dst"][0]["dt"] not in _ROUNDED:
            d[...] = o["value"]
            return
        self.mem.write(o["dst"][0], np.full(d.shape, o["value"]))

    def op_COPY_PREDICATED(self, o):
        a, mask, old = (self.mem.read(s) for s in o["src"])
        a = np.broadcast_to(a.reshape(old.shape) if a.size == old.size else a, old.shape)
        self.mem.write(o["dst"][0], np.where((mask.reshape(old.shape) != 0) != bool(o.get("reverse")), a, old))

    def op_TENSOR_SCAN(self, o):
        x = _p2(self.mem.read(o["src"][0]))
        self.mem.write(o["dst"][0], np.cumsum(x, axis=1) if o.get("op", "add") == "add" else np.cumprod(x, axis=1))

    def op_TENSOR_TENSOR_SCAN(self, o):
        srcs = [self.mem.read(s) for s in o["src"]]
        a, b = (as_tensor(_p2(s).astype(np.float32)) for s in srcs[:2])
        prev = _scalar(o, "initial", srcs)
        prev = prev if isinstance(prev, torch.Tensor) else torch.full((a.shape[0], 1), float(prev))
        out = torch.empty_like(a)
        for i in range(a.shape[1]):         # a true scan: each column needs the previous result
            prev = alu(o["op1"], alu(o["op0"], a[:, i:i + 1], prev), b[:, i:i + 1])
            out[:, i:i + 1] = prev
        self.mem.write(o["dst"][0], out.numpy())

    def op_SCALAR_TENSOR_TENSOR(self, o):
        srcs = [self.mem.read(s) for s in o["src"]]
        x = alu(o["op0"], as_tensor(_p2(srcs[0]).astype(np.float32)), _scalar(o, "scalar0", srcs))
        self.mem.write(o["dst"][0], alu(o["op1"], x, as_tensor(_p2(srcs[1]).astype(np.float32))).numpy())

    def _vector_acc(self, o, res: np.ndarray) -> None:
        """The running max of the Vector Engine accumulators (``reduce_cmd``) and its read-out into dst[1]."""
        cmd = o.get("reduce_cmd", "idle")
        if cmd in ("reset", "reset_reduce") or self.vacc is None or len(self.vacc) != len(res):
            self.vacc = np.full(len(res), -np.inf, np.float32)
        if cmd in ("reduce", "reset_reduce"):
            self.vacc = np.maximum(self.vacc, res.max(axis=1))
        if len(o["dst"]) > 1:
            self.mem.write(o["dst"][1], self.vacc[:, None])

    def op_SELECT_REDUCE(self, o):
        srcs = [self.mem.read(s) for s in o["src"]]
        pred = (_p2(srcs[0]) != 0) != bool(o.get("reverse_pred"))
        fill = _scalar(o, "on_false", srcs)
        res = np.where(pred, _p2(srcs[1]).astype(np.float32), fill.numpy() if isinstance(fill, torch.Tensor) else fill)
        self.mem.write(o["dst"][0], res)
        self._vector_acc(o, res)

    def op_RANGE_SELECT(self, o):
        srcs = [self.mem.read(s) for s in o["src"]]
        x = _p2(srcs[0]).astype(np.float32)
        i = np.float32(o["range_start"]) + np.arange(x.shape[1], dtype=np.float32)[None, :]
        cmp = {"equal": np.equal, "less": np.less, "less_equal": np.less_equal, "greater": np.greater,
               "greater_equal": np.greater_equal}
        b0, b1 = (_scalar(o, k, srcs).numpy() for k in ("bound0", "bound1"))
        res = np.where(cmp[o["cmp0"]](i, b0) & cmp[o["cmp1"]](i, b1), x, np.float32(o["on_false"]))
        self.mem.write(o["dst"][0], res)
        self._vector_acc(o, res)

    def op_RNG_SEED(self, o):
        seed = o["seed"] if o.get("seed") is not None else int(_p2(self.mem.read(o["src"][0]))[0, 0])
        self.rng = np.random.Generator(np.random.PCG64(seed & 0xFFFFFFFF))

    def op_DROPOUT(self, o):
        srcs = [self.mem.read(s) for s in o["src"]]
        x = _p2(srcs[0])
        prob = _scalar(o, "prob", srcs)
        prob = prob.numpy() if isinstance(prob, torch.Tensor) else prob
        keep = self.rng.random(x.shape, dtype=np.float32) >= prob
        self.mem.write(o["dst"][0], np.where(keep, x, 0))

    def op_RAND(self, o):
        d = self.mem.view(o["dst"][0])
        if o.get("bits"):       # nisa.rng: 32 random bits, the low bits kept by the dtype's width
            b = o["bits"]
            v = self.rng.integers(0, 1 << 32, d.shape, dtype=np.int64) % (1 << b)
            self.mem.write(o["dst"][0], v - (1 << b) * (v >= 1 << (b - 1)) if o.get("signed") else v)
        else:
            self.mem.write(o["dst"][0], self.rng.random(d.shape, dtype=np.float32))

    def op_MATCH_REPLACE8(self, o):
        x, vals = _p2(self.mem.read(o["src"][0])).copy(), _p2(self.mem.read(o["src"][1]))
        rows = np.arange(x.shape[0])
        idx = np.zeros(vals.shape, np.int64)
        for j in range(vals.shape[1]):      # in order: a repeated value matches its next occurrence
            hit = x == vals[:, j:j + 1]
            first = np.argmax(hit, axis=1)
            found = hit[rows, first]
            idx[:, j] = first
            x[rows[found], first[found]] = o["imm"]
        self.mem.write(o["dst"][0], x)
        if len(o["dst"]) > 1:
            self.mem.write(o["dst"][1], idx)

    def op_SHUFFLE(self, o):
        src, out = _p2(self.mem.read(o["src"][0])), _p2(self.mem.read(o["src"][1])).copy()
        for i in range(out.shape[0]):
            m = o["mask"][i % 32]
            if m != 255:
                out[i] = src[i // 32 * 32 + m]
        self.mem.write(o["dst"][0], out)

    def op_TENSOR_SCALAR_CUMULATIVE(self, o):
        srcs = [self.mem.read(s) for s in o["src"]]
        x = alu(o["op0"], as_tensor(_p2(srcs[0]).astype(np.float32)), _scalar(o, "imm0", srcs))
        P = x.shape[0]
        cmd = o["reduce_cmd"]
        if cmd == "load_reduce":
            imm1 = _scalar(o, "imm1", srcs)
            reg = imm1 if isinstance(imm1, torch.Tensor) else torch.full((P, 1), float(imm1))
        elif cmd == "reduce" and self.vacc is not None and len(self.vacc) == P:
            reg = torch.from_numpy(self.vacc.astype(np.float32)).reshape(P, 1)
        else:
            init = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}[o["op1"]]
            reg = torch.full((P, 1), init)
        out = torch.empty_like(x)
        for i in range(x.shape[1]):
            reg = alu(o["op1"], x[:, i:i + 1], reg)
            out[:, i:i + 1] = reg
        self.vacc = reg[:, 0].numpy().copy()
        self.mem.write(o["dst"][0], out.numpy())

    def op_MAX8(self, o):
        x = _p2(self.mem.read(o["src"][0]))
        self.mem.write(o["dst"][0], -np.sort(-x, axis=1)[:, :8])

    def op_FIND_INDEX8(self, o):
        x, vals = _p2(self.mem.read(o["src"][0])), _p2(self.mem.read(o["src"][1]))
        idx = np.stack([np.argmax(x == vals[:, j:j + 1], axis=1) for j in range(vals.shape[1])], axis=1)
        self.mem.write(o["dst"][0], idx)

    # Scalar Engine
    def op_ACTIVATE(self, o):
        srcs = [self.mem.read(s) for s in o["src"]]
        if o.get("func") == "aten":
            res = aten_call(o["aten"], o["args"], o.get("kwargs"), [as_tensor(_p2(s)) for s in srcs])
            y = res
        else:
            x = as_tensor(_p2(srcs[0])).to(torch.float32)
            scale, bias = _scalar(o, "scale", srcs), _scalar(o, "bias", srcs)
            if not (isinstance(scale, (int, float)) and scale == 1):
                x = x * scale
            if not (isinstance(bias, (int, float)) and bias == 0):
                x = x + bias
            y = activation(o["func"], x)
        self.mem.write(o["dst"][0], y.numpy())
        if len(o["dst"]) > 1:
            self._accumulate(o, y)

    def _accumulate(self, o, y):
        """The free-axis reduction ``acc_op`` of ``y`` into the second destination (a [P, 1] column)."""
        y2 = y.reshape(y.shape[0], -1)
        op = o.get("acc_op", "add")
        r = {"add": lambda: y2.sum(1, keepdim=True), "max": lambda: y2.amax(1, keepdim=True),
             "min": lambda: y2.amin(1, keepdim=True), "multiply": lambda: y2.prod(1, keepdim=True),
             "logical_and": lambda: (y2 != 0).all(1, keepdim=True),
             "logical_or": lambda: (y2 != 0).any(1, keepdim=True)}[op]()
        self.mem.write(o["dst"][1], r.numpy())

    # GpSimd
    def op_IOTA(self, o):
        d = self.mem.view(o["dst"][0])
        P, F = d.shape[0], int(np.prod(d.shape[1:])) if d.ndim > 1 else 1
        p = np.arange(P)[:, None]
        f = np.arange(F)[None, :]
        self.mem.write(o["dst"][0], o["base"] + p * o["channel_multiplier"] + f * o["step"])

    def op_AFFINE_SELECT(self, o):
        d = self.mem.view(o["dst"][0])
        P, F = d.shape[0], int(np.prod(d.shape[1:])) if d.ndim > 1 else 1
        expr = o["base"] + np.arange(P)[:, None] * o["channel_multiplier"] + np.arange(F)[None, :] * o["step"]
        cmp = {"equal": np.equal, "greater_equal": np.greater_equal, "less": np.less}[o["cmp"]]
        on_true = _p2(self.mem.read(o["src"][0])).reshape(P, F) if o["src"] else o["on_true"]   # NKI: a tile
        self.mem.write(o["dst"][0], np.where(cmp(expr, 0), on_true, o["on_false"]))

    def op_PARTITION_REDUCE(self, o):
        x = _p2(self.mem.read(o["src"][0]))
        red = {"add": np.add, "max": np.maximum, "bitwise_or": np.bitwise_or, "bitwise_and": np.bitwise_and}[o["op"]]
        x = x.astype(np.int64) if o["op"].startswith("bitwise") else x.astype(np.float32)
        self.mem.write(o["dst"][0], red.reduce(x, axis=0, keepdims=True))

    def op_LOCAL_GATHER(self, o):
        src, idx = _p2(self.mem.read(o["src"][0])), _p2(self.mem.read(o["src"][1])).astype(np.int64)
        k, nv = o["num_elem_per_idx"], o["num_valid_indices"]
        out = np.empty((src.shape[0], nv, k), src.dtype)
        for c in range(0, src.shape[0], 16):        # each GpSimd core: its 16 partitions, its own indices
            cols = idx[c:c + 16].flatten(order="F")[:nv, None] + np.arange(k)[None, :]
            out[c:c + 16] = src[c:c + 16][:, cols]
        self.mem.write(o["dst"][0], out)

    def op_N_GATHER(self, o):
        data, idx = _p2(self.mem.read(o["src"][0])), _p2(self.mem.read(o["src"][1])).astype(np.int64)
        self.mem.write(o["dst"][0], np.take_along_axis(data, idx, axis=1))

    def op_SEQUENCE_BOUNDS(self, o):
        seq = _p2(self.mem.read(o["src"][0]))[0]
        n = len(seq)
        lo, hi = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for i in range(n):
            lo[i] = n if seq[i] == 0 else lo[i - 1] if i and seq[i] == seq[i - 1] else i
        for i in range(n - 1, -1, -1):
            hi[i] = -1 if seq[i] == 0 else hi[i + 1] if i < n - 1 and seq[i] == seq[i + 1] else i + 1
        self.mem.write(o["dst"][0], np.stack([lo, hi])[None])

    def op_NONZERO_WITH_COUNT(self, o):
        src, out = _p2(self.mem.read(o["src"][0])), _p2(self.mem.read(o["src"][1])).copy()
        T = src.shape[1]
        for p in range(0, src.shape[0], 16):    # each GpSimd core reads and writes its first partition only
            nz = np.flatnonzero(src[p] != 0)
            out[p, :T] = o["padding_val"]
            out[p, :len(nz)] = nz + o["index_offset"]
            out[p, T] = len(nz)
        self.mem.write(o["dst"][0], out)

    def op_CUSTOM_OP(self, o):
        tensors = []
        for s in o["src"]:
            op = {"m": "hbm", "b": s["b"], "dt": s["dt"], "o": s["o"],
                  "ap": [[st, n] for st, n in zip(s["strides"], s["shape"])] or [[1, 1]]}
            a = self.mem.read(op).reshape(s["shape"])
            t = torch.from_numpy(np.ascontiguousarray(a))
            if s["dt"] in ("bfloat16", "float16"):
                t = t.to(getattr(torch, s["dt"]))
            tensors.append(t)
        res = aten_call(o["aten"], o["args"], o.get("kwargs"), tensors)
        outs = res if isinstance(res, (list, tuple)) else [res]
        for d, r in zip(o["dst"], outs):
            r = r.detach()
            if r.is_floating_point():
                r = r.to(torch.float32)
            self.mem.write(d, r.reshape(-1).numpy())

    def _cc(self, o):
        # one rank: every collective is the identity on its input (multi-rank data moves in torch.distributed)
        if o["dst"] and o["src"]:
            self.mem.write(o["dst"][0], self.mem.read(o["src"][0]).reshape(-1))

    op_CC_ALL_REDUCE = op_CC_ALL_GATHER = op_CC_REDUCE_SCATTER = op_CC_WAIT = _cc


def run(program: Program, partition: int, schedule, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute ``schedule`` (a :class:`~neuron_stack.compiler.schedule.Schedule` of ``partition``) on ``inputs``.

    ``inputs`` maps the partition's input value names (placeholders, values of other partitions)
    to arrays; weights come from ``program.constants`` unless given. Returns every value the
    partition produces for others (``schedule.outputs``) plus every value it keeps in HBM
    (views and tuple elements included; intermediates resident in SBUF have no HBM copy), as arrays.
    Example: ``run(prog, 0, build_schedule(prog, 0, get_profile("trn1"), {}), {"x": x})["relu"]``.
    """
    m = Machine()
    consts = {n.name: n.args[0] for n in program.nodes if n.target == "get_attr"}
    for name, meta in schedule.buffers.items():
        if meta["role"] not in ("input", "const"):
            continue
        if name in inputs:
            val = inputs[name]
        elif name in consts and consts[name] in program.constants:
            val = program.constants[consts[name]]
        else:
            raise InterpError(f"input {name!r} of partition {partition} was not given")
        if hasattr(val, "detach"):
            val = val.detach().float().numpy() if val.is_floating_point() else val.detach().numpy()
        m.mem.fill_buffer(name, meta, val)
    ops_col = schedule.table.column("operands").to_pylist()
    opc = schedule.table.column("opcode").to_pylist()
    order = np.argsort(np.asarray(schedule.table.column("seq")), kind="stable")
    for i in order:
        try:
            m.step(opc[i], json.loads(ops_col[i]))
        except InterpError:
            raise
        except Exception as e:
            node = schedule.table.column("node")[int(i)].as_py()
            raise InterpError(f"instruction {int(i)} {opc[i]} of {node}: {type(e).__name__}: {e}") from e
    return {name: m.mem.read_value(val) for name, val in schedule.values.items()}


def run_program(program: Program, inputs: dict[str, np.ndarray], schedules: dict[int, Any]) -> list[np.ndarray]:
    """Run a whole program: device partitions through the interpreter, CPU partitions with torch.

    ``schedules`` maps each device partition to its schedule
    (:func:`neuron_stack.compiler.schedule.build_schedules` builds them all). Returns the program
    outputs (flattened ``output_names``) as arrays.
    Example: ``run_program(prog, {"x": x.numpy()}, build_schedules(prog))[0]``.
    """
    env: dict[str, Any] = {k: np.asarray(v) for k, v in inputs.items()}
    parts = program.partitions or [Partition(0, "device", ())]
    for p in parts:
        if p.kind == "cpu":
            for n in program.nodes:
                if n.partition == p.index and n.is_compute:
                    env[n.name] = _eager(n, env, program)
            continue
        s = schedules[p.index]
        need = {k: env[k] for k in s.inputs if k in env}
        env.update(run(program, p.index, s, need))
    for n in program.nodes:
        if n.target == "getitem" and n.name not in env and n.args[0]["node"] in env:
            v = env[n.args[0]["node"]]
            env[n.name] = v[n.args[1]] if isinstance(v, (list, tuple)) else v
    return [env[name] for name in _flat_names(program.output_names)]


def _flat_names(o) -> list[str]:
    if isinstance(o, dict) and "node" in o:
        return [o["node"]]
    if isinstance(o, (list, tuple)):
        return [x for v in o for x in _flat_names(v)]
    return []


def _eager(n, env, program):
    consts = {x.name: x.args[0] for x in program.nodes if x.target == "get_attr"}

    def sub(a):
        if isinstance(a, dict) and set(a) == {"node"}:
            k = a["node"]
            if k not in env and k not in consts:
                src = program.node(k)
                if src.target == "getitem":
                    v = sub(src.args[0])
                    return v[src.args[1]]
            if k in env:
                v = env[k]
                return torch.from_numpy(np.asarray(v)) if isinstance(v, np.ndarray) else v
            return program.constants[consts[k]]
        if isinstance(a, list):
            return [sub(x) for x in a]
        if isinstance(a, dict) and "dtype" in a:
            return getattr(torch, a["dtype"])
        if isinstance(a, dict) and "device" in a:
            return torch.device("cpu")
        return a

    if n.target == "getitem":
        return sub(n.args[0])[n.args[1]]
    r = aten_call(n.target, [sub(a) for a in n.args], {k: sub(v) for k, v in n.kwargs.items()}, [])
    return r.numpy() if hasattr(r, "numpy") else r
