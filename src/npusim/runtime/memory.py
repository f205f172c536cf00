"""Device memory statistics and capacity of the ``torch.npu`` module."""

from __future__ import annotations

from typing import Any

from npusim.config import parse_bytes
from npusim.runtime import acl
from npusim.runtime.device import _device_t, _get_device_index


def memory_stats(device: _device_t = None) -> dict[str, Any]:
    return acl.memory_stats(_get_device_index(device))


def memory_allocated(device: _device_t = None) -> int:
    return memory_stats(device)["allocated_bytes"]


def max_memory_allocated(device: _device_t = None) -> int:
    return memory_stats(device)["peak_allocated_bytes"]


def memory_reserved(device: _device_t = None) -> int:
    return memory_stats(device)["reserved_bytes"]


def max_memory_reserved(device: _device_t = None) -> int:
    return memory_stats(device)["peak_reserved_bytes"]


def reset_peak_memory_stats(device: _device_t = None) -> None:
    acl.reset_peak_memory_stats(_get_device_index(device))


def empty_cache() -> None:
    """Releases freed blocks that no stream can still touch."""
    acl.empty_cache()


def set_memory_capacity(nbytes: int | str | None, device: _device_t = None) -> None:
    """Caps the device's memory (None: unlimited); over it, OutOfMemoryError."""
    value = -1 if nbytes is None else (parse_bytes(nbytes) if isinstance(nbytes, str) else int(nbytes))
    acl.set_memory_capacity(_get_device_index(device), value)


def mem_get_info(device: _device_t = None) -> tuple[int, int]:
    """(free, total) bytes; total is the capacity, 0 when unlimited."""
    stats = memory_stats(device)
    cap = stats["capacity_bytes"]
    if cap < 0:
        return (0, 0)
    return (max(0, cap - stats["reserved_bytes"]), cap)
