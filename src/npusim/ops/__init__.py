"""The op plugin: npu kernels registered with ``torch.library`` on PrivateUse1.

Importing this package (``import npusim`` does) registers ``aten::_foreach_copy_``
for the npu (see ``npusim.ops.foreach_copy`` for its routing), the fused RNN
cells (``npusim.ops.rnn_cells``) and SyncBatchNorm's statistics
(``npusim.ops.sync_batch_norm``), CUDA-only ops PyTorch calls on an npu tensor,
and then routes structured ops' functional and in-place variants, and the ops
whose composite would stand in for CPU's own kernel, straight to the CPU
fallback (:data:`FALLBACK_ROUTES`).
"""

import npusim._device  # noqa: F401, I001  (registers the npu device first)
import npusim.ops.rnn_cells  # noqa: F401  (registrations)
import npusim.ops.sync_batch_norm  # noqa: F401  (registrations)
from npusim.ops.foreach_copy import (
    foreach_copy_mode,
    get_foreach_copy_mode,
    original_batch_eligibility,
    set_foreach_copy_mode,
)
from npusim.ops.trace import CallRecord, GroupRecord, trace_foreach_copy
from npusim.ops import fused
from npusim.ops.routes import CUDA_RUNS_THE_COMPOSITE
from npusim.runtime import acl

fused.register()  # op-plugin's fused operators (torch.ops.npu.npu_*)

# The ops whose npu kernel is the CPU fallback instead of a composite, each "unboxed" or "boxed"
# (csrc/fallback_routes.cpp, Note [CPU's kernel, not the composite]). Routed after the registrations
# above, which the rule must see: it leaves ops with npu kernels alone.
FALLBACK_ROUTES: dict[str, str] = acl.route_structured_ops_to_fallback(list(CUDA_RUNS_THE_COMPOSITE))

__all__ = [
    "FALLBACK_ROUTES", "CallRecord", "GroupRecord", "foreach_copy_mode", "get_foreach_copy_mode",
    "original_batch_eligibility", "set_foreach_copy_mode", "trace_foreach_copy",
]
