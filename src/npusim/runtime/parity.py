"""The public names torch_npu's ``torch.npu`` shares with ``torch.cuda``, and the ones that
mean nothing on a simulator (with why). ``tests/test_npu_api_parity.py`` checks the rest.

Where the list comes from: the ``__all__`` of Ascend/pytorch ``torch_npu/npu/__init__.py``
(which re-exports its ``memory``, ``random``, ``streams`` and ``graphs`` submodules' names),
plus the submodules themselves (``amp``, ``memory``, ``random``, ``streams``, ``graphs``),
intersected with ``torch.cuda.__all__`` of torch 2.13.0. Read from the Ascend/pytorch
master branch in December 2026; 92 names.
"""

from __future__ import annotations

SHARED_WITH_CUDA: tuple[str, ...] = (
    "BFloat16Storage", "BFloat16Tensor", "BoolStorage", "BoolTensor", "ByteStorage", "ByteTensor", "CharStorage",
    "CharTensor", "DoubleStorage", "DoubleTensor", "Event", "FloatStorage", "FloatTensor", "HalfStorage",
    "HalfTensor", "IntStorage", "IntTensor", "LongStorage", "LongTensor", "MemPool", "ShortStorage", "ShortTensor",
    "Stream", "StreamContext", "amp", "caching_allocator_alloc", "caching_allocator_delete",
    "can_device_access_peer", "change_current_allocator", "current_blas_handle", "current_device",
    "current_stream", "default_stream", "device", "device_count", "device_of", "empty_cache",
    "get_allocator_backend", "get_device_capability", "get_device_name", "get_device_properties",
    "get_per_process_memory_fraction", "get_rng_state", "get_rng_state_all", "get_sync_debug_mode", "graph",
    "graph_pool_handle", "graphs", "host_memory_stats", "host_memory_stats_as_nested_dict", "init",
    "initial_seed", "ipc_collect", "is_available", "is_bf16_supported", "is_current_stream_capturing",
    "is_initialized", "make_graphed_callables", "manual_seed", "manual_seed_all", "max_memory_allocated",
    "max_memory_cached", "max_memory_reserved", "mem_get_info", "memory", "memory_allocated", "memory_cached",
    "memory_reserved", "memory_snapshot", "memory_stats", "memory_stats_as_nested_dict", "memory_summary",
    "random", "reset_accumulated_host_memory_stats", "reset_accumulated_memory_stats",
    "reset_max_memory_allocated", "reset_max_memory_cached", "reset_peak_host_memory_stats",
    "reset_peak_memory_stats", "seed", "seed_all", "set_device", "set_per_process_memory_fraction",
    "set_rng_state", "set_rng_state_all", "set_stream", "set_sync_debug_mode", "stream", "streams",
    "synchronize", "use_mem_pool", "utilization",
)

NOT_APPLICABLE: dict[str, str] = {
    "MemPool": "private memory pools (CUDA-graph pools, custom allocators) are not simulated; every "
               "allocation comes from the device's one caching pool",
    "use_mem_pool": "private memory pools are not simulated (see MemPool)",
    "change_current_allocator": "the device core's caching allocator is the only one; pluggable allocators "
                                "are not simulated",
    "current_blas_handle": "there is no BLAS handle: matrix products run PyTorch's CPU kernels",
    "set_sync_debug_mode": "npusim does not intercept synchronizing calls; the mode is stored and returned "
                           "by get_sync_debug_mode, nothing warns or raises",
    "get_sync_debug_mode": "see set_sync_debug_mode",
    "reset_accumulated_host_memory_stats": "pinned host memory is not cached; host_memory_stats counts live "
                                           "pinned bytes and allocations, with no resettable history",
    "reset_peak_host_memory_stats": "see reset_accumulated_host_memory_stats",
}
