"""The timing model: makes device work take chip time (off by default).

With it on, a copy task lasts ``launch_us + bytes / bandwidth``, a collective the cost of HCCL's
algorithm for its group over the profile's links plus ``launch_us`` (Note [Collective cost model]
in runtime/collective_cost.py; ``link_gbps``, when set, replaces the profile's link bandwidths),
and with ``compute`` on a compute task ``launch_us`` plus its op's roofline time on the profile's
chip (Note [Compute cost model] in runtime/cost_model.py). Durations are kept on the chip clock
(Note [Chip clock] in csrc/runtime/chip_clock.cpp): every stream, the host and each comm stream
keep a virtual time, nothing sleeps, and every time npusim reports (``Event.elapsed_time``, the
profiler, ``npusim timeline``) is the chip's, the same in every run. ``host`` picks how the host's
clock moves: ``"launch"`` (the profile's cost per launch) or ``"measured"`` (plus this CPU's time
between launches, scaled by the profile's ``host_cpu_factor``). ``realtime`` also holds each stream
for its tasks' durations in real time, as the model did before the chip clock: for tests that need
an ordering bug to show as a wrong value. Set it by API or with
``NPUSIM_TIMING="copy_gbps=2,launch_us=20,link_gbps=1,compute=1,host=measured,realtime=1"``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch

from npusim import config
from npusim.runtime import acl, collective_cost, cost_model
from npusim.runtime.profiles import get_profile

_FLAGS = ("compute", "realtime")
HOST_MODES = ("launch", "measured")


class TimingModel(NamedTuple):
    copy_gbps: float = 0.0  # device copy bandwidth, GB/s (0: instantaneous)
    launch_us: float = 0.0  # latency of each device task
    link_gbps: float = 0.0  # collective / cross-device link bandwidth, GB/s (0: the profile's links)
    compute: bool = False  # compute tasks last their op's modelled time on the profile's chip
    realtime: bool = False  # streams are also held in real time (tests of ordering)
    host: str = "launch"  # how the host's chip clock moves: one of HOST_MODES

    @property
    def enabled(self) -> bool:
        return self.copy_gbps > 0 or self.launch_us > 0 or self.link_gbps > 0 or self.compute


_NUMBERS = TimingModel._fields[:3]
_current = TimingModel()


def get() -> TimingModel:
    return _current


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


def ranks_per_node() -> int:
    """How many ranks share a node, for pricing collectives: ``NPUSIM_RANKS_PER_NODE``, else the
    launcher's ``LOCAL_WORLD_SIZE`` (torchrun's), else the profile's server size."""
    return config.ranks_per_node() or get_profile().ranks_per_node


def _collective_cost(launch_us: float, link_gbps: float) -> Callable[[str, int, list[int]], float]:
    """The hook acl.set_collective_cost installs: (op, bytes, global ranks) -> us on the chip clock."""
    def cost(op: str, nbytes: int, ranks: list[int]) -> float:
        profile = get_profile()
        if link_gbps > 0:  # the user's link replaces the profile's, inside and between nodes, at the rate given
            profile = profile.replace(intra_link_gbps=link_gbps, intra_node_gbps=link_gbps * max(len(ranks) - 1, 1),
                                      inter_node_gbps=link_gbps, bus_eff=1.0)
        return launch_us + collective_cost.collective_us(op, nbytes, ranks, ranks_per_node=ranks_per_node(),
                                                         profile=profile)
    return cost


def apply_chip_clock() -> None:
    """Gives the chip clock the current model's settings and the current profile's host figures
    (a profile that becomes current sends its own figures: profiles._activate)."""
    current, profile = get(), get_profile()
    acl.set_chip_clock(current.enabled, current.realtime, profile.host_launch_us,
                       profile.host_cpu_factor if current.host == "measured" else 0.0)


def set(copy_gbps: float = 0.0, launch_us: float = 0.0, link_gbps: float = 0.0,  # noqa: A001
        compute: bool = False, realtime: bool = False, host: str = "launch") -> TimingModel:
    """Sets the model; all zero / False turns it off. Set it alike on every rank of a job: the
    ranks exchange chip times at each collective only while it is on."""
    global _current
    for name, value in (("copy_gbps", copy_gbps), ("launch_us", launch_us), ("link_gbps", link_gbps)):
        if value < 0:
            raise ValueError(f"npusim timing model: {name} must be >= 0, got {value}")
    if host not in HOST_MODES:
        raise ValueError(f"npusim timing model: host must be one of {HOST_MODES}, got {host!r}")
    _current = TimingModel(float(copy_gbps), float(launch_us), float(link_gbps), bool(compute), bool(realtime), host)
    acl.set_timing_model(copy_gbps, launch_us, link_gbps)
    acl.set_compute_cost(_compute_cost(launch_us) if compute else None)
    acl.set_collective_cost(_collective_cost(launch_us, link_gbps) if _current.enabled else None)
    apply_chip_clock()
    return _current


@contextmanager
def model(copy_gbps: float = 0.0, launch_us: float = 0.0, link_gbps: float = 0.0,
          compute: bool = False, realtime: bool = False, host: str = "launch") -> Iterator[TimingModel]:
    """Temporarily sets the timing model (device work is drained on exit)."""
    previous = get()
    try:
        yield set(copy_gbps, launch_us, link_gbps, compute, realtime, host)
    finally:
        acl.synchronize_all()
        set(*previous)


def host_clock_us() -> float:
    """The host's chip clock, in microseconds (Note [Chip clock]); it moves only under the model."""
    return acl.host_clock_us()


def stream_clock_us(stream: torch.Stream | None = None) -> float:
    """The chip time at which ``stream``'s (default: the current stream's) completed work ends."""
    stream = stream if stream is not None else torch.npu.current_stream()
    return acl.stream_clock_us(stream.stream_id, stream.device_index)


def parse(text: str) -> TimingModel:
    """Parses ``"copy_gbps=2,launch_us=20,link_gbps=1,compute=1,host=measured"`` (``NPUSIM_TIMING``)."""
    return TimingModel(**config.parse_timing(text, _NUMBERS, _FLAGS, {"host": HOST_MODES}))


def apply_env() -> None:
    settings = config.timing(_NUMBERS, _FLAGS, {"host": HOST_MODES})
    if settings is not None:
        set(**TimingModel(**settings)._asdict())
