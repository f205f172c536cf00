"""``torch_npu._inductor``: importing it readies inductor for the npu, as torch_npu's does.

npusim's inductor backend (C++ kernels on npu memory, npusim.compile) registers itself when
inductor is imported (Note [Registering with dynamo and inductor lazily]); importing this
module imports dynamo and inductor now. torch_npu's triton-ascend lowerings and codegen
(``torch_npu._inductor.lowering``, ``codegen``, ``config``) are not simulated.
"""

import sys
from typing import Any

import torch._dynamo  # noqa: F401  (registers npusim's dynamo device interface)
import torch._inductor.compile_fx  # noqa: F401  (registers npusim's inductor backend)

from npusim.compat.torch_npu import NotSimulatedError


def __getattr__(name: str) -> Any:
    raise NotSimulatedError(f"torch_npu._inductor.{name} is not simulated by npusim: npusim's inductor backend "
                            "generates C++ kernels (npusim.compile), not torch_npu's triton-ascend code",
                            name=name, obj=sys.modules[__name__])
