"""Steps on the device axis, and each step's Overlap Analysis per device.

A ``ProfilerStep#N`` range is host time; its device tasks run later. As torch_npu does
(FwkCANNRelationParser.get_step_range), a step's window on the device starts at the first task launched
by an op inside the range (at the range's start if none) and ends at the later of the last such task's
end and the range's end; a device task belongs to the first step whose window holds its start
(torch_npu's step_trace_time and communication views; a task in no window has no step). With no steps
the whole trace is one step, named None.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from npusim.compat.ascend_profiler.records import COMMUNICATION, COMPUTE, STEP_PREFIX, DeviceTask, Records
from npusim.runtime.overlap import Interval, StepFigures, step_figures

__all__ = ["StepWindow", "overlap_by_step", "step_of", "step_windows"]

RECEIVES = ("recv", "receive")  # collectives that are pipeline receives: torch_npu's Bubble (hcom_receive)


class StepWindow(NamedTuple):
    """A step's span on the device axis, in chip nanoseconds."""

    id: str | None  # "3" for ProfilerStep#3, None for the whole trace when there are no steps
    host_start_ns: int  # where its ProfilerStep range starts (Preparing counts from here)
    start_ns: float
    end_ns: float


def step_windows(records: Records) -> list[StepWindow]:
    """The windows of the records' steps, or one window over everything when there are none."""
    steps = records.steps
    if not steps:
        first_host = min((op.start_ns for op in records.host), default=0)
        return [StepWindow(None, first_host, -math.inf, math.inf)]
    launched_at = {op.id: op.start_ns for op in records.host}
    windows = []
    for step in steps:
        tasks = [t for t in records.device if step.start_ns <= launched_at.get(t.op, -1) <= step.end_ns]
        start = min((t.start_ns for t in tasks), default=step.start_ns)
        end = max([step.end_ns, *(t.end_ns for t in tasks)])
        windows.append(StepWindow(step.name.removeprefix(STEP_PREFIX), step.start_ns, start, end))
    return windows


def step_of(windows: list[StepWindow], start_ns: float) -> StepWindow | None:
    """The first window holding ``start_ns`` (half open, as torch_npu's), None if none does."""
    return next((w for w in windows if w.start_ns <= start_ns < w.end_ns), None)


def _ns(task: DeviceTask) -> Interval:
    # Integer nanoseconds: absolute microseconds as doubles are only a quarter-microsecond apart.
    return task.start_ns, task.end_ns


def overlap_by_step(records: Records, windows: list[StepWindow]) -> dict[tuple[int, str | None], StepFigures]:
    """The Overlap Analysis (runtime/overlap.py, in microseconds) of each (device, step id), for every
    device with tasks and every window, in device then step order."""
    grouped: dict[tuple[int, str | None], list[DeviceTask]] = {
        (device, w.id): [] for device in sorted({t.device for t in records.device}) for w in windows}
    for task in records.device:
        window = step_of(windows, task.start_ns)
        if window is not None:
            grouped[task.device, window.id].append(task)
    starts = {w.id: w.host_start_ns for w in windows}
    figures = {}
    for (device, step), tasks in grouped.items():
        compute = [_ns(t) for t in tasks if t.kind == COMPUTE]
        communication = [_ns(t) for t in tasks if t.kind == COMMUNICATION]
        receive = [_ns(t) for t in tasks if t.kind == COMMUNICATION and any(r in t.name for r in RECEIVES)]
        in_ns = step_figures(compute, communication, receive, step_start=starts[step])
        figures[device, step] = StepFigures(*(value / 1000 for value in in_ns))
    return figures
