"""``torch_npu.testing._internal.common_fsdp``: PyTorch's FSDP test base on the npu over hccl.

Importing it points ``torch.testing._internal.common_fsdp`` at the npu (its
``DEVICE_TYPE``, ``DISTRIBUTED_BACKEND`` and ``DEVICE_COUNT``, which its models and
helpers read when they run), as torch_npu's does. ``FSDPNPUTest`` is PyTorch's
``FSDPTest``: one spawned process per rank (each re-imports the test file, which gets
npusim's torch_npu, Note [torch_npu in every process of the job]); each rank joins an
hccl group and uses npu ``rank % device_count()``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.testing._internal.common_fsdp as _common_fsdp
from torch.testing._internal.common_distributed import TEST_SKIPS
from torch.testing._internal.common_fsdp import FSDPTest
from torch.testing._internal.common_utils import set_rng_seed

__all__ = ["FSDPNPUTest"]

_common_fsdp.DEVICE_TYPE = "npu"
_common_fsdp.DISTRIBUTED_BACKEND = "hccl"
_common_fsdp.DEVICE_COUNT = torch.npu.device_count()


class FSDPNPUTest(FSDPTest):
    """FSDPTest whose ranks run on the npu with the hccl backend."""

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        if torch.npu.device_count() < self.world_size:
            sys.exit(TEST_SKIPS[f"multi-gpu-{self.world_size}"].exit_code)
        if kwargs.get("fake_pg", False):
            from torch.testing._internal.distributed.fake_pg import FakeStore

            dist.init_process_group(backend="fake", world_size=self.world_size, rank=rank, store=FakeStore())
        else:
            dist.init_process_group(init_method=self.init_method, backend="hccl", world_size=int(self.world_size),
                                    rank=self.rank)
        device_id = self.rank % torch.npu.device_count()
        torch.npu.set_device(device_id)
        # A barrier first, so that a rank skipping at once does not leave the others waiting.
        dist.barrier(device_ids=[device_id])
        torch._dynamo.reset()
        set_rng_seed()
        self.run_test(test_name, pipe)
        torch._dynamo.reset()
        dist.barrier(device_ids=[device_id])
        dist.destroy_process_group()
