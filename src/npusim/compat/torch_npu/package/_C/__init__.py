"""``torch_npu._C``: the entry points of torch_npu's extension that frameworks call directly.

Provided where they mean something on the simulator: the raw stream inductor-generated
code and ``torch.compile`` backends ask for (``_npu_getCurrentRawStream``, the current
stream's id, as npusim's own inductor backend uses it), ``_npu_sleep``, the CANN version
queries, a few device and allocator calls, and ``_distributed_c10d`` (``ProcessGroupHCCL``
and its ``Options``). Every other name raises NotSimulatedError naming the call.
"""

import sys
from typing import Any

import torch
from torch_npu._C import _distributed_c10d

from npusim.compat.torch_npu import NotSimulatedError
from npusim.compile.generated_calls import get_raw_stream as _npu_getCurrentRawStream  # noqa: N812  (torch_npu's name)
from npusim.runtime.utils import _is_gte_cann_version, get_cann_version

__all__ = ["_distributed_c10d", "_get_cann_version", "_is_gte_cann_version", "_npu_getCurrentRawStream",
           "_npu_getDeviceCount", "_npu_hostEmptyCache", "_npu_npuCachingAllocator_set_allocator_settings",
           "_npu_sleep"]

# torch_npu's spellings.
_get_cann_version = get_cann_version
_npu_sleep = torch.npu._sleep
_npu_getDeviceCount = torch.npu.device_count  # noqa: N816
_npu_hostEmptyCache = torch.npu.host_empty_cache  # noqa: N816
_npu_npuCachingAllocator_set_allocator_settings = torch.npu.memory._set_allocator_settings  # noqa: N816


def __getattr__(name: str) -> Any:
    raise NotSimulatedError(f"torch_npu._C.{name} is not simulated by npusim (an entry point of torch_npu's "
                            "C++ extension with no counterpart in npusim's device core)", name=name,
                            obj=sys.modules[__name__])
