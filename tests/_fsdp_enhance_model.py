"""A small transformer with activation checkpointing, and training helpers, for the FSDP2 enhancement tests.

Shared by tests/test_fsdp_enhance.py; the benchmark has its own copy-free
variant in npusim.bench.fsdp_enhance (tests are not importable from src).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import fully_shard as upstream_fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
from torch.utils.checkpoint import checkpoint

from npusim.distributed import fsdp as enhanced
from npusim.distributed.fsdp.recompute import in_backward

VOCAB, DIM, HEADS, SEQ = 32, 16, 2, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        # Written out rather than scaled_dot_product_attention: no fused kernel choice on the npu.
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // HEADS)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyTransformer(nn.Module):
    """Tied embedding/output weights; every block call checkpointed; ``order`` may repeat a block."""

    def __init__(self, n_blocks: int = 3, order: tuple[int, ...] | None = None,
                 use_reentrant: bool | None = False) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        self.blocks = nn.ModuleList(Block() for _ in range(n_blocks))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.tok.weight
        self.order = order if order is not None else tuple(range(n_blocks))
        self.use_reentrant = use_reentrant  # None: no checkpointing

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tok(idx) + self.pos[: idx.shape[1]]
        for i in self.order:
            block = self.blocks[i]
            h = block(h) if self.use_reentrant is None else checkpoint(block, h, use_reentrant=self.use_reentrant)
        return self.head(self.norm(h))


class Setup(NamedTuple):
    mem_cache: bool = False
    recompute_rule: bool = False
    reshard_after_forward: bool | int | None = None  # None: fully_shard's default
    nested: bool = False  # also shard fc1 / fc2 inside each (checkpointed) block
    prefetch: bool = True  # explicit forward prefetch block i -> block i + 1


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


def shard(model: TinyTransformer, setup: Setup, cache: enhanced.CommBufferCache | None) -> list[FSDPModule]:
    """Shards bottom-up; the enhancement layer when any enhancement is on, PyTorch's otherwise."""
    use_layer = setup.mem_cache or setup.recompute_rule
    kw: dict[str, Any] = {}
    if setup.reshard_after_forward is not None:
        kw["reshard_after_forward"] = setup.reshard_after_forward
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


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    idx = torch.randint(0, VOCAB, (2, SEQ + 1), generator=gen)
    return idx[:, :-1].to(device), idx[:, 1:].to(device)


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def full_params(model: nn.Module) -> list[torch.Tensor]:
    return [p.full_tensor().detach().cpu() for p in model.parameters()]
