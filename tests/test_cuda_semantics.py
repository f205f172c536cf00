"""Where CPU's kernel is stricter than CUDA's, npu follows CUDA: mixed-dtype batch norm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812  (the usual name)
from torch.testing import assert_close

import npusim  # noqa: F401


def _stats(c: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(c).abs() * 0.1, torch.rand(c) + 0.5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_reduced_input_and_weights_with_fp32_running_stats(dtype, training):
    """FSDP2 mixed precision: bf16/fp16 input and weights, fp32 running stats, as CUDA computes them (in fp32)."""
    torch.manual_seed(0)
    x = torch.randn(8, 4, 5)
    w, b = torch.rand(4) + 0.5, torch.randn(4)
    mean, var = _stats(4)
    with pytest.raises(RuntimeError):  # CPU's kernel refuses this mix
        F.batch_norm(x.to(dtype), mean.clone(), var.clone(), w.to(dtype), b.to(dtype), training)
    # The reference: CUDA's rule, computing in fp32 from the same rounded values.
    ref_mean, ref_var = mean.clone(), var.clone()
    xr = x.to(dtype).float().requires_grad_()
    wr, br = w.to(dtype).float().requires_grad_(), b.to(dtype).float().requires_grad_()
    ref = F.batch_norm(xr, ref_mean, ref_var, wr, br, training)
    ref.sum().backward()

    run_mean, run_var = mean.npu(), var.npu()
    xn = x.to(dtype).npu().requires_grad_()
    wn, bn = w.to(dtype).npu().requires_grad_(), b.to(dtype).npu().requires_grad_()
    out = F.batch_norm(xn, run_mean, run_var, wn, bn, training)
    assert out.dtype == dtype and out.device.type == "npu"
    out.float().sum().backward()
    tol = {"atol": 2e-2, "rtol": 2e-2}
    assert_close(out.cpu().float(), ref.to(dtype).float(), **tol)
    assert_close(run_mean.cpu(), ref_mean)
    assert_close(run_var.cpu(), ref_var)
    assert xn.grad.dtype == dtype and wn.grad.dtype == dtype
    assert_close(xn.grad.cpu().float(), xr.grad.to(dtype).float(), **tol)
    assert_close(wn.grad.cpu().float(), wr.grad.to(dtype).float(), **tol)
    assert_close(bn.grad.cpu().float(), br.grad.to(dtype).float(), **tol)


def test_reduced_running_stats_are_updated():
    """fp32 input with bf16 running statistics: the statistics are updated in their own dtype."""
    torch.manual_seed(0)
    x = torch.randn(16, 3)
    mean, var = torch.zeros(3, dtype=torch.bfloat16, device="npu"), torch.ones(3, dtype=torch.bfloat16, device="npu")
    F.batch_norm(x.npu(), mean, var, training=True, momentum=0.5)
    ref_mean, ref_var = torch.zeros(3), torch.ones(3)
    F.batch_norm(x, ref_mean, ref_var, training=True, momentum=0.5)
    assert mean.dtype == torch.bfloat16
    # One bf16 rounding apart at most (fp32 result rounded vs the reference's).
    assert_close(mean.cpu(), ref_mean.to(torch.bfloat16), atol=1e-2, rtol=1.6e-2)
    assert_close(var.cpu(), ref_var.to(torch.bfloat16), atol=1e-2, rtol=1.6e-2)


def test_uniform_dtype_batch_norm_is_cpu_exact():
    """Without a mix, batch norm is CPU's kernel, bit for bit."""
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    m = torch.nn.BatchNorm1d(4)
    ref = m(x)
    out = m.npu()(x.npu())
    assert torch.equal(out.cpu(), ref)
