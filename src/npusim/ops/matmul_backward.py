"""The npu kernel of ``aten::matmul_backward``: both gradients of ``torch.matmul`` in one op.

PyTorch differentiates ``matmul`` through its composite (``mm`` / ``bmm`` / views), and its
``matmul_backward`` op has a kernel for nested tensors only. torch_npu gives the op a device
kernel and DTensor strategies for it, and frameworks written for Ascend (torchtitan-npu's
sharding patches) look the op up; ``npusim.distributed.dtensor_strategies`` shards it, so its
local computation on each rank needs this kernel.

The gradients follow ``torch.matmul``'s rules: a 1-D left operand is a row, a 1-D right
operand a column, batch dimensions broadcast; each gradient is summed back to its operand's
shape (``Tensor.sum_to_size``), so a broadcast operand gets the sum over the dimensions it
was broadcast along. ``mask`` says which gradients to compute; the other is undefined, as in
PyTorch's nested-tensor kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

# The registration lives as long as this library object (made by register()).
_lib: torch.library.Library | None = None


def _check(grad: Tensor, self: Tensor, other: Tensor) -> None:
    """torch.matmul's shape rules, with the op, the device and the shapes named on failure."""
    where = f"aten::matmul_backward on {self.device}"
    if self.dim() == 0 or other.dim() == 0:
        raise RuntimeError(f"{where}: both operands must be at least 1-D, got shapes {tuple(self.shape)} and "
                           f"{tuple(other.shape)}")
    k_self = self.shape[-1]
    k_other = other.shape[0] if other.dim() == 1 else other.shape[-2]
    if k_self != k_other:
        raise RuntimeError(f"{where}: the contracted sizes differ: self {tuple(self.shape)} has {k_self}, other "
                           f"{tuple(other.shape)} has {k_other}")
    batch = torch.broadcast_shapes(self.shape[:-2], other.shape[:-2])
    # torch.matmul's output: the broadcast batch, then m unless self is 1-D, then n unless other is 1-D.
    expected = (*batch, *self.shape[-2:-1], *other.shape[-1:]) if self.dim() > 1 else (*batch, *other.shape[-1:])
    if other.dim() == 1:
        expected = (*batch, *self.shape[-2:-1]) if self.dim() > 1 else ()
    if tuple(grad.shape) != expected:
        raise RuntimeError(f"{where}: grad must have matmul's output shape {expected} for self "
                           f"{tuple(self.shape)} and other {tuple(other.shape)}, got {tuple(grad.shape)}")


def matmul_backward(grad: Tensor, self: Tensor, other: Tensor, mask: list[bool]) -> tuple[Tensor, Tensor]:
    """The gradients of ``torch.matmul(self, other)`` for the output gradient ``grad``: (d self, d other)."""
    _check(grad, self, other)
    # The matrix forms torch.matmul computes with: [..., m, k] @ [..., k, n] -> [..., m, n].
    a = self if self.dim() > 1 else self.unsqueeze(0)
    b = other if other.dim() > 1 else other.unsqueeze(-1)
    g = grad if other.dim() > 1 else grad.unsqueeze(-1)
    g = g if self.dim() > 1 else g.unsqueeze(-2)
    grad_self = grad_other = None
    if mask[0]:
        grad_self = torch.matmul(g, b.mT).sum_to_size(a.shape).view(self.shape)
    if mask[1]:
        grad_other = torch.matmul(a.mT, g).sum_to_size(b.shape).view(other.shape)
    return grad_self, grad_other


def register() -> None:
    """Registers ``aten::matmul_backward`` for the npu (idempotent)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("matmul_backward", matmul_backward, "PrivateUse1")
