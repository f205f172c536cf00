"""npusim: a simulated Ascend-style NPU for PyTorch, with CUDA-aligned
``torch._foreach_copy_`` and patch-free FSDP2.

``import npusim`` runs the one ordered registration step
(:func:`npusim._device.register`): the PrivateUse1 device named ``npu`` and the
``torch.npu`` module, then the npu kernels of the op plugin (:mod:`npusim.ops`),
the ``"hccl"`` collective backend (:mod:`npusim.distributed`), ``torch.compile``
support (:mod:`npusim.compile`) and the sanitizer when ``NPUSIM_SANITIZER=1``, so
NPU training scripts work with just ``import npusim``. Importing those modules
registers nothing; this module hands their public names on.
"""

from __future__ import annotations

import npusim.compile
import npusim.distributed
import npusim.ops
from npusim import _device, sanitizer
from npusim._device import BackendConflictError
from npusim.runtime import timing
from npusim.runtime.profiles import PRESETS, Profile, get_profile, set_profile, use_profile

__version__ = "0.1.0"

_device.register(npusim.ops.register, npusim.distributed.register, npusim.compile.register,
                 sanitizer.enable_from_env)

__all__ = ["PRESETS", "BackendConflictError", "Profile", "get_profile", "sanitizer", "set_profile", "timing",
           "use_profile"]
