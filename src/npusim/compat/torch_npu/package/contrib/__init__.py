"""``torch_npu.contrib``: ``transfer_to_npu`` and ``module`` (the modules PyTorch's operators compute) are
simulated."""

import sys
from typing import Any

from npusim.compat.torch_npu import NotSimulatedError

# torch_npu's contrib lists its fused functions and modules here; npusim simulates none of them at this level
# (``module`` and ``transfer_to_npu`` are submodules), so nothing here is public (test_public_bindings' rule).
__all__: list[str] = []


def __getattr__(name: str) -> Any:
    if name in ("transfer_to_npu", "module"):
        import importlib

        return importlib.import_module(f"torch_npu.contrib.{name}")
    raise NotSimulatedError(f"torch_npu.contrib.{name} is not simulated by npusim (torch_npu.contrib's fused "
                            "modules and functions are CANN kernels)", name=name, obj=sys.modules[__name__])
