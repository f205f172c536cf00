"""The statistics kernels of ``nn.SyncBatchNorm`` for the npu.

``SyncBatchNorm`` (``torch/nn/modules/_functions.py``) computes per-rank
statistics with ``batch_norm_stats``, all-gathers them, combines them with
``batch_norm_gather_stats_with_counts`` and normalizes with
``batch_norm_elemt``; backward reduces with ``batch_norm_backward_reduce``,
all-reduces, and finishes with ``batch_norm_backward_elemt``. These five ops
and ``batch_norm_gather_stats`` (every rank's count the same) exist for CUDA
only (Note [npu follows CUDA where CPU differs] in csrc/aten/cuda_semantics.cpp);
here they are computed from their definitions, with CUDA's dtypes:
statistics in the accumulation dtype (fp32 for fp16 / bf16 input), outputs
in the input's dtype, weight gradients in the weight's.
"""

from __future__ import annotations

import torch
from torch import Tensor

# The registrations live as long as this library object (made by register()).
_lib: torch.library.Library | None = None


def _acc_dtype(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _reduce_dims(t: Tensor) -> list[int]:
    """Every dimension but the channels (dim 1)."""
    return [0, *range(2, t.dim())]


def _per_channel(stat: Tensor, like: Tensor) -> Tensor:
    """``stat`` of shape (C,) viewed to broadcast against ``like`` (N, C, ...)."""
    return stat.view(1, -1, *([1] * (like.dim() - 2)))


def _invstd(var: Tensor, eps: float) -> Tensor:
    # CUDA's kernels give 0, not inf, for a constant channel with eps = 0.
    return torch.where((var == 0) & (eps == 0), torch.zeros_like(var), (var + eps).rsqrt())


def batch_norm_stats(inp: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Per-channel mean and 1 / sqrt(biased variance + eps) of this rank's input."""
    x = inp.to(_acc_dtype(inp))
    dims = _reduce_dims(x)
    mean = x.mean(dims)
    var = (x - _per_channel(mean, x)).square().mean(dims)
    return mean, _invstd(var, eps)


def batch_norm_gather_stats_with_counts(inp: Tensor, mean: Tensor, invstd: Tensor, running_mean: Tensor | None,
                                        running_var: Tensor | None, momentum: float, eps: float,
                                        counts: Tensor) -> tuple[Tensor, Tensor]:
    """Combines the ranks' (W, C) means and invstds, weighted by their (W,) counts.

    Updates the running statistics with the unbiased variance, as CUDA does.
    """
    acc = mean.dtype
    n = counts.to(acc).view(-1, 1)
    total = n.sum()
    var = (1.0 / invstd.to(acc).square() - eps).clamp_min(0)
    global_mean = (n * mean).sum(0) / total
    global_var = (n * (var + (mean - global_mean).square())).sum(0) / total
    if running_mean is not None:
        running_mean.copy_(running_mean * (1 - momentum) + global_mean * momentum)
    if running_var is not None:
        unbiased = global_var * total / (total - 1)
        running_var.copy_(running_var * (1 - momentum) + unbiased * momentum)
    return global_mean, _invstd(global_var, eps)


def batch_norm_gather_stats(inp: Tensor, mean: Tensor, invstd: Tensor, running_mean: Tensor | None,
                            running_var: Tensor | None, momentum: float, eps: float,
                            count: int) -> tuple[Tensor, Tensor]:
    """:func:`batch_norm_gather_stats_with_counts` where every rank counted ``count`` elements per
    channel, as CUDA's kernel is."""
    counts = torch.full((mean.size(0),), count, dtype=mean.dtype, device=mean.device)
    return batch_norm_gather_stats_with_counts(inp, mean, invstd, running_mean, running_var, momentum, eps, counts)


def batch_norm_elemt(inp: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                     eps: float) -> Tensor:
    """(input - mean) * invstd * weight + bias, per channel, in the input's dtype."""
    x = inp.to(mean.dtype)
    out = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    if weight is not None:
        out = out * _per_channel(weight.to(mean.dtype), x)
    if bias is not None:
        out = out + _per_channel(bias.to(mean.dtype), x)
    return out.to(inp.dtype)


def batch_norm_backward_reduce(grad_out: Tensor, inp: Tensor, mean: Tensor, invstd: Tensor,
                               weight: Tensor | None, input_g: bool, weight_g: bool,
                               bias_g: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-channel sum(dy), sum(dy * (x - mean)), and this rank's weight and bias gradients.

    CUDA leaves the outputs that were not asked for undefined; a Python
    kernel cannot, and the callers ignore them.
    """
    dy = grad_out.to(mean.dtype)
    dims = _reduce_dims(dy)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (inp.to(mean.dtype) - _per_channel(mean, dy))).sum(dims)
    param_dtype = weight.dtype if weight is not None else inp.dtype
    return sum_dy, sum_dy_xmu, (sum_dy_xmu * invstd).to(param_dtype), sum_dy.to(param_dtype)


def batch_norm_backward_elemt(grad_out: Tensor, inp: Tensor, mean: Tensor, invstd: Tensor,
                              weight: Tensor | None, sum_dy: Tensor, sum_dy_xmu: Tensor,
                              count: Tensor) -> Tensor:
    """The input gradient from the all-reduced sums over ``count.sum()`` elements per channel."""
    acc = mean.dtype
    total = count.to(acc).sum()
    dy = grad_out.to(acc)
    x = inp.to(acc)
    mean_dy = _per_channel(sum_dy.to(acc) / total, dy)
    mean_dy_xmu = _per_channel(sum_dy_xmu.to(acc) / total, dy)
    scale = _per_channel(invstd, dy)
    if weight is not None:
        scale = scale * _per_channel(weight.to(acc), dy)
    grad = (dy - mean_dy - (x - _per_channel(mean, x)) * _per_channel(invstd.square(), x) * mean_dy_xmu) * scale
    return grad.to(inp.dtype)


def register() -> None:
    """Registers SyncBatchNorm's statistics kernels for the npu (idempotent)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    for name, fn in [("batch_norm_stats", batch_norm_stats),
                     ("batch_norm_gather_stats", batch_norm_gather_stats),
                     ("batch_norm_gather_stats_with_counts", batch_norm_gather_stats_with_counts),
                     ("batch_norm_elemt", batch_norm_elemt),
                     ("batch_norm_backward_reduce", batch_norm_backward_reduce),
                     ("batch_norm_backward_elemt", batch_norm_backward_elemt)]:
        _lib.impl(name, fn, "PrivateUse1")
