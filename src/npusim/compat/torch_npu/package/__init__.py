"""torch_npu as npusim simulates it: this package is executed as the module ``torch_npu``.

``python -m npusim run`` (:mod:`npusim.compat.torch_npu`) makes ``import torch_npu``
load it. ``torch_npu.npu`` is ``torch.npu``; op-plugin's fused operators are
``torch_npu.<name>`` when npusim simulates them; every other torch_npu name raises
NotSimulatedError (an AttributeError) naming the call. See Note [The torch_npu of
npusim run] in npusim/compat/torch_npu/__init__.py.
"""

if __name__ != "torch_npu":
    raise ImportError(f"{__name__} is npusim's torch_npu: it is imported as torch_npu under `python -m npusim run`, "
                      "never under its npusim name")

import importlib
import os
import sys
from typing import Any

import torch
from torch_npu._C import _cd
from torch_npu.version import __version__  # noqa: F401  (torch_npu.__version__)

from npusim.compat.torch_npu import PACKAGE_DIR, NotSimulatedError
from npusim.distributed import dtensor_strategies
from npusim.ops.fused import OPS
from npusim.ops.fused.layout import Format  # noqa: F401  (torch_npu.Format, the ACL formats)
from npusim.runtime.parity import TORCH_NPU_EXPOSED_OPS

__npusim_shim__ = True  # npusim's own torch_npu, not a real one (npusim._device checks it)

# torch_npu's public names: the fused operators op-plugin marks exposed, of those npusim defines. The rest of
# the namespace (the other operators, the dtype numbers, Format) is reachable, not public, as on torch_npu,
# whose test/npu/test_public_bindings.py checks the split.
__all__ = sorted(name for name in TORCH_NPU_EXPOSED_OPS if name in OPS)

# torch_npu exports every custom dtype number of _C._cd.DType on itself (torch_npu.hifloat8 == 290, ...).
for _name in _cd.NAMES:
    globals()[_name] = getattr(_cd.DType, _name)


# torch_npu registers its DTensor strategies of aten.matmul / matmul_backward on import, and frameworks wrap
# them (torchtitan-npu's custom_shardings): npusim.distributed.dtensor_strategies.
dtensor_strategies.register()

npu = torch.npu
sys.modules["torch_npu.npu"] = torch.npu
for _name in torch.npu.SUBMODULES:
    sys.modules[f"torch_npu.npu.{_name}"] = getattr(torch.npu, _name)

# torch_npu.npu's submodules that are npusim modules imported when a script imports them (ALIASED_MODULES of
# npusim.compat.torch_npu: torch_npu.npu._graph_tree is npusim.compile.graph_trees, which imports inductor):
# an empty __path__ makes the import system ask npusim run's finder for them (uninstall removes it).
torch.npu.__path__ = []

# The subpackages in this directory, imported on first attribute access as torch_npu's are on import.
_SUBPACKAGES = frozenset(entry.removesuffix(".py") for entry in os.listdir(PACKAGE_DIR)
                         if not entry.startswith("__") and (entry.endswith(".py") or (PACKAGE_DIR / entry).is_dir()))


def __getattr__(name: str) -> Any:
    """op-plugin's fused operators npusim simulates, then this package's submodules; else NotSimulatedError."""
    op = OPS.get(name)
    if op is not None:
        return op
    if name in _SUBPACKAGES:
        return importlib.import_module(f"torch_npu.{name}")
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(f"module 'torch_npu' has no attribute {name!r}")
    if name.startswith(("npu_", "_npu_")):
        raise NotSimulatedError(
            f"torch_npu.{name} is not simulated by npusim: op-plugin's fused operator has no npu kernel here "
            f"(simulated: {', '.join(sorted(OPS)) or 'none yet'}); use the PyTorch operators it fuses, or run on "
            "a real NPU", name=name, obj=sys.modules[__name__])
    raise NotSimulatedError(f"torch_npu.{name} is not simulated by npusim (npusim's torch_npu provides torch_npu.npu, "
                            "op-plugin's simulated fused operators, the custom dtype numbers, "
                            "torch_npu.testing, torch_npu._C's raw streams and hccl options, torch_npu.utils, "
                            "torch_npu.profiler and torch_npu.contrib)",
                            name=name, obj=sys.modules[__name__])


def __dir__() -> list[str]:
    return sorted({*globals(), *OPS, *_SUBPACKAGES})
