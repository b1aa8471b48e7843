"""``nki.typing`` (``nt``): the annotation types of NKI kernels. They only annotate here: shapes and
dtypes are checked when the kernel runs.

>>> tensor[[128, 512], "float32"] is tensor
True
"""
from __future__ import annotations


class tensor:
    """``nt.tensor[shape, dtype]``: an annotation for a kernel argument."""

    def __class_getitem__(cls, item):
        return cls


mutable_tensor = tensor
scalar = tensor
