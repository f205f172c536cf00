"""The ``torch.npu`` module of the simulated NPU.

npusim registers this module as ``torch.npu``; it offers what PyTorch asks
of an accelerator's device module (devices, streams, events, memory, RNG,
AMP) under the names torch.cuda uses.
"""

import torch

from npusim.runtime.device import (
    _get_device_index,
    _lazy_init,
    current_device,
    device,
    device_count,
    device_of,
    get_amp_supported_dtype,
    get_device_name,
    init,
    is_available,
    is_bf16_supported,
    is_initialized,
    set_device,
    synchronize,
)
from npusim.runtime.graphs import (
    NPUGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from npusim.runtime.memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_peak_memory_stats,
    set_memory_capacity,
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
    current_stream,
    default_stream,
    set_stream,
    stream,
    synchronize_stream,
)

# As torch.cuda.default_generators: one per device, fixed once npusim is imported.
default_generators: tuple[torch.Generator, ...] = _default_generators()

__all__ = [
    "_get_device_index", "_is_in_bad_fork", "_lazy_init", "current_device", "current_stream",
    "default_generator", "default_generators", "default_stream", "device", "device_count", "device_of",
    "empty_cache", "Event", "get_amp_supported_dtype", "get_device_name", "get_rng_state",
    "get_rng_state_all", "graph", "graph_pool_handle", "init", "initial_seed", "is_available",
    "is_bf16_supported", "is_current_stream_capturing", "is_initialized", "make_graphed_callables",
    "manual_seed", "manual_seed_all", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
    "memory_allocated", "memory_reserved", "memory_stats", "NPUGraph", "reset_peak_memory_stats", "seed",
    "seed_all", "set_device", "set_memory_capacity", "set_rng_state", "set_rng_state_all", "set_stream",
    "Stream", "stream", "StreamContext", "synchronize", "synchronize_stream",
]
