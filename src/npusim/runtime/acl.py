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
# Gives the npu slot of structured ops' functional and in-place variants, and of ops whose
# composite would stand in for CPU's kernel, to the CPU fallback, except the ops named
# (Note [Structured ops go straight to the fallback], Note [CPU's kernel, not the composite]).
# Routes once (later calls return the first result): {"aten::add.Tensor": "unboxed", "boxed" or "foreach", ...,
# "aten::addr_": "checked in place"}.
route_structured_ops_to_fallback: Callable[[list[str]], dict[str, str]] = C.route_structured_ops_to_fallback
set_launch_blocking: Callable[[bool], None] = C.set_launch_blocking
# NPUSIM_SMALL_OPS_ON_THE_HOST: False makes every compute op a stream task (Note [Work on an idle stream]).
set_small_ops_on_the_host: Callable[[bool], None] = C.set_small_ops_on_the_host
# The launch queue's bound per stream (Note [Bounded launch queue]).
set_max_pending_launches: Callable[[int], None] = C.set_max_pending_launches
max_pending_launches: Callable[[], int] = C.max_pending_launches
# A device's first asynchronous failure, "" if none (Note [Sticky device errors]); forgetting it is for
# test harnesses only (npusim.testing.clear_device_failures).
device_failure: Callable[[int], str] = C.device_failure
clear_device_failure: Callable[[int], None] = C.clear_device_failure
# Interpreter exit (Note [Launches at exit]): from begin_exit on, other Python threads stop at their next
# launch or host wait.
begin_exit: Callable[[], None] = C.begin_exit
# Waits for every stream without raising; False at the timeout (timeout_s < 0: no limit).
drain_streams: Callable[[float], bool] = C.drain_streams
# True in a child forked after the npu was used (its device calls raise).
in_bad_fork: Callable[[], bool] = C.in_bad_fork

# ---- streams (aclrtCreateStream, aclrtSynchronizeStream, ...) ---------------

# A stream is named by (stream_id, device_index, device_type), as torch.Stream stores it.
current_stream: Callable[[int], tuple[int, int, int]] = C.current_stream
default_stream: Callable[[int], tuple[int, int, int]] = C.default_stream
set_stream: Callable[[int, int], None] = C.set_stream
stream_priority: Callable[[int, int], int] = C.stream_priority
stream_pending: Callable[[int, int], int] = C.stream_pending
# Tasks ever enqueued on the stream (work done on the host, Note [Work on an idle stream], is not one).
stream_enqueued: Callable[[int, int], int] = C.stream_enqueued
# Items of a task's shared work (a foreach copy's spans, a random fill's ranges) that host threads
# waiting for the stream ran: Note [A waiting host helps] in runtime/stream.cpp.
stream_items_helped: Callable[[int, int], int] = C.stream_items_helped
# (stream_id, device, timeout_s < 0 waits forever); a timeout raises an error naming the stream.
synchronize_stream: Callable[[int, int, float], None] = C.synchronize_stream
synchronize_device: Callable[[int], None] = C.synchronize_device
synchronize_all: Callable[[], None] = C.synchronize_all


# (device, kernel, args): kernel(*args) after the current stream's earlier work, or recorded as a
# task of that stream while it is captured (a compiled region's C++ kernel).
launch_host_kernel: Callable[[int, Callable[..., Any], tuple[Any, ...]], None] = C.launch_host_kernel


def synchronize_current_stream(device: int, timeout_s: float = -1.0) -> None:
    """aclrtSynchronizeStream on the current stream of ``device``."""
    stream_id, index, _ = C.current_stream(device)
    C.synchronize_stream(stream_id, index, timeout_s)


def busy_streams(device: int) -> tuple[int, int]:
    """(streams of ``device`` with unfinished work, streams of a device)."""
    busy = sum(1 for stream_id in range(STREAMS_PER_DEVICE) if C.stream_pending(stream_id, device) > 0)
    return busy, STREAMS_PER_DEVICE


# ---- memory (aclrtGetMemInfo, ...) ------------------------------------------


# The simulated node's sizes, defined once in the core (csrc/runtime/npu_type.h).
DEFAULT_DEVICE_COUNT: int = int(C.DEFAULT_DEVICE_COUNT)  # physical NPUs when NPUSIM_DEVICE_COUNT is unset
MAX_DEVICES: int = int(C.MAX_DEVICES)
STREAMS_PER_DEVICE: int = int(C.STREAMS_PER_DEVICE)  # the default stream and two pools of 8

# ---- memory (aclrtGetMemInfo, aclrtMalloc's caching allocator, ...) ---------

# Total device memory (-1: unlimited) and the fraction this process may reserve.
memory_capacity: Callable[[int], int] = C.memory_capacity
set_memory_capacity: Callable[[int, int], None] = C.set_memory_capacity
memory_fraction: Callable[[int], float] = C.memory_fraction
set_memory_fraction: Callable[[int, float], None] = C.set_memory_fraction
reset_peak_memory_stats: Callable[[int], None] = C.reset_peak_memory_stats
reset_accumulated_memory_stats: Callable[[int], None] = C.reset_accumulated_memory_stats
empty_cache: Callable[[], None] = C.empty_cache
# The caching allocator's settings (Note [Allocator settings], npusim/config.py): (max_split_size bytes
# or -1, max_non_split_rounding bytes or -1 (the large segment size), large_segment_size bytes,
# garbage_collection_threshold or 0, 16 roundup_power2_divisions, expandable_segments).
set_allocator_settings: Callable[[int, int, int, float, Sequence[int], bool], None] = C.set_allocator_settings
# What the allocator holds: max_split_size (bytes or None), max_non_split_rounding, large_segment_size,
# garbage_collection_threshold, roundup_power2_divisions (16), expandable_segments.
allocator_settings: Callable[[], dict[str, Any]] = C.allocator_settings
# fn() reads PYTORCH_NPU_ALLOC_CONF into the allocator; the allocator calls it when it initialises
# (its first allocation or call), again after each time it raises.
set_allocator_settings_reader: Callable[[Callable[[], None]], None] = C.set_allocator_settings_reader
ensure_allocator_settings: Callable[[], None] = C.ensure_allocator_settings
# Segments as torch.cuda.memory_snapshot lists them (each with its blocks); pool: only that private pool's.
memory_snapshot: Callable[..., list[dict[str, Any]]] = C.memory_snapshot
# (enabled, max_entries): the alloc / free trace of _record_memory_history.
record_memory_history: Callable[[bool, int], None] = C.record_memory_history
memory_trace: Callable[[int], list[dict[str, Any]]] = C.memory_trace

# Private pools (CUDA's MemPool / graph pools; Note [Private pools] in csrc/runtime/private_pools.cpp).
PoolId = tuple[int, int]
new_mempool_id: Callable[[bool], PoolId] = C.new_mempool_id  # (user_created) -> (0, n) or (n, 0)
# (device, id, no_split, use_on_oom)
create_or_incref_pool: Callable[[int, PoolId, bool, bool], None] = C.create_or_incref_pool
begin_allocate_current_thread_to_pool: Callable[[int, PoolId], None] = C.begin_allocate_current_thread_to_pool
end_allocate_to_pool: Callable[[int, PoolId], None] = C.end_allocate_to_pool
release_pool: Callable[[int, PoolId], None] = C.release_pool
pool_use_count: Callable[[int, PoolId], int] = C.pool_use_count
# The addresses of the pool's allocated blocks (graph trees' live-allocation check).
pool_live_allocations: Callable[[int, PoolId], list[int]] = C.pool_live_allocations
# CUDA's _cuda_getCheckpointState / _cuda_setCheckpointPoolState: (device, pool) -> PoolCheckpoint;
# (checkpoint, stale storage pointers, storage pointers to add deleters to).
PoolCheckpoint: Any = C.PoolCheckpoint
checkpoint_pool: Callable[[int, PoolId], Any] = C.checkpoint_pool
set_checkpoint_pool_state: Callable[[Any, Sequence[int], Sequence[int]], None] = C.set_checkpoint_pool_state
# The host behind the device (Note [Host memory behind the device]): the margin the allocator leaves it
# (-1: the default, 0: no check), a simulated host with that many bytes available (-1: the real one;
# a test hook), the next n segment mappings failing as a refused mmap (a test hook), and the bytes of
# segments mapped now.
set_host_memory_margin: Callable[[int], None] = C.set_host_memory_margin
simulate_host_memory: Callable[[int], None] = C.simulate_host_memory
fail_host_mappings: Callable[[int], None] = C.fail_host_mappings
mapped_segment_bytes: Callable[[], int] = C.mapped_segment_bytes
# Plan mode (Note [Plan mode] in csrc/runtime/plan_mode.cpp): no kernel runs, device memory is not backed.
# Set before the first npu allocation only.
set_plan_mode: Callable[[bool], None] = C.set_plan_mode
device_computes: Callable[[], bool] = C.device_computes
host_memory_stats: Callable[[], dict[str, int]] = C.host_memory_stats
reset_peak_host_memory_stats: Callable[[], None] = C.reset_peak_host_memory_stats
reset_accumulated_host_memory_stats: Callable[[], None] = C.reset_accumulated_host_memory_stats

# ---- timing model -----------------------------------------------------------

# (copy_gbps, launch_us, link_gbps), the fields of npusim.timing.TimingModel; all zero is off.
set_timing_model: Callable[[float, float, float], None] = C.set_timing_model
timing_model: Callable[[], tuple[float, float, float]] = C.timing_model
# The chip clock (Note [Chip clock] in csrc/runtime/chip_clock.cpp): (on, realtime, host_launch_us,
# host_cpu_factor); the host's and a stream's chip time; the collective-cost hook fn(op, bytes,
# global ranks) -> us (None: the link bandwidth alone); the profiler axis' anchor (profiler ns,
# chip us) and the host clock's samples since it was anchored.
set_chip_clock: Callable[[bool, bool, float, float], None] = C.set_chip_clock
# The compute-cost hook's answers, cached per meta plan, are stale (the profile changed).
invalidate_compute_costs: Callable[[], None] = C.invalidate_compute_costs
chip_clock: Callable[[], tuple[bool, bool, float, float]] = C.chip_clock
host_clock_us: Callable[[], float] = C.host_clock_us
stream_clock_us: Callable[[int, int], float] = C.stream_clock_us
set_collective_cost: Callable[[Callable[[str, int, list[int]], float] | None], None] = C.set_collective_cost
profiler_axis_anchor: Callable[[], tuple[int, float]] = C.profiler_axis_anchor
host_clock_samples: Callable[[], list[tuple[int, float]]] = C.host_clock_samples

# The compute-cost hook (csrc/aten/launch/op_launch.h): fn(name, overload, meta_inputs, meta_outputs) -> the
# task's duration in microseconds, called at the launch of every compute task on the launching thread
# with the op's arguments and results as Meta tensors (devices as "meta"); None removes it. While one is
# installed no compute op is done on the host (Note [Work on an idle stream]).
set_compute_cost: Callable[[Callable[[str, str, list[Any], list[Any]], float] | None], None] = C.set_compute_cost

# How many Meta kernel answers the calling thread's cache holds (Note [Cached output metadata]).
cached_meta_plans: Callable[[], int] = C.cached_meta_plans

# The cores this process may run on (its affinity mask), and the intra-op team a stream worker runs a
# kernel with, given the user's torch.set_num_threads count, its largest tensor's elements and whether
# the op is pointwise: one thread fewer for a small pointwise kernel when the count takes every core
# (csrc/aten/intraop_threads.h, Note [A core for the host]).
usable_cores: Callable[[], int] = C.usable_cores
worker_intraop_threads: Callable[[int, int, bool], int] = C.worker_intraop_threads

# ---- random numbers ---------------------------------------------------------

# The device's default Philox generator (seed, offset) as a torch.Generator; the
# same object on every call while it lives. See Note [npu Philox stream] (generator.h).
default_generator: Callable[[int], torch.Generator] = C.default_generator
# (form, seed, offset, n): the words of n Philox blocks drawn by one form of the batched kernel
# ("auto", "portable", "avx2", "avx512"; Note [Philox blocks in batches]), an int64 tensor [n, 4];
# None where the machine lacks the form.
philox_words: Callable[[str, int, int, int], torch.Tensor | None] = C.philox_words
# (form, reference): over every input the float normal_'s log1pf and cosf take, how many results of
# form ("auto", "portable", "avx2") differ from reference's ("portable", or "libm": this machine's),
# as (log1pf, cosf) counts; None where the machine lacks either (Note [Box-Muller bit for bit]).
box_muller_mismatches: Callable[[str, str], tuple[int, int] | None] = C.box_muller_mismatches

# ---- graphs (aclmdlRICaptureBegin / End, aclmdlRIExecuteAsync) --------------

# A capture of the current stream: capture_begin(pool, mode), capture_end(), replay(), reset(), pool().
NpuGraph: Any = C.NpuGraph
graph_pool_handle: Callable[[], tuple[int, int]] = C.graph_pool_handle
# A make_graphed_callables step: GraphedStep(forward_graph, static_inputs, params, static_outputs, backward),
# called with the user's input tensors: copies the new ones in, replays, and returns the outputs tied to one
# autograd node whose backward calls backward(*grads) (Note [A graphed step without autograd.Function]).
GraphedStep: Any = C.GraphedStep
# (stream_id, device): True while a graph captures that stream.
stream_is_capturing: Callable[[int, int], bool] = C.stream_is_capturing
# The npu graph trees' outputs: each npu tensor's geometry over a new storage that aliases its memory and
# keeps the old storage alive, one per storage they share, in one call; and
# torch._C._set_storage_access_error_msg of CUDA builds.
in_new_storages: Callable[[list[torch.Tensor]], list[torch.Tensor]] = C.in_new_storages
set_storage_access_error: Callable[[torch.Tensor, str], None] = C.set_storage_access_error

# ---- the aten::_foreach_copy_ kernel and its router (csrc/aten/foreach_copy.h) ----

# aclnnForeachCopy's SINGLE_FOREACH_OP_TENSOR_COUNT: pairs per device task of the fast route.
SINGLE_FOREACH_OP_TENSOR_COUNT: int = int(C.SINGLE_FOREACH_OP_TENSOR_COUNT)
# The kernel decides every route (See Note [The _foreach_copy_ router]) from the routing fields of
# the current profile, which runtime/profiles.py hands over when a profile becomes current:
# (kernel, nd_out, batch, memcpy_batch, memcpy_batch_async, fast_dtypes, sync_timeout_s).
# A task that only holds the current stream of a device for duration_us (device, duration_us).
launch_delay: Callable[[int, float], None] = C.launch_delay
register_foreach_copy_kernel: Callable[[], None] = C.register_foreach_copy_kernel
set_foreach_copy_config: Callable[[bool, bool, bool, bool, bool, Sequence[torch.dtype], float], None] = (
    C.set_foreach_copy_config)
# Those fields as the kernel holds them (fast_dtypes in ScalarType order).
foreach_copy_config: Callable[[], dict[str, Any]] = C.foreach_copy_config
# The mode is the kernel's (True: legacy); ops/foreach_copy.py's get/set are its accessors.
set_foreach_copy_legacy: Callable[[bool], None] = C.set_foreach_copy_legacy
foreach_copy_legacy: Callable[[], bool] = C.foreach_copy_legacy
# Regression only: batch eligibility without npusim's per-pair correction.
set_original_batch_eligibility: Callable[[bool], None] = C.set_original_batch_eligibility
# sink(groups, non_blocking, legacy) after each call, groups as (route, pairs, chunks, non_blocking,
# dtype or None); None removes it (ops/trace.py).
set_foreach_copy_trace_sink: Callable[[Callable[[list[tuple[Any, ...]], bool, bool], None] | None], None] = (
    C.set_foreach_copy_trace_sink)
foreach_copy_traced: Callable[[], bool] = C.foreach_copy_traced
# Dtype groups copied so far per route: {"fast": n, "batch": n, "slow": n, "compat": n}.
foreach_copy_route_counts: Callable[[], dict[str, int]] = C.foreach_copy_route_counts
# Calls the host ran with CPU's TensorIterator kernel on the npu tensors themselves (add, sub, mul,
# div; Note [TensorIterator kernels on npu tensors], csrc/aten/iterator_kernels.cpp).
iterator_kernel_runs: Callable[[], int] = C.iterator_kernel_runs
# Tasks that ran a unary foreach op per tensor into the outputs the host allocated (Note [A foreach op's
# results in place], csrc/aten/launch/op_task.cpp).
foreach_results_in_place_runs: Callable[[], int] = C.foreach_results_in_place_runs
# Kernel results a task copied into the output the host allocated, where an out= kernel writes it in place
# (Note [Unboxed fallback kernels], csrc/aten/fallback_routes.cpp).
results_copied_into_place: Callable[[], int] = C.results_copied_into_place


# ---- observers (npusim.sanitizer; torch.profiler needs none: csrc/runtime/device_profiler.cpp)

# fn(op, event_id, device, stream_id) after each event record / wait and host
# synchronize, on the host thread that did it (op numbers: csrc/runtime/trace.h StreamOp); None removes it.
set_stream_op_observer: Callable[[Callable[[int, int, int, int], None] | None], None] = C.set_stream_op_observer
# fn(ptr, delta_bytes, device) per allocation (> 0) and free (< 0); device -1 is pinned host memory.
# Called at once on a thread holding the GIL; otherwise kept for take_memory_events.
set_memory_observer: Callable[[Callable[[int, int, int], None] | None], None] = C.set_memory_observer
take_memory_events: Callable[[], list[tuple[int, int, int]]] = C.take_memory_events


# ---- extensions -------------------------------------------------------------

def core_api_capsule() -> Any:
    """The versioned table of runtime entry points other extensions link against (core_api.h)."""
    return C.core_api()

# ---- tensor backend metadata (Note [npu backend metadata] in csrc/aten/backend_meta.cpp) ----------

# The named integer fields of an npu tensor; set replaces them all ({} removes them).
get_backend_meta: Callable[[torch.Tensor], dict[str, int]] = C.get_backend_meta
set_backend_meta: Callable[[torch.Tensor, dict[str, int]], None] = C.set_backend_meta

# ---- sharing between processes (Note [Sharing npu tensors between processes] in csrc/aten/ipc.cpp) ----

# The descriptor of the shared memory an npu tensor's storage lives in (moved there on first use;
# the device is synchronized first).
share_npu_storage: Callable[[torch.Tensor], int] = C.share_npu_storage
# (descriptor, bytes, device): that shared memory as a 1-D uint8 npu tensor over all of it.
open_shared_npu_storage: Callable[[int, int, int], torch.Tensor] = C.open_shared_npu_storage
