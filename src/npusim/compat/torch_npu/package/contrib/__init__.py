"""``torch_npu.contrib``: only ``transfer_to_npu`` is simulated."""

import sys
from typing import Any

from npusim.compat.torch_npu import NotSimulatedError


def __getattr__(name: str) -> Any:
    if name == "transfer_to_npu":
        import importlib

        return importlib.import_module("torch_npu.contrib.transfer_to_npu")
    raise NotSimulatedError(f"torch_npu.contrib.{name} is not simulated by npusim (torch_npu.contrib's fused "
                            "modules and functions are CANN kernels)", name=name, obj=sys.modules[__name__])
