"""``torch_npu.contrib.transfer_to_npu`` as npusim simulates it: CUDA-written code runs on the npu.

``import torch_npu.contrib.transfer_to_npu`` under ``python -m npusim run`` calls
:func:`install`, for the whole process; :func:`uninstall` undoes
every patch (tests; :func:`npusim.compat.torch_npu.uninstall` calls it). See
Note [transfer_to_npu in npusim].

Note [transfer_to_npu in npusim]
--------------------------------
Ascend users import torch_npu's transfer_to_npu to run code written for CUDA (scripts,
HF / accelerate paths, DDP and FSDP over nccl) on the NPU unmodified. npusim's gives
the same observable contract (read from Ascend/pytorch ``torch_npu/contrib/
transfer_to_npu.py`` and its tests):

- devices: the device-taking ``torch`` functions (``torch_api.TORCH_FUNCTIONS``),
  ``Tensor`` and ``Module`` methods (``.to``, ``.new_*``, ``.pin_memory``, ``.to_empty``),
  ``torch.UntypedStorage``, ``torch.Generator``, ``torch.Event``, ``torch.autocast``,
  ``with torch.device("cuda")`` / ``set_default_device`` (``DeviceContext``) and
  ``torch.load``'s ``map_location`` take "cuda", "cuda:N", ``torch.device("cuda", N)``
  (and an int where it is a device) as the npu (``devices.py``; Note [Which strings
  are devices] says where npusim reads fewer strings as devices than torch_npu);
  ``Tensor.cuda`` / ``Module.cuda`` are ``.npu``, ``Tensor.is_cuda`` /
  ``TypedStorage.is_cuda`` are ``.is_npu``;
- ``torch.cuda``: the names torch_npu's ``torch.npu`` shares with it
  (``runtime/parity.py: SHARED_WITH_CUDA``), ``torch.cuda.amp``'s (``autocast``,
  ``GradScaler`` with torch_npu's rule), ``torch.cuda.random``'s, ``default_generators``,
  ``CUDAGraph`` and ``memory._record_memory_history`` / ``_snapshot`` are
  ``torch.npu``'s, with device arguments mapped; so ``torch.cuda.is_available()`` is
  True, as under torch_npu. ``torch.cuda.DoubleTensor`` is ``torch.npu.FloatTensor``:
  torch_npu's NPU has no float64 and its transfer_to_npu says so; a script run on one
  gets float32 there, so it gets float32 here (float64 tensors made otherwise stay
  float64: npusim computes them);
- ``torch.distributed`` (``distributed.py``): nccl is hccl, ``is_nccl_available`` is
  hccl's, DDP / FSDP / DeviceMesh / ``init_device_mesh`` / pipelining take CUDA devices
  as the npu;
- the rest: ``torch.profiler.profile(activities=[..., CUDA])`` records the npu
  (``ProfilerActivity.PrivateUse1``), ``torch.jit.script`` returns what it is given
  (warning once, as torch_npu's; the code then runs in Python, devices mapped),
  ``has_triton()`` is False, inductor keys its caches as without a GPU (``compiler.py``),
  ``torch._utils._get_available_device_type()`` is "npu",
  and the framework functions of ``libraries.CUDA_CHECKS`` see PyTorch's own
  ``torch.cuda.is_available``.

Why attributes and never the module: torch_npu also patches names *in* ``torch.cuda``
(its ``_apply_patches`` copies ``torch.npu``'s public names into the existing module)
rather than rebinding ``torch.cuda``. PyTorch's own modules read ``torch.cuda``'s other
names (dynamo's ``torch.cuda._CudaDeviceProperties``, ``torch.cuda.nvtx``,
``torch.cuda._is_compiled()``) and bind ``torch.cuda`` functions at import; with the
module replaced they fail (npusim's first transfer_to_npu broke ``torch.compile`` so),
with names patched they see the npu where a CUDA script would see the GPU and PyTorch's
CUDA-only internals where nothing maps them.

Where npusim differs from torch_npu, on purpose: it does not replace
``torch.profiler.profile`` (its own profiler records the npu's device tasks; it
re-points the CUDA activity in the call, because re-pointing the enum member would make
PyTorch's profiler think CUDA was asked for) and keeps ``experimental_config``; it leaves
inductor's ``get_gpu_type`` alone (torch_npu points it at its triton-ascend backend;
npusim's npu compiles through inductor's C++ kernels, so the GPU-only passes stay off
for it, as they are without transfer_to_npu); it adds no torch_npu-only names to
``torch.cuda`` (a CUDA-written script cannot call them); and it patches modules a script
has not imported yet (FSDP1, pipelining, DCP's loader, the frameworks) when they are
imported, never importing them itself. The patches live in one :class:`Ledger`, so
:func:`uninstall` restores each attribute (or deletes the ones it added) in reverse.
"""

from __future__ import annotations

import torch

from npusim.compat.transfer_to_npu import compiler, cuda_names, distributed, libraries, torch_api
from npusim.compat.transfer_to_npu.ledger import Ledger

__all__ = ["install", "installed", "pytorch_cuda_is_available", "uninstall"]

_ledger = Ledger()
# PyTorch's torch.cuda.is_available, kept while torch.cuda's answers the npu.
pytorch_cuda_is_available = torch.cuda.is_available


def installed() -> bool:
    """Whether transfer_to_npu's patches are in place."""
    return len(_ledger) > 0


def install() -> None:
    """Makes CUDA-written code run on the npu (idempotent). See Note [transfer_to_npu in npusim]."""
    if installed():
        return
    try:
        torch_api.patch(_ledger)
        cuda_names.patch(_ledger)
        distributed.patch(_ledger)
        compiler.patch(_ledger)
        libraries.patch(_ledger, pytorch_cuda_is_available)
    except BaseException:
        _ledger.undo()
        raise


def uninstall() -> None:
    """Undoes every patch :func:`install` made, the last first (idempotent)."""
    _ledger.undo()
