"""``torch_npu._C._distributed_c10d``: the hccl backend's classes.

``ProcessGroupHCCL`` is the class of npusim's hccl backend (what
``pg._get_backend(torch.device("npu"))`` returns, so ``isinstance`` checks hold) and
``ProcessGroupHCCL.Options`` the options it takes (Note [hccl options] in
npusim/distributed/backend.py). torch_npu's other distributed internals
(``ProcessGroupLCCL``, ``ParallelStore``, ``_dump_hccl_trace``) raise NotSimulatedError.
"""

import sys
from typing import Any

from npusim.compat.torch_npu import NotSimulatedError
from npusim.distributed import backend as _backend

__all__ = ["ProcessGroupHCCL"]

ProcessGroupHCCL = _backend.load().ProcessGroupNpu


def __getattr__(name: str) -> Any:
    raise NotSimulatedError(f"torch_npu._C._distributed_c10d.{name} is not simulated by npusim", name=name,
                            obj=sys.modules[__name__])
