"""Shared by the caching-allocator tests: the device they use (its cache emptied by conftest's ``clean_npu``),
its statistics, and where a block sits in the snapshot."""

from __future__ import annotations

import torch

MIB = 1 << 20
KIB = 1 << 10
DEVICE = 7  # no other test file allocates here, so its cache is empty after empty_cache


def stat(key: str) -> int:
    return torch.npu.memory_stats(DEVICE)[key]


def stats(*keys: str) -> tuple[int, ...]:
    s = torch.npu.memory_stats(DEVICE)
    return tuple(s[k] for k in keys)


def blob(nbytes: int, stream: torch.Stream | None = None) -> torch.Tensor:
    """``nbytes`` of uninitialised npu memory on the current device (on ``stream`` when given)."""
    if stream is None:
        return torch.empty(nbytes, dtype=torch.uint8, device="npu")
    with torch.npu.stream(stream):
        return torch.empty(nbytes, dtype=torch.uint8, device="npu")


def segment_of(address: int, device: int = DEVICE) -> dict:
    """The snapshot segment that holds ``address``."""
    for s in torch.npu.memory_snapshot():
        if s["device"] == device and s["address"] <= address < s["address"] + s["total_size"]:
            return s
    raise KeyError(f"no segment of npu:{device} holds {address:#x}")


def block_at(address: int, device: int = DEVICE) -> dict:
    return next(b for b in segment_of(address, device)["blocks"] if b["address"] == address)
