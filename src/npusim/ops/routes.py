"""Which aten ops keep their composite kernel on npu although CPU has a kernel of its own.

``npusim.ops`` routes every aten op whose npu slot would hold a composite kernel where CPU
has its own kernel to that kernel (Note [CPU's kernel, not the composite] in
``csrc/aten/fallback_routes.cpp``), except the ops listed here: for them CUDA has no kernel and
runs the composite itself, and npu follows CUDA (Note [npu follows CUDA where CPU differs]).
A CPU build's dispatcher holds no CUDA registrations, so the list is written here;
``tests/test_fallback_routes.py`` derives it again from PyTorch's ``native_functions.yaml``.
"""

from __future__ import annotations

__all__ = ["CUDA_RUNS_THE_COMPOSITE"]

# aten ops with a CPU kernel and a composite kernel but no CUDA kernel (torch 2.13).
CUDA_RUNS_THE_COMPOSITE: tuple[str, ...] = (
    "aten::_stack",
    "aten::_stack.out",
    "aten::narrow_copy",
    "aten::native_channel_shuffle",
    "aten::pixel_shuffle",
    "aten::pixel_unshuffle",
)
