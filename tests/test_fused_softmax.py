"""op-plugin's npu_scaled_masked_softmax on npu against its reference: softmax of x * scale filled with -10000 where
the mask is True, forward and backward, with a given mask and with fixed_triu_mask."""

from __future__ import annotations

import pytest
import torch

from _fused_util import DTYPES, assert_device_errors, assert_matches, gradcheck, opcheck, randn

ops = torch.ops.npu


def _reference(x: torch.Tensor, mask: torch.Tensor, scale: float, fixed_triu_mask: bool) -> torch.Tensor:
    """op-plugin's test_scaled_masked_softmax.py, in float32."""
    if fixed_triu_mask:
        mask = torch.triu(torch.ones(mask.shape, device=mask.device), diagonal=1).bool()
    return torch.softmax((x.float() * scale).masked_fill(mask, -10000), dim=-1)


def _mask(*shape: int, seed: int = 5) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.6


# (mask shape, fixed_triu_mask): a full mask, one broadcast over heads, a 2-D one, and the generated triangle.
_MASKS = [((2, 3, 32, 64), False), ((2, 1, 32, 64), False), ((32, 64), False), ((32, 64), True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_shape, fixed_triu_mask", _MASKS, ids=["full", "heads", "2d", "triu"])
def test_scaled_masked_softmax_forward_and_backward(dtype, mask_shape, fixed_triu_mask):
    """Output and x-gradient (npu_scaled_masked_softmax_backward) equal the reference and its autograd."""
    x, grad = randn(2, 3, 32, 64, dtype=dtype, scale=3), randn(2, 3, 32, 64, dtype=dtype, seed=1)
    mask = _mask(*mask_shape)
    xn = x.npu().requires_grad_()
    out = ops.npu_scaled_masked_softmax(xn, mask.npu(), 0.7, fixed_triu_mask)
    out.backward(grad.npu())
    xr = x.float().requires_grad_()
    ref = _reference(xr, mask, 0.7, fixed_triu_mask)
    ref.backward(grad.float())
    assert out.dtype == dtype and xn.grad.dtype == dtype
    assert_matches(out, ref)
    assert_matches(xn.grad, xr.grad)


def test_scaled_masked_softmax_masks_to_exactly_zero_gradient():
    """Masked positions get a zero gradient even in a fully masked row (the filled scores do not depend on x)."""
    mask = torch.zeros(32, 32, dtype=torch.bool)
    mask[0] = True  # row 0 fully masked: its softmax is uniform
    xn = randn(1, 1, 32, 32).npu().requires_grad_()
    out = ops.npu_scaled_masked_softmax(xn, mask.npu(), 1.0)
    (out * randn(1, 1, 32, 32, seed=1).npu()).sum().backward()
    assert torch.allclose(out[0, 0, 0].cpu(), torch.full((32,), 1 / 32))
    assert torch.equal(xn.grad[0, 0, 0].cpu(), torch.zeros(32))


@pytest.mark.parametrize("fixed_triu_mask", [False, True])
def test_scaled_masked_softmax_gradcheck(fixed_triu_mask):
    """The backward op passes gradcheck in float64."""
    mask = _mask(1, 1, 32, 32).npu()
    gradcheck(lambda t: ops.npu_scaled_masked_softmax(t, mask, 0.5, fixed_triu_mask), randn(1, 1, 32, 32))


def test_scaled_masked_softmax_errors_name_the_op_and_argument():
    """The documented shape limits, a non-bool or non-broadcasting mask, and devices are refused by name."""
    x, mask = randn(2, 32, 64).npu(), _mask(32, 64).npu()
    with pytest.raises(RuntimeError, match=r"npu_scaled_masked_softmax: x's W dimension must be a multiple of 32 in "
                                           r"\[32, 4096\], got 48"):
        ops.npu_scaled_masked_softmax(randn(2, 32, 48).npu(), mask[:, :48])
    with pytest.raises(RuntimeError, match="npu_scaled_masked_softmax: mask must be bool, got float32"):
        ops.npu_scaled_masked_softmax(x, mask.float())
    with pytest.raises(RuntimeError, match=r"npu_scaled_masked_softmax: mask of shape \(3, 32, 64\) must broadcast"):
        ops.npu_scaled_masked_softmax(x, _mask(3, 32, 64).npu())
    assert_device_errors(ops.npu_scaled_masked_softmax, [x, mask], 1, "mask", "npu_scaled_masked_softmax")


def test_softmax_ops_pass_opcheck():
    """PyTorch's opcheck (schema, fake kernel, AOT tracing) of the softmax operator and its backward op."""
    x, mask = randn(1, 2, 32, 32).npu().requires_grad_(), _mask(1, 1, 32, 32).npu()
    opcheck(ops.npu_scaled_masked_softmax, x, mask, 0.3, False)
    y = ops.npu_scaled_masked_softmax(x, mask).detach()
    opcheck(ops.npu_scaled_masked_softmax_backward, torch.ones_like(y), y, mask, 0.3, True)
