"""torch_npu's ``enable_deterministic_with_backward`` / ``disable_deterministic_with_backward``.

Marks on a tensor that switch ``torch.use_deterministic_algorithms`` in the forward and
back in the backward, so the region between them runs deterministically both ways (a
torch_npu API; its ``torch.npu`` exports them). Kept out of compiled graphs, as torch_npu
marks them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["disable_deterministic_with_backward", "enable_deterministic_with_backward"]


def _forbid_in_graph(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn._dynamo_forbidden = True  # type: ignore[attr-defined]  (what torch._dynamo checks)
    return fn


class _Begin(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: Tensor) -> Tensor:
        with torch.autograd.profiler.record_function("deterministic_algorithms_begin_op_forward"):
            torch.use_deterministic_algorithms(True)
        return tensor

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        with torch.autograd.profiler.record_function("deterministic_algorithms_begin_op_backward"):
            torch.use_deterministic_algorithms(False)
        return grad


class _End(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: Tensor) -> Tensor:
        with torch.autograd.profiler.record_function("deterministic_algorithms_end_op_forward"):
            torch.use_deterministic_algorithms(False)
        return tensor

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        with torch.autograd.profiler.record_function("deterministic_algorithms_end_op_backward"):
            torch.use_deterministic_algorithms(True)
        return grad


@_forbid_in_graph
def enable_deterministic_with_backward(tensor: Tensor) -> Tensor:
    """Deterministic algorithms from here in the forward, until this point in the backward."""
    return _Begin.apply(tensor)


@_forbid_in_graph
def disable_deterministic_with_backward(tensor: Tensor) -> Tensor:
    """Ends enable_deterministic_with_backward's region (and starts it again in the backward)."""
    return _End.apply(tensor)
