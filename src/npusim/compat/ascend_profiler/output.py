"""The ``<worker>_<UTC time>_ascend_pt`` directory torch_npu.profiler writes, and its analysis.

Layout as torch_npu's (ProfPathCreator, ProfilerPathManager): ``<dir_name>/<hostname>_<pid>_<%Y%m%d%H%M%S
and ms, UTC>_ascend_pt/`` holds ``profiler_info.json`` (``profiler_info_<rank>.json`` in a process group),
the raw records (``FRAMEWORK/``; torch_npu keeps its raw data there and under ``PROF_*``) and, once
analysed, ``ASCEND_PROFILER_OUTPUT/`` with the views of Note [What npusim's torch_npu.profiler writes].
"""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from npusim.compat.ascend_profiler import communication, records, steps, tables, trace_view

__all__ = ["OUTPUT_DIR", "RECORDS_PATH", "analyse", "info_path", "new_profiler_dir", "save_raw"]

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
RECORDS_PATH = Path("FRAMEWORK") / "npusim_records.json"
NPU_ACTIVITY = "ProfilerActivity.NPU"  # how profiler_info.json names the activities
CPU_ACTIVITY = "ProfilerActivity.CPU"
DETAILED_LEVELS = ("Level1", "Level2")  # op_statistic.csv and communication.json need Level1 or more


def _utc_ms() -> str:
    return datetime.now(UTC).strftime("%Y%m%d%H%M%S%f")[:-3]


def new_profiler_dir(dir_name: str | os.PathLike[str] | None, worker_name: str | None) -> Path:
    """Creates and returns a new ``*_ascend_pt`` directory under ``dir_name`` (None: $ASCEND_WORK_PATH's
    profiling_data if set, else the working directory), named after ``worker_name`` (None: host_pid)."""
    if dir_name is None:
        work = os.environ.get("ASCEND_WORK_PATH")
        dir_name = Path(work).resolve() / "profiling_data" if work else Path.cwd()
    worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
    path = Path(dir_name) / f"{worker}_{_utc_ms()}_ascend_pt"
    while path.exists():  # two saves within one millisecond
        time.sleep(0.001)
        path = Path(dir_name) / f"{worker}_{_utc_ms()}_ascend_pt"
    path.mkdir(parents=True)
    return path


def info_path(prof_dir: Path, rank: int) -> Path:
    """profiler_info.json, or profiler_info_<rank>.json for a rank of a process group."""
    return prof_dir / ("profiler_info.json" if rank < 0 else f"profiler_info_{rank}.json")


def save_raw(prof_dir: Path, data: records.Records, config: dict[str, Any], versions: dict[str, str]) -> None:
    """Writes profiler_info(_<rank>).json (``config``: common_config and experimental_config) and the records."""
    end_info = {"collectionTimeEnd": time.time_ns(), "MonotonicTimeEnd": time.monotonic_ns()}
    info = {"config": config, "end_info": end_info, **versions, "rank_id": data.rank}
    info_path(prof_dir, data.rank).write_text(json.dumps(info, indent=4))
    (prof_dir / RECORDS_PATH).parent.mkdir(exist_ok=True)
    records.save(data, prof_dir / RECORDS_PATH)


def _read_info(prof_dir: Path) -> dict[str, Any]:
    found = sorted(prof_dir.glob("profiler_info*.json"))
    if not found or not (prof_dir / RECORDS_PATH).exists():
        raise FileNotFoundError(f"torch_npu.profiler.analyse: {prof_dir} is no *_ascend_pt directory npusim wrote "
                                f"(expected profiler_info.json and {RECORDS_PATH})")
    return json.loads(found[0].read_text())


def analyse(prof_dir: Path) -> Path:
    """Writes ``prof_dir``'s ASCEND_PROFILER_OUTPUT views from its saved records; returns that directory."""
    config = _read_info(prof_dir)["config"]
    activities = config["common_config"]["activities"]
    detailed = config["experimental_config"]["_profiler_level"] in DETAILED_LEVELS
    data = records.load(prof_dir / RECORDS_PATH)
    out = prof_dir / OUTPUT_DIR
    out.mkdir(exist_ok=True)
    windows = steps.step_windows(data)
    (out / "trace_view.json").write_text(trace_view.trace_view_json(data))
    if CPU_ACTIVITY in activities:
        tables.write_csv(out / "operator_details.csv", tables.operator_details(data))
    if NPU_ACTIVITY in activities:
        tables.write_csv(out / "kernel_details.csv", tables.kernel_details(data, windows))
        tables.write_csv(out / "step_trace_time.csv", tables.step_trace_time(data, windows))
        if detailed:
            tables.write_csv(out / "op_statistic.csv", tables.op_statistic(data))
        if detailed and any(t.kind == records.COMMUNICATION for t in data.device):
            (out / "communication.json").write_text(
                json.dumps(communication.communication_json(data, windows), indent=4))
    return out
