"""The timing model: makes device work take simulated time (off by default).

With it on, a copy task occupies its stream for ``launch_latency_us +
bytes / bandwidth``, so asynchrony and overlap are observable whatever the host
speed. Set it by API or with ``NPUSIM_TIMING="copy_gbps=2,launch_us=20,link_gbps=1"``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from npusim import config
from npusim.runtime import acl


class TimingModel(NamedTuple):
    copy_gbps: float = 0.0  # device copy bandwidth, GB/s (0: instantaneous)
    launch_us: float = 0.0  # latency of each device task
    link_gbps: float = 0.0  # collective / cross-device link bandwidth, GB/s

    @property
    def enabled(self) -> bool:
        return any(v > 0 for v in self)


def get() -> TimingModel:
    return TimingModel(*acl.timing_model())


def set(copy_gbps: float = 0.0, launch_us: float = 0.0, link_gbps: float = 0.0) -> TimingModel:  # noqa: A001
    """Sets the model; all zero turns it off."""
    for name, value in (("copy_gbps", copy_gbps), ("launch_us", launch_us), ("link_gbps", link_gbps)):
        if value < 0:
            raise ValueError(f"npusim timing model: {name} must be >= 0, got {value}")
    acl.set_timing_model(copy_gbps, launch_us, link_gbps)
    return get()


@contextmanager
def model(copy_gbps: float = 0.0, launch_us: float = 0.0, link_gbps: float = 0.0) -> Iterator[TimingModel]:
    """Temporarily sets the timing model (device work is drained on exit)."""
    previous = get()
    try:
        yield set(copy_gbps, launch_us, link_gbps)
    finally:
        acl.synchronize_all()
        set(*previous)


def parse(text: str) -> TimingModel:
    """Parses ``"copy_gbps=2,launch_us=20,link_gbps=1"`` (``NPUSIM_TIMING``)."""
    return TimingModel(**config.parse_timing(text, TimingModel._fields))


def apply_env() -> None:
    settings = config.timing(TimingModel._fields)
    if settings is not None:
        set(*TimingModel(**settings))
