"""``torch_npu.utils``: the helpers that mean something on a simulator.

``get_cann_version`` is ``torch.npu.utils.get_cann_version`` (the profile's CANN
release); ``_path_manager.PathManager`` torch_npu's checked file-system helpers (a
submodule). torch_npu's other utilities (combined tensors, thread affinity, FLOP
counters, ``save_async``) raise NotSimulatedError naming the call.
"""

import sys
from typing import Any

from npusim.compat.torch_npu import NotSimulatedError
from npusim.runtime.utils import get_cann_version

__all__ = ["get_cann_version"]


def __getattr__(name: str) -> Any:
    raise NotSimulatedError(f"torch_npu.utils.{name} is not simulated by npusim", name=name,
                            obj=sys.modules[__name__])
