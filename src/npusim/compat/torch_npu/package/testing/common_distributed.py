"""``torch_npu.testing.common_distributed``: multi-npu skips and process-group set-up for torch_npu's tests.

The simulated node has ``NPUSIM_DEVICE_COUNT`` npus (8 by default), so a test that
needs N of them runs whenever N <= that count; ``hccl`` is npusim's backend.
"""

from __future__ import annotations

import contextlib
import functools
import os
import unittest
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

__all__ = ["TEST_SKIPS", "TestSkip", "init_pg", "skipIfUnsupportMultiNPU", "with_comms"]


class TestSkip(NamedTuple):
    exit_code: int
    message: str


TestSkip.__test__ = False  # type: ignore[attr-defined]  (a record, not a pytest test class)

TEST_SKIPS: dict[str, TestSkip] = {
    "multi-npu": TestSkip(75, "Multi-NPU condition not satisfied"),
    **{f"multi-npu-{n}": TestSkip(75, f"Need at least {n} ASCEND devices") for n in range(1, 9)},
    "hccl": TestSkip(76, "c10d not compiled with HCCL support"),
    "known_issues": TestSkip(77, "Test skipped due to known issues"),
}


def skipIfUnsupportMultiNPU(npu_number_needed: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:  # noqa: N802
    """Skips the test unless at least ``npu_number_needed`` npus are available."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not torch.npu.is_available() or torch.npu.device_count() < npu_number_needed:
                raise unittest.SkipTest(f"Multi-NPU {npu_number_needed} condition not satisfied")
            return func(self, *args, **kwargs)

        return wrapper

    return decorate


def init_pg(backend: str = "hccl", world_size: int = 1, rank: int = 0, file_name: str = "file://") -> None:
    """A default process group rendezvousing through ``file_name``; with hccl, rank r uses npu:r."""
    if backend not in ("hccl", "gloo"):
        raise RuntimeError(f"init_pg: backend {backend!r} not supported (expected 'hccl' or 'gloo')")
    if backend == "hccl" and torch.npu.device_count() < world_size:
        raise RuntimeError(TEST_SKIPS[f"multi-npu-{world_size}"].message)
    dist.init_process_group(backend=backend, world_size=world_size, rank=rank, init_method=f"file://{file_name}")
    if backend == "hccl":
        torch.npu.set_device(rank)


def with_comms(func: Callable[..., Any]) -> Callable[..., Any]:
    """Runs a MultiProcessTestCase test inside a process group: hccl when there are enough npus, else gloo."""
    if func is None:
        raise RuntimeError("with_comms: the test function is None")

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        on_npu = torch.npu.is_available() and torch.npu.device_count() >= self.world_size
        init_pg(backend="hccl" if on_npu else "gloo", world_size=self.world_size, rank=self.rank,
                file_name=self.file_name)
        torch.npu.manual_seed(0)
        func(self, *args, **kwargs)
        self.destroy_pg()

    return wrapper


@contextlib.contextmanager
def _dynamo_dist_per_rank_init(rank: int, world_size: int, init_pg_: bool = True) -> Iterator[None]:
    """One rank of a compiled distributed test: npu:rank, an hccl group over localhost, dynamo reset around."""
    import torch._dynamo

    torch.npu.set_device(rank)
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ.setdefault("MASTER_PORT", "6789")
    if init_pg_:
        dist.init_process_group(backend="hccl", rank=rank, world_size=world_size)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        yield
    finally:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        if init_pg_:
            dist.destroy_process_group()
