"""World-size-2 FSDP2 training with and without the historical patch (run by test_historical_patch.py
through npusim.testing.ranks.run_ranks). Each rank returns, for each mode, the losses, the final full
parameters and how the foreach copies it saw were issued."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

import npusim.distributed  # noqa: F401  (npu device and its collective backend)
from npusim.distributed import historical_patch as hp

STEPS = 3


class CopyCounter:
    """Counts ``torch._foreach_copy_`` calls from any thread (autograd's included), and those non_blocking."""

    def __init__(self) -> None:
        self.total = self.non_blocking = 0
        self._real = torch._foreach_copy_

    def __enter__(self) -> CopyCounter:
        def counting(dsts, srcs, non_blocking=False):
            self.total += 1
            self.non_blocking += bool(non_blocking)
            return self._real(dsts, srcs, non_blocking=non_blocking)

        torch._foreach_copy_ = counting
        return self

    def __exit__(self, *exc: object) -> None:
        torch._foreach_copy_ = self._real


def train(device: torch.device, rank: int) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    # A bf16 param dtype sends every parameter through the foreach-copy cast.
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # An explicit mesh: the default one would be on the accelerator (npu) even for a CPU model.
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses, counter = [], CopyCounter()
    with counter:
        for _ in range(STEPS):
            x = torch.randn(8, 16, generator=gen).to(device)
            loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    params = [p.full_tensor().float().cpu().flatten().tolist() for p in model.parameters()]
    return {"losses": losses, "params": params, "copies": counter.total, "non_blocking_copies": counter.non_blocking}


def run_patched(device: torch.device, rank: int) -> dict:
    finalize_calls = 0
    with hp.historical_patch():
        historical = FSDPParamGroup.finalize_backward

        def counting(self: FSDPParamGroup) -> None:
            nonlocal finalize_calls
            finalize_calls += 1
            historical(self)

        FSDPParamGroup.finalize_backward = counting
        try:
            result = train(device, rank)
        finally:
            FSDPParamGroup.finalize_backward = historical
    return {**result, "finalize_calls": finalize_calls}


def backend_for(device_type: str) -> str:
    return "gloo" if device_type == "cpu" else "cpu:gloo,npu:hccl"


def job(rank: int, world_size: int, device_type: str) -> dict:
    device = torch.device(device_type, rank) if device_type == "npu" else torch.device("cpu")
    result = {"upstream": train(device, rank), "patched": run_patched(device, rank)}
    dist.barrier()
    return result
