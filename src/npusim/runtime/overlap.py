"""The Overlap Analysis of one step on one device: pure functions over time intervals.

Ascend's users read how a step's device time splits into computing, communication and idle time in
MindStudio Insight's "Overlap Analysis" lane and in torch_npu's ``step_trace_time.csv``; npusim's
torch_npu.profiler writes both from :func:`step_figures`. See Note [Overlap Analysis figures].
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

__all__ = ["Interval", "StepFigures", "gaps", "intersect", "merge", "step_figures", "subtract", "total"]

# Note [Overlap Analysis figures]
# The figures of one step on one device, as torch_npu computes them (torch_npu/profiler/analysis:
# _trace_step_time_db_parser.py, _time_range_calculator.py; _trace_step_time_parser.py sums msprof's
# Overlap Analysis slices, which are the same sets), with C the union of the step's compute-task
# intervals, M the union of its collectives' and R the union of its receive collectives':
# - Computing = |C|.
# - Communication = |M|.
# - Communication(Not Overlapped) = |M - C|: communication no computation hides.
# - Overlapped = |M & C| = Communication - Communication(Not Overlapped).
# - Free = the step's device span minus |C | M|, the span running from the first task's start to the
#   last task's end (C and M together): the gaps between busy intervals, where the device computes
#   nothing and communicates nothing.
# - Bubble = |R|: time in receives (``hcom_receive``), the pipeline-parallel wait; 0 without pipeline
#   parallelism, as torch_npu writes it then.
# - Stage = the span minus Bubble.
# - Communication(Not Overlapped and Exclude Receive) = Communication(Not Overlapped) - Bubble.
# - Preparing = the first task's start minus the step's start on the host (the ``ProfilerStep#N``
#   range): how long the device waited for the step's first work.
# Which tasks are compute: kernels only. Copies (torch_npu's MEMCPY_ASYNC tasks) are no compute task of
# CANN's COMPUTE_TASK_INFO, which torch_npu's Computing reads, and no communication op either: a copy
# counts in neither, so time in copies alone is Free. Event records and waits (a stream waiting for a
# collective included) are synchronisation, counted in neither. Intervals are in any one unit; npusim
# writes microseconds, as torch_npu does.

Interval = tuple[float, float]


class StepFigures(NamedTuple):
    """One row of step_trace_time.csv after its Device_id and Step (Note [Overlap Analysis figures])."""

    computing: float
    communication_not_overlapped: float
    overlapped: float
    communication: float
    free: float
    stage: float
    bubble: float
    communication_not_overlapped_exclude_receive: float
    preparing: float


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted, disjoint, non-empty intervals (touching ones joined)."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def total(intervals: Iterable[Interval]) -> float:
    """The length of the union of ``intervals`` (time covered once, however many overlap)."""
    return sum(end - start for start, end in merge(intervals))


def intersect(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The time in both unions, as sorted disjoint intervals."""
    left, right = merge(a), merge(b)
    out: list[Interval] = []
    i = j = 0
    while i < len(left) and j < len(right):
        start, end = max(left[i][0], right[j][0]), min(left[i][1], right[j][1])
        if end > start:
            out.append((start, end))
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The time in the union of ``a`` and not in that of ``b``, as sorted disjoint intervals."""
    out: list[Interval] = []
    holes = merge(b)
    for start, end in merge(a):
        cursor = start
        for hole_start, hole_end in holes:
            if hole_end <= cursor or hole_start >= end:
                continue
            if hole_start > cursor:
                out.append((cursor, hole_start))
            cursor = max(cursor, hole_end)
        if cursor < end:
            out.append((cursor, end))
    return out


def gaps(intervals: Iterable[Interval]) -> list[Interval]:
    """The uncovered time between the first start and the last end of ``intervals``."""
    merged = merge(intervals)
    return [(left[1], right[0]) for left, right in zip(merged, merged[1:], strict=False)]


def step_figures(compute: Sequence[Interval], communication: Sequence[Interval], receive: Sequence[Interval] = (),
                 step_start: float | None = None) -> StepFigures:
    """The Overlap Analysis of one step (Note [Overlap Analysis figures]): ``compute`` are its compute
    tasks, ``communication`` its collectives, ``receive`` those of them that are receives, ``step_start``
    the start of its ``ProfilerStep#N`` range on the same clock (None: Preparing is 0)."""
    computing, communicating = total(compute), total(communication)
    not_overlapped = total(subtract(communication, compute))
    busy = merge([*compute, *communication])
    span = busy[-1][1] - busy[0][0] if busy else 0.0
    bubble = total(receive)
    preparing = busy[0][0] - step_start if busy and step_start is not None else 0.0
    return StepFigures(
        computing=computing,
        communication_not_overlapped=not_overlapped,
        overlapped=communicating - not_overlapped,
        communication=communicating,
        free=span - total(busy),
        stage=span - bubble,
        bubble=bubble,
        communication_not_overlapped_exclude_receive=not_overlapped - bubble,
        preparing=preparing,
    )
