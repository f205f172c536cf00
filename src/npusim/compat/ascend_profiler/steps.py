"""Steps on the device axis, which step each device task belongs to, and each step's Overlap Analysis.

A ``ProfilerStep#N`` range is host time; its device tasks run later. A device task belongs to the step
whose range holds the op that launched it (the op's ``ProfilerStep#N`` ancestor, or on another thread the
range holding its start): torch_npu links tasks to ops by the same correlation (its step's task_info).
A task no step's op launched belongs to the first step whose window holds its start, the window running,
as torch_npu's (FwkCANNRelationParser.get_step_range), from the step's first task (its range's start if
none) to the later of its last task's end and its range's end. With no steps the whole trace is one step,
named None.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from npusim.compat.ascend_profiler.records import (
    COMMUNICATION,
    COMPUTE,
    STEP_PREFIX,
    DeviceTask,
    HostOp,
    Records,
    collective,
)
from npusim.runtime.overlap import Interval, StepFigures, step_figures

__all__ = ["StepWindow", "overlap_by_step", "step_windows", "task_steps"]

RECEIVES = ("recv", "receive")  # collectives that are pipeline receives: torch_npu's Bubble (hcom_receive)


class StepWindow(NamedTuple):
    """A step's span on the device axis, in chip nanoseconds."""

    id: str | None  # "3" for ProfilerStep#3, None for the whole trace when there are no steps
    host_start_ns: int  # where its ProfilerStep range starts (Preparing counts from here)
    start_ns: float
    end_ns: float


def _op_steps(records: Records) -> dict[int, str]:
    """The step id of each host op inside a step: its ProfilerStep#N ancestor, else the range holding its start."""
    ops = {op.id: op for op in records.host}
    steps = records.steps
    found: dict[int, str] = {}
    for op in records.host:
        ancestor: HostOp | None = op
        while ancestor is not None and not ancestor.name.startswith(STEP_PREFIX):
            ancestor = ops.get(ancestor.parent)
        if ancestor is None:  # another thread (autograd's, a comm thread): by time, half open
            ancestor = next((s for s in steps if s.start_ns <= op.start_ns < s.end_ns), None)
        if ancestor is not None:
            found[op.id] = ancestor.name.removeprefix(STEP_PREFIX)
    return found


def step_windows(records: Records) -> list[StepWindow]:
    """The windows of the records' steps, or one window over everything when there are none."""
    steps = records.steps
    if not steps:
        first_host = min((op.start_ns for op in records.host), default=0)
        return [StepWindow(None, first_host, -math.inf, math.inf)]
    op_steps = _op_steps(records)
    windows = []
    for step in steps:
        step_id = step.name.removeprefix(STEP_PREFIX)
        tasks = [t for t in records.device if op_steps.get(t.op) == step_id]
        start = min((t.start_ns for t in tasks), default=step.start_ns)
        end = max([step.end_ns, *(t.end_ns for t in tasks)])
        windows.append(StepWindow(step_id, step.start_ns, start, end))
    return windows


def task_steps(records: Records, windows: list[StepWindow]) -> list[StepWindow | None]:
    """The step window of each of ``records.device``'s tasks, None for a task in no step."""
    by_id = {w.id: w for w in windows}
    op_steps = _op_steps(records)
    found = []
    for task in records.device:
        window = by_id.get(op_steps[task.op]) if task.op in op_steps else None
        if window is None:
            window = next((w for w in windows if w.start_ns <= task.start_ns < w.end_ns), None)
        found.append(window)
    return found


def _ns(task: DeviceTask) -> Interval:
    # Integer nanoseconds: absolute microseconds as doubles are only a quarter-microsecond apart.
    return task.start_ns, task.end_ns


def overlap_by_step(records: Records, windows: list[StepWindow]) -> dict[tuple[int, str | None], StepFigures]:
    """The Overlap Analysis (runtime/overlap.py, in microseconds) of each (device, step id), for every
    device with tasks and every window, in device then step order."""
    grouped: dict[tuple[int, str | None], list[DeviceTask]] = {
        (device, w.id): [] for device in sorted({t.device for t in records.device}) for w in windows}
    for task, window in zip(records.device, task_steps(records, windows), strict=True):
        if window is not None:
            grouped[task.device, window.id].append(task)
    starts = {w.id: w.host_start_ns for w in windows}
    figures = {}
    for (device, step), tasks in grouped.items():
        compute = [_ns(t) for t in tasks if t.kind == COMPUTE]
        communication = [_ns(t) for t in tasks if t.kind == COMMUNICATION]
        receive = [_ns(t) for t in tasks if t.kind == COMMUNICATION and collective(t) in RECEIVES]
        in_ns = step_figures(compute, communication, receive, step_start=starts[step])
        figures[device, step] = StepFigures(*(value / 1000 for value in in_ns))
    return figures
