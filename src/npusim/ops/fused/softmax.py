"""``npu_scaled_masked_softmax`` (+ backward): softmax over the last dimension of ``x * scale`` with masking.

op-plugin (``torch_npu-npu_scaled_masked_softmax.md``, ``test_scaled_masked_softmax.py``):
positions where the bool ``mask`` is True are filled with -10000 after scaling, the softmax is
computed in float32 and cast to x's dtype. ``fixed_triu_mask=True`` replaces ``mask`` by the
strictly upper triangle of the last two dimensions, as op-plugin's reference builds it. The
docs limit the last two dimensions to multiples of 32 in [32, 4096]; so does npusim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npusim.ops.fused._checks import check, check_dim, check_dtype, check_shape, compute_dtype
from npusim.ops.fused._library import define, implement, register_autograd

SCALED_MASKED_SOFTMAX = define("npu_scaled_masked_softmax(Tensor x, Tensor mask, Scalar scale=1, "
                               "bool fixed_triu_mask=False) -> Tensor")
SCALED_MASKED_SOFTMAX_BACKWARD = define("npu_scaled_masked_softmax_backward(Tensor y_grad, Tensor y, Tensor mask, "
                                        "Scalar scale, bool fixed_triu_mask) -> Tensor")

_MASKED = -10000.0


def _check(op: str, x: Tensor, x_name: str, mask: Tensor) -> None:
    check_dtype(op, x_name, x)
    check_dim(op, x_name, x, range(2, 9))
    for axis, size in (("H", x.shape[-2]), ("W", x.shape[-1])):
        check(32 <= size <= 4096 and size % 32 == 0, op,
              f"{x_name}'s {axis} dimension must be a multiple of 32 in [32, 4096], got {size} "
              f"(shape {tuple(x.shape)})")
    check_dtype(op, "mask", mask, (torch.bool,))
    trailing = zip(mask.shape[::-1], x.shape[::-1], strict=False)
    broadcasts = mask.dim() <= x.dim() and all(m in (1, s) for m, s in trailing)
    check(broadcasts, op,
          f"mask of shape {tuple(mask.shape)} must broadcast to {x_name} of shape {tuple(x.shape)}")


def _mask(mask: Tensor, like: Tensor, fixed_triu_mask: bool) -> Tensor:
    if fixed_triu_mask:
        h, w = like.shape[-2:]
        return torch.ones(h, w, dtype=torch.bool, device=like.device).triu(1)
    return mask


def scaled_masked_softmax(x: Tensor, mask: Tensor, scale: float = 1, fixed_triu_mask: bool = False) -> Tensor:
    _check("npu_scaled_masked_softmax", x, "x", mask)
    scores = (x.to(compute_dtype(x.dtype)) * scale).masked_fill(_mask(mask, x, fixed_triu_mask), _MASKED)
    return torch.softmax(scores, dim=-1).to(x.dtype)


def _scaled_masked_softmax_fake(x: Tensor, mask: Tensor, scale: float = 1, fixed_triu_mask: bool = False) -> Tensor:
    _check("npu_scaled_masked_softmax", x, "x", mask)
    return torch.empty_like(x)


def scaled_masked_softmax_backward(y_grad: Tensor, y: Tensor, mask: Tensor, scale: float,
                                   fixed_triu_mask: bool) -> Tensor:
    """scale * y * (dy - sum(dy * y)), zero where masked (the filled positions do not depend on x)."""
    op = "npu_scaled_masked_softmax_backward"
    _check(op, y, "y", mask)
    check_shape(op, "y_grad", y_grad, y.shape, "the shape of y")
    acc = compute_dtype(y.dtype)
    dy, ya = y_grad.to(acc), y.to(acc)
    dx = scale * ya * (dy - (dy * ya).sum(-1, keepdim=True))
    return dx.masked_fill(_mask(mask, y, fixed_triu_mask), 0).to(y_grad.dtype)


def _scaled_masked_softmax_backward_fake(y_grad: Tensor, y: Tensor, mask: Tensor, scale: float,
                                         fixed_triu_mask: bool) -> Tensor:
    _check("npu_scaled_masked_softmax_backward", y, "y", mask)
    return torch.empty_like(y_grad)


def _setup(ctx, inputs, output) -> None:
    _, mask, ctx.scale, ctx.fixed_triu_mask = inputs
    ctx.save_for_backward(output, mask)


def _autograd(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
    y, mask = ctx.saved_tensors
    dx = torch.ops.npu.npu_scaled_masked_softmax_backward(grad, y, mask, ctx.scale, ctx.fixed_triu_mask)
    return dx, None, None, None


implement(SCALED_MASKED_SOFTMAX, scaled_masked_softmax, _scaled_masked_softmax_fake)
implement(SCALED_MASKED_SOFTMAX_BACKWARD, scaled_masked_softmax_backward, _scaled_masked_softmax_backward_fake)
register_autograd(SCALED_MASKED_SOFTMAX, _autograd, setup_context=_setup)
