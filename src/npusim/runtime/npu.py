"""The ``torch.npu`` module of the simulated NPU.

npusim registers this module as ``torch.npu``; it offers what PyTorch asks
of an accelerator's device module (devices, streams, events, memory, RNG,
AMP) under the names torch.cuda and torch_npu use, with the submodules
``amp``, ``graphs``, ``memory``, ``random``, ``streams`` and ``utils`` (importable as
``torch.npu.<name>``). The names it shares with
torch_npu and torch.cuda are listed in ``runtime/parity.py``.
"""

import torch

from npusim.runtime import aclnn, amp, graphs, memory, random, streams, utils  # noqa: F401  (torch.npu.<submodule>)
from npusim.runtime.backends import (  # torch_npu's torch.npu has torch.backends.npu's switches too
    enable_flash_sdp,
    enable_math_sdp,
    enable_mem_efficient_sdp,
    flash_sdp_enabled,
    math_sdp_enabled,
    mem_efficient_sdp_enabled,
    preferred_linalg_library,
    sdp_kernel,
)
from npusim.runtime.compat import (
    are_compatible_impl_enabled,
    config,
    conv,
    get_autocast_dtype,
    is_autocast_enabled,
    is_jit_compile_false,
    matmul,
    set_autocast_dtype,
    set_autocast_enabled,
    set_compile_mode,
    set_option,
    use_compatible_impl,
)
from npusim.runtime.deterministic import disable_deterministic_with_backward, enable_deterministic_with_backward
from npusim.runtime.device import (
    _get_device_index,
    _lazy_call,
    _lazy_init,
    _NPUDeviceProperties,
    _sleep,
    can_device_access_peer,
    current_device,
    device,
    device_count,
    device_of,
    get_amp_supported_dtype,
    get_arch_list,
    get_device_capability,
    get_device_name,
    get_device_properties,
    get_sync_debug_mode,
    init,
    ipc_collect,
    is_available,
    is_bf16_supported,
    is_initialized,
    set_device,
    set_sync_debug_mode,
    synchronize,
    utilization,
)
from npusim.runtime.graphs import (
    NPUGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from npusim.runtime.legacy_types import *  # noqa: F403  (FloatTensor, FloatStorage, ...)
from npusim.runtime.legacy_types import __all__ as _legacy_names
from npusim.runtime.memory import (
    MemPool,
    _dump_snapshot,
    _record_memory_history,
    _snapshot,
    caching_allocator_alloc,
    caching_allocator_delete,
    empty_cache,
    get_allocator_backend,
    get_per_process_memory_fraction,
    host_empty_cache,
    host_memory_stats,
    host_memory_stats_as_nested_dict,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_host_memory_stats,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_host_memory_stats,
    reset_peak_memory_stats,
    set_memory_capacity,
    set_per_process_memory_fraction,
    use_mem_pool,
)
from npusim.runtime.random import (
    _default_generators,
    _is_in_bad_fork,
    default_generator,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from npusim.runtime.streams import (
    Event,
    Stream,
    StreamContext,
    SyncLaunchStream,
    current_stream,
    default_stream,
    set_stream,
    stream,
    synchronize_stream,
)
from npusim.runtime.utils import (  # torch_npu.npu re-exports them
    clear_npu_overflow_flag,
    get_npu_overflow_flag,
    get_soc_version,  # torch_npu.npu's, from its _backends
)

# What the caching allocator raises when the device's memory (or this process's share) is spent: torch's
# own class, as torch.cuda.OutOfMemoryError is.
OutOfMemoryError = torch.OutOfMemoryError

# The submodules `import torch.npu.<name>` finds (torch_npu's torch.npu is a package).
SUBMODULES = ("aclnn", "amp", "graphs", "memory", "random", "streams", "utils")

# As torch.cuda.default_generators: one per device, fixed once npusim is imported.
default_generators: tuple[torch.Generator, ...] = _default_generators()

__all__ = [
    "_dump_snapshot", "_get_device_index", "_is_in_bad_fork", "_lazy_call", "_lazy_init", "_NPUDeviceProperties",
    "_sleep",
    "_record_memory_history", "_snapshot", "aclnn", "amp", "are_compatible_impl_enabled", "caching_allocator_alloc",
    "caching_allocator_delete",
    "can_device_access_peer", "clear_npu_overflow_flag", "config", "conv", "current_device", "current_stream",
    "default_generator",
    "default_generators", "default_stream", "device", "device_count", "device_of",
    "disable_deterministic_with_backward", "empty_cache", "enable_deterministic_with_backward", "enable_flash_sdp",
    "enable_math_sdp", "enable_mem_efficient_sdp", "Event", "flash_sdp_enabled", "get_npu_overflow_flag",
    "get_soc_version",
    "math_sdp_enabled", "mem_efficient_sdp_enabled", "preferred_linalg_library", "sdp_kernel",
    "get_allocator_backend", "get_amp_supported_dtype", "get_arch_list", "get_autocast_dtype",
    "get_device_capability", "get_device_name", "get_device_properties", "get_per_process_memory_fraction",
    "get_rng_state", "get_rng_state_all", "get_sync_debug_mode", "graph", "graph_pool_handle", "graphs",
    "host_empty_cache", "host_memory_stats", "host_memory_stats_as_nested_dict", "init", "initial_seed",
    "ipc_collect", "is_autocast_enabled", "is_available", "is_bf16_supported", "is_current_stream_capturing",
    "is_initialized", "is_jit_compile_false", "make_graphed_callables", "manual_seed", "manual_seed_all", "matmul",
    "max_memory_allocated", "max_memory_cached", "max_memory_reserved", "mem_get_info", "memory", "memory_allocated",
    "memory_cached", "memory_reserved", "memory_snapshot", "memory_stats", "memory_stats_as_nested_dict",
    "memory_summary", "MemPool", "NPUGraph", "OutOfMemoryError", "random", "reset_accumulated_host_memory_stats",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
    "reset_peak_host_memory_stats", "reset_peak_memory_stats", "seed", "seed_all", "set_autocast_dtype",
    "set_autocast_enabled", "set_compile_mode", "set_device", "set_memory_capacity", "set_option",
    "set_per_process_memory_fraction", "set_rng_state", "set_rng_state_all", "set_stream", "set_sync_debug_mode",
    "Stream", "stream", "StreamContext", "streams", "synchronize", "synchronize_stream", "SyncLaunchStream",
    "use_compatible_impl", "use_mem_pool", "utilization",
    "utils", *_legacy_names,
]
