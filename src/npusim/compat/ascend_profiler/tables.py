"""The CSV views of ASCEND_PROFILER_OUTPUT: kernel_details, op_statistic, operator_details, step_trace_time.

Headers are torch_npu's (torch_npu/profiler/analysis: _csv_headers.py, _op_statistic_bean.py,
_operator_view_parser.py, _trace_step_time_parser.py); times are microseconds. Each function returns
(header, rows) for :func:`write_csv`.
"""

from __future__ import annotations

import csv
import functools
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.utils import flop_counter

from npusim.compat.ascend_profiler.records import (
    COMMUNICATION,
    COMPUTE,
    MEMCPY,
    STEP_PREFIX,
    DeviceTask,
    Records,
    collective,
)
from npusim.compat.ascend_profiler.steps import StepWindow, overlap_by_step, task_steps

__all__ = ["KERNEL_HEADERS", "OPERATOR_HEADERS", "OP_STATISTIC_HEADERS", "STEP_TRACE_HEADERS", "accelerator_core",
           "kernel_details", "op_statistic", "op_type", "operator_details", "step_trace_time", "write_csv"]

KERNEL_HEADERS = ["Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)", "Wait Time(us)",
                  "Block Num"]
OP_STATISTIC_HEADERS = ["Device_id", "OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)",
                        "Avg Time(us)", "Max Time(us)", "Ratio(%)"]
OPERATOR_HEADERS = ["Name", "Input Shapes", "Call Stack", "Host Self Duration(us)", "Host Total Duration(us)",
                    "Device Self Duration(us)", "Device Total Duration(us)", "Device Self Duration With AICore(us)",
                    "Device Total Duration With AICore(us)"]
STEP_TRACE_HEADERS = ["Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped", "Communication",
                      "Free", "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)", "Preparing"]
KERNEL_KINDS = (COMPUTE, MEMCPY, COMMUNICATION)  # event records and waits are no kernel_details row


def _us(ns: float) -> float:
    return round(ns / 1000, 3)


def _timestamp(ns: int) -> str:
    # msprof writes absolute timestamps as text with a tab, so spreadsheets keep every digit; torch_npu's
    # readers strip it (convert_us2ns).
    return f"{ns // 1000}.{ns % 1000:03d}\t"


def op_type(task: DeviceTask) -> str:
    """The Type column: the op without its namespace, MEMCPY_ASYNC, or hcom_<collective>_ as msprof names them."""
    if task.kind == MEMCPY:
        return "MEMCPY_ASYNC"
    if task.kind == COMMUNICATION:
        return f"hcom_{collective(task)}_"
    return task.name.split("::")[-1]


@functools.cache
def _on_cube(name: str) -> bool:
    namespace, _, op = name.rpartition("::")
    packet = getattr(getattr(torch.ops, namespace or "aten"), op, None) if op.isidentifier() else None
    return packet is not None and packet in flop_counter.flop_registry


def accelerator_core(task: DeviceTask) -> str:
    """AI_CORE for an op the cost model puts on the cube units (one with a FLOP formula), else AI_VECTOR_CORE;
    MEMCPY_ASYNC and COMMUNICATION for copies and collectives."""
    if task.kind != COMPUTE:
        return "MEMCPY_ASYNC" if task.kind == MEMCPY else "COMMUNICATION"
    return "AI_CORE" if _on_cube(task.name) else "AI_VECTOR_CORE"


def kernel_details(records: Records, windows: list[StepWindow]) -> tuple[list[str], list[list[Any]]]:
    """One row per kernel, copy and collective, in start order; Step Id first when there are steps."""
    stepped = windows[0].id is not None
    previous_end: dict[tuple[int, int], int] = {}
    rows = []
    for task, window in zip(records.device, task_steps(records, windows), strict=True):
        if task.kind not in KERNEL_KINDS:
            continue
        lane = task.device, task.stream
        wait = max(0, task.start_ns - previous_end[lane]) if lane in previous_end else 0
        previous_end[lane] = task.end_ns
        row = [task.device, task.name, op_type(task), accelerator_core(task), _timestamp(task.start_ns),
               _us(task.end_ns - task.start_ns), _us(wait), 0]
        if stepped:
            row.insert(0, window.id if window is not None else "")
        rows.append(row)
    return (["Step Id", *KERNEL_HEADERS] if stepped else KERNEL_HEADERS), rows


def op_statistic(records: Records) -> tuple[list[str], list[list[Any]]]:
    """Count and time of each (device, op type, core type) of compute kernels, most time first."""
    durations: dict[tuple[int, str, str], list[float]] = defaultdict(list)
    for task in records.device:
        if task.kind == COMPUTE:
            durations[task.device, op_type(task), accelerator_core(task)].append((task.end_ns - task.start_ns) / 1000)
    per_device: dict[int, float] = defaultdict(float)
    for (device, _, _), times in durations.items():
        per_device[device] += sum(times)
    rows = []
    for (device, kind, core), times in sorted(durations.items(), key=lambda item: (item[0][0], -sum(item[1]))):
        share = 100 * sum(times) / per_device[device] if per_device[device] else 0.0
        rows.append([device, kind, core, len(times), round(sum(times), 3), round(min(times), 3),
                     round(sum(times) / len(times), 3), round(max(times), 3), round(share, 2)])
    return OP_STATISTIC_HEADERS, rows


def operator_details(records: Records) -> tuple[list[str], list[list[Any]]]:
    """Host and device time of each host op (ProfilerStep ranges and Python frames left out), self and total;
    an op's device time is that of the tasks it launched, With AICore counting only AI_CORE kernels."""
    children: dict[int, list[int]] = defaultdict(list)
    for op in records.host:
        children[op.parent].append(op.id)
    launched: dict[int, tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))  # (all, AI_CORE) microseconds
    for task in records.device:
        duration = (task.end_ns - task.start_ns) / 1000
        done, on_core = launched[task.op]
        launched[task.op] = (done + duration, on_core + (duration if accelerator_core(task) == "AI_CORE" else 0.0))
    parents = {op.id: op.parent for op in records.host}
    depth: dict[int, int] = {}
    for op in records.host:  # walk up to a root or an op of known depth, then number the way back down
        chain: list[int] = []
        up = op.id
        while up in parents and up not in depth and up not in chain:
            chain.append(up)
            up = parents[up]
        level = depth.get(up, -1)
        for op_id in reversed(chain):
            level += 1
            depth[op_id] = level
    totals: dict[int, tuple[float, float]] = {}
    for op in sorted(records.host, key=lambda op: depth[op.id], reverse=True):  # children before parents
        below = [totals[c] for c in children.get(op.id, [])]
        own = launched.get(op.id, (0.0, 0.0))
        totals[op.id] = (own[0] + sum(b[0] for b in below), own[1] + sum(b[1] for b in below))
    spans = {op.id: (op.end_ns - op.start_ns) / 1000 for op in records.host}
    rows = []
    for op in records.host:
        if op.name.startswith(STEP_PREFIX) or op.category == "python_function":
            continue
        host_self = spans[op.id] - sum(spans[c] for c in children.get(op.id, []))
        own, total = launched.get(op.id, (0.0, 0.0)), totals[op.id]
        rows.append([op.name, op.input_shapes, op.call_stack, round(host_self, 3), round(spans[op.id], 3),
                     round(own[0], 3), round(total[0], 3), round(own[1], 3), round(total[1], 3)])
    return OPERATOR_HEADERS, rows


def step_trace_time(records: Records, windows: list[StepWindow]) -> tuple[list[str], list[list[Any]]]:
    """The Overlap Analysis of each device and step (runtime/overlap.py), Step empty with no steps."""
    rows = []
    for (device, step), figures in overlap_by_step(records, windows).items():
        rows.append([device, "" if step is None else step, *(round(value, 3) for value in figures)])
    return STEP_TRACE_HEADERS, rows


def write_csv(path: Path, table: tuple[list[str], list[list[Any]]]) -> None:
    """Writes (header, rows) as a CSV file."""
    header, rows = table
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows(rows)
