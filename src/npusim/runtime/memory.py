"""Device memory statistics and capacity of the ``torch.npu`` module."""

from __future__ import annotations

import re
from typing import Any

from npusim.runtime._core import C
from npusim.runtime.device import _device_t, _get_device_index

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}


def parse_bytes(text: str) -> int:
    """Parses ``"512MiB"``, ``"2g"`` or ``"1048576"``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"npusim: expected a byte size like '512MiB' or '1048576', got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def memory_stats(device: _device_t = None) -> dict[str, Any]:
    return C.memory_stats(_get_device_index(device))


def memory_allocated(device: _device_t = None) -> int:
    return memory_stats(device)["allocated_bytes"]


def max_memory_allocated(device: _device_t = None) -> int:
    return memory_stats(device)["peak_allocated_bytes"]


def memory_reserved(device: _device_t = None) -> int:
    return memory_stats(device)["reserved_bytes"]


def max_memory_reserved(device: _device_t = None) -> int:
    return memory_stats(device)["peak_reserved_bytes"]


def reset_peak_memory_stats(device: _device_t = None) -> None:
    C.reset_peak_memory_stats(_get_device_index(device))


def empty_cache() -> None:
    """Releases freed blocks that no stream can still touch."""
    C.empty_cache()


def set_memory_capacity(nbytes: int | str | None, device: _device_t = None) -> None:
    """Caps the device's memory (None: unlimited); over it, OutOfMemoryError."""
    value = -1 if nbytes is None else (parse_bytes(nbytes) if isinstance(nbytes, str) else int(nbytes))
    C.set_memory_capacity(_get_device_index(device), value)


def mem_get_info(device: _device_t = None) -> tuple[int, int]:
    """(free, total) bytes; total is the capacity, 0 when unlimited."""
    stats = memory_stats(device)
    cap = stats["capacity_bytes"]
    if cap < 0:
        return (0, 0)
    return (max(0, cap - stats["reserved_bytes"]), cap)
