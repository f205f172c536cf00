"""torch_npu.profiler on npusim: torch_npu's API over torch.profiler, the *_ascend_pt directory it writes
(headers, rows that are device activities, a Chrome trace with host and device lanes), the Overlap Analysis
of step_trace_time.csv (runtime/overlap.py), the refusals of what npusim cannot collect, and a 2-rank
all_reduce in communication.json."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.autograd import DeviceType

import npusim
from npusim.compat import torch_npu as shim
from npusim.compat.ascend_profiler import records
from npusim.runtime import overlap
from npusim.runtime.chip_clock import host_ns_to_chip_ns
from npusim.testing.ranks import run_ranks

OUTPUT = "ASCEND_PROFILER_OUTPUT"
KERNEL_HEADER = ["Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)", "Wait Time(us)",
                 "Block Num"]
STEP_TRACE_HEADER = ["Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped",
                     "Communication", "Free", "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)",
                     "Preparing"]
OPERATOR_HEADER = ["Name", "Input Shapes", "Call Stack", "Host Self Duration(us)", "Host Total Duration(us)",
                   "Device Self Duration(us)", "Device Total Duration(us)", "Device Self Duration With AICore(us)",
                   "Device Total Duration With AICore(us)"]
OP_STATISTIC_HEADER = ["Device_id", "OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)",
                       "Avg Time(us)", "Max Time(us)", "Ratio(%)"]


@pytest.fixture
def torch_npu() -> Iterator[Any]:
    module = shim.install()
    try:
        yield module
    finally:
        shim.uninstall()


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], [dict(zip(rows[0], row, strict=True)) for row in rows[1:]]


def _train(torch_npu: Any, prof: Any, steps_run: int) -> None:
    """A torch_npu user's loop: a small model on npu, one prof.step() per iteration."""
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to("npu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps_run):
        loss = model(torch.randn(16, 32).to("npu")).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        prof.step()
    torch_npu.npu.synchronize()


def _profiled(torch_npu: Any, out: Path, level: str = "Level1") -> tuple[Any, Path]:
    """Profiles steps 2 and 3 of five (wait 1, warmup 1, active 2) as torch_npu's docs do; returns the
    profiler and the one *_ascend_pt directory."""
    import torch_npu.profiler as npu_profiler

    config = npu_profiler._ExperimentalConfig(profiler_level=getattr(npu_profiler.ProfilerLevel, level))
    with npu_profiler.profile(
            activities=[npu_profiler.ProfilerActivity.CPU, npu_profiler.ProfilerActivity.NPU],
            schedule=npu_profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
            on_trace_ready=npu_profiler.tensorboard_trace_handler(str(out)), record_shapes=True,
            experimental_config=config) as prof:
        _train(torch_npu, prof, 5)
    (prof_dir,) = out.glob("*_ascend_pt")
    return prof, prof_dir


def test_overlap_figures_on_hand_made_intervals():
    """Computing, Communication, their overlap, Free, Stage, Bubble and Preparing of runtime/overlap.py on
    overlapping, gapped and nested intervals, as Note [Overlap Analysis figures] defines them."""
    # compute [0,4) and [6,10); communication [3,7) overlaps both by 1; gap [4,6) is covered by communication.
    figures = overlap.step_figures([(0, 4), (6, 10)], [(3, 7)], step_start=-2)
    assert figures == overlap.StepFigures(computing=8, communication_not_overlapped=2, overlapped=2, communication=4,
                                          free=0, stage=10, bubble=0, communication_not_overlapped_exclude_receive=2,
                                          preparing=2)
    # Gaps: nothing runs in [2,5) and [6,8); nested compute [1,1.5) inside [0,2) counts once.
    figures = overlap.step_figures([(0, 2), (1, 1.5), (8, 9)], [(5, 6)])
    assert (figures.computing, figures.communication, figures.overlapped) == (3, 1, 0)
    assert (figures.free, figures.stage) == (5, 9)
    assert figures.preparing == 0  # no step start given
    # A receive inside the communication is Bubble; Stage and the receive-excluded figure leave it out.
    figures = overlap.step_figures([(0, 1)], [(2, 6), (3, 5)], receive=[(3, 5)])
    assert (figures.communication, figures.bubble, figures.stage) == (4, 2, 4)
    assert figures.communication_not_overlapped_exclude_receive == 2
    assert overlap.step_figures([], []) == overlap.StepFigures(0, 0, 0, 0, 0, 0, 0, 0, 0)
    assert overlap.merge([(5, 6), (0, 2), (2, 3), (4, 4)]) == [(0, 3), (5, 6)]
    assert overlap.intersect([(0, 10)], [(2, 3), (5, 12)]) == [(2, 3), (5, 10)]
    assert overlap.subtract([(0, 10)], [(2, 3), (5, 12)]) == [(0, 2), (3, 5)]
    assert overlap.gaps([(0, 1), (3, 4), (2, 2.5)]) == [(1, 2), (2.5, 3)]


def test_torch_npu_script_writes_the_ascend_pt_directory(torch_npu, tmp_path: Path):
    """A schedule and tensorboard_trace_handler write <host>_<pid>_<UTC ms>_ascend_pt with profiler_info.json
    and ASCEND_PROFILER_OUTPUT's trace_view.json and CSV views under torch_npu's headers, steps 2 and 3."""
    _, prof_dir = _profiled(torch_npu, tmp_path)
    assert re.fullmatch(r".+_\d+_\d{17}_ascend_pt", prof_dir.name)
    info = json.loads((prof_dir / "profiler_info.json").read_text())
    assert info["config"]["experimental_config"]["_profiler_level"] == "Level1"
    assert info["config"]["common_config"]["activities"] == ["ProfilerActivity.CPU", "ProfilerActivity.NPU"]
    out = prof_dir / OUTPUT
    assert {p.name for p in out.iterdir()} == {"trace_view.json", "kernel_details.csv", "operator_details.csv",
                                               "step_trace_time.csv", "op_statistic.csv"}  # no collective ran
    header, kernels = _read_csv(out / "kernel_details.csv")
    assert header == ["Step Id", *KERNEL_HEADER]
    assert {row["Step Id"] for row in kernels} == {"2", "3"}
    assert {"addmm", "mm", "relu"} <= {row["Type"] for row in kernels}
    header, step_rows = _read_csv(out / "step_trace_time.csv")
    assert header == STEP_TRACE_HEADER and [row["Step"] for row in step_rows] == ["2", "3"]
    assert all(float(row["Computing"]) > 0 and float(row["Communication"]) == 0 for row in step_rows)
    header, operators = _read_csv(out / "operator_details.csv")
    assert header == OPERATOR_HEADER
    mm = next(row for row in operators if row["Name"] == "aten::mm")
    assert float(mm["Device Self Duration(us)"]) > 0 and float(mm["Device Self Duration With AICore(us)"]) > 0
    linear = next(row for row in operators if row["Name"] == "aten::linear")  # launches nothing itself
    assert float(linear["Device Self Duration(us)"]) == 0 < float(linear["Device Total Duration(us)"])
    header, statistics = _read_csv(out / "op_statistic.csv")
    assert header == OP_STATISTIC_HEADER
    assert sum(float(row["Ratio(%)"]) for row in statistics) == pytest.approx(100, abs=0.1)


def test_kernel_details_rows_are_device_activities(torch_npu, tmp_path: Path):
    """Each kernel_details row is a device activity of the profiler: same device, name, start and duration."""
    prof, prof_dir = _profiled(torch_npu, tmp_path)
    origin = prof.profiler.kineto_results.trace_start_ns()
    activities = {(e.device_index, e.name, origin + round(e.time_range.start * 1000)): e for e in prof.events()
                  if e.device_type == DeviceType.PrivateUse1}
    _, rows = _read_csv(prof_dir / OUTPUT / "kernel_details.csv")
    assert rows
    for row in rows:
        us, _, ns = row["Start Time(us)"].strip().partition(".")
        start_ns = int(us) * 1000 + int(ns)
        activity = activities[int(row["Device_id"]), row["Name"], start_ns]
        assert float(row["Duration(us)"]) == pytest.approx(activity.time_range.elapsed_us(), abs=1e-3)


def _steps_of_device_events(prof: Any) -> dict[str, tuple[int, list[Any]]]:
    """Step id -> (its start on the chip clock, its device events), from the profiler's raw kineto events: an
    event belongs to the ProfilerStep#N range holding the start of the op that launched it (on the chip clock,
    where under the timing model an op that launches costs host time)."""
    events = prof.profiler.kineto_results.events()
    cpu = {e.correlation_id(): e for e in events if e.device_type() == DeviceType.CPU}
    ranges = {e.name().removeprefix("ProfilerStep#"): (host_ns_to_chip_ns(e.start_ns()), host_ns_to_chip_ns(e.end_ns()))
              for e in cpu.values() if e.name().startswith("ProfilerStep#")}
    found: dict[str, tuple[int, list[Any]]] = {step: (start, []) for step, (start, _) in ranges.items()}
    for event in events:
        op = cpu.get(event.linked_correlation_id()) if event.device_type() == DeviceType.PrivateUse1 else None
        if op is None:
            continue
        launched = host_ns_to_chip_ns(op.start_ns())
        step = next((step for step, (start, end) in ranges.items() if start <= launched < end), None)
        if step is not None:
            found[step][1].append(event)
    return found


def test_step_trace_time_is_the_overlap_of_the_profiled_events(torch_npu, tmp_path: Path):
    """Under the timing model, step_trace_time.csv's figures are runtime/overlap.py's step_figures of the same
    profiler events: each step's compute kernels (Note [Overlap Analysis figures]), from the raw kineto events."""
    with npusim.timing.model(launch_us=5, compute=True):
        prof, prof_dir = _profiled(torch_npu, tmp_path)
    _, rows = _read_csv(prof_dir / OUTPUT / "step_trace_time.csv")
    per_step = _steps_of_device_events(prof)
    assert sorted(per_step) == [row["Step"] for row in rows] == ["2", "3"]
    for row in rows:
        step_start, events = per_step[row["Step"]]
        compute = [(e.start_ns(), e.end_ns()) for e in events
                   if e.activity_type() == "kernel" and e.name() not in records.STREAM_WAITS]
        expected = overlap.step_figures(compute, [], step_start=step_start)
        written = [float(row[name]) for name in STEP_TRACE_HEADER[2:]]
        assert written == pytest.approx([value / 1000 for value in expected], abs=1e-3)
        assert expected.computing > 0 and expected.free + expected.computing == pytest.approx(expected.stage)


def test_trace_view_has_host_and_device_lanes_on_one_axis(torch_npu, tmp_path: Path):
    """trace_view.json is a JSON array with a Python process and, for npu 0, Ascend Hardware and Overlap Analysis
    processes labelled "NPU 0"; each device task starts after the host op its flow comes from."""
    _, prof_dir = _profiled(torch_npu, tmp_path)
    events = json.loads((prof_dir / OUTPUT / "trace_view.json").read_text())
    assert isinstance(events, list)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    labels = {e["pid"]: e["args"]["labels"] for e in events if e["ph"] == "M" and e["name"] == "process_labels"}
    by_name = {name: pid for pid, name in names.items()}
    assert {"Python", "Ascend Hardware", "Overlap Analysis"} <= set(by_name)
    assert labels[by_name["Ascend Hardware"]] == labels[by_name["Overlap Analysis"]] == "NPU 0"
    slices = [e for e in events if e["ph"] == "X"]
    host = [e for e in slices if e["pid"] == by_name["Python"]]
    device = [e for e in slices if e["pid"] == by_name["Ascend Hardware"]]
    assert any(e["name"] == "aten::mm" for e in host) and any(e["name"] == "aten::mm" for e in device)
    assert {e["name"] for e in slices if e["pid"] == by_name["Overlap Analysis"]} >= {"Computing", "Free"}
    flows = {}
    for e in events:
        if e["ph"] in "sf":
            flows.setdefault(e["id"], {})[e["ph"]] = float(e["ts"])
    assert flows and all(flow["s"] <= flow["f"] for flow in flows.values())


def test_without_schedule_one_step_and_no_step_id(torch_npu, tmp_path: Path):
    """With no schedule there are no steps: step_trace_time has one row with an empty Step, kernel_details no
    Step Id; Level0 writes no op_statistic.csv, as torch_npu."""
    import torch_npu.profiler as npu_profiler

    with npu_profiler.profile(on_trace_ready=npu_profiler.tensorboard_trace_handler(str(tmp_path))) as prof:
        x = torch.randn(64, 64, device="npu")
        (x @ x).sum().item()
    assert prof.npu_activities == npu_profiler.supported_activities()
    (prof_dir,) = tmp_path.glob("*_ascend_pt")
    out = prof_dir / OUTPUT
    assert not (out / "op_statistic.csv").exists()
    header, _ = _read_csv(out / "kernel_details.csv")
    assert header == KERNEL_HEADER
    _, rows = _read_csv(out / "step_trace_time.csv")
    assert [(row["Device_id"], row["Step"]) for row in rows] == [("0", "")] and float(rows[0]["Computing"]) > 0
    prof.export_chrome_trace(str(tmp_path / "trace.json"))  # torch_npu's export: its trace_view array
    exported = json.loads((tmp_path / "trace.json").read_text())
    assert isinstance(exported, list) and any(e.get("name") == "aten::mm" and e["ph"] == "X" for e in exported)


def test_with_stack_writes_call_stacks(torch_npu, tmp_path: Path):
    """with_stack=True: operator_details.csv has each op's Python call stack, trace_view.json its frames."""
    import torch_npu.profiler as npu_profiler

    with npu_profiler.profile(with_stack=True, on_trace_ready=npu_profiler.tensorboard_trace_handler(str(tmp_path))):
        x = torch.randn(64, 64, device="npu")
        (x @ x).sum().item()
    (prof_dir,) = tmp_path.glob("*_ascend_pt")
    _, operators = _read_csv(prof_dir / OUTPUT / "operator_details.csv")
    mm = next(row for row in operators if row["Name"] == "aten::mm")
    assert "test_with_stack_writes_call_stacks" in mm["Call Stack"]
    events = json.loads((prof_dir / OUTPUT / "trace_view.json").read_text())
    assert any(e.get("cat") == "python_function" for e in events)


def test_analyse_writes_the_views_later(torch_npu, tmp_path: Path):
    """analyse_flag=False saves the raw records only; torch_npu.profiler.analyse writes the views from them."""
    import torch_npu.profiler as npu_profiler

    handler = npu_profiler.tensorboard_trace_handler(str(tmp_path), worker_name="worker0", analyse_flag=False)
    with npu_profiler.profile(on_trace_ready=handler) as prof:
        torch.ones(8, device="npu").add_(1).sum().item()
    assert isinstance(prof, torch.profiler.profile)
    (prof_dir,) = tmp_path.glob("worker0_*_ascend_pt")
    assert not (prof_dir / OUTPUT).exists()
    npu_profiler.analyse(str(tmp_path))
    assert (prof_dir / OUTPUT / "kernel_details.csv").exists() and (prof_dir / OUTPUT / "trace_view.json").exists()


def test_schedule_acts_as_torch_profilers(torch_npu):
    """torch_npu.profiler.schedule gives torch.profiler.schedule's steps as torch_npu's own ProfilerAction (a class
    of torch_npu.profiler.scheduler, as test_public_bindings wants), positional arguments as torch_npu's; the
    profile takes them and torch.profiler's alike."""
    import torch_npu.profiler as npu_profiler
    from torch_npu.profiler.scheduler import _to_torch_action

    ours = npu_profiler.schedule(1, 2, warmup=1, repeat=2, skip_first=1)
    theirs = torch.profiler.schedule(wait=1, active=2, warmup=1, repeat=2, skip_first=1)
    assert [ours(step).name for step in range(12)] == [theirs(step).name for step in range(12)]
    assert ours(4) is npu_profiler.ProfilerAction.RECORD_AND_SAVE
    assert npu_profiler.ProfilerAction is not torch.profiler.ProfilerAction
    assert npu_profiler.ProfilerAction.__module__ == "torch_npu.profiler.scheduler"
    assert [_to_torch_action(ours)(step) for step in range(12)] == [theirs(step) for step in range(12)]
    assert _to_torch_action(theirs)(4) is torch.profiler.ProfilerAction.RECORD_AND_SAVE
    with pytest.raises(ValueError, match="step=-1"):
        ours(-1)
    with pytest.warns(UserWarning, match="invalid parameter active=0, reset it to 1"):
        assert npu_profiler.schedule(wait=0, active=0).active == 1


def test_what_npusim_cannot_collect_is_refused_by_name(torch_npu):
    """AI Core metrics, the db export and the chip's other counters raise NotSimulatedProfilerConfigError naming
    torch_npu.profiler, what was asked and what is supported; the levels and the default metric are accepted;
    torch_npu.profiler's other names are NotSimulatedError."""
    import torch_npu.profiler as npu_profiler

    config = npu_profiler._ExperimentalConfig
    with pytest.raises(npu_profiler.NotSimulatedProfilerConfigError,
                       match=r"torch_npu\.profiler\._ExperimentalConfig\(aic_metrics=AiCMetrics\.PipeUtilization\) "
                             r"is not simulated by npusim: .*supported: aic_metrics=AiCMetrics\.AiCoreNone"):
        config(profiler_level=npu_profiler.ProfilerLevel.Level2, aic_metrics=npu_profiler.AiCMetrics.PipeUtilization)
    with pytest.raises(NotImplementedError,
                       match=r"export_type=ExportType\.Db.*supported: export_type=ExportType\.Text"):
        config(export_type=[npu_profiler.ExportType.Text, npu_profiler.ExportType.Db])
    with pytest.raises(NotImplementedError, match=r"l2_cache=True.*supported: l2_cache left at its default"):
        config(l2_cache=True)
    for level in (npu_profiler.ProfilerLevel.Level0, npu_profiler.ProfilerLevel.Level1,
                  npu_profiler.ProfilerLevel.Level2, npu_profiler.ProfilerLevel.Level_none):
        assert config(profiler_level=level, aic_metrics=npu_profiler.AiCMetrics.AiCoreNone).to_info()[
            "_profiler_level"] == level
    assert npu_profiler.ExperimentalConfig is config and npu_profiler.supported_export_type() == {"text"}
    with pytest.raises(ValueError, match=r"activity .*CUDA.* expected ProfilerActivity.CPU or ProfilerActivity.NPU"):
        npu_profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    with pytest.raises(AttributeError, match=r"torch_npu\.profiler\.dynamic_profile is not simulated by npusim"):
        npu_profiler.dynamic_profile  # noqa: B018


def _all_reduce_job(rank: int, world: int, out: str) -> dict[str, Any]:
    torch_npu = shim.install()
    try:
        import torch.distributed as dist
        import torch_npu.profiler as npu_profiler

        x = torch.ones(1 << 12, device=f"npu:{rank}")
        config = npu_profiler._ExperimentalConfig(profiler_level=npu_profiler.ProfilerLevel.Level1)
        with npu_profiler.profile(schedule=npu_profiler.schedule(wait=0, active=1, repeat=1),
                                  on_trace_ready=npu_profiler.tensorboard_trace_handler(out, worker_name=f"rank{rank}"),
                                  experimental_config=config) as prof:
            y = x * 2
            dist.all_reduce(y)
            torch_npu.npu.synchronize()
            prof.step()
        assert torch.equal(y.cpu(), torch.full_like(x.cpu(), 4.0))
        (prof_dir,) = Path(out).glob(f"rank{rank}_*_ascend_pt")
        return {"communication": json.loads((prof_dir / OUTPUT / "communication.json").read_text()),
                "info": sorted(p.name for p in prof_dir.glob("profiler_info*.json")),
                "steps": _read_csv(prof_dir / OUTPUT / "step_trace_time.csv")[1]}
    finally:
        shim.uninstall()


def test_all_reduce_of_two_ranks_is_in_communication_json(tmp_path: Path):
    """2 ranks, one all_reduce inside the profiled step: each rank's communication.json holds it under step0's
    collectives with torch_npu's time keys, profiler_info is per rank, and Communication is in step_trace_time."""
    results = run_ranks(_all_reduce_job, str(tmp_path), timeout=180, name="torch_npu.profiler all_reduce")
    for rank, result in enumerate(results):
        assert result["info"] == [f"profiler_info_{rank}.json"]
        collective = result["communication"]["step0"]["collective"]
        (name,) = [key for key in collective if key != "Total Op Info"]
        assert name.startswith("hcom_all_reduce__")
        time_info = collective[name]["Communication Time Info"]
        assert time_info["Elapse Time(ms)"] > 0 and set(time_info) >= {
            "Start Timestamp(us)", "Transit Time(ms)", "Wait Time(ms)", "Synchronization Time(ms)", "Idle Time(ms)",
            "Wait Time Ratio", "Synchronization Time Ratio"}
        assert set(collective[name]["Communication Bandwidth Info"]) == {"RDMA", "HCCS", "PCIE", "SDMA", "SIO"}
        assert collective["Total Op Info"]["Communication Time Info"]["Elapse Time(ms)"] == time_info["Elapse Time(ms)"]
        (row,) = result["steps"]
        assert row["Step"] == "0" and float(row["Communication"]) > 0


PROFILED_SCRIPT = Path(__file__).parent / "scripts" / "torch_npu_profiled_train.py"


def _profiled_run(out: Path, *launch: str) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, str]]]]:
    """tests/scripts/torch_npu_profiled_train.py under ``npusim run`` (under ``torchrun *launch`` if given)
    on the chip clock: each step's time by NPU events, and the rows of each *_ascend_pt directory's
    step_trace_time.csv by its profiler_info file name (one per rank)."""
    import sys

    from npusim.testing.torchrun import run_bounded

    runner = [sys.executable, "-m", "torch.distributed.run", *launch] if launch else [sys.executable]
    result = run_bounded([*runner, "-m", "npusim", "run", str(PROFILED_SCRIPT), str(out)], 240,
                         env={"NPUSIM_TIMING": "launch_us=10,compute=1"})
    assert result.returncode == 0, result.stderr[-3000:]
    # Two ranks' lines may interleave on torchrun's stdout: each step is one flat JSON object.
    steps = [json.loads(obj) for obj in re.findall(r"\{[^{}]*\}", result.stdout)]
    rows = {}
    for prof_dir in sorted(out.glob("*_ascend_pt")):
        expected = ["trace_view.json", "kernel_details.csv", "op_statistic.csv", "operator_details.csv"]
        for name in expected + (["communication.json"] if launch else []):
            assert (prof_dir / OUTPUT / name).stat().st_size > 0, (prof_dir, name)
        (info,) = prof_dir.glob("profiler_info*.json")
        rows[info.name] = _read_csv(prof_dir / OUTPUT / "step_trace_time.csv")[1]
    return steps, rows


def test_a_torch_npu_script_under_npusim_run_writes_chip_figures_that_repeat(tmp_path: Path):
    """An unmodified torch_npu script (schedule, tensorboard_trace_handler) under ``npusim run`` with the
    timing model on writes the *_ascend_pt files; its profiled steps' figures are chip time: each step's
    device span (Stage) fits in the step's time by NPU events, and two runs write the same rows."""
    steps, rows = _profiled_run(tmp_path / "first")
    assert (steps, rows) == _profiled_run(tmp_path / "second")
    (written,) = rows.values()
    assert [row["Step"] for row in written] == ["2", "3"]
    step_us = {str(s["step"]): s["ms"] * 1e3 for s in steps}
    for row in written:
        assert 0 < float(row["Computing"]) <= float(row["Stage"]) <= step_us[row["Step"]]
        assert float(row["Computing"]) + float(row["Free"]) == pytest.approx(float(row["Stage"]), abs=2e-3)


@pytest.mark.asynchronous
def test_the_same_script_on_two_ranks_under_torchrun_writes_communication(tmp_path: Path):
    """Under ``torchrun --nproc-per-node 2 -m npusim run``, each rank writes its own directory with
    communication.json; its steps communicate (the gradients' all_reduce on the chip clock) and both ranks
    report the same step times and figures."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    steps, rows = _profiled_run(tmp_path, "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                                "--master-port", str(port))
    assert sorted(rows) == ["profiler_info_0.json", "profiler_info_1.json"]
    first, second = rows.values()
    assert [row["Device_id"] for row in first + second] == ["0", "0", "1", "1"]
    same = [{k: v for k, v in row.items() if k != "Device_id"} for row in first + second]
    assert same[:2] == same[2:] and [row["Step"] for row in first] == ["2", "3"]
    assert all(float(row["Communication"]) > 0 for row in first)
    by_rank = [[s["ms"] for s in steps if s["rank"] == rank] for rank in (0, 1)]
    assert by_rank[0] == by_rank[1] and len(by_rank[0]) == 4
