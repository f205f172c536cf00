"""nn.SyncBatchNorm on 2 npu ranks equals one BatchNorm over the whole batch on CPU."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.testing import assert_close

from npusim.testing.ranks import run_ranks


def _data(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(shape, generator=gen) * 3 + 1, torch.randn(shape, generator=gen)


def _reference(shape: tuple[int, ...], steps: int) -> dict[str, torch.Tensor]:
    x, g = _data(shape)
    bn = nn.BatchNorm2d(shape[1], momentum=0.3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        xr = x.clone().requires_grad_()
        out = bn(xr)
        bn.zero_grad()
        (out * g).sum().backward()
    return {"out": out.detach(), "grad_x": xr.grad, "grad_w": bn.weight.grad, "grad_b": bn.bias.grad,
            "running_mean": bn.running_mean, "running_var": bn.running_var}


def _sync_bn_rank(rank: int, world: int, shape: tuple[int, ...], steps: int) -> dict[str, torch.Tensor]:
    x, g = _data(shape)
    part = shape[0] // world
    x, g = x[rank * part:(rank + 1) * part].npu(), g[rank * part:(rank + 1) * part].npu()
    bn = nn.SyncBatchNorm(shape[1], momentum=0.3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
    bn = bn.npu()
    for _ in range(steps):
        xr = x.clone().requires_grad_()
        out = bn(xr)
        bn.zero_grad()
        (out * g).sum().backward()
    grads = torch.cat([bn.weight.grad, bn.bias.grad])
    dist.all_reduce(grads)  # each rank holds its part's parameter gradients
    c = shape[1]
    return {"out": out.detach().cpu(), "grad_x": xr.grad.cpu(), "grad_w": grads[:c].cpu(),
            "grad_b": grads[c:].cpu(), "running_mean": bn.running_mean.cpu(), "running_var": bn.running_var.cpu()}


def test_sync_batch_norm_matches_single_process_batch_norm():
    """Outputs, input and parameter gradients and running statistics over 2 steps match CPU BatchNorm2d."""
    shape, steps = (6, 3, 4, 5), 2
    ref = _reference(shape, steps)
    results = run_ranks(_sync_bn_rank, shape, steps, timeout=150)
    part = shape[0] // 2
    for rank, res in enumerate(results):
        rows = slice(rank * part, (rank + 1) * part)
        assert_close(res["out"], ref["out"][rows], atol=1e-5, rtol=1e-4)
        assert_close(res["grad_x"], ref["grad_x"][rows], atol=1e-5, rtol=1e-4)
        for key in ("grad_w", "grad_b", "running_mean", "running_var"):
            assert_close(res[key], ref[key], atol=1e-5, rtol=1e-4, msg=lambda m, k=key: f"{k}: {m}")


def test_batch_norm_gather_stats_equal_counts():
    """batch_norm_gather_stats (every rank counts `count` elements) combines per-rank statistics into
    the whole batch's mean and invstd and updates the running statistics as BatchNorm over the whole
    batch does; it equals the counts variant given equal counts."""
    x = torch.randn(6, 4, 5, 5, generator=torch.Generator().manual_seed(3)) * 2 + 1
    eps, momentum = 1e-5, 0.1
    stats = [torch.batch_norm_stats(chunk.npu(), eps) for chunk in x.chunk(3)]
    mean = torch.stack([m for m, _ in stats])
    invstd = torch.stack([s for _, s in stats])
    running_mean, running_var = torch.zeros(4, device="npu"), torch.ones(4, device="npu")
    count = 2 * 5 * 5
    got_mean, got_invstd = torch.batch_norm_gather_stats(x.npu(), mean, invstd, running_mean, running_var,
                                                         momentum, eps, count)
    assert_close(got_mean.cpu(), x.mean((0, 2, 3)))
    assert_close(got_invstd.cpu(), (x.var((0, 2, 3), unbiased=False) + eps).rsqrt())
    ref_mean, ref_var = torch.zeros(4), torch.ones(4)
    torch.nn.functional.batch_norm(x, ref_mean, ref_var, training=True, momentum=momentum, eps=eps)
    assert_close(running_mean.cpu(), ref_mean)
    assert_close(running_var.cpu(), ref_var)
    counts = torch.full((3,), float(count), device="npu")
    with_counts = torch.batch_norm_gather_stats_with_counts(x.npu(), mean, invstd, None, None, momentum, eps,
                                                             counts)
    assert torch.equal(with_counts[0].cpu(), got_mean.cpu()) and torch.equal(with_counts[1].cpu(), got_invstd.cpu())
