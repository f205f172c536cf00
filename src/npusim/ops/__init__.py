"""The op plugin: npu kernels registered with ``torch.library`` on PrivateUse1.

:func:`register` (the package's step of ``npusim``'s one ordered registration,
run by ``npusim._device.register``) registers ``aten::_foreach_copy_`` for the
npu (see ``npusim.ops.foreach_copy`` for its routing), the fused attention
kernels (``npusim.ops.attention``), the fused RNN cells
(``npusim.ops.rnn_cells``) and SyncBatchNorm's statistics
(``npusim.ops.sync_batch_norm``), torch_npu's ``aten::matmul_backward``
(``npusim.ops.matmul_backward``), the losses the chip computes in float32 for
16-bit operands (``npusim.ops.chip_upcast``), CUDA-only ops PyTorch calls on an npu tensor,
op-plugin's fused operators (``npusim.ops.fused``), and then routes structured
ops' functional and in-place variants, and the ops whose composite would stand
in for CPU's own kernel, straight to the CPU fallback (:data:`FALLBACK_ROUTES`,
except :data:`~npusim.ops.routes.CUDA_RUNS_THE_COMPOSITE`). Which file provides each aten op's npu kernel is
listed by tests/test_registration.py.
"""

from npusim.ops import attention, chip_upcast, foreach_copy, fused, matmul_backward, rnn_cells, sync_batch_norm
from npusim.ops.foreach_copy import (
    foreach_copy_mode,
    get_foreach_copy_mode,
    original_batch_eligibility,
    set_foreach_copy_mode,
)
from npusim.ops.routes import CUDA_RUNS_THE_COMPOSITE
from npusim.ops.trace import CallRecord, GroupRecord, trace_foreach_copy
from npusim.runtime import acl

# The ops whose npu kernel is the CPU fallback instead of a composite, each "unboxed" or "boxed",
# the _foreach_* ops' one-launch kernel, "foreach" (Note [A foreach op is one launch]), and addr_'s
# checks before its composite, "checked in place" (Note [addr_ is in place by identity])
# (csrc/aten/fallback_routes.cpp, Note [CPU's kernel, not the composite]).
FALLBACK_ROUTES: dict[str, str] = {}


def register() -> None:
    """Registers the op plugin's kernels, in order (idempotent)."""
    attention.register()
    rnn_cells.register()
    sync_batch_norm.register()
    matmul_backward.register()  # torch_npu's device kernel of aten::matmul_backward (DTensor shards it)
    chip_upcast.register()  # Note [float16 losses computed in float32]
    foreach_copy.register()
    fused.register()  # op-plugin's fused operators (torch.ops.npu.npu_*)
    # Last: the rule sees the registrations above and leaves ops with npu kernels alone.
    FALLBACK_ROUTES.update(acl.route_structured_ops_to_fallback(list(CUDA_RUNS_THE_COMPOSITE)))


__all__ = [
    "FALLBACK_ROUTES", "CallRecord", "GroupRecord", "foreach_copy_mode", "get_foreach_copy_mode",
    "original_batch_eligibility", "register", "set_foreach_copy_mode", "trace_foreach_copy",
]
