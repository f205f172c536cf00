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

The samples and the profiler's host events are stamped with the same clock (the approximate clock
the profiler reads), but each side converts it to nanoseconds with its own converter, and two
converters started together disagree by a constant of up to about 0.25 us on this project's VM
(each takes its offset from one clock reading). A wait's jump is sampled a few hundred nanoseconds
before the op that waited ends its range, close enough for that disagreement to put the range's
end first, so that the range ended, on the chip's axis, before the wait (test_timeline failed so,
1 run in 14 beside two busy loops). So the end of a range is taken to come after a sample stamped
up to :data:`END_TOLERANCE_NS` after it: a range ending that close before a move of the host's
clock includes the move. The next op's moves come microseconds later (its launch at least); a
range's start is mapped as stamped, since its own op's launch may follow it within a microsecond.
"""

from __future__ import annotations

import bisect

from npusim.runtime import acl

__all__ = ["host_ns_to_chip_ns"]

_cache: tuple[tuple[int, float], list[int], list[float]] | None = None

# How much later than its conversion the end of a host range is compared with the samples (see above).
END_TOLERANCE_NS = 500


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


def host_ns_to_chip_ns(ns: int, *, end: bool = False) -> int:
    """Maps a host timestamp of the profiler (ns) to the chip clock on the same axis; ``end``: the
    timestamp ends a range (it then includes moves of the host's clock up to END_TOLERANCE_NS later)."""
    (anchor_ns, anchor_us), times, chip_us = _samples()
    if not times:  # the recording did not start on the chip clock
        return ns
    i = bisect.bisect_right(times, ns + (END_TOLERANCE_NS if end else 0)) - 1
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

    def chip_us(ts_us: float, end: bool = False) -> float:
        return (host_ns_to_chip_ns(base_ns + round(ts_us * 1e3), end=end) - base_ns) / 1e3

    for event in trace.get("traceEvents", []):
        if event.get("cat") in DEVICE_CATEGORIES or "ts" not in event or event.get("ph") == "M":
            continue
        start = float(event["ts"])
        if event.get("ph") == "X":
            end = chip_us(start + float(event.get("dur", 0)), end=True)
            event["ts"] = chip_us(start)
            event["dur"] = max(end - event["ts"], 0.0)
        elif event.get("ph") != "f":  # a flow's end sits on its device activity
            event["ts"] = chip_us(start)
    return trace
