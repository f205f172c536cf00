"""npusim: a simulated Ascend-style NPU for PyTorch, with CUDA-aligned
``torch._foreach_copy_`` and patch-free FSDP2.

``import npusim`` registers a PrivateUse1 device named ``npu`` and the
``torch.npu`` module (:mod:`npusim._device`), the npu kernel of
``aten::_foreach_copy_`` (:mod:`npusim.ops`), the ``"hccl"`` collective
backend (:mod:`npusim.distributed`) and ``torch.compile`` support
(:mod:`npusim.compile`), so NPU training scripts work with just
``import npusim``. This module only hands their public names on.
"""

from __future__ import annotations

__version__ = "0.1.0"

from npusim._device import BackendConflictError  # noqa: E402, I001  (registers the device first)
from npusim.runtime import timing  # noqa: E402
from npusim.runtime.profiles import PRESETS, Profile, get_profile, set_profile, use_profile  # noqa: E402

import npusim.compile  # noqa: E402, I001  (torch.compile on the npu)
import npusim.distributed  # noqa: E402, F401  (registers the collective backend)
import npusim.ops  # noqa: E402, F401  (registers the _foreach_copy_ kernel)
from npusim import sanitizer  # noqa: E402

npusim.compile.register()  # torch.compile on the npu, registered lazily (Note in npusim/compile)
sanitizer.enable_from_env()  # NPUSIM_SANITIZER=1

__all__ = ["PRESETS", "BackendConflictError", "Profile", "get_profile", "sanitizer", "set_profile", "timing",
           "use_profile"]
