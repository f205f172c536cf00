"""trace_view.json: host and device lanes on the chip's time axis, as torch_npu writes them.

A bare JSON array of Chrome trace events (torch_npu writes no ``traceEvents`` wrapper), loadable in
Perfetto, chrome://tracing and MindStudio Insight. Processes as Ascend's timeline names them: "Python"
(host ops, one row per thread), then per device "Ascend Hardware" (one row per stream), "Communication"
(the collectives) and "Overlap Analysis" (rows Computing, Communication, Communication(Not Overlapped)
and Free, from runtime/overlap.py over the whole trace); each device process labelled "NPU <d>", the label
torch_npu's readers map to a device. ``ts`` is microseconds as text with three decimals, as torch_npu
writes it (absolute nanoseconds do not fit a double); ``async_npu`` flows link each task to its op.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from npusim.compat.ascend_profiler.records import COMMUNICATION, COMPUTE, MEMCPY, DeviceTask, HostOp, Records
from npusim.compat.ascend_profiler.tables import accelerator_core
from npusim.runtime.overlap import gaps, merge, subtract

__all__ = ["trace_view", "trace_view_json"]

HARDWARE, COMM, OVERLAP = 1, 2, 3  # sort indexes of a device's processes, packed into their pids
OVERLAP_ROWS = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")


def _ts(ns: float) -> str:
    ns = int(ns)
    return f"{ns // 1000}.{ns % 1000:03d}"


def _device_pid(records: Records, index: int, device: int) -> int:
    # torch_npu packs its extra processes' pids the same way: (pid << 10) | (sort index << 5) | device.
    return (records.pid << 10) | (index << 5) | device


def _process(pid: int, name: str, label: str, sort_index: int) -> list[dict[str, Any]]:
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
            {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": label}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort_index}}]


def _thread(pid: int, tid: int, name: str) -> list[dict[str, Any]]:
    # Every row gets a sort index: Insight hides rows that lack one when others have it.
    return [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}]


def _slice(name: str, pid: int, tid: int, start_ns: float, end_ns: float, cat: str,
           args: dict[str, Any] | None = None) -> dict[str, Any]:
    event = {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": _ts(start_ns),
             "dur": round((end_ns - start_ns) / 1000, 3), "cat": cat}
    return {**event, "args": args} if args else event


def _host_events(records: Records) -> list[dict[str, Any]]:
    events = _process(records.pid, "Python", "CPU", 0)
    for thread in sorted({op.thread for op in records.host}):
        events += _thread(records.pid, thread, f"Thread {thread}")
    for op in records.host:
        args: dict[str, Any] = {"Sequence number": op.sequence_nr, "Fwd thread id": op.fwd_thread}
        for key, value in (("Input Dims", op.input_shapes), ("Input type", op.input_types),
                           ("Call stack", op.call_stack)):
            if value:
                args[key] = value
        events.append(_slice(op.name, records.pid, op.thread, op.start_ns, op.end_ns, op.category, args))
    return events


def _task_type(task: DeviceTask) -> str:
    if task.kind in (COMPUTE, MEMCPY, COMMUNICATION):
        return accelerator_core(task)
    return "EVENT_WAIT" if "wait" in task.name else "EVENT_RECORD"


def _overlap_events(pid: int, tasks: list[DeviceTask]) -> list[dict[str, Any]]:
    compute = merge((t.start_ns, t.end_ns) for t in tasks if t.kind == COMPUTE)
    communication = merge((t.start_ns, t.end_ns) for t in tasks if t.kind == COMMUNICATION)
    rows = (compute, communication, subtract(communication, compute), gaps([*compute, *communication]))
    events = []
    for tid, (name, intervals) in enumerate(zip(OVERLAP_ROWS, rows, strict=True)):
        events += _thread(pid, tid, name)
        events += [_slice(name, pid, tid, start, end, "overlap_analysis") for start, end in intervals]
    return events


def _device_events(records: Records, device: int, tasks: list[DeviceTask]) -> list[dict[str, Any]]:
    hardware, comm, overlap = (_device_pid(records, index, device) for index in (HARDWARE, COMM, OVERLAP))
    label = f"NPU {device}"
    events = _process(hardware, "Ascend Hardware", label, HARDWARE) + _process(comm, "Communication", label, COMM)
    for stream in sorted({t.stream for t in tasks if t.kind != COMMUNICATION}):
        events += _thread(hardware, stream, f"Stream {stream}")
    events += _thread(comm, 0, "Group npu_group Communication")
    for task in tasks:
        pid, tid = (comm, 0) if task.kind == COMMUNICATION else (hardware, task.stream)
        args = {"Task Type": _task_type(task), "Stream Id": task.stream, "Device Id": device,
                "correlation_id": task.op}
        events.append(_slice(task.name, pid, tid, task.start_ns, task.end_ns, "kernel", args))
    events += _process(overlap, "Overlap Analysis", label, OVERLAP) + _overlap_events(overlap, tasks)
    return events


def _flows(records: Records, ops: dict[int, HostOp]) -> Iterable[dict[str, Any]]:
    for flow_id, task in enumerate(records.device, start=1):
        op = ops.get(task.op)
        if op is None:
            continue
        pid = _device_pid(records, COMM if task.kind == COMMUNICATION else HARDWARE, task.device)
        tid = 0 if task.kind == COMMUNICATION else task.stream
        common = {"name": "torch_to_npu", "id": flow_id, "cat": "async_npu", "bp": "e"}
        yield {**common, "ph": "s", "pid": records.pid, "tid": op.thread, "ts": _ts(op.start_ns)}
        yield {**common, "ph": "f", "pid": pid, "tid": tid, "ts": _ts(task.start_ns)}


def trace_view(records: Records) -> list[dict[str, Any]]:
    """The trace_view.json events of ``records``."""
    events = _host_events(records)
    for device in sorted({t.device for t in records.device}):
        events += _device_events(records, device, [t for t in records.device if t.device == device])
    events += _flows(records, {op.id: op for op in records.host})
    return events


def trace_view_json(records: Records) -> str:
    """trace_view.json's text."""
    return json.dumps(trace_view(records))
