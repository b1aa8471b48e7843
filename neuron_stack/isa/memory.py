"""The interpreter's memory: flat numpy buffers per (memory, name, storage kind), operands as strided views.

Floating-point buffers are held in fp32 and rounded to bf16/fp16/fp8 when written with that dtype (the engines
compute in fp32); PSUM is fp32.

>>> m = Memory()
>>> m.write({"m": "sbuf", "b": "t", "dt": "bfloat16", "o": 0, "ap": [[4, 2], [1, 4]]}, [[1.0 + 2**-10] * 4] * 2)
>>> float(m.read({"m": "sbuf", "b": "t", "dt": "bfloat16", "o": 0, "ap": [[1, 1]]})[0])
1.0
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_stack.isa.functions import InterpError

_NP = {"float32": np.float32, "float64": np.float64, "bfloat16": np.float32, "float16": np.float32,
       "int64": np.int64, "int32": np.int64, "int16": np.int64, "int8": np.int64, "uint8": np.int64,
       "bool": np.bool_}


_KIND = {k: np.dtype(v).name for k, v in _NP.items()}
_ROUNDED = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def _round(dt: str, a: np.ndarray) -> np.ndarray:
    """Round fp32 values to the storage precision of ``dt`` (bf16/fp16/fp8), keeping fp32 storage."""
    if dt in _ROUNDED:
        t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
        return t.to(getattr(torch, dt)).to(torch.float32).numpy()
    return a


class Memory:
    """Flat buffers by (memory, name, storage kind); grown on demand for SBUF/PSUM slots."""

    def __init__(self):
        self.bufs: dict[tuple, np.ndarray] = {}

    def _buf(self, op: dict, need: int) -> np.ndarray:
        psum = op["m"] == "psum"
        key = (op["m"], op["b"], "f32" if psum else _KIND.get(op["dt"], "float32"))
        b = self.bufs.get(key)
        if b is None or b.size < need:
            nb = np.zeros(max(need, 1), dtype=np.float32 if psum else _NP.get(op["dt"], np.float32))
            if b is not None:
                nb[:b.size] = b
            self.bufs[key] = b = nb
        return b

    def view(self, op: dict) -> np.ndarray:
        """The strided view of an access-pattern operand (writes go through to memory); a bitcast operand
        (``"bc"``: the buffer's own dtype) is decoded from the buffer's bytes into a copy."""
        if "bc" in op:
            return self._bitcast(op)
        ap = op["ap"]
        o = op["o"]
        extent = o + 1
        for s, n in ap:
            if s > 0:
                extent += (n - 1) * s
        b = self._buf(op, extent)
        isz = b.itemsize
        # np.ndarray over the buffer, not as_strided: a third of the interpreter's time went to as_strided
        return np.ndarray(tuple(n for _, n in ap), b.dtype, b, o * isz, tuple(s * isz for s, _ in ap))

    def _bitcast(self, op: dict) -> np.ndarray:
        src, dst = _bits(op["bc"]), _bits(op["dt"])
        r = src.itemsize // dst.itemsize
        extent = op["o"] + 1 + sum((n - 1) * s for s, n in op["ap"] if s > 0)
        under = self._buf({**op, "dt": op["bc"]}, -(-extent // r))[:-(-extent // r)]
        flat = np.ascontiguousarray(under.astype(src)).view(dst)
        flat = flat.astype(np.float32 if dst.kind == "f" or dst.name.startswith(("bfloat", "float8")) else np.int64)
        isz = flat.itemsize
        return np.ndarray(tuple(n for _, n in op["ap"]), flat.dtype, flat, op["o"] * isz,
                          tuple(s * isz for s, _ in op["ap"]))

    def read(self, op: dict) -> np.ndarray:
        return np.array(self.view(op))

    def write(self, op: dict, value) -> None:
        if "bc" in op:
            raise InterpError("a write through a bitcast view (the tile's bytes as another dtype) is not simulated")
        v = self.view(op)
        val = np.asarray(value)
        if val.size != v.size:
            raise InterpError(f"write of {val.size} elements into an operand of {v.size}")
        if val.shape != v.shape:
            val = val.reshape(v.shape)
        if v.dtype.kind == "f" and op["dt"] in _ROUNDED:
            val = _round(op["dt"], val)
        np.copyto(v, val, casting="unsafe")      # the cast to the storage dtype rounds as astype would

    def fill_buffer(self, name: str, meta: dict, value: np.ndarray) -> None:
        """Place a logical tensor into HBM buffer ``name`` with the buffer's storage strides."""
        shape, strides = meta["shape"], meta.get("strides") or contiguous_strides(meta["shape"])
        op = {"m": "hbm", "b": name, "dt": meta["dtype"], "o": 0,
              "ap": meta.get("fill_ap") or [[s, n] for s, n in zip(strides, shape)] or [[1, 1]]}
        if meta.get("fill_ap"):       # a weight laid out in tiles at compile time: its logical order, re-cut
            shape = [n for _, n in meta["fill_ap"]]
        self.write(op, np.asarray(value).reshape(shape) if shape else np.asarray(value).reshape(1))

    def read_value(self, val: dict) -> np.ndarray:
        op = {"m": "hbm", "b": val["buf"], "dt": val["dtype"], "o": val["offset"],
              "ap": [[s, n] for s, n in zip(val["strides"], val["shape"])] or [[1, 1]]}
        return self.read(op).reshape(val["shape"])


def _bits(dt: str) -> np.dtype:
    """The numpy dtype holding ``dt``'s bytes as the hardware stores them (bf16/fp8 from ml_dtypes)."""
    import ml_dtypes  # numpy has no bf16/fp8
    return np.dtype(getattr(ml_dtypes, dt, None) or (np.uint8 if dt == "bool" else dt))


def contiguous_strides(shape) -> list[int]:
    """Element strides of a row-major (C-contiguous) tensor of ``shape``, as access patterns use them.

    >>> contiguous_strides((2, 3, 4))
    [12, 4, 1]
    """
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]
