"""Where CPU's kernel is stricter than CUDA's, npu follows CUDA: mixed-dtype batch norm (and where
CUDA's fused backward refuses the mix), integer histc, bool abs / softsign / trace."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812  (the usual name)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.testing import assert_close

import npusim  # noqa: F401


def _stats(c: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(c).abs() * 0.1, torch.rand(c) + 0.5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_reduced_input_and_weights_with_fp32_running_stats(dtype, training):
    """FSDP2 mixed precision: bf16/fp16 (N, C) input and weights, fp32 running stats, as CUDA computes them
    (in fp32; an (N, C) input takes CUDA's channels-last kernels, which accept the mix)."""
    torch.manual_seed(0)
    x = torch.randn(8, 4)
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


FUSED_BACKWARD_ERROR = "Expected running_mean to have type {} but got Float"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5, 7), (3, 5, 7, 7)], ids=["NCL", "NCHW"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_fused_backward_refuses_reduced_weights_with_fp32_stats(dtype, shape, training):
    """CUDA's fused backward (NCHW-like input) reads weight and running stats in one dtype: bf16/fp16 weights
    with fp32 stats raise CUDA's error in backward; the forward computes; fp32 weights, or channels_last, compute."""
    x = torch.randn(*shape, dtype=dtype, device="npu", requires_grad=True)
    w = torch.ones(5, dtype=dtype, device="npu", requires_grad=True)
    b = torch.zeros(5, dtype=dtype, device="npu", requires_grad=True)
    out = F.batch_norm(x, torch.zeros(5, device="npu"), torch.ones(5, device="npu"), w, b, training)
    assert out.dtype == dtype
    name = "BFloat16" if dtype == torch.bfloat16 else "Half"
    with pytest.raises(RuntimeError, match=FUSED_BACKWARD_ERROR.format(name)):
        out.sum().backward()
    assert x.grad is None and w.grad is None
    w32, b32 = w.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    F.batch_norm(x, torch.zeros(5, device="npu"), torch.ones(5, device="npu"), w32, b32, training).sum().backward()
    assert x.grad.dtype == dtype and w32.grad.dtype == torch.float32
    if len(shape) == 4:
        xl = x.detach().to(memory_format=torch.channels_last).requires_grad_()
        F.batch_norm(xl, torch.zeros(5, device="npu"), torch.ones(5, device="npu"), w, b, training).sum().backward()
        assert xl.grad.dtype == dtype and w.grad.dtype == dtype


@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fsdp2_norm_modules_follow_cuda(param_dtype):
    """PyTorch's test_fully_shard_mixed_precision.py _test_norm_modules on a one-rank npu group: LayerNorm and
    BatchNorm1d train, BatchNorm2d with fp32 buffers raises CUDA's error in backward, and trains with its
    buffers cast down or with an output_dtype-only policy."""
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("npu", 0))
    try:
        policy = MixedPrecisionPolicy(param_dtype=param_dtype)

        def sharded(*modules: nn.Module, norm_policy: MixedPrecisionPolicy = policy) -> nn.Sequential:
            model = nn.Sequential(*modules).to("npu")
            fully_shard(model[1], mp_policy=norm_policy)
            for module in (model[0], model[2], model):
                fully_shard(module, mp_policy=policy)
            return model

        def step(model: nn.Module, x: torch.Tensor) -> None:
            z = model(x.npu())
            assert z.dtype == param_dtype
            z.sum().backward()

        step(sharded(nn.Linear(32, 32), nn.LayerNorm(32), nn.Linear(32, 32)), torch.randn(4, 32))
        step(sharded(nn.Linear(32, 32), nn.BatchNorm1d(32), nn.Linear(32, 32)), torch.randn(4, 32))
        convs = (nn.Conv2d(1, 5, 3), nn.BatchNorm2d(5), nn.Conv2d(5, 4, 3))
        name = "BFloat16" if param_dtype == torch.bfloat16 else "Half"
        with pytest.raises(RuntimeError, match=FUSED_BACKWARD_ERROR.format(name)):
            step(sharded(*convs), torch.randn(3, 1, 9, 9))
        model = sharded(nn.Conv2d(1, 5, 3), nn.BatchNorm2d(5), nn.Conv2d(5, 4, 3))
        model[1].running_mean = model[1].running_mean.to(param_dtype)
        model[1].running_var = model[1].running_var.to(param_dtype)
        step(model, torch.randn(3, 1, 9, 9))
        step(sharded(nn.Conv2d(1, 5, 3), nn.BatchNorm2d(5), nn.Conv2d(5, 4, 3),
                     norm_policy=MixedPrecisionPolicy(output_dtype=param_dtype)), torch.randn(3, 1, 9, 9))
    finally:
        dist.destroy_process_group()


# ---- dtypes CUDA accepts and CPU refuses (Note [Dtypes CUDA accepts and CPU refuses]) -------------

def _histc_cuda(values: list[int], bins: int, lo: float, hi: float) -> list[int]:
    """CUDA's _histc_cuda for integer input, in plain Python: int64 bounds, integer bin arithmetic."""
    lo_i, hi_i = int(lo), int(hi)
    if lo_i == hi_i and values:
        lo_i, hi_i = min(values), max(values)
    if lo_i == hi_i:
        lo_i, hi_i = lo_i - 1, hi_i + 1
    counts = [0] * bins
    for v in values:
        if lo_i <= v <= hi_i:
            counts[min((v - lo_i) * bins // (hi_i - lo_i), bins - 1)] += 1
    return counts


INTEGRAL = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _cuda_only_dtypes() -> dict[str, set[torch.dtype]]:
    from torch.testing._internal.common_methods_invocations import op_db

    out = {}
    for op in op_db:
        cpu = set(op.dtypes)
        extra = set(op.dtypesIfCUDA) - cpu if op.dtypesIfCUDA is not None else set()
        if extra:
            out[op.full_name] = extra
    return out


def test_opinfo_integer_and_bool_dtypes_only_cuda_has_are_the_covered_ones():
    """OpInfo's dtypesIfCUDA against dtypes: the integer / bool inputs CUDA accepts and CPU refuses are
    histc's integers, abs, softsign and trace of bool, the ones npu computes as CUDA does."""
    narrow = {name: {d for d in extra if not d.is_floating_point and not d.is_complex}
              for name, extra in _cuda_only_dtypes().items()}
    assert {name: d for name, d in narrow.items() if d} == {
        "histc": set(INTEGRAL), "abs": {torch.bool}, "nn.functional.softsign": {torch.bool}, "trace": {torch.bool}}


@pytest.mark.parametrize("dtype", INTEGRAL, ids=str)
def test_histc_of_integers_is_cudas(dtype):
    """torch.histc of integer npu input (torchtitan's MoE router) counts as CUDA's kernel does, in the input's
    dtype; the out= form too; bad bounds raise CUDA's errors; CPU's kernel still refuses the input."""
    torch.manual_seed(0)
    x = torch.randint(0, 100, (257,), dtype=dtype)
    for bins, lo, hi in ((8, 0, 8), (10, 0, 0), (7, 3.5, 60.9), (16, 99, 99)):
        got = torch.histc(x.npu(), bins=bins, min=lo, max=hi)
        assert got.dtype == dtype and got.device.type == "npu"
        assert got.cpu().tolist() == _histc_cuda(x.tolist(), bins, lo, hi), (bins, lo, hi)
    out = torch.empty(0, dtype=torch.int64, device="npu")
    assert torch.histc(x.npu(), bins=5, min=0, max=50, out=out) is out
    assert out.cpu().tolist() == _histc_cuda(x.tolist(), 5, 0, 50)
    experts = torch.randint(0, 8, (64, 2), dtype=dtype)
    routed = torch.histc(experts.npu().view(-1), bins=8, min=0, max=8)  # torchtitan's tokens per expert
    assert routed.cpu().tolist() == torch.bincount(experts.view(-1).long(), minlength=8).tolist()
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x.npu(), bins=4, min=9, max=2)
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(x.npu(), bins=0)
    with pytest.raises(NotImplementedError, match="histogram_cpu"):
        torch.histc(x, bins=4)
    assert torch.equal(torch.histc(x.npu().double(), bins=6).cpu(), torch.histc(x.double(), bins=6))  # CPU's


def test_abs_softsign_and_trace_of_bool_are_cudas():
    """abs of bool is the identity, softsign of bool x / (1 + x), trace of bool the count on the diagonal
    (int64), as CUDA computes them; CPU refuses all three; other dtypes keep CPU's kernels."""
    b = torch.tensor([[True, False, True], [False, False, True], [True, True, True]])
    n = b.npu()
    assert torch.equal(torch.abs(n).cpu(), b) and torch.abs(n).dtype == torch.bool
    assert torch.equal(n.clone().abs_().cpu(), b)
    assert torch.equal(F.softsign(n).cpu(), b.float() / (1 + b.float()))
    assert torch.trace(n).dtype == torch.int64 and torch.trace(n).item() == 2
    for call in (torch.abs, F.softsign, torch.trace):
        with pytest.raises(NotImplementedError, match="Bool"):
            call(b)
    with pytest.raises(RuntimeError, match="expected a matrix"):
        torch.trace(n[0])
    x = torch.randn(4, 4)
    assert torch.equal(torch.abs(x.npu()).cpu(), torch.abs(x))
    assert torch.equal(torch.trace(x.npu()).cpu(), torch.trace(x))
