"""Device memory of the ``torch.npu`` module: torch.cuda's memory API over the
caching allocator of the device core (see Note [Caching allocator] in
``csrc/memory.cpp``).

The statistics are CUDA's (``allocated_bytes.all.current``, ...): the core's
``c10::DeviceAllocator::getDeviceStats`` fills them and
``torch.accelerator.memory_stats`` flattens them, so both report the same.
"""

from __future__ import annotations

import collections
import pickle
import sys
import warnings
from typing import Any

import torch

from npusim import config
from npusim.runtime import acl
from npusim.runtime.device import _device_t, _get_device_index

__all__ = [
    "caching_allocator_alloc", "caching_allocator_delete", "empty_cache", "get_allocator_backend",
    "get_per_process_memory_fraction", "host_empty_cache", "host_memory_stats", "host_memory_stats_as_nested_dict",
    "max_memory_allocated", "max_memory_cached", "max_memory_reserved", "mem_get_info", "memory_allocated",
    "memory_cached", "memory_reserved", "memory_snapshot", "memory_stats", "memory_stats_as_nested_dict",
    "memory_summary", "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
    "reset_peak_memory_stats", "set_memory_capacity", "set_per_process_memory_fraction",
]


def _index(device: _device_t) -> int:
    index = _get_device_index(device)
    if not 0 <= index < acl.device_count():
        raise RuntimeError(f"Invalid device argument: npu:{index}; expected 0 <= index < device_count() = "
                           f"{acl.device_count()}")
    return index


def memory_stats(device: _device_t = None) -> collections.OrderedDict[str, Any]:
    """CUDA's flat statistics (``"<stat>.<all|small_pool|large_pool>.<current|peak|allocated|freed>"``,
    ``num_ooms``, ``num_alloc_retries``, ...)."""
    return torch.accelerator.memory_stats(_index(device))


def memory_stats_as_nested_dict(device: _device_t = None) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def memory_allocated(device: _device_t = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: _device_t = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: _device_t = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: _device_t = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def memory_cached(device: _device_t = None) -> int:
    warnings.warn("torch.npu.memory_cached has been renamed to torch.npu.memory_reserved", FutureWarning,
                  stacklevel=2)
    return memory_reserved(device)


def max_memory_cached(device: _device_t = None) -> int:
    warnings.warn("torch.npu.max_memory_cached has been renamed to torch.npu.max_memory_reserved",
                  FutureWarning, stacklevel=2)
    return max_memory_reserved(device)


def reset_peak_memory_stats(device: _device_t = None) -> None:
    acl.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: _device_t = None) -> None:
    acl.reset_accumulated_memory_stats(_index(device))


def reset_max_memory_allocated(device: _device_t = None) -> None:
    warnings.warn("torch.npu.reset_max_memory_allocated now calls torch.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: _device_t = None) -> None:
    warnings.warn("torch.npu.reset_max_memory_cached now calls torch.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Returns cached blocks that no stream can still touch to the host."""
    acl.empty_cache()


def host_empty_cache() -> None:
    """Nothing to release: pinned host blocks are returned to the host when freed, never cached
    (torch_npu: releases the pinned-memory cache)."""


def _set_allocator_settings(settings: str) -> None:
    """torch_npu's contract: only ``"expandable_segments:True"`` / ``"...:False"`` is accepted. As in
    ``PYTORCH_NPU_ALLOC_CONF``, the key is accepted without effect (the simulated allocator has no
    expandable segments); any other setting raises, naming the call."""
    key, sep, value = settings.partition(":")
    if key.strip() != "expandable_segments" or not sep:
        raise RuntimeError(f"torch.npu.memory._set_allocator_settings: torch_npu accepts only "
                           f"'expandable_segments:True' or 'expandable_segments:False', got {settings!r}")
    config.parse_bool(value, "torch.npu.memory._set_allocator_settings: expandable_segments")


def set_memory_capacity(nbytes: int | str | None, device: _device_t = None) -> None:
    """Sets the device's total memory (None: the profile's HBM size); over it, OutOfMemoryError."""
    from npusim.runtime.profiles import get_profile

    if nbytes is None:
        value = get_profile().total_memory
    else:
        value = config.parse_bytes(nbytes) if isinstance(nbytes, str) else int(nbytes)
    acl.set_memory_capacity(_index(device), value)


def mem_get_info(device: _device_t = None) -> tuple[int, int]:
    """(free, total) bytes: total is the device's capacity, free what the allocator has not reserved."""
    return torch.accelerator.get_memory_info(_index(device))


def set_per_process_memory_fraction(fraction: float, device: _device_t = None) -> None:
    """Caps what this process may reserve on the device at ``fraction`` of its total memory."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    acl.set_memory_fraction(_index(device), fraction)


def get_per_process_memory_fraction(device: _device_t = None) -> float:
    return acl.memory_fraction(_index(device))


def get_allocator_backend() -> str:
    """``"native"``: the device core's caching allocator (there is no async backend)."""
    return "native"


_raw_allocations: dict[int, torch.Tensor] = {}


def caching_allocator_alloc(size: int, device: _device_t = None, stream: torch.Stream | None = None) -> int:
    """Allocates ``size`` bytes from the caching allocator on ``stream``; returns the address."""
    from npusim.runtime.streams import current_stream
    from npusim.runtime.streams import stream as stream_context

    index = _index(device)
    if stream is None:
        stream = current_stream(index)
    if not isinstance(stream, torch.Stream):
        raise TypeError("Invalid type for stream argument, must be `torch.npu.Stream`")
    with stream_context(stream):
        block = torch.empty(size, dtype=torch.uint8, device=torch.device("npu", index))
    _raw_allocations[block.data_ptr()] = block
    return block.data_ptr()


def caching_allocator_delete(mem_ptr: int) -> None:
    """Frees memory from :func:`caching_allocator_alloc` (stream-ordered)."""
    if _raw_allocations.pop(mem_ptr, None) is None:
        raise RuntimeError(f"caching_allocator_delete: {mem_ptr:#x} was not allocated by caching_allocator_alloc")


def host_memory_stats() -> dict[str, int]:
    """Pinned host memory: live bytes, their peak, allocation and free counts."""
    return dict(acl.host_memory_stats())


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in host_memory_stats().items():
        name, _, leaf = key.partition(".")
        if leaf:
            nested.setdefault(name, {})[leaf] = value
        else:
            nested[name] = value
    return nested


# ---- snapshots and history (torch.cuda.memory._snapshot, ...) ----------------

def _snapshot(device: _device_t = None) -> dict[str, Any]:
    """Segments of every device and each device's alloc / free trace (while recording)."""
    return {
        "segments": acl.memory_snapshot(),
        "device_traces": [acl.memory_trace(index) for index in range(acl.device_count())],
        # What the allocator holds (PYTORCH_NPU_ALLOC_CONF as parsed once), plus the keys accepted without effect.
        "allocator_settings": {**acl.allocator_settings(),
                               "expandable_segments": config.alloc_conf().expandable_segments},
    }


def memory_snapshot() -> list[dict[str, Any]]:
    """Every segment of every device, as torch.cuda.memory_snapshot lists them."""
    return _snapshot()["segments"]


def _record_memory_history(enabled: str | None = "all", context: str | None = "all", stacks: str = "all",
                           max_entries: int = sys.maxsize, device: _device_t = None) -> None:
    """Starts (``enabled="all"`` or ``"state"``) or stops (None) recording allocations and frees.

    npusim records actions, addresses, sizes, streams and times; no stack frames (``frames`` is empty).
    """
    if enabled not in (None, "all", "state"):
        raise ValueError(f"_record_memory_history: enabled must be None, 'state' or 'all', got {enabled!r}")
    acl.record_memory_history(enabled == "all", max_entries if enabled == "all" else 0)


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    with open(filename, "wb") as out:
        pickle.dump(_snapshot(), out)


def memory_summary(device: _device_t = None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator's statistics for one device."""
    index = _index(device)
    stats = memory_stats(index)
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    rows = [("allocated_bytes", "Allocated memory", True), ("active_bytes", "Active memory", True),
            ("requested_bytes", "Requested memory", True), ("reserved_bytes", "NPU reserved memory", True),
            ("allocation", "Allocations", False), ("active", "Active allocs", False),
            ("segment", "NPU reserved segments", False)]

    def size(n: int) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(n) < 1024 or unit == "GiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
            n /= 1024
        return str(n)

    width = 82
    lines = ["=" * width,
             f" npusim NPU memory summary, device npu:{index} ({acl.device_count()} devices)".ljust(width),
             "-" * width,
             f" NPU OOMs: {stats.get('num_ooms', 0):<10} | cache flush retries: {stats.get('num_alloc_retries', 0)}",
             "=" * width,
             f" {'Metric':<26}| {'Cur Usage':>12} | {'Peak Usage':>12} | {'Tot Alloc':>12} | {'Tot Freed':>12}",
             "-" * width]
    for key, title, is_bytes in rows:
        for pool in pools:
            fmt = size if is_bytes else str
            values = [stats.get(f"{key}.{pool}.{metric}", 0) for metric in ("current", "peak", "allocated", "freed")]
            label = title if pool == "all" else f"      from {pool.replace('_pool', '')} pool"
            lines.append(f" {label:<26}| " + " | ".join(f"{fmt(v):>12}" for v in values))
        lines.append("-" * width)
    free, total = mem_get_info(index)
    lines.append(f" Device capacity: {size(total)}, free: {size(free)}, "
                 f"per-process fraction: {get_per_process_memory_fraction(index):g}")
    lines.append("=" * width)
    return "\n".join(lines) + "\n"
