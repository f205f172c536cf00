"""The device core as the layers above see it: one typed call per runtime call.

This module is the only one that imports the compiled core (``npusim._C``,
through :mod:`npusim.runtime._core`). Every call is named after the ACL / CUDA
runtime call it stands for, so ``ops/`` and ``distributed/`` read like the
op-plugin code they mirror. Hot calls are bound directly to the native
function (no Python frame in between); the annotation states their contract.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from npusim.runtime._core import C

TensorList = Sequence[torch.Tensor]

# ---- devices (aclrtGetDeviceCount, aclrtSetDevice, ...) ---------------------

device_count: Callable[[], int] = C.device_count
set_device_count: Callable[[int], None] = C.set_device_count
current_device: Callable[[], int] = C.current_device
set_device: Callable[[int], None] = C.set_device
register_device: Callable[[], None] = C.register_device
set_launch_blocking: Callable[[bool], None] = C.set_launch_blocking

# ---- streams (aclrtCreateStream, aclrtSynchronizeStream, ...) ---------------

# A stream is named by (stream_id, device_index, device_type), as torch.Stream stores it.
current_stream: Callable[[int], tuple[int, int, int]] = C.current_stream
default_stream: Callable[[int], tuple[int, int, int]] = C.default_stream
set_stream: Callable[[int, int], None] = C.set_stream
stream_priority: Callable[[int, int], int] = C.stream_priority
stream_pending: Callable[[int, int], int] = C.stream_pending
# (stream_id, device, timeout_s < 0 waits forever); a timeout raises an error naming the stream.
synchronize_stream: Callable[[int, int, float], None] = C.synchronize_stream
synchronize_device: Callable[[int], None] = C.synchronize_device
synchronize_all: Callable[[], None] = C.synchronize_all


def synchronize_current_stream(device: int, timeout_s: float = -1.0) -> None:
    """aclrtSynchronizeStream on the current stream of ``device``."""
    stream_id, index, _ = C.current_stream(device)
    C.synchronize_stream(stream_id, index, timeout_s)


# ---- memory (aclrtGetMemInfo, ...) ------------------------------------------

memory_stats: Callable[[int], dict[str, int]] = C.memory_stats
set_memory_capacity: Callable[[int, int], None] = C.set_memory_capacity
reset_peak_memory_stats: Callable[[int], None] = C.reset_peak_memory_stats
empty_cache: Callable[[], None] = C.empty_cache

# ---- timing model -----------------------------------------------------------

# (copy bytes/us, launch latency us, link bytes/us); all zero is off.
set_timing_model: Callable[[float, float, float], None] = C.set_timing_model
timing_model: Callable[[], tuple[float, float, float]] = C.timing_model

# ---- random numbers ---------------------------------------------------------

manual_seed: Callable[[int, int], None] = C.manual_seed
seed: Callable[[int], int] = C.seed
initial_seed: Callable[[int], int] = C.initial_seed
get_rng_state: Callable[[int], torch.Tensor] = C.get_rng_state
set_rng_state: Callable[[int, torch.Tensor], None] = C.set_rng_state

# ---- the op-plugin's primitives (aclnnForeachCopy, aclrtMemcpyBatch) --------

# aclnnForeachCopy's SINGLE_FOREACH_OP_TENSOR_COUNT: pairs per device task.
SINGLE_FOREACH_OP_TENSOR_COUNT: int = int(C.SINGLE_FOREACH_OP_TENSOR_COUNT)
# One device task per call on the current stream; at most SINGLE_FOREACH_OP_TENSOR_COUNT pairs.
launch_foreach_copy: Callable[[TensorList, TensorList], None] = C.launch_foreach_copy
# Blocking host<->device batch (the caller synchronizes the stream first).
memcpy_batch: Callable[[TensorList, TensorList], None] = C.memcpy_batch
# One asynchronous task; pageable sources staged now, a pageable destination waits.
memcpy_batch_async: Callable[[TensorList, TensorList], None] = C.memcpy_batch_async
# PyTorch's own at::native::can_use_fast_route and check_foreach_api_restrictions.
can_use_fast_route: Callable[[TensorList, TensorList], bool] = C.can_use_fast_route
check_foreach_api_restrictions: Callable[[TensorList, TensorList], None] = C.check_foreach_api_restrictions
increment_version: Callable[[TensorList], None] = C.increment_version


# ---- observers (npusim.sanitizer; torch.profiler needs none, see csrc/trace.h) --

# fn(op, event_id, device, stream_id) after each event record / wait and host
# synchronize, on the host thread that did it (op numbers: csrc/trace.h StreamOp); None removes it.
set_stream_op_observer: Callable[[Callable[[int, int, int, int], None] | None], None] = C.set_stream_op_observer
# fn(ptr, delta_bytes, device) per allocation (> 0) and free (< 0); device -1 is pinned host memory.
# Called at once on a thread holding the GIL; otherwise kept for take_memory_events.
set_memory_observer: Callable[[Callable[[int, int, int], None] | None], None] = C.set_memory_observer
take_memory_events: Callable[[], list[tuple[int, int, int]]] = C.take_memory_events


# ---- extensions -------------------------------------------------------------

def core_api_capsule() -> Any:
    """The versioned table of runtime entry points other extensions link against (core_api.h)."""
    return C.core_api()
