"""Helpers shared by the ``_foreach_copy_`` tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from npusim.ops import CallRecord, set_foreach_copy_mode, trace_foreach_copy
from npusim.runtime import acl


@pytest.fixture(autouse=True)
def aligned_mode() -> Iterator[None]:
    """Every test starts and ends in the default (aligned) mode."""
    set_foreach_copy_mode("aligned")
    yield
    set_foreach_copy_mode("aligned")


def values(shape: tuple[int, ...], dtype: torch.dtype, device: str = "npu", seed: int = 0) -> torch.Tensor:
    """Small non-negative values that every dtype holds exactly (no overflow, no rounding)."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randint(0, 100, shape, generator=gen)
    t = t.bool() if dtype == torch.bool else (t / 4 if dtype.is_floating_point else t).to(dtype)
    return t.to(device)


def pairs(n: int, dtype: torch.dtype, src_device: str = "npu", dst_device: str = "npu",
          dst_dtype: torch.dtype | None = None, shape: tuple[int, ...] = (33,),
          ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(dst, src): n distinct sources and zero-filled destinations."""
    src = [values(shape, dtype, src_device, seed=i) for i in range(n)]
    dst = [torch.zeros(shape, dtype=dst_dtype or dtype, device=dst_device) for _ in range(n)]
    return dst, src


def expected(dst: list[torch.Tensor], src: list[torch.Tensor]) -> list[torch.Tensor]:
    """What CPU-native ``_foreach_copy_`` leaves in copies of ``dst``."""
    ref = [d.cpu().clone() for d in dst]
    torch._foreach_copy_(ref, [s.cpu() for s in src])
    return ref


def sync_all() -> None:
    acl.synchronize_all()


def copy(dst: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False) -> CallRecord:
    """Runs ``_foreach_copy_``, waits for every device and returns the call's route record."""
    with trace_foreach_copy() as calls:
        torch._foreach_copy_(dst, src, non_blocking=non_blocking)
    sync_all()
    assert len(calls) == 1, calls
    return calls[0]


def assert_equal_lists(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and torch.equal(g.cpu(), w.cpu()), f"pair {i}: {g.cpu()} != {w.cpu()}"
