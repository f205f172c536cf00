"""The timing model: makes device work take simulated time (off by default).

With it on, a copy task occupies its stream for ``launch_latency_us +
bytes / bandwidth``, so asynchrony and overlap are observable whatever the host
speed. Set it by API or with ``NPUSIM_TIMING="copy_gbps=2,launch_us=20,link_gbps=1"``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from npusim.runtime._core import C

_BYTES_PER_US_PER_GBPS = 1e9 / 1e6


class TimingModel(NamedTuple):
    copy_gbps: float = 0.0  # device copy bandwidth, GB/s (0: instantaneous)
    launch_us: float = 0.0  # latency of each device task
    link_gbps: float = 0.0  # collective / cross-device link bandwidth, GB/s

    @property
    def enabled(self) -> bool:
        return any(v > 0 for v in self)


def get() -> TimingModel:
    copy_bpus, launch_us, link_bpus = C.timing_model()
    return TimingModel(copy_bpus / _BYTES_PER_US_PER_GBPS, launch_us, link_bpus / _BYTES_PER_US_PER_GBPS)


def set(copy_gbps: float = 0.0, launch_us: float = 0.0, link_gbps: float = 0.0) -> TimingModel:  # noqa: A001
    """Sets the model; all zero turns it off."""
    for name, value in (("copy_gbps", copy_gbps), ("launch_us", launch_us), ("link_gbps", link_gbps)):
        if value < 0:
            raise ValueError(f"npusim timing model: {name} must be >= 0, got {value}")
    C.set_timing_model(copy_gbps * _BYTES_PER_US_PER_GBPS, launch_us, link_gbps * _BYTES_PER_US_PER_GBPS)
    return get()


@contextmanager
def model(copy_gbps: float = 0.0, launch_us: float = 0.0, link_gbps: float = 0.0) -> Iterator[TimingModel]:
    """Temporarily sets the timing model (device work is drained on exit)."""
    previous = get()
    try:
        yield set(copy_gbps, launch_us, link_gbps)
    finally:
        C.synchronize_all()
        set(*previous)


def parse(text: str) -> TimingModel:
    keys = {"copy_gbps", "launch_us", "link_gbps"}
    values: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in keys:
            raise ValueError(f"NPUSIM_TIMING: expected comma-separated {sorted(keys)}=number, got {item!r}")
        values[key.strip()] = float(value)
    return TimingModel(**values)


def apply_env() -> None:
    text = os.environ.get("NPUSIM_TIMING", "")
    if text:
        set(*parse(text))
