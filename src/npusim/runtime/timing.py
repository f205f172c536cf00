"""The timing model: makes device work take simulated time (off by default).

With it on, a copy task occupies its stream for ``launch_us + bytes / bandwidth``, a collective
its comm stream for ``launch_us + bytes / link bandwidth``, and with ``compute`` on a compute
task for ``launch_us`` plus its op's roofline time on the profile's chip (Note [Compute cost
model] in runtime/cost_model.py), so asynchrony and overlap are observable whatever the host
speed. Set it by API or with ``NPUSIM_TIMING="copy_gbps=2,launch_us=20,link_gbps=1,compute=1"``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch

from npusim import config
from npusim.runtime import acl, cost_model

_FLAGS = ("compute",)


class TimingModel(NamedTuple):
    copy_gbps: float = 0.0  # device copy bandwidth, GB/s (0: instantaneous)
    launch_us: float = 0.0  # latency of each device task
    link_gbps: float = 0.0  # collective / cross-device link bandwidth, GB/s
    compute: bool = False  # compute tasks last their op's modelled time on the profile's chip

    @property
    def enabled(self) -> bool:
        return any(v > 0 for v in self)


_NUMBERS = TimingModel._fields[:3]
_compute = False


def get() -> TimingModel:
    return TimingModel(*acl.timing_model(), compute=_compute)


def compute_task_us(op: torch._ops.OpOverload, inputs: Sequence[Any], outputs: Sequence[Any], *,
                    launch_us: float) -> float:
    """A compute task's modelled duration in microseconds, from its op, its arguments in schema order and
    its results (as the device core hands them to the hook: meta tensors)."""
    args, kwargs = cost_model.split_arguments(op, inputs)
    out = outputs[0] if len(op._schema.returns) == 1 else tuple(outputs)  # what the op returns
    return cost_model.op_cost(op, args, kwargs, out, launch_us=launch_us).us


@functools.cache
def _operator(name: str, overload: str) -> torch._ops.OpOverload:
    namespace, _, op = name.partition("::")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")


def _compute_cost(launch_us: float) -> Callable[[str, str, list[Any], list[Any]], float]:
    """The hook acl.set_compute_cost installs: (op name, overload, meta inputs, meta outputs) -> us."""
    def cost(name: str, overload: str, inputs: list[Any], outputs: list[Any]) -> float:
        return compute_task_us(_operator(name, overload), inputs, outputs, launch_us=launch_us)
    return cost


def set(copy_gbps: float = 0.0, launch_us: float = 0.0, link_gbps: float = 0.0,  # noqa: A001
        compute: bool = False) -> TimingModel:
    """Sets the model; all zero / False turns it off."""
    global _compute
    for name, value in (("copy_gbps", copy_gbps), ("launch_us", launch_us), ("link_gbps", link_gbps)):
        if value < 0:
            raise ValueError(f"npusim timing model: {name} must be >= 0, got {value}")
    acl.set_timing_model(copy_gbps, launch_us, link_gbps)
    acl.set_compute_cost(_compute_cost(launch_us) if compute else None)
    _compute = bool(compute)
    return get()


@contextmanager
def model(copy_gbps: float = 0.0, launch_us: float = 0.0, link_gbps: float = 0.0,
          compute: bool = False) -> Iterator[TimingModel]:
    """Temporarily sets the timing model (device work is drained on exit)."""
    previous = get()
    try:
        yield set(copy_gbps, launch_us, link_gbps, compute)
    finally:
        acl.synchronize_all()
        set(*previous)


def parse(text: str) -> TimingModel:
    """Parses ``"copy_gbps=2,launch_us=20,link_gbps=1,compute=1"`` (``NPUSIM_TIMING``)."""
    return TimingModel(**config.parse_timing(text, _NUMBERS, _FLAGS))


def apply_env() -> None:
    settings = config.timing(_NUMBERS, _FLAGS)
    if settings is not None:
        set(**TimingModel(**settings)._asdict())
