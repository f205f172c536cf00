"""The one place a host timestamp of the profiler becomes a time on the chip's clock.

Device tasks carry the chip's times in the profiler already (Note [Chip clock] in
csrc/runtime/chip_clock.cpp: the device core places them on the profiler's axis, from an anchor
taken when the recording starts); host ranges (ops, ``ProfilerStep#N``) carry the host's real
times. Everything npusim writes on the device axis beside device tasks (torch_npu.profiler's
trace_view.json, the step windows of step_trace_time.csv, ``npusim timeline``) passes its host
timestamps through :func:`host_ns_to_chip_ns`, so the mapping lives here and nowhere else.

The mapping is a step function of the host clock's samples: while device activities are
recorded, the core notes (profiler ns, host chip us) at each change of the host's chip clock
(a launch's cost, a wait's jump), so a host timestamp maps to the host's chip time as it stood
then. A host range then lasts, on the chip's axis, what the host's clock moved inside it: a range
that launches one kernel lasts the launch's host cost, one that waits lasts the wait. With the
timing model off when the recording started, the mapping is the identity.
"""

from __future__ import annotations

import bisect

from npusim.runtime import acl

__all__ = ["host_ns_to_chip_ns"]

_cache: tuple[tuple[int, float], list[int], list[float]] | None = None


def _samples() -> tuple[tuple[int, float], list[int], list[float]]:
    """The current recording's anchor and samples (fetched again when either changed)."""
    global _cache
    anchor = acl.profiler_axis_anchor()
    if _cache is None or _cache[0] != anchor:
        samples = acl.host_clock_samples()
        _cache = (anchor, [ns for ns, _ in samples], [us for _, us in samples])
    return _cache


def refresh() -> None:
    """Forgets the samples fetched so far (a recording that is still going on added some)."""
    global _cache
    _cache = None


def host_ns_to_chip_ns(ns: int) -> int:
    """Maps a host timestamp of the profiler (ns) to the chip clock on the same axis."""
    (anchor_ns, anchor_us), times, chip_us = _samples()
    if not times:  # the recording did not start on the chip clock
        return ns
    i = bisect.bisect_right(times, ns) - 1
    return anchor_ns + round((chip_us[max(i, 0)] - anchor_us) * 1e3)


# Kineto's categories of device activities (npusim's kernels, copies and syncs), which carry chip
# times already; every other event of a Chrome trace is the host's.
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"})


def map_chrome_trace(trace: dict) -> dict:
    """Puts the host events of a Chrome trace that torch.profiler exported (``export_chrome_trace``)
    on the chip clock, in place: each host event's start and end go through
    :func:`host_ns_to_chip_ns`. Call it in the process that recorded the trace (the samples are
    its own)."""
    base_ns = int(trace.get("baseTimeNanoseconds", 0))
    refresh()

    def chip_us(ts_us: float) -> float:
        return (host_ns_to_chip_ns(base_ns + round(ts_us * 1e3)) - base_ns) / 1e3

    for event in trace.get("traceEvents", []):
        if event.get("cat") in DEVICE_CATEGORIES or "ts" not in event or event.get("ph") == "M":
            continue
        start = float(event["ts"])
        if event.get("ph") == "X":
            end = chip_us(start + float(event.get("dur", 0)))
            event["ts"] = chip_us(start)
            event["dur"] = max(end - event["ts"], 0.0)
        elif event.get("ph") != "f":  # a flow's end sits on its device activity
            event["ts"] = chip_us(start)
    return trace
