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
    """OpInfo's dtypes CUDA lists and CPU does not, by op full name."""
    from torch.testing._internal.common_methods_invocations import op_db

    return {op.full_name: set(op.dtypesIfCUDA) - set(op.dtypes) for op in op_db
            if op.dtypesIfCUDA is not None and set(op.dtypesIfCUDA) - set(op.dtypes)}


REDUCED = {torch.float16, torch.bfloat16}
# (op, dtypes) npu computes as CUDA defines them; see Note [Dtypes CUDA accepts and CPU refuses].
COMPUTED_AS_CUDA = {
    "histc": set(INTEGRAL), "abs": {torch.bool}, "nn.functional.softsign": {torch.bool}, "trace": {torch.bool},
    "nansum": {torch.complex64, torch.complex128}, "nanmean": {torch.complex64, torch.complex128},
    "nn.functional.avg_pool3d": REDUCED, "_upsample_bilinear2d_aa": REDUCED,
    "nn.functional.multi_margin_loss": REDUCED, "nn.functional.multilabel_margin_loss": REDUCED,
    "nn.functional.rrelu": {torch.float16},
}


def _not_honoured(name: str, dtype: torch.dtype) -> bool:
    """complex32, fp16 fft and CUDA's fused attention kernels (no CPU kernel at all), with the Note's reasons."""
    return dtype == torch.complex32 or name.startswith(("fft.", "torch.ops.aten._"))


def _on_npu(value):
    return value.npu() if isinstance(value, torch.Tensor) else value


def _to_cpu(tree):
    return torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, tree)


def _check_cuda_only(op, name: str, dtype: torch.dtype) -> None:
    """The first two samples of ``op`` in ``dtype``: CUDA's results where npu computes them, CPU's where CPU runs
    them, else a clear error for a dtype the Note says is not honoured."""
    for sample in list(op.sample_inputs("cpu", dtype))[:2]:
        args = [_on_npu(v) for v in (sample.input, *sample.args)]
        kwargs = {k: _on_npu(v) for k, v in sample.kwargs.items()}
        if dtype in COMPUTED_AS_CUDA.get(name, ()):
            got = op(*args, **kwargs)
            if name == "nn.functional.rrelu":  # random slopes: the dtype and the positive part
                positive = sample.input > 0
                assert got.dtype == dtype and torch.equal(got.cpu()[positive], sample.input[positive])
            elif dtype in REDUCED:  # CUDA's definition: the reduced tensors read in fp32, rounded once
                wide = [v.float() if isinstance(v, torch.Tensor) and v.dtype == dtype else v
                        for v in (sample.input, *sample.args)]
                assert_close(got.cpu(), op(*wide, **sample.kwargs).to(dtype), msg=f"{name} {dtype}")
            else:
                assert got.device.type == "npu", name
            continue
        try:
            expected = op(sample.input, *sample.args, **sample.kwargs)
        except (RuntimeError, NotImplementedError):
            assert _not_honoured(name, dtype), f"{name} {dtype}: CPU refuses it and npu does not compute it"
            with pytest.raises((RuntimeError, NotImplementedError)):
                op(*args, **kwargs)
            continue
        assert_close(_to_cpu(op(*args, **kwargs)), expected, equal_nan=True, msg=f"{name} {dtype}")


def test_opinfo_dtypes_only_cuda_has_are_computed_as_cuda_does():
    """Every (op, dtype) OpInfo lists for CUDA and not for CPU: integer histc, bool abs / softsign / trace,
    fp16 / bf16 pooling, losses and rrelu, complex nansum / nanmean give CUDA's results on npu; those CPU runs
    already (stale OpInfo lists) run on npu; complex32, fp16 fft and CUDA's fused attention raise clear errors."""
    from torch.testing._internal.common_methods_invocations import op_db

    ops = {op.full_name: op for op in op_db}
    extra = _cuda_only_dtypes()
    integral = {name: {d for d in ds if not d.is_floating_point and not d.is_complex} for name, ds in extra.items()}
    narrow = ("histc", "abs", "nn.functional.softsign", "trace")
    assert {name: ds for name, ds in integral.items() if ds} == {n: COMPUTED_AS_CUDA[n] for n in narrow}
    for name, dtypes in sorted(extra.items()):
        for dtype in sorted(dtypes, key=str):
            _check_cuda_only(ops[name], name, dtype)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_complex32_ops_run_on_the_host_after_the_streams_work():
    """An op with a complex32 npu argument runs on the host after the stream's earlier work, whatever its size
    (Note [complex32 on the host]): acos and exp, which CPU refuses, raise CPU's error from the call, where as
    stream tasks they failed the device; a product of a conversion still on the stream, and a backward pass
    through complex32, give CPU's values; later work runs."""
    torch.manual_seed(0)
    n = 1 << 16  # a stream task were it not complex32 (Note [Work on an idle stream])
    x = torch.randn(n, dtype=torch.complex64).to(torch.complex32)
    w = torch.randn(n)
    xn = x.npu()
    busy = torch.randn(512, 512, device="npu")
    for op in (torch.acos, torch.exp):
        busy = busy @ busy  # the stream has earlier work
        with pytest.raises(RuntimeError, match="not implemented for 'ComplexHalf'"):
            op(xn)
    # The conversion is a stream task; the host's product reads its result after it.
    product = w.npu().to(torch.complex32) * xn
    assert torch.equal(torch.view_as_real(product.cpu()), torch.view_as_real(w.to(torch.complex32) * x))
    grads = []
    for device in ("cpu", "npu"):
        leaf = w.to(device, copy=True).requires_grad_()
        (leaf.to(torch.complex32) * x.to(device)).abs().float().sum().backward()  # abs's backward: complex32
        grads.append(leaf.grad.cpu())
    assert torch.equal(grads[1], grads[0])
    torch.npu.synchronize()
    assert torch.equal((busy + 1).cpu(), busy.cpu() + 1)


def test_an_op_without_a_cpu_kernel_raises_from_the_call():
    """CUDA's fused attention has no CPU kernel: npu does not compute it, and the call raises PyTorch's error
    whatever its size (OpTraits::host_only), where as a stream task it failed the device; later work runs."""
    q = torch.randn(1, 1024, 4, 64, device="npu")  # 262144 elements: a stream task, were it one
    with pytest.raises(NotImplementedError, match="Could not run 'aten::_flash_attention_forward'"):
        torch.ops.aten._flash_attention_forward(q, q, q, None, None, 1024, 1024, 0.0, False, False)
    torch.npu.synchronize()
    assert torch.equal((q + 1).cpu(), q.cpu() + 1)


def test_widened_ops_keep_their_gradients_in_the_reduced_dtype():
    """fp16 / bf16 avg_pool3d forward and backward on npu are CPU's fp32 kernels rounded once, as CUDA's
    accumulate in fp32; the out= variant writes the caller's fp16 tensor."""
    torch.manual_seed(0)
    for dtype in sorted(REDUCED, key=str):
        x = torch.randn(2, 3, 4, 4, 4, dtype=dtype)
        xn = x.npu().requires_grad_()
        out = F.avg_pool3d(xn, 2)
        out.float().square().sum().backward()
        xr = x.float().requires_grad_()
        ref = F.avg_pool3d(xr, 2)
        ref.to(dtype).float().square().sum().backward()
        assert out.dtype == dtype and torch.equal(out.cpu(), ref.to(dtype))
        assert xn.grad.dtype == dtype
        assert_close(xn.grad.cpu(), xr.grad.to(dtype))
    written = torch.empty(0, dtype=torch.float16, device="npu")
    ones = torch.ones(1, 1, 2, 2, 2, dtype=torch.float16, device="npu")
    assert torch._C._nn.avg_pool3d(ones, 2, out=written) is written
    assert written.dtype == torch.float16 and written.cpu().flatten().tolist() == [1.0]


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


# Note [Half-to-float softmax as CUDA's] (csrc/aten/fallback_routes.cpp).


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_half_to_float_softmax_and_its_backward_are_cudas(log):
    """aten::_(log_)softmax(x_half, dim, half_to_float=True) gives CUDA's float32 result of the fp32 computation;
    its backward (_softmax_backward_data with float grad and output, input_dtype half) a half gradient; bf16 with
    half_to_float is refused with CUDA's message."""
    forward = torch.ops.aten._log_softmax if log else torch.ops.aten._softmax
    reference = torch.log_softmax if log else torch.softmax
    x, grad = torch.randn(4, 7, dtype=torch.half), torch.randn(4, 7)
    xn = x.npu().requires_grad_()
    out = forward(xn, -1, True)
    out.backward(grad.npu())
    xr = x.float().requires_grad_()
    ref = reference(xr, -1)
    ref.backward(grad)
    assert out.dtype == torch.float32 and xn.grad.dtype == torch.float16
    assert_close(out.cpu(), ref)
    assert_close(xn.grad.cpu(), xr.grad.half())
    backward = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    direct = backward(grad.npu(), ref.detach().npu(), -1, torch.float16)
    assert direct.dtype == torch.float16
    assert_close(direct.cpu(), xr.grad.half())
    with pytest.raises(RuntimeError, match="conversion is supported for Half type only"):
        forward(x.bfloat16().npu(), -1, True).cpu()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_reduced_bicubic_antialiased_upsampling_is_cudas(dtype):
    """F.interpolate(mode="bicubic", antialias=True) of fp16 / bf16 is CPU's fp32 kernel on the widened values
    rounded once, forward and backward, as CUDA's kernel accumulates in fp32 (bilinear AA already is)."""
    x = torch.randn(2, 3, 9, 11, dtype=dtype)
    xn = x.npu().requires_grad_()
    out = F.interpolate(xn, size=(4, 5), mode="bicubic", antialias=True)
    out.float().square().sum().backward()
    xr = x.float().requires_grad_()
    ref = F.interpolate(xr, size=(4, 5), mode="bicubic", antialias=True)
    ref.to(dtype).float().square().sum().backward()
    assert out.dtype == dtype and xn.grad.dtype == dtype
    assert torch.equal(out.cpu(), ref.to(dtype))
    assert_close(xn.grad.cpu(), xr.grad.to(dtype))
