"""Activations: ``npu_swiglu``, ``npu_geglu``, ``npu_gelu``, ``npu_fast_gelu`` / ``fast_gelu``, with their backwards.

Formulas from op-plugin's docs (``torch_npu-npu_swiglu.md``, ``torch_npu-npu_gelu.md``,
``torch_npu-npu_fast_gelu.md``) and, for GeGLU, CANN's GeGluV2 (``activate_left`` picks the
half that goes through GELU; ``approximate`` 0 is erf, 1 is tanh). npu_fast_gelu is the
Atlas A2 / A3 formula ``x / (1 + exp(-1.702 x))``, the SoC npusim models. Each computes in
float32 for 16-bit inputs (Note [Precision of the fused operators]).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from npusim.ops.fused._checks import check, check_dtype, check_shape, upcast
from npusim.ops.fused._library import define, implement, register_autograd

SWIGLU = define("npu_swiglu(Tensor self, int dim=-1) -> Tensor")
SWIGLU_BACKWARD = define("npu_swiglu_backward(Tensor grad_output, Tensor self, int dim=-1) -> Tensor")
GEGLU = define("npu_geglu(Tensor self, int dim=-1, int approximate=1, bool activate_left=False) -> (Tensor, Tensor)")
GEGLU_GRAD = define("npu_geglu_grad(Tensor grad_output, Tensor self, Tensor gelu, int dim=-1, int approximate=1, "
                    "bool activate_left=False) -> Tensor")
GELU = define("npu_gelu(Tensor self, *, str approximate='none') -> Tensor")
GELU_BACKWARD = define("npu_gelu_backward(Tensor grad_output, Tensor self, *, str approximate='none') -> Tensor")
FAST_GELU = define("npu_fast_gelu(Tensor self) -> Tensor")
FAST_GELU_PLAIN = define("fast_gelu(Tensor self) -> Tensor")
FAST_GELU_BACKWARD = define("npu_fast_gelu_backward(Tensor grad, Tensor self) -> Tensor")

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu(x: Tensor, approximate: str) -> Tensor:
    if approximate == "tanh":
        return 0.5 * x * (1 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x.pow(3))))
    return 0.5 * x * (1 + torch.erf(x * math.sqrt(0.5)))


def _gelu_derivative(x: Tensor, approximate: str) -> Tensor:
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x.pow(3))
        t = torch.tanh(inner)
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
    return 0.5 * (1 + torch.erf(x * math.sqrt(0.5))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _check_glu(op: str, x: Tensor, dim: int) -> int:
    """The wrapped dim along which x halves (its size there is even)."""
    check_dtype(op, "self", x)
    check(1 <= x.dim() <= 8, op, f"self must have 1 to 8 dimensions, got {x.dim()}-D")
    check(-x.dim() <= dim < x.dim(), op, f"dim must be in [{-x.dim()}, {x.dim() - 1}], got {dim}")
    dim %= x.dim()
    check(x.shape[dim] % 2 == 0, op, f"self's size in dim {dim} must be even, got {x.shape[dim]} "
                                     f"(shape {tuple(x.shape)})")
    return dim


def _halved(x: Tensor, dim: int) -> list[int]:
    shape = list(x.shape)
    shape[dim] //= 2
    return shape


# -- npu_swiglu ----------------------------------------------------------------------------------------------------

def swiglu(x: Tensor, dim: int = -1) -> Tensor:
    """silu(A) * B, where A and B are the first and second halves of x along dim."""
    dim = _check_glu("npu_swiglu", x, dim)
    a, b = upcast(x).chunk(2, dim)
    return (a * torch.sigmoid(a) * b).to(x.dtype)


def _swiglu_fake(x: Tensor, dim: int = -1) -> Tensor:
    dim = _check_glu("npu_swiglu", x, dim)
    return x.new_empty(_halved(x, dim))


def swiglu_backward(grad_output: Tensor, x: Tensor, dim: int = -1) -> Tensor:
    dim = _check_glu("npu_swiglu_backward", x, dim)
    check_shape("npu_swiglu_backward", "grad_output", grad_output, _halved(x, dim), "half of self along dim")
    a, b = upcast(x).chunk(2, dim)
    g = upcast(grad_output)
    sig = torch.sigmoid(a)
    da = g * b * sig * (1 + a * (1 - sig))
    db = g * a * sig
    return torch.cat((da, db), dim).to(x.dtype)


def _swiglu_backward_fake(grad_output: Tensor, x: Tensor, dim: int = -1) -> Tensor:
    dim = _check_glu("npu_swiglu_backward", x, dim)
    check_shape("npu_swiglu_backward", "grad_output", grad_output, _halved(x, dim), "half of self along dim")
    return torch.empty_like(x)


def _swiglu_setup(ctx, inputs, output) -> None:
    ctx.dim = inputs[1]
    ctx.save_for_backward(inputs[0])


def _swiglu_autograd(ctx, grad: Tensor) -> tuple[Tensor, None]:
    (x,) = ctx.saved_tensors
    return torch.ops.npu.npu_swiglu_backward(grad, x, ctx.dim), None


implement(SWIGLU, swiglu, _swiglu_fake)
implement(SWIGLU_BACKWARD, swiglu_backward, _swiglu_backward_fake)
register_autograd(SWIGLU, _swiglu_autograd, setup_context=_swiglu_setup)


# -- npu_geglu -----------------------------------------------------------------------------------------------------

_APPROXIMATE = {0: "none", 1: "tanh"}


def _check_geglu(op: str, x: Tensor, dim: int, approximate: int) -> int:
    check(approximate in _APPROXIMATE, op, f"approximate must be 0 (erf) or 1 (tanh), got {approximate}")
    return _check_glu(op, x, dim)


def geglu(x: Tensor, dim: int = -1, approximate: int = 1, activate_left: bool = False) -> tuple[Tensor, Tensor]:
    """(gelu(A) * B if activate_left else A * gelu(B), the gelu of the activated half)."""
    dim = _check_geglu("npu_geglu", x, dim, approximate)
    a, b = upcast(x).chunk(2, dim)
    gate, value = (a, b) if activate_left else (b, a)
    activated = _gelu(gate, _APPROXIMATE[approximate])
    return (activated * value).to(x.dtype), activated.to(x.dtype)


def _geglu_fake(x: Tensor, dim: int = -1, approximate: int = 1, activate_left: bool = False) -> tuple[Tensor, Tensor]:
    dim = _check_geglu("npu_geglu", x, dim, approximate)
    return x.new_empty(_halved(x, dim)), x.new_empty(_halved(x, dim))


def geglu_grad(grad_output: Tensor, x: Tensor, gelu: Tensor, dim: int = -1, approximate: int = 1,
               activate_left: bool = False) -> Tensor:
    op = "npu_geglu_grad"
    dim = _check_geglu(op, x, dim, approximate)
    check_shape(op, "grad_output", grad_output, _halved(x, dim), "half of self along dim")
    check_shape(op, "gelu", gelu, _halved(x, dim), "half of self along dim")
    a, b = upcast(x).chunk(2, dim)
    gate, value = (a, b) if activate_left else (b, a)
    g = upcast(grad_output)
    d_gate = g * value * _gelu_derivative(gate, _APPROXIMATE[approximate])
    d_value = g * upcast(gelu)
    parts = (d_gate, d_value) if activate_left else (d_value, d_gate)
    return torch.cat(parts, dim).to(x.dtype)


def _geglu_grad_fake(grad_output: Tensor, x: Tensor, gelu: Tensor, dim: int = -1, approximate: int = 1,
                     activate_left: bool = False) -> Tensor:
    _check_geglu("npu_geglu_grad", x, dim, approximate)
    return torch.empty_like(x)


def _geglu_setup(ctx, inputs, output) -> None:
    _, ctx.dim, ctx.approximate, ctx.activate_left = inputs
    ctx.save_for_backward(inputs[0], output[1])


def _geglu_autograd(ctx, grad: Tensor, _dgelu: Tensor | None) -> tuple[Tensor, None, None, None]:
    # Only the product is differentiable (derivatives.yaml: output_differentiability [true, false]).
    x, gelu = ctx.saved_tensors
    return torch.ops.npu.npu_geglu_grad(grad, x, gelu, ctx.dim, ctx.approximate, ctx.activate_left), None, None, None


implement(GEGLU, geglu, _geglu_fake)
implement(GEGLU_GRAD, geglu_grad, _geglu_grad_fake)
register_autograd(GEGLU, _geglu_autograd, setup_context=_geglu_setup)


# -- npu_gelu ------------------------------------------------------------------------------------------------------

def _check_gelu(op: str, x: Tensor, approximate: str) -> None:
    check_dtype(op, "self", x)
    check(x.dim() <= 8, op, f"self must have at most 8 dimensions, got {x.dim()}-D")
    check(approximate in ("none", "tanh"), op, f"approximate must be 'none' or 'tanh', got {approximate!r}")


def gelu(x: Tensor, *, approximate: str = "none") -> Tensor:
    _check_gelu("npu_gelu", x, approximate)
    return _gelu(upcast(x), approximate).to(x.dtype)


def _gelu_fake(x: Tensor, *, approximate: str = "none") -> Tensor:
    _check_gelu("npu_gelu", x, approximate)
    return torch.empty_like(x)


def gelu_backward(grad_output: Tensor, x: Tensor, *, approximate: str = "none") -> Tensor:
    _check_gelu("npu_gelu_backward", x, approximate)
    check_shape("npu_gelu_backward", "grad_output", grad_output, x.shape, "the shape of self")
    return (upcast(grad_output) * _gelu_derivative(upcast(x), approximate)).to(x.dtype)


def _gelu_backward_fake(grad_output: Tensor, x: Tensor, *, approximate: str = "none") -> Tensor:
    _check_gelu("npu_gelu_backward", x, approximate)
    return torch.empty_like(x)


def _gelu_setup(ctx, inputs, keyword_only_inputs, output) -> None:
    ctx.approximate = keyword_only_inputs["approximate"]
    ctx.save_for_backward(inputs[0])


def _gelu_autograd(ctx, grad: Tensor) -> Tensor:
    (x,) = ctx.saved_tensors
    return torch.ops.npu.npu_gelu_backward(grad, x, approximate=ctx.approximate)


implement(GELU, gelu, _gelu_fake)
implement(GELU_BACKWARD, gelu_backward, _gelu_backward_fake)
register_autograd(GELU, _gelu_autograd, setup_context=_gelu_setup)


# -- npu_fast_gelu / fast_gelu -------------------------------------------------------------------------------------

_FAST = 1.702


def _check_fast_gelu(op: str, x: Tensor) -> None:
    check_dtype(op, "self", x)
    check(x.dim() <= 8, op, f"self must have at most 8 dimensions, got {x.dim()}-D")


def _fast_gelu_kernels(op: str):
    """The kernel and fake of ``op`` (npu_fast_gelu and fast_gelu are one operator under two names)."""

    def fast_gelu(x: Tensor) -> Tensor:
        """x / (1 + exp(-1.702 x))."""
        _check_fast_gelu(op, x)
        acc = upcast(x)
        return (acc * torch.sigmoid(_FAST * acc)).to(x.dtype)

    def fast_gelu_fake(x: Tensor) -> Tensor:
        _check_fast_gelu(op, x)
        return torch.empty_like(x)

    return fast_gelu, fast_gelu_fake


def fast_gelu_backward(grad: Tensor, x: Tensor) -> Tensor:
    _check_fast_gelu("npu_fast_gelu_backward", x)
    check_shape("npu_fast_gelu_backward", "grad", grad, x.shape, "the shape of self")
    acc = upcast(x)
    sig = torch.sigmoid(_FAST * acc)
    return (upcast(grad) * (sig + _FAST * acc * sig * (1 - sig))).to(x.dtype)


def _fast_gelu_backward_fake(grad: Tensor, x: Tensor) -> Tensor:
    _check_fast_gelu("npu_fast_gelu_backward", x)
    return torch.empty_like(x)


def _fast_gelu_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _fast_gelu_autograd(ctx, grad: Tensor) -> Tensor:
    (x,) = ctx.saved_tensors
    return torch.ops.npu.npu_fast_gelu_backward(grad, x)


implement(FAST_GELU_BACKWARD, fast_gelu_backward, _fast_gelu_backward_fake)
for _qualname in (FAST_GELU, FAST_GELU_PLAIN):  # derivatives.yaml gives both this backward
    implement(_qualname, *_fast_gelu_kernels(_qualname.split("::")[1]))
    register_autograd(_qualname, _fast_gelu_autograd, setup_context=_fast_gelu_setup)
