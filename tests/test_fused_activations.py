"""op-plugin's activation operators on npu (npu_swiglu, npu_geglu, npu_gelu, npu_fast_gelu / fast_gelu) against
their documented formulas, forward and backward."""

from __future__ import annotations

import math

import pytest
import torch

from _fused_util import DTYPES, assert_device_errors, assert_matches, gradcheck, opcheck, randn

ops = torch.ops.npu


def _gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """The docs' GELU: x * Phi(x), erf form or its tanh approximation."""
    if approximate == "tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))


def _swiglu(x: torch.Tensor, dim: int) -> torch.Tensor:
    a, b = x.float().chunk(2, dim)
    return a * torch.sigmoid(a) * b


def _geglu(x: torch.Tensor, dim: int, approximate: int, activate_left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """GeGluV2: gelu(A) * B when activate_left, else A * gelu(B); approximate 0 erf, 1 tanh."""
    a, b = x.float().chunk(2, dim)
    gate, value = (a, b) if activate_left else (b, a)
    g = _gelu(gate, "tanh" if approximate else "none")
    return g * value, g


def _fast_gelu(x: torch.Tensor) -> torch.Tensor:
    """The Atlas A2 / A3 formula: x / (1 + exp(-1.702 x))."""
    x = x.float()
    return x / (1 + torch.exp(-1.702 * x))


def _forward_backward(op, reference, x: torch.Tensor, dtype: torch.dtype, grad_shape) -> None:
    """op(x) and its x-gradient equal the reference and autograd of the reference (float32)."""
    grad = randn(*grad_shape, dtype=dtype, seed=7)
    xn = x.npu().requires_grad_()
    out = op(xn)
    out.backward(grad.npu())
    xr = x.float().requires_grad_()
    ref = reference(xr)
    ref.backward(grad.float())
    assert out.dtype == dtype and xn.grad.dtype == dtype
    assert_matches(out, ref)
    assert_matches(xn.grad, xr.grad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_swiglu(dtype, dim):
    """npu_swiglu = silu(A) * B of x's halves along dim; its backward is npu_swiglu_backward."""
    x = randn(4, 6, 8, dtype=dtype)
    shape = list(x.shape)
    shape[dim] //= 2
    _forward_backward(lambda t: ops.npu_swiglu(t, dim), lambda t: _swiglu(t, dim), x, dtype, shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", [0, 1])
@pytest.mark.parametrize("activate_left", [False, True])
def test_geglu(dtype, approximate, activate_left):
    """npu_geglu's product and gelu outputs; the product's backward is npu_geglu_grad (the gelu output has none)."""
    x = randn(3, 10, dtype=dtype)
    product, activated = ops.npu_geglu(x.npu(), -1, approximate, activate_left)
    ref_product, ref_activated = _geglu(x, -1, approximate, activate_left)
    assert_matches(product, ref_product)
    assert_matches(activated, ref_activated)
    _forward_backward(lambda t: ops.npu_geglu(t, -1, approximate, activate_left)[0],
                      lambda t: _geglu(t, -1, approximate, activate_left)[0], x, dtype, (3, 5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(dtype, approximate):
    """npu_gelu in erf and tanh forms; its backward is npu_gelu_backward."""
    x = randn(5, 7, dtype=dtype, scale=2)
    _forward_backward(lambda t: ops.npu_gelu(t, approximate=approximate), lambda t: _gelu(t.float(), approximate),
                      x, dtype, (5, 7))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["npu_fast_gelu", "fast_gelu"])
def test_fast_gelu(dtype, name):
    """npu_fast_gelu and fast_gelu (one operator, two names) and their backward npu_fast_gelu_backward."""
    x = randn(5, 7, dtype=dtype, scale=2)
    _forward_backward(getattr(ops, name), _fast_gelu, x, dtype, (5, 7))


def test_activation_gradchecks():
    """Each activation's backward op passes gradcheck in float64."""
    x = randn(3, 4)
    gradcheck(lambda t: ops.npu_swiglu(t, 1), x)
    for approximate in (0, 1):
        for left in (False, True):
            gradcheck(lambda t, a=approximate, s=left: ops.npu_geglu(t, -1, a, s)[0], x)
    for approximate in ("none", "tanh"):
        gradcheck(lambda t, a=approximate: ops.npu_gelu(t, approximate=a), x)
    gradcheck(ops.npu_fast_gelu, x)


def test_activation_errors_name_the_op_and_argument():
    """Odd split sizes, bad dims and modes, dtypes and devices are refused naming the op and the argument."""
    x = randn(3, 5).npu()
    with pytest.raises(RuntimeError, match=r"npu_swiglu: self's size in dim 1 must be even, got 5"):
        ops.npu_swiglu(x)
    with pytest.raises(RuntimeError, match=r"npu_geglu: dim must be in \[-2, 1\], got 2"):
        ops.npu_geglu(x, 2)
    with pytest.raises(RuntimeError, match="npu_geglu: approximate must be 0 .erf. or 1 .tanh., got 3"):
        ops.npu_geglu(randn(3, 4).npu(), -1, 3)
    with pytest.raises(RuntimeError, match="npu_gelu: approximate must be 'none' or 'tanh', got 'erf'"):
        ops.npu_gelu(x, approximate="erf")
    with pytest.raises(RuntimeError, match="npu_fast_gelu: self must be float16, .*, got int32"):
        ops.npu_fast_gelu(x.int())
    with pytest.raises(RuntimeError, match=r"npu_swiglu_backward: grad_output must have shape \(3, 2\)"):
        ops.npu_swiglu_backward(randn(3, 3).npu(), randn(3, 4).npu())
    with pytest.raises(RuntimeError, match="npu_gelu: self must be on an npu device, got cpu"):
        ops.npu_gelu(x.cpu())
    assert_device_errors(ops.npu_gelu_backward, [x, x], 1, "self", "npu_gelu_backward")


def test_activation_ops_pass_opcheck():
    """PyTorch's opcheck (schema, fake kernel, AOT tracing) of every activation operator and backward op."""
    x, half = randn(3, 8).npu().requires_grad_(), randn(3, 4, seed=1).npu()
    opcheck(ops.npu_swiglu, x, -1)
    opcheck(ops.npu_swiglu_backward, half, x.detach(), -1)
    opcheck(ops.npu_geglu, x, -1, 0, True)
    opcheck(ops.npu_geglu_grad, half, x.detach(), half, -1, 1, False)
    opcheck(ops.npu_gelu, x, approximate="tanh")
    opcheck(ops.npu_gelu_backward, x.detach(), x.detach(), approximate="none")
    opcheck(ops.npu_fast_gelu, x)
    opcheck(ops.fast_gelu, x)
    opcheck(ops.npu_fast_gelu_backward, x.detach(), x.detach())
