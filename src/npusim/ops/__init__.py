"""The op plugin: npu kernels registered with ``torch.library`` on PrivateUse1.

Importing this package (``import npusim`` does) registers ``aten::_foreach_copy_``
for the npu; see ``npusim.ops.foreach_copy`` for its routing.
"""

import npusim._device  # noqa: F401, I001  (registers the npu device first)
from npusim.ops.foreach_copy import (
    foreach_copy_mode,
    get_foreach_copy_mode,
    original_batch_eligibility,
    set_foreach_copy_mode,
)
from npusim.ops.trace import CallRecord, GroupRecord, trace_foreach_copy

__all__ = [
    "CallRecord", "GroupRecord", "foreach_copy_mode", "get_foreach_copy_mode", "original_batch_eligibility",
    "set_foreach_copy_mode", "trace_foreach_copy",
]
