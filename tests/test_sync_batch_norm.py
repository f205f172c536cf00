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
