"""``transfer_to_npu`` on ``torch.cuda``: its names answered by ``torch.npu``'s.

The module objects ``torch.cuda``, ``torch.cuda.amp`` and ``torch.cuda.random`` stay
PyTorch's; their public names that torch_npu's ``torch.npu`` shares are set to
``torch.npu``'s (see Note [transfer_to_npu in npusim] for why not the module).
"""

from __future__ import annotations

from types import ModuleType

import torch

from npusim.compat.transfer_to_npu.devices import on_npu
from npusim.compat.transfer_to_npu.ledger import Ledger
from npusim.runtime.parity import SHARED_WITH_CUDA

__all__ = ["CUDA_FUNCTIONS_TAKING_DEVICES", "cuda_names", "patch"]

# torch.cuda functions (once they are torch.npu's) that take a device, given in CUDA's
# spelling by a CUDA-written script: torch_npu's transfer_to_npu's list.
CUDA_FUNCTIONS_TAKING_DEVICES = (
    "caching_allocator_alloc", "can_device_access_peer", "current_stream", "default_stream", "get_device_capability",
    "get_device_name", "get_device_properties", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
    "memory_allocated", "memory_reserved", "memory_stats", "memory_summary", "reset_max_memory_allocated",
    "reset_max_memory_cached", "reset_peak_memory_stats", "set_device", "set_per_process_memory_fraction",
    "synchronize", "utilization",
)


def cuda_names(cuda_module: ModuleType, npu_module: ModuleType) -> list[str]:
    """The public names of ``cuda_module`` that ``npu_module`` answers (modules excluded)."""
    shared = SHARED_WITH_CUDA if cuda_module is torch.cuda else getattr(cuda_module, "__all__", ())
    return [name for name in shared
            if hasattr(npu_module, name) and not isinstance(getattr(npu_module, name), ModuleType)]


def patch(ledger: Ledger) -> None:
    """Applies the ``torch.cuda`` patches to ``ledger``."""
    npu = torch.npu
    pairs = [(torch.cuda, npu), (torch.cuda.amp, npu.amp), (torch.cuda.random, npu.random),
             (torch.cuda.amp.autocast_mode, npu.amp), (torch.cuda.amp.grad_scaler, npu.amp)]
    for cuda_module, npu_module in pairs:
        for name in cuda_names(cuda_module, npu_module):
            ledger.set(cuda_module, name, getattr(npu_module, name))
    for name in CUDA_FUNCTIONS_TAKING_DEVICES:
        ledger.wrap(torch.cuda, name, on_npu)
    ledger.wrap(npu.device, "__init__", on_npu)  # torch.cuda.device(torch.device("cuda:1"))
    ledger.set(torch.cuda, "default_generators", npu.default_generators)
    ledger.set(torch.cuda, "CUDAGraph", npu.NPUGraph)
    # torch_npu's NPU has no float64, so its transfer_to_npu makes DoubleTensor float32;
    # npusim follows (Note [transfer_to_npu in npusim]).
    ledger.set(torch.cuda, "DoubleTensor", npu.FloatTensor)
    for name in ("_record_memory_history", "_snapshot"):
        ledger.set(torch.cuda.memory, name, on_npu(getattr(npu.memory, name)))
    ledger.set(torch.cuda.memory, "_dump_snapshot", npu.memory._dump_snapshot)
