"""The ISA's function tables as data: what each Vector/GpSimd ALU op and each Scalar-engine activation
computes (the interpreter applies them to fp32 tiles), and how a CUSTOM_OP's aten call is rebuilt.
Built once at import, not per instruction.

>>> import torch
>>> alu("maximum", torch.tensor([1.0, 3.0]), 2.0).tolist(), activation("relu", torch.tensor([-1.0])).tolist()
([2.0, 3.0], [0.0])
"""
from __future__ import annotations

import numpy as np
import torch

F = torch.nn.functional


class InterpError(RuntimeError):
    """An instruction the interpreter cannot execute (names the instruction)."""


ALU = {
    "add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "divide": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "power": torch.pow, "mod": torch.remainder,
    "fmod": torch.fmod, "equal": torch.eq, "not_equal": torch.ne, "less": torch.lt, "less_equal": torch.le,
    "greater": torch.gt, "greater_equal": torch.ge, "logical_and": torch.logical_and,
    "logical_or": torch.logical_or, "logical_xor": torch.logical_xor, "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor, "atan2": torch.atan2,
    "hypot": torch.hypot, "copysign": torch.copysign, "floor_divide": torch.floor_divide,
    "rsub": lambda x, y: torch.sub(y, x), "rdivide": lambda x, y: torch.div(y, x), "bypass": lambda x, y: x,
    "left_shift": torch.bitwise_left_shift, "right_shift": torch.bitwise_right_shift,
    # the ALU's unary arithmetic ops (NKI's "Supported Math Operators" table): the operand is ignored
    "abs": lambda x, y: torch.abs(x), "rsqrt": lambda x, y: torch.rsqrt(x),
    "reciprocal": lambda x, y: torch.reciprocal(x),
}


ACTIVATIONS = {
    "copy": lambda t: t, "identity": lambda t: t, "relu": torch.relu, "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu, "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "square": torch.square, "erf": torch.erf, "sin": torch.sin, "cos": torch.cos, "abs": torch.abs,
    "sign": torch.sign, "softplus": F.softplus, "reciprocal": torch.reciprocal, "neg": torch.neg,
    "exp2": torch.exp2, "log2": torch.log2, "log1p": torch.log1p, "expm1": torch.expm1,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
    "tan": torch.tan, "arctan": torch.atan, "mish": F.mish,
    "gelu_apprx_sigmoid": lambda t: t * torch.sigmoid(1.702 * t),
    "gelu_dx": lambda t: 0.5 * (1 + torch.erf(t / 2 ** 0.5)) + t * torch.exp(-0.5 * t * t) / (2 * torch.pi) ** 0.5,
    "gelu_apprx_sigmoid_dx": lambda t: (lambda s: s + 1.702 * t * s * (1 - s))(torch.sigmoid(1.702 * t)),
    "silu_dx": lambda t: (lambda s: s * (1 + t * (1 - s)))(torch.sigmoid(t)),
    "erf_dx": lambda t: 2 / torch.pi ** 0.5 * torch.exp(-t * t),
}


def alu(op: str, a, b):
    if op not in ALU:
        raise InterpError(f"unknown ALU op {op!r}")
    if not isinstance(b, torch.Tensor):
        b = torch.tensor(b, dtype=a.dtype if a.is_floating_point() or isinstance(b, int) else torch.float32)
    if op in ("maximum", "minimum", "atan2", "hypot", "copysign") and b.dtype != a.dtype:
        dt = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dt), b.to(dt)
    return ALU[op](a, b)


def activation(func: str, x):
    if func not in ACTIVATIONS:
        raise InterpError(f"unknown activation function {func!r}")
    return ACTIVATIONS[func](x)


def as_tensor(a: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(a))


def aten_call(target: str, template, kwargs, tensors: list):
    parts = target.split(".")
    op = getattr(getattr(torch.ops.aten, parts[1]), parts[2] if len(parts) > 2 else "default")

    def sub(a):
        if isinstance(a, dict) and set(a) == {"src"}:
            return tensors[a["src"]]
        if isinstance(a, dict) and "dtype" in a:
            return getattr(torch, a["dtype"])
        if isinstance(a, dict) and "device" in a:
            return torch.device("cpu")
        if isinstance(a, dict) and "layout" in a:
            return getattr(torch, a["layout"])
        if isinstance(a, dict) and "memory_format" in a:
            return getattr(torch, a["memory_format"])
        if isinstance(a, list):
            return [sub(x) for x in a]
        return a

    return op(*sub(template), **{k: sub(v) for k, v in (kwargs or {}).items()})
