"""``torch_npu._C``: the entry points of torch_npu's extension that frameworks call directly.

Provided where they mean something on the simulator: the raw stream inductor-generated
code and ``torch.compile`` backends ask for (``_npu_getCurrentRawStream``, the current
stream's id, as npusim's own inductor backend uses it; ``_npu_getCurrentRawStreamNoWait``, the
same: npusim has no task queue to drain first), ``_npu_sleep``, the CANN and SoC version
queries, a few device, tensor and allocator calls (the graph trees' pool check and history
flag), ``_cd`` (torch_npu's custom dtype numbers) and ``_distributed_c10d``
(``ProcessGroupHCCL`` and its ``Options``). Every other name raises NotSimulatedError naming
the call.
"""

import sys
from typing import Any

import torch
from torch_npu._C import _cd, _distributed_c10d

from npusim.compat.torch_npu import NotSimulatedError
from npusim.compile.generated_calls import get_raw_stream as _npu_getCurrentRawStream  # noqa: N812  (torch_npu's name)
from npusim.ops.fused import layout
from npusim.runtime.memory import _npu_checkPoolLiveAllocations, _npu_isHistoryEnabled
from npusim.runtime.utils import _is_gte_cann_version, get_cann_version, get_soc_version

__all__ = ["_cd", "_distributed_c10d", "_empty_strided_npu", "_get_cann_version", "_is_gte_cann_version",
           "_npu_checkPoolLiveAllocations", "_npu_getCurrentRawStream", "_npu_getCurrentRawStreamNoWait",
           "_npu_getDeviceCount", "_npu_get_soc_version", "_npu_hostEmptyCache", "_npu_isHistoryEnabled",
           "_npu_npuCachingAllocator_set_allocator_settings", "_npu_sleep", "_weak_ref_tensor"]

# torch_npu's spellings.
_get_cann_version = get_cann_version
_npu_sleep = torch.npu._sleep
_npu_getDeviceCount = torch.npu.device_count  # noqa: N816
_npu_hostEmptyCache = torch.npu.host_empty_cache  # noqa: N816
_npu_npuCachingAllocator_set_allocator_settings = torch.npu.memory._set_allocator_settings  # noqa: N816
# torch_npu's NoWait variant skips draining its task queue first; npusim launches without one.
_npu_getCurrentRawStreamNoWait = _npu_getCurrentRawStream  # noqa: N816

# torch_npu's name for torch_npu.npu.utils.get_soc_version's binding.
_npu_get_soc_version = get_soc_version


def _empty_strided_npu(*args: Any) -> torch.Tensor:
    """``_empty_strided_npu(sizes, strides, dtype)``: an uninitialised tensor on the current npu device, what
    torch_npu's inductor wrapper allocates buffers with."""
    if len(args) != 3:
        raise TypeError(f"torch_npu._C._empty_strided_npu expects exactly 3 args: (sizes, strides, dtype), "
                        f"got {len(args)}")
    sizes, strides, dtype = args
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"torch_npu._C._empty_strided_npu: arg 3 must be a torch.dtype, got {type(dtype).__name__}")
    if len(sizes) != len(strides):
        raise ValueError(f"torch_npu._C._empty_strided_npu on npu:{torch.npu.current_device()}: sizes and strides "
                         f"must have one entry per dimension, got {len(sizes)} sizes and {len(strides)} strides")
    return torch.empty_strided(tuple(sizes), tuple(strides), dtype=dtype,
                               device=torch.device("npu", torch.npu.current_device()))


def _weak_ref_tensor(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s memory (same sizes, strides, offset, dtype and npu format) that does not keep it
    alive, as torch_npu's: its storage is a data pointer without a deleter (PyTorch's
    ``_construct_storage_from_data_pointer``, what CUDA's graph trees use), so reading it after ``t``'s storage
    is freed reads freed memory. The graph trees hand such tensors out over memory they own."""
    if not isinstance(t, torch.Tensor) or t.device.type != "npu":
        where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"torch_npu._C._weak_ref_tensor: expected an npu tensor, got {where}")
    source = t.untyped_storage()
    storage = torch._C._construct_storage_from_data_pointer(source.data_ptr(), t.device, source.nbytes())
    out = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape, t.stride())
    fmt = layout._FORMATS.get(source)  # the format lives with the storage (Note [Where the npu format lives])
    if fmt is not None:
        layout._FORMATS[out.untyped_storage()] = fmt
    return out


def __getattr__(name: str) -> Any:
    raise NotSimulatedError(f"torch_npu._C.{name} is not simulated by npusim (an entry point of torch_npu's "
                            "C++ extension with no counterpart in npusim's device core)", name=name,
                            obj=sys.modules[__name__])
