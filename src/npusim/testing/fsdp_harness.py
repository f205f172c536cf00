"""Harness for FSDP2 enhancement runs: shard a TinyTransformer with or without the
enhancements, count communication-buffer allocations of PyTorch's default
comms, all-gathers and reduce-scatters by phase, and check every parameter
group is sharded. Shared by the fsdp-enhance benchmark and its tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
from torch.distributed.fsdp import fully_shard as upstream_fully_shard

from npusim.distributed import fsdp as enhanced
from npusim.distributed.fsdp.fsdp_private import DefaultAllGather, DefaultReduceScatter, in_backward


class CountingAllGather(DefaultAllGather):
    """PyTorch's default all-gather, counting buffer allocations (the no-cache baseline)."""

    allocations = 0

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        CountingAllGather.allocations += 1
        return super().allocate(size, dtype=dtype, device=device)


class CountingReduceScatter(DefaultReduceScatter):
    allocations = 0

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        CountingReduceScatter.allocations += 1
        return super().allocate(size, dtype=dtype, device=device)


class CommCounter:
    """Counts all-gathers and reduce-scatters issued through ``torch.distributed``, by phase."""

    def __init__(self) -> None:
        self.ag_fwd = self.ag_bwd = self.rs = 0

    @contextmanager
    def active(self) -> Iterator[CommCounter]:
        real_ag, real_rs = dist.all_gather_single, dist.reduce_scatter_single

        def ag(*args: Any, **kwargs: Any) -> Any:
            if in_backward():
                self.ag_bwd += 1
            else:
                self.ag_fwd += 1
            return real_ag(*args, **kwargs)

        def rs(*args: Any, **kwargs: Any) -> Any:
            self.rs += 1
            return real_rs(*args, **kwargs)

        dist.all_gather_single, dist.reduce_scatter_single = ag, rs
        try:
            yield self
        finally:
            dist.all_gather_single, dist.reduce_scatter_single = real_ag, real_rs

    def snapshot(self) -> tuple[int, int, int]:
        return self.ag_fwd, self.ag_bwd, self.rs


def all_sharded(modules: list[FSDPModule]) -> bool:
    groups = [m._get_fsdp_state()._fsdp_param_group for m in modules]
    return all(g is None or g.is_sharded for g in groups)


class Setup(NamedTuple):
    mem_cache: bool = False
    recompute_rule: bool = False
    reshard_after_forward: bool | int | None = None  # None: fully_shard's default
    nested: bool = False  # also shard fc1 / fc2 inside each (checkpointed) block
    prefetch: bool = True  # explicit forward prefetch block i -> block i + 1
    mixed_precision: bool = False  # bf16 parameters for compute, fp32 gradient reduction


def shard(model: nn.Module, setup: Setup, cache: enhanced.CommBufferCache | None) -> list[FSDPModule]:
    """Shards bottom-up; the enhancement layer when any enhancement is on, PyTorch's otherwise."""
    use_layer = setup.mem_cache or setup.recompute_rule
    kw: dict[str, Any] = {}
    if setup.reshard_after_forward is not None:
        kw["reshard_after_forward"] = setup.reshard_after_forward
    if setup.mixed_precision:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if use_layer:
        kw.update(mem_cache=cache if setup.mem_cache else False, recompute_rule=setup.recompute_rule)
    fs: Callable[..., Any] = enhanced.fully_shard if use_layer else upstream_fully_shard
    modules: list[FSDPModule] = []
    for block in model.blocks:
        if setup.nested:
            modules += [fs(block.fc1, **kw), fs(block.fc2, **kw)]
        modules.append(fs(block, **kw))
    modules.append(fs(model, **kw))
    if not setup.mem_cache:
        for m in modules:
            m.set_custom_all_gather(CountingAllGather())
            m.set_custom_reduce_scatter(CountingReduceScatter())
    if setup.prefetch:
        blocks = list(model.blocks)
        for a, b in zip(blocks[:-1], blocks[1:], strict=True):
            a.set_modules_to_forward_prefetch([b])
    return modules


def sharded_step(rank: int, dim: int, blocks: int) -> tuple[nn.Module, Callable[[], None]]:
    """A TinyTransformer (vocab 64, 4 heads, seq 32) under FSDP2 on ``npu:<rank>`` without prefetch,
    and one SGD training step on fresh tokens that ends with a device synchronize (the model of the
    timeline and the sanitizer benchmark)."""
    import torch.nn.functional as F  # noqa: N812

    from npusim.testing.models import TinyTransformer

    device = torch.device("npu", rank)
    torch.manual_seed(0)
    model = TinyTransformer(vocab=64, dim=dim, heads=4, seq=32, n_blocks=blocks).to(device)
    shard(model, Setup(prefetch=False), None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)

    def step() -> None:
        idx = torch.randint(0, 64, (4, 33), generator=gen).to(device)
        F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.npu.synchronize()

    return model, step
