"""Ops the chip computes in float32 for 16-bit operands: fp16 / bf16 binary_cross_entropy_with_logits on npu
equals CPU's float32 result rounded once, forward and backward, with and without autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812  (the usual name)

import npusim  # noqa: F401  (registers the npu)

# (weight shape, pos_weight shape) of torch_npu's test_binary_cross_entropy_with_logits, on (10, 64) inputs.
_WEIGHTS = [(None, None), ((10, 1), None), (None, (64,)), ((10, 64), (10, 64))]
_REDUCTIONS = ("none", "mean", "sum")


def _inputs(dtype: torch.dtype, weight_shape: tuple | None, pos_shape: tuple | None) -> list[torch.Tensor | None]:
    """x in [0, 10), a 0/1 target, weights in [0, 10), as torch_npu's test draws them."""
    generator = torch.Generator().manual_seed(42)
    x = (torch.rand(10, 64, generator=generator) * 10).to(dtype)
    target = torch.randint(0, 2, (10, 64), generator=generator).to(dtype)
    weight = None if weight_shape is None else (torch.rand(weight_shape, generator=generator) * 10).to(dtype)
    pos = None if pos_shape is None else (torch.rand(pos_shape, generator=generator) * 10).to(dtype)
    return [x, target, weight, pos]


def _npu(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.npu()


def _float32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward_is_the_float32_result_rounded_once(dtype: torch.dtype) -> None:
    """Every reduction and weighting of torch_npu's test: npu equals CPU's float32 result cast to the 16-bit dtype,
    where CPU's own 16-bit composite, rounding every step, differs in some of them."""
    cpu_differs = 0
    for weight_shape, pos_shape in _WEIGHTS:
        x, target, weight, pos = _inputs(dtype, weight_shape, pos_shape)
        for reduction in _REDUCTIONS:
            expected = F.binary_cross_entropy_with_logits(
                x.float(), target.float(), _float32(weight), pos_weight=_float32(pos), reduction=reduction).to(dtype)
            got = F.binary_cross_entropy_with_logits(x.npu(), target.npu(), _npu(weight), pos_weight=_npu(pos),
                                                     reduction=reduction)
            assert got.device.type == "npu" and got.dtype == dtype
            assert torch.equal(got.cpu(), expected), (weight_shape, pos_shape, reduction)
            cpu = F.binary_cross_entropy_with_logits(x, target, weight, pos_weight=pos, reduction=reduction)
            cpu_differs += not torch.equal(cpu, expected)
    assert cpu_differs > 0, "no case tells the float32-inside kernel from CPU's 16-bit composite"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gradients_are_the_float32_gradients_rounded_once(dtype: torch.dtype) -> None:
    """The gradients of input and target are the float32 ones cast to the 16-bit dtype (the chip's backward
    kernel rounds once too); autograd records the casts around the float32 op."""
    for weight_shape, pos_shape in _WEIGHTS:
        x, target, weight, pos = _inputs(dtype, weight_shape, pos_shape)
        x32, t32 = x.float().requires_grad_(), target.float().requires_grad_()
        F.binary_cross_entropy_with_logits(x32, t32, _float32(weight), pos_weight=_float32(pos),
                                           reduction="sum").backward()
        xn, tn = x.npu().requires_grad_(), target.npu().requires_grad_()
        loss = F.binary_cross_entropy_with_logits(xn, tn, _npu(weight), pos_weight=_npu(pos), reduction="sum")
        assert type(loss.grad_fn).__name__ == "ToCopyBackward0"
        loss.backward()
        assert xn.grad.dtype == tn.grad.dtype == dtype
        assert torch.equal(xn.grad.cpu(), x32.grad.to(dtype)), (weight_shape, pos_shape)
        assert torch.equal(tn.grad.cpu(), t32.grad.to(dtype)), (weight_shape, pos_shape)


def test_without_autograd_the_npu_kernel_computes_in_float32() -> None:
    """Under torch.inference_mode (no autograd key) the npu kernel itself computes in float32."""
    x, target, weight, pos = _inputs(torch.float16, (10, 64), (10, 64))
    expected = F.binary_cross_entropy_with_logits(x.float(), target.float(), weight.float(), pos_weight=pos.float(),
                                                  reduction="sum").half()
    with torch.inference_mode():
        got = F.binary_cross_entropy_with_logits(x.npu(), target.npu(), weight.npu(), pos_weight=pos.npu(),
                                                 reduction="sum")
    assert got.dtype == torch.float16 and torch.equal(got.cpu(), expected)


def test_float32_and_mixed_dtypes_keep_pytorchs_kernel() -> None:
    """float32 (and a float16 input with a float32 target) take PyTorch's composite and formula, equal to CPU."""
    x, target, _, _ = _inputs(torch.float32, None, None)
    for xt, tt in ((x, target), (x.half(), target)):
        cpu_x, npu_x = xt.clone().requires_grad_(), xt.npu().requires_grad_()
        cpu_loss = F.binary_cross_entropy_with_logits(cpu_x, tt)
        npu_loss = F.binary_cross_entropy_with_logits(npu_x, tt.npu())
        assert type(npu_loss.grad_fn).__name__ == "BinaryCrossEntropyWithLogitsBackward0"
        assert npu_loss.dtype == cpu_loss.dtype
        torch.testing.assert_close(npu_loss.cpu(), cpu_loss, rtol=0, atol=0)
        cpu_loss.backward()
        npu_loss.backward()
        torch.testing.assert_close(npu_x.grad.cpu(), cpu_x.grad, rtol=0, atol=0)
