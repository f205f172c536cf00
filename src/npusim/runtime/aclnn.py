"""``torch.npu.aclnn``: torch_npu's switch for HF32 in aclnn convolutions.

``allow_hf32`` is the same flag as ``torch.npu.conv.allow_hf32`` (torch_npu keeps both in
its ``ALLOW_CONV_HF32`` option), and ``flags(allow_hf32=...)`` sets it for a block. It is
stored only: npu compute runs PyTorch's CPU kernels, in fp32.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

from npusim.runtime import compat

__all__ = ["flags", "set_flags", "version"]  # and allow_hf32, a property of the module (below)


def version() -> None:
    """None, as torch_npu's: no ACLNN library version to report."""
    return None


def set_flags(_allow_hf32: bool | None = None) -> tuple[bool]:
    """Sets allow_hf32 when given; returns the flags as they were (torch_npu's signature)."""
    previous = (compat.conv.allow_hf32,)
    if _allow_hf32 is not None:
        compat.conv.allow_hf32 = bool(_allow_hf32)
    return previous


@contextmanager
def flags(allow_hf32: bool = True) -> Iterator[None]:
    """allow_hf32 for the block, restored after it."""
    previous = set_flags(allow_hf32)
    try:
        yield
    finally:
        set_flags(*previous)


class _AclnnModule(types.ModuleType):
    """This module with ``allow_hf32`` as a property over conv's flag (torch_npu's ContextProp)."""

    @property
    def allow_hf32(self) -> bool:
        return compat.conv.allow_hf32

    @allow_hf32.setter
    def allow_hf32(self, value: bool) -> None:
        compat.conv.allow_hf32 = bool(value)


sys.modules[__name__].__class__ = _AclnnModule
