"""What a torch.profiler session recorded, as plain records on the chip's clock.

Every view torch_npu.profiler writes is computed from :class:`Records` and nothing else, so the
views can be written when the profiler stops or later from a saved copy (``analyse_flag=False``,
then ``torch_npu.profiler.analyse``). Device tasks keep the timestamps the profiler gives them;
host ranges go through :func:`npusim.runtime.chip_clock.host_ns_to_chip_ns`.
"""

from __future__ import annotations

import bisect
import json
import os
import socket
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

from torch.autograd import DeviceType

from npusim.runtime.chip_clock import host_ns_to_chip_ns

__all__ = ["DeviceTask", "HostOp", "Records", "collect", "collective", "load", "save"]

# Task kinds (Note [Overlap Analysis figures] in runtime/overlap.py says which count where).
COMPUTE, MEMCPY, SYNC, COMMUNICATION = "compute", "memcpy", "sync", "communication"
# A stream waiting for a collective to finish (csrc/distributed/work.cpp) is a kernel to kineto but a
# wait to the chip: Ascend's Notify Wait, no computation.
STREAM_WAITS = frozenset({"wait_collective"})
# The collectives of a device are named "hccl <what>" on its collectives row (Note [Device tasks in
# torch.profiler] in csrc/runtime/device_profiler.cpp).
COLLECTIVE_PREFIX = "hccl "
STEP_PREFIX = "ProfilerStep#"


class HostOp(NamedTuple):
    """A host range (op, ``record_function``, ``ProfilerStep#N``) with its times on the chip clock."""

    id: int  # the profiler's correlation id, by which device tasks name their launching op (< 0: a Python frame)
    name: str
    start_ns: int
    end_ns: int
    thread: int
    parent: int  # id of the innermost enclosing range on the same thread, 0 if none
    category: str  # "cpu_op", "user_annotation" or "python_function"
    input_shapes: str  # "64,64;64,64" (torch_npu's "Input Dims"), "" without record_shapes
    input_types: str  # "float;float"
    call_stack: str  # frames joined by ";", "" without with_stack
    sequence_nr: int
    fwd_thread: int


class DeviceTask(NamedTuple):
    """A device activity: a kernel, copy, sync or collective of one stream (or the collectives' row)."""

    name: str
    kind: str  # COMPUTE, MEMCPY, SYNC or COMMUNICATION
    device: int
    stream: int  # the row: a stream id, or the row after the streams for collectives
    start_ns: int
    end_ns: int
    op: int  # id of the host op that launched it, 0 if none


class Records(NamedTuple):
    """One profiled span of one process."""

    hostname: str
    pid: int
    rank: int  # torch.distributed's rank, -1 outside a process group
    host: list[HostOp]
    device: list[DeviceTask]

    @property
    def steps(self) -> list[HostOp]:
        """The ``ProfilerStep#N`` ranges, in order."""
        return sorted((op for op in self.host if op.name.startswith(STEP_PREFIX)), key=lambda op: op.start_ns)


def collective(task: DeviceTask) -> str:
    """The collective of a task named "hccl ... <what> on <device> ...": all_reduce, send, recv, ..."""
    return task.name.split(" on ")[0].split()[-1]


def _kind(name: str, activity_type: str) -> str:
    if name.startswith(COLLECTIVE_PREFIX):
        return COMMUNICATION
    if activity_type == "gpu_memcpy":
        return MEMCPY
    if activity_type == "cuda_sync" or name in STREAM_WAITS:
        return SYNC
    return COMPUTE


def _joined(shapes: Any) -> str:
    return ";".join(",".join(str(d) for d in shape) if isinstance(shape, list) else "" for shape in shapes or [])


def _call_stack(event: Any) -> str:
    """The op's Python frames, innermost first: its recorded stack, else (the Python tracer of with_stack) its
    enclosing python_function ranges."""
    frames = list(event.stack or [])
    if not frames and not event.is_python_function:
        parent = event.cpu_parent
        while parent is not None:
            if parent.is_python_function:
                frames.append(parent.name)
            parent = parent.cpu_parent
    return ";".join(frames)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else -1


def _launchers(prof: Any) -> dict[int, int]:
    """The surviving op of each op torch's post-processing merged away, by id.

    ``prof.events()`` drops an op nested alone in an op of its name (``aten::mean`` dispatching to
    ``aten::mean``; EventList._remove_dup_nodes) and moves its device time to the outer one; its tasks still
    name the inner op, so they are linked to the outer op here: the innermost kept op of that name on the
    thread whose range holds the dropped one's."""
    kept: dict[tuple[int, str], list[Any]] = defaultdict(list)  # (thread, name) -> ops by start
    for event in prof.events():
        if event.device_type == DeviceType.CPU:
            kept[event.thread, event.name].append(event)
    starts = {}
    for key, ops in kept.items():
        ops.sort(key=lambda e: e.time_range.start)
        starts[key] = [e.time_range.start for e in ops]
    kept_ids = {e.id for ops in kept.values() for e in ops}
    origin_ns = prof.profiler.kineto_results.trace_start_ns()
    merged = {}
    for event in prof.profiler.kineto_results.events():
        if event.device_type() != DeviceType.CPU or event.correlation_id() in kept_ids:
            continue
        start_us, end_us = (event.start_ns() - origin_ns) / 1000, (event.end_ns() - origin_ns) / 1000
        key = event.start_thread_id(), event.name()
        ops = kept.get(key, [])
        i = bisect.bisect_right(starts.get(key, []), start_us)
        holder = next((e for e in reversed(ops[:i]) if end_us <= e.time_range.end), None)
        if holder is not None:
            merged[event.correlation_id()] = holder.id
    return merged


def collect(prof: Any) -> Records:
    """The records of a stopped ``torch.profiler.profile`` (its ``events()``, absolute in nanoseconds)."""
    origin_ns = prof.profiler.kineto_results.trace_start_ns()
    launchers = _launchers(prof)
    events = prof.events()
    # Python frames (with_stack) all have correlation id 0: they get negative ids of their own, which no
    # device task names.
    ids = {id(e): -i if e.is_python_function else e.id for i, e in enumerate(events, start=1)}
    host: list[HostOp] = []
    device: list[DeviceTask] = []
    for event in events:
        name = event.trace_name or event.name  # event.name has "ProfilerStep*" for every ProfilerStep#N
        # FunctionEvents hold microseconds from the trace's start; back to the profiler's nanoseconds.
        start_ns = origin_ns + round(event.time_range.start * 1000)
        end_ns = origin_ns + round(event.time_range.end * 1000)
        if event.device_type == DeviceType.PrivateUse1:
            op = launchers.get(event.linked_correlation_id, event.linked_correlation_id)
            device.append(DeviceTask(name, _kind(name, event.activity_type or ""), event.device_index,
                                     event.device_resource_id, start_ns, end_ns, op))
        elif event.device_type == DeviceType.CPU and name != "[memory]":
            category = ("python_function" if event.is_python_function else
                        "user_annotation" if event.is_user_annotation else "cpu_op")
            parent = ids.get(id(event.cpu_parent), 0) if event.cpu_parent is not None else 0
            host.append(HostOp(ids[id(event)], name, host_ns_to_chip_ns(start_ns), host_ns_to_chip_ns(end_ns, end=True),
                               event.thread, parent, category, _joined(event.input_shapes),
                               ";".join(str(t) for t in event.input_dtypes or []), _call_stack(event),
                               event.sequence_nr, event.fwd_thread or 0))
    device.sort(key=lambda task: (task.start_ns, task.device, task.stream))
    return Records(socket.gethostname(), os.getpid(), _rank(), host, device)


def save(records: Records, path: Path) -> None:
    """Writes ``records`` as JSON (what ``analyse`` reads back)."""
    path.write_text(json.dumps({"hostname": records.hostname, "pid": records.pid, "rank": records.rank,
                                "host": records.host, "device": records.device}))


def load(path: Path) -> Records:
    """The records :func:`save` wrote."""
    data = json.loads(path.read_text())
    return Records(data["hostname"], data["pid"], data["rank"], [HostOp(*op) for op in data["host"]],
                   [DeviceTask(*task) for task in data["device"]])
