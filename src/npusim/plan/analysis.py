"""One rank's report of one step, from torch.profiler's Chrome trace and the tracker's marks.

Pure functions over plain data (the trace's events as ``export_chrome_trace`` writes them, before its
host events are put on the chip clock, and the tracker's :class:`~npusim.plan.tracker.Mark` list), so
that plan mode, which records the same trace without computing, reuses them unchanged. See Note [The
step report] in plan/session.py for what each figure is.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from npusim.plan.tracker import MARK_PREFIX, OUTSIDE, PHASES, Mark
from npusim.runtime import overlap

__all__ = ["PRIVATEUSE1", "StepChoice", "analyse", "choose_step"]

PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1, the "Device Type" of an npu memory event
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "cuda_sync")
COLLECTIVE_PREFIX = "hccl "  # a collective's task on its device's collectives row (compat/ascend_profiler/records)
STREAM_WAITS = frozenset({"wait_collective"})  # a stream waiting for a collective: synchronisation
TOP_ALLOCATIONS = 10
TOP_MODULES = 20


class StepChoice(NamedTuple):
    """The step a report is of: its number, its marks' range and whether it ended (optimizer.step returned)."""

    step: int
    first_seq: int  # its window starts at this mark (None-like -1: the start of the recording)
    last_seq: int  # and ends at this one (-1: the end of the recording)
    complete: bool
    note: str  # why this step, when it is not the one asked for


def choose_step(marks: Sequence[Mark], step_ends: dict[int, int], asked: int | None, failed: bool) -> StepChoice:
    """Step ``asked`` (1-based), else the last that ended, or the step a failed run stopped in."""
    last_step = marks[-1].step if marks else 1
    note = ""
    if asked is not None and (asked in step_ends or asked == last_step):
        step = asked
    else:
        if asked is not None:
            note = f"step {asked} was not run ({len(step_ends)} step(s) ended); "
        if failed or not step_ends:
            step = last_step
            note += "the step the run stopped in" if failed else "no optimizer.step ran: the whole run"
        else:
            step = max(step_ends)
            note += "the last step run" if asked is not None else ""
    start = step_ends.get(step - 1, -1)
    end = step_ends.get(step, -1)
    return StepChoice(step, start, end, step in step_ends, note)


class _Event(NamedTuple):
    ts: float  # the profiler's host time, microseconds
    order: int  # marks before memory events at the same time
    seq: int  # a mark's seq, or -1
    allocated: int
    reserved: int
    nbytes: int
    addr: int
    tid: int


def _timeline_events(trace: list[dict[str, Any]], device: int) -> tuple[list[_Event], dict[int, float]]:
    """The device's memory events and the tracker's marks, in the profiler's time order; each mark's time."""
    events: list[_Event] = []
    mark_ts: dict[int, float] = {}
    for e in trace:
        name = e.get("name", "")
        if name == "[memory]":
            args = e.get("args", {})
            if args.get("Device Type") == PRIVATEUSE1 and args.get("Device Id") == device:
                events.append(_Event(float(e["ts"]), 1, -1, int(args["Total Allocated"]), int(args["Total Reserved"]),
                                     int(args["Bytes"]), int(args["Addr"]), int(e.get("tid", 0))))
        elif e.get("ph") == "X" and isinstance(name, str) and name.startswith(MARK_PREFIX):
            seq = int(name[len(MARK_PREFIX):])
            mark_ts[seq] = float(e["ts"])
            events.append(_Event(float(e["ts"]), 0, seq, 0, 0, 0, 0, int(e.get("tid", 0))))
    events.sort(key=lambda ev: (ev.ts, ev.order))
    return events, mark_ts


class _Ops:
    """The innermost host op holding a time on a thread (what launched an allocation)."""

    def __init__(self, trace: list[dict[str, Any]]) -> None:
        by_tid: dict[int, list[tuple[float, float, str]]] = {}
        for e in trace:
            if e.get("ph") == "X" and e.get("cat") == "cpu_op" and not str(e.get("name", "")).startswith(MARK_PREFIX):
                by_tid.setdefault(int(e.get("tid", 0)), []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"]),
                                                                   str(e["name"])))
        self.by_tid = {tid: sorted(ops) for tid, ops in by_tid.items()}
        self.starts = {tid: [op[0] for op in ops] for tid, ops in self.by_tid.items()}

    def at(self, tid: int, ts: float) -> str:
        ops, starts = self.by_tid.get(tid, []), self.starts.get(tid, [])
        pos = bisect.bisect_right(starts, ts)
        for i in range(pos - 1, max(pos - 200, 0) - 1, -1):  # the latest-starting op still running: innermost
            if ops[i][1] >= ts:
                return ops[i][2]
        return ""


def _where(mark: Mark | None, chip_us: float, op: str = "") -> dict[str, Any]:
    return {"step": mark.step if mark else 1, "phase": mark.phase if mark else "forward",
            "module": mark.module if mark else OUTSIDE,
            "chip_us": round(chip_us, 3), "op": op}


def _device_tasks(trace: list[dict[str, Any]], device: int, start_ts: float, end_ts: float) -> list[dict[str, Any]]:
    """The device's tasks launched by host ops inside [start_ts, end_ts) (host time), and its unlinked tasks
    (collectives a backend thread started) that start within the span of the linked ones."""
    host_ts = {e["args"]["External id"]: float(e["ts"]) for e in trace if e.get("ph") == "X"
               and e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e.get("args", {})}
    tasks = [e for e in trace if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES and e.get("pid") == device]
    linked, unlinked = [], []
    for task in tasks:
        ts = host_ts.get(task.get("args", {}).get("External id", 0))
        if ts is None:
            unlinked.append(task)
        elif start_ts <= ts < end_ts:
            linked.append(task)
    if not linked:
        return []
    first = min(float(t["ts"]) for t in linked)
    last = max(float(t["ts"]) + float(t["dur"]) for t in linked)
    return linked + [t for t in unlinked if first <= float(t["ts"]) < last]


def _kind(task: dict[str, Any]) -> str:
    name = str(task.get("name", ""))
    if name.startswith(COLLECTIVE_PREFIX):
        return "communication"
    if task.get("cat") == "gpu_memcpy":
        return "memcpy"
    if task.get("cat") == "cuda_sync" or name in STREAM_WAITS:
        return "sync"
    return "compute"


def step_time(tasks: list[dict[str, Any]]) -> dict[str, float]:
    """The step's span on the device and its Overlap Analysis (Note [Overlap Analysis figures]), in us:
    computing + unhidden communication + free = the span from its first task's start to its last's end
    (copies count in none but the span: time in copies alone is free)."""
    spans = {kind: [(float(t["ts"]), float(t["ts"]) + float(t["dur"])) for t in tasks if _kind(t) == kind]
             for kind in ("compute", "communication", "memcpy")}
    busy = [*spans["compute"], *spans["communication"], *spans["memcpy"]]
    if not busy:
        return {"step_us": 0.0, "start_us": 0.0, "end_us": 0.0, "computing_us": 0.0, "communication_us": 0.0,
                "communication_not_overlapped_us": 0.0, "free_us": 0.0}
    start, end = min(s for s, _ in busy), max(e for _, e in busy)
    figures = overlap.step_figures(spans["compute"], spans["communication"])
    span = end - start
    return {"step_us": span, "start_us": start, "end_us": end, "computing_us": figures.computing,
            "communication_us": figures.communication,
            "communication_not_overlapped_us": figures.communication_not_overlapped,
            "free_us": max(span - figures.computing - figures.communication_not_overlapped, 0.0)}


def analyse(trace: list[dict[str, Any]], marks: Sequence[Mark], choice: StepChoice, device: int,
            to_chip_us: Callable[[float], float], device_to_chip_us: Callable[[float], float]) -> dict[str, Any]:
    """The memory and time figures of step ``choice`` on ``device``: ``trace`` is the profiler's Chrome
    trace events with host times not yet on the chip clock; ``to_chip_us`` maps such a host time (the
    trace's us) to the chip clock (npusim.timing.host_clock_us's), ``device_to_chip_us`` a device task's."""
    events, mark_ts = _timeline_events(trace, device)
    start_ts = mark_ts.get(choice.first_seq, -math.inf) if choice.first_seq >= 0 else -math.inf
    end_ts = mark_ts.get(choice.last_seq, math.inf) if choice.last_seq >= 0 else math.inf
    by_seq = {m.seq: m for m in marks}
    ops = _Ops(trace)

    # One pass: the state before the window, then every event inside it.
    mark: Mark | None = None
    allocated = reserved = 0
    live: dict[int, tuple[int, Mark | None, float, int]] = {}  # addr -> (bytes, mark, ts, tid)
    peak_alloc: tuple[int, int, Mark | None, float, int] | None = None  # (bytes, event index, mark, ts, tid)
    peak_res: tuple[int, int, Mark | None, float, int] | None = None
    by_phase: dict[str, dict[str, Any]] = {}
    by_module: dict[tuple[str, str], int] = {}
    series: list[tuple[float, int, int]] = []
    samples: list[dict[str, Any]] = []
    phase_spans: list[list[Any]] = []
    started = False
    for index, ev in enumerate(events):
        inside = start_ts <= ev.ts <= end_ts
        if inside and not started:
            started = True
            peak_alloc = (allocated, -1, mark, ev.ts, 0)
            peak_res = (reserved, -1, mark, ev.ts, 0)
            series.append((to_chip_us(ev.ts), allocated, reserved))
        if ev.seq >= 0:
            mark = by_seq.get(ev.seq, mark)
            if inside and mark is not None:
                _seed(by_phase, by_module, mark, allocated, reserved, mark.host_us)
                samples.append({"chip_us": round(mark.host_us, 3), "phase": mark.phase, "module": mark.module,
                                "kind": mark.kind, "allocated": allocated, "reserved": reserved})
                if not phase_spans or phase_spans[-1][0] != mark.phase:
                    phase_spans.append([mark.phase, mark.host_us, mark.host_us])
                phase_spans[-1][2] = mark.host_us
            continue
        allocated, reserved = ev.allocated, ev.reserved
        if ev.nbytes > 0:
            live[ev.addr] = (ev.nbytes, mark, ev.ts, ev.tid)
        else:
            live.pop(ev.addr, None)
        if not inside:
            continue
        chip = to_chip_us(ev.ts)
        series.append((chip, allocated, reserved))
        if peak_alloc is None or allocated > peak_alloc[0]:
            peak_alloc = (allocated, index, mark, ev.ts, ev.tid)
        if peak_res is None or reserved > peak_res[0]:
            peak_res = (reserved, index, mark, ev.ts, ev.tid)
        _seed(by_phase, by_module, mark, allocated, reserved, chip)
    # Each phase lasts from its first mark to the next phase's; the last to the window's last event.
    for span, after in zip(phase_spans, phase_spans[1:], strict=False):
        span[2] = after[1]
    if phase_spans and series:
        phase_spans[-1][2] = max(phase_spans[-1][2], series[-1][0])
    phase_spans = [span for span in phase_spans if span[2] > span[1] or len(phase_spans) == 1]
    if not started:  # nothing at all inside the window: the state it started with
        peak_alloc = (allocated, -1, mark, 0.0, 0)
        peak_res = (reserved, -1, mark, 0.0, 0)
    assert peak_alloc is not None and peak_res is not None

    # The live allocations at the peak: the events again, up to the peak's.
    at_peak: dict[int, tuple[int, Mark | None, float, int]] = {}
    mark = None
    stop = peak_alloc[1] if peak_alloc[1] >= 0 else next((i for i, ev in enumerate(events) if ev.ts >= start_ts),
                                                          len(events)) - 1
    for ev in events[:stop + 1]:
        if ev.seq >= 0:
            mark = by_seq.get(ev.seq, mark)
        elif ev.nbytes > 0:
            at_peak[ev.addr] = (ev.nbytes, mark, ev.ts, ev.tid)
        else:
            at_peak.pop(ev.addr, None)
    largest = sorted(at_peak.values(), key=lambda v: -v[0])[:TOP_ALLOCATIONS]

    tasks = [{**task, "ts": device_to_chip_us(float(task["ts"]))}
             for task in _device_tasks(trace, device, start_ts, end_ts)]
    time = step_time(tasks)
    first, last = by_seq.get(choice.first_seq, marks[0] if marks else None), by_seq.get(choice.last_seq,
                                                                                       marks[-1] if marks else None)
    host_start, host_end = (first.host_us if first else 0.0), (last.host_us if last else 0.0)
    time["host_step_us"] = max(host_end - host_start, 0.0)

    def where(peak: tuple[int, int, Mark | None, float, int]) -> dict[str, Any]:
        if peak[1] < 0:
            return {**_where(peak[2], to_chip_us(peak[3]) if peak[3] else 0.0), "at_step_start": True}
        return _where(peak[2], to_chip_us(peak[3]), ops.at(peak[4], peak[3]))

    return {
        "peak_allocated": peak_alloc[0],
        "peak_allocated_at": where(peak_alloc),
        "peak_reserved": peak_res[0],
        "peak_reserved_at": where(peak_res),
        "end_allocated": allocated if end_ts == math.inf else _state_at(events, end_ts)[0],
        "end_reserved": reserved if end_ts == math.inf else _state_at(events, end_ts)[1],
        "by_phase": {phase: by_phase[phase] for phase in PHASES if phase in by_phase},
        "by_module": [{"module": module, "phase": phase, "peak_allocated": value} for (module, phase), value in
                      sorted(by_module.items(), key=lambda kv: -kv[1])[:TOP_MODULES]],
        "largest_allocations": [{"bytes": nbytes, **_where(m, to_chip_us(ts), ops.at(tid, ts))}
                                for nbytes, m, ts, tid in largest],
        "live_at_peak": len(at_peak),
        "timeline": samples,
        "series": [(round(c, 3), a, r) for c, a, r in series],
        "phase_spans": [(phase, round(s, 3), round(e, 3)) for phase, s, e in phase_spans],
        "time": {key: round(value, 3) for key, value in time.items()},
        "device_tasks": len(tasks),
    }


def _seed(by_phase: dict[str, dict[str, Any]], by_module: dict[tuple[str, str], int], mark: Mark | None,
          allocated: int, reserved: int, chip_us: float) -> None:
    """Counts ``allocated`` / ``reserved`` as held in ``mark``'s phase and module (at an event, or when a mark
    moves in while they are held)."""
    phase, module = (mark.phase, mark.module) if mark else ("forward", OUTSIDE)
    slot = by_phase.setdefault(phase, {"peak_allocated": -1, "peak_reserved": 0, "module": OUTSIDE, "chip_us": 0.0})
    if allocated > slot["peak_allocated"]:
        slot.update(peak_allocated=allocated, module=module, chip_us=round(chip_us, 3))
    slot["peak_reserved"] = max(slot["peak_reserved"], reserved)
    key = (module, phase)
    by_module[key] = max(by_module.get(key, 0), allocated)


def _state_at(events: list[_Event], ts: float) -> tuple[int, int]:
    allocated = reserved = 0
    for ev in events:
        if ev.ts > ts:
            break
        if ev.seq < 0:
            allocated, reserved = ev.allocated, ev.reserved
    return allocated, reserved
