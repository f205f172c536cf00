"""RMSNorm family: ``npu_rms_norm`` (+ ``npu_rms_norm_backward``), ``npu_gemma_rms_norm``, ``npu_add_rms_norm``.

Schemas from op-plugin's ``op_plugin_functions.yaml``; formulas from its docs
(``torch_npu-npu_rms_norm.md``, ``torch_npu-npu_add_rms_norm.md``) and tests
(``test_npu_gemma_rms_norm.py``). The normalized dimensions are the last ``gamma.dim()``
ones; ``rstd`` keeps every dimension, with size 1 over the normalized ones.

torch_npu differentiates ``npu_rms_norm`` only (derivatives.yaml); ``npu_add_rms_norm`` is
marked not differentiable (AutogradErrorFallback.cpp) and ``npu_gemma_rms_norm`` has no
derivative, so a backward through either raises.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npusim.ops.fused._checks import FLOATING, check, check_dim, check_dtype, check_same_dtype, compute_dtype
from npusim.ops.fused._library import define, implement, no_derivative, register_autograd

RMS_NORM = define("npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)")
RMS_NORM_BACKWARD = define("npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) "
                           "-> (Tensor, Tensor)")
GEMMA_RMS_NORM = define("npu_gemma_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)")
ADD_RMS_NORM = define("npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) "
                      "-> (Tensor, Tensor, Tensor)")


def _check_norm(op: str, x: Tensor, x_name: str, gamma: Tensor, gamma_may_be_float32: bool) -> None:
    """Shapes and dtypes of op-plugin's RMSNorm: gamma is the trailing shape of x."""
    check_dtype(op, x_name, x)
    check_dim(op, x_name, x, range(1, 9))
    check(1 <= gamma.dim() <= x.dim(), op,
          f"gamma must have 1 to {x_name}.dim() ({x.dim()}) dimensions, got {gamma.dim()}-D")
    trailing = tuple(x.shape[x.dim() - gamma.dim():])
    check(tuple(gamma.shape) == trailing, op,
          f"gamma must have the trailing shape of {x_name} {trailing}, got {tuple(gamma.shape)}")
    # A2/A3 pair float16 / bfloat16 inputs with a float32 gamma too (the docs' dtype table).
    if not (gamma_may_be_float32 and gamma.dtype == torch.float32):
        check_same_dtype(op, x_name, {x_name: x, "gamma": gamma})


def _rstd_shape(x: Tensor, gamma: Tensor) -> list[int]:
    keep = x.dim() - gamma.dim()
    return [*x.shape[:keep], *([1] * gamma.dim())]


def _stat_dtype(x: Tensor) -> torch.dtype:
    """rstd is float32 (float64 for float64 inputs, Note [float64 inputs])."""
    return compute_dtype(x.dtype)


def _rms(x: Tensor, gamma: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """(x / rms(x) in the compute dtype, rstd) over the trailing gamma.dim() dimensions."""
    acc = x.to(compute_dtype(x.dtype))
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(acc.square().mean(dims, keepdim=True) + epsilon)
    return acc * rstd, rstd


# -- npu_rms_norm --------------------------------------------------------------------------------------------------

def rms_norm(x: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor]:
    """(x * rstd * gamma in x's dtype, rstd = 1 / sqrt(mean(x^2) + epsilon) in float32)."""
    _check_norm("npu_rms_norm", x, "self", gamma, True)
    normed, rstd = _rms(x, gamma, epsilon)
    return (normed * gamma.to(normed.dtype)).to(x.dtype), rstd


def _rms_norm_fake(x: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor]:
    _check_norm("npu_rms_norm", x, "self", gamma, True)
    return torch.empty_like(x), x.new_empty(_rstd_shape(x, gamma), dtype=_stat_dtype(x))


def rms_norm_backward(dy: Tensor, x: Tensor, gamma: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    """(dx in x's dtype, dgamma in float32) of y = x * rstd * gamma, rstd taken from the forward."""
    op = "npu_rms_norm_backward"
    _check_norm(op, x, "self", gamma, True)
    check(dy.shape == x.shape, op, f"dy must have the shape of self {tuple(x.shape)}, got {tuple(dy.shape)}")
    check(list(rstd.shape) == _rstd_shape(x, gamma), op,
          f"rstd must have shape {tuple(_rstd_shape(x, gamma))}, got {tuple(rstd.shape)}")
    acc = compute_dtype(x.dtype)
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    r = rstd.to(acc)
    xhat = x.to(acc) * r
    dyg = dy.to(acc) * gamma.to(acc)
    dx = r * (dyg - xhat * (dyg * xhat).mean(dims, keepdim=True))
    dgamma = dy.to(acc) * xhat
    if x.dim() > gamma.dim():  # sum over an empty dim list would reduce everything
        dgamma = dgamma.sum(list(range(x.dim() - gamma.dim())))
    return dx.to(x.dtype), dgamma


def _rms_norm_backward_fake(dy: Tensor, x: Tensor, gamma: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), gamma.new_empty(gamma.shape, dtype=_stat_dtype(x))


def _rms_norm_setup(ctx, inputs, output) -> None:
    x, gamma, _ = inputs
    ctx.save_for_backward(x, gamma, output[1])


def _rms_norm_autograd(ctx, dy: Tensor, _drstd: Tensor | None) -> tuple[Tensor | None, Tensor | None, None]:
    # Only y is differentiable (derivatives.yaml: output_differentiability [true, false]).
    x, gamma, rstd = ctx.saved_tensors
    dx, dgamma = torch.ops.npu.npu_rms_norm_backward(dy, x, gamma, rstd)
    return dx, dgamma, None


implement(RMS_NORM, rms_norm, _rms_norm_fake)
implement(RMS_NORM_BACKWARD, rms_norm_backward, _rms_norm_backward_fake)
register_autograd(RMS_NORM, _rms_norm_autograd, setup_context=_rms_norm_setup)


# -- npu_gemma_rms_norm --------------------------------------------------------------------------------------------

def gemma_rms_norm(x: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Gemma's RMSNorm: x * rstd * (1 + gamma), with rstd as in npu_rms_norm."""
    _check_norm("npu_gemma_rms_norm", x, "self", gamma, False)
    normed, rstd = _rms(x, gamma, epsilon)
    return (normed * (1 + gamma.to(normed.dtype))).to(x.dtype), rstd


def _gemma_rms_norm_fake(x: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor]:
    _check_norm("npu_gemma_rms_norm", x, "self", gamma, False)
    return torch.empty_like(x), x.new_empty(_rstd_shape(x, gamma), dtype=_stat_dtype(x))


implement(GEMMA_RMS_NORM, gemma_rms_norm, _gemma_rms_norm_fake)
no_derivative(GEMMA_RMS_NORM)


# -- npu_add_rms_norm ----------------------------------------------------------------------------------------------

def _check_add(x1: Tensor, x2: Tensor, gamma: Tensor) -> None:
    op = "npu_add_rms_norm"
    _check_norm(op, x1, "x1", gamma, False)
    check_dtype(op, "x2", x2, FLOATING)
    check_same_dtype(op, "x1", {"x1": x1, "x2": x2})
    check(x1.shape == x2.shape, op, f"x2 must have the shape of x1 {tuple(x1.shape)}, got {tuple(x2.shape)}")
    check(x1.numel() > 0, op, "x1 must not be empty")


def add_rms_norm(x1: Tensor, x2: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor, Tensor]:
    """(RMSNorm(x1 + x2) * gamma, rstd, x1 + x2): the sum is formed once, in float32, and normalized unrounded."""
    _check_add(x1, x2, gamma)
    acc = compute_dtype(x1.dtype)
    total = x1.to(acc) + x2.to(acc)
    normed, rstd = _rms(total, gamma, epsilon)
    return (normed * gamma.to(acc)).to(x1.dtype), rstd, total.to(x1.dtype)


def _add_rms_norm_fake(x1: Tensor, x2: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor, Tensor]:
    _check_add(x1, x2, gamma)
    return torch.empty_like(x1), x1.new_empty(_rstd_shape(x1, gamma), dtype=_stat_dtype(x1)), torch.empty_like(x1)


implement(ADD_RMS_NORM, add_rms_norm, _add_rms_norm_fake)
no_derivative(ADD_RMS_NORM)
