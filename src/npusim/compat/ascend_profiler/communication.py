"""communication.json: each step's collectives with their time and bandwidth, in torch_npu's keys.

Layout (torch_npu's CommunicationParser, MindStudio Insight's communication view): ``{"step<N>": {"p2p":
{...}, "collective": {"<op>@<group>": {"Communication Time Info": {...}, "Communication Bandwidth Info":
{<transport>: {...}}}, "Total Op Info": {...}}}}``, the step key ``"step"`` when there are no steps.
npusim knows a collective's span on its device, not how it splits into waiting and transfer, nor its
bytes: the whole span is Transit Time, Wait / Synchronization / Idle Time are 0, and each transport's
size and bandwidth are 0 (Note [What npusim's torch_npu.profiler writes] in __init__.py).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from npusim.compat.ascend_profiler.records import COMMUNICATION, DeviceTask, Records, collective
from npusim.compat.ascend_profiler.steps import StepWindow, task_steps

__all__ = ["communication_json"]

TRANSPORTS = ("RDMA", "HCCS", "PCIE", "SDMA", "SIO")  # msprof's keys of "Communication Bandwidth Info"
P2P_PREFIXES = ("hcom_send", "hcom_receive", "hcom_batchsendrecv")  # torch_npu's split into p2p / collective


def _op_name(task: DeviceTask, index: int) -> str:
    what = {"recv": "receive"}.get(collective(task), collective(task))
    # torch_npu names an op hcom_<what>__<index>_<...>@<group>; its group lets Insight match ranks' ops.
    return f"hcom_{what}__{index}@npu_group"


def _time_info(task: DeviceTask) -> dict[str, float]:
    elapse_ms = (task.end_ns - task.start_ns) / 1e6
    return {"Start Timestamp(us)": task.start_ns / 1000, "Elapse Time(ms)": elapse_ms, "Transit Time(ms)": elapse_ms,
            "Wait Time(ms)": 0.0, "Synchronization Time(ms)": 0.0, "Idle Time(ms)": 0.0, "Wait Time Ratio": 0.0,
            "Synchronization Time Ratio": 0.0}


def _bandwidth_info() -> dict[str, dict[str, Any]]:
    return {transport: {"Transit Size(MB)": 0.0, "Transit Time(ms)": 0.0, "Bandwidth(GB/s)": 0.0,
                        "Large Packet Ratio": 0.0, "Size Distribution": {}} for transport in TRANSPORTS}


def _ratio(part: float, whole: float) -> float:
    return round(part / whole, 4) if abs(whole) > 1e-15 else 0.0


def _with_total(ops: dict[str, Any]) -> dict[str, Any]:
    """``ops`` and their "Total Op Info" (sums of the times, ratios of the sums), as torch_npu adds it."""
    if not ops:
        return ops
    times: dict[str, float] = defaultdict(float)
    for info in ops.values():
        for key, value in info["Communication Time Info"].items():
            if not key.endswith("Ratio") and key != "Start Timestamp(us)":
                times[key] += value
    times["Wait Time Ratio"] = _ratio(times["Wait Time(ms)"], times["Wait Time(ms)"] + times["Transit Time(ms)"])
    times["Synchronization Time Ratio"] = _ratio(times["Synchronization Time(ms)"],
                                                 times["Synchronization Time(ms)"] + times["Transit Time(ms)"])
    bandwidth = {transport: {"Transit Time(ms)": 0.0, "Transit Size(MB)": 0.0, "Size Distribution": {}}
                 for transport in TRANSPORTS}
    return {**ops, "Total Op Info": {"Communication Time Info": dict(times), "Communication Bandwidth Info": bandwidth}}


def communication_json(records: Records, windows: list[StepWindow]) -> dict[str, Any]:
    """The communication.json of the records' collectives (of every device of the process)."""
    by_step: dict[str | None, dict[str, dict[str, Any]]] = {w.id: {"p2p": {}, "collective": {}} for w in windows}
    collectives = [(task, window) for task, window in zip(records.device, task_steps(records, windows), strict=True)
                   if task.kind == COMMUNICATION]
    for index, (task, window) in enumerate(collectives):
        if window is None:
            continue
        name = _op_name(task, index)
        group = "p2p" if name.startswith(P2P_PREFIXES) else "collective"
        by_step[window.id][group][name] = {"Communication Time Info": _time_info(task),
                                           "Communication Bandwidth Info": _bandwidth_info()}
    return {("step" if step is None else f"step{step}"): {group: _with_total(ops) for group, ops in groups.items()}
            for step, groups in by_step.items()}
