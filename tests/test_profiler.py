"""torch.profiler on the npu: device tasks as device activities on their streams' rows with their
(modelled) duration, linked to the op that launched them (its device time); memory events for npu
allocations and frees; ranges for the _foreach_copy_ route and the collectives; the legacy profiler's
device timing (``use_device="npu"``), as PyTorch's OpenReg backend passes it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler import profile as autograd_profile
from torch.profiler import ProfilerActivity, profile

import npusim
from npusim.testing.ranks import run_ranks

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1, as the trace's memory events write it
COMM_LANE = 17  # the row after a device's 17 streams: its collectives


def _pairs(n: int = 4, numel: int = 1024, device: str = "npu") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return ([torch.empty(numel, device=device) for _ in range(n)],
            [torch.randn(numel, device=device) for _ in range(n)])


def _trace(prof: Any, tmp_path: Path) -> list[dict[str, Any]]:
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    return json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


@pytest.mark.asynchronous
def test_device_tasks_are_device_activities_on_their_streams_with_modelled_duration():
    """A _foreach_copy_ chunk and a side-stream copy are PrivateUse1 events of their stream (device 0),
    lasting at least the timing model's 20 ms, ending after the host call that launched them returned."""
    dst, src = _pairs()
    side = torch.npu.Stream()
    torch.npu.synchronize()
    with npusim.timing.model(launch_us=20_000), profile(activities=ACTIVITIES) as prof:
        torch._foreach_copy_(dst, src)
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            dst[0].copy_(src[1])
        torch.npu.synchronize()
    device = {e.name: e for e in prof.events() if e.device_type == DeviceType.PrivateUse1}
    chunk, copy = device["foreach_copy"], device["copy_d2d"]
    assert (chunk.device_index, chunk.device_resource_id) == (0, 0)
    assert (copy.device_index, copy.device_resource_id) == (0, side.stream_id)
    # Chip times: the modelled 20 ms, up to the rounding of large clock values.
    assert chunk.device_time_total >= 20_000 - 1e-6 and copy.device_time_total >= 20_000 - 1e-6
    assert chunk.cpu_time_total == 0  # device time, not host time
    host = next(e for e in prof.events() if e.name == "aten::_foreach_copy_")
    # The host call returns before the modelled 20 ms are over (the aligned fast path never waits).
    assert host.time_range.end < chunk.time_range.end
    assert copy.time_range.start >= chunk.time_range.end  # stream order: the side stream waited


def test_device_time_goes_to_the_launching_op():
    """key_averages gives aten::_foreach_copy_ (the op that launched the chunk) its task's device time
    as Self NPU, within the span of the task; the chunk's own row shows the same device time."""
    dst, src = _pairs()
    with npusim.timing.model(launch_us=5_000), profile(activities=ACTIVITIES) as prof:
        torch._foreach_copy_(dst, src)
        torch.npu.synchronize()
    rows = {row.key: row for row in prof.key_averages()}
    op, task = rows["aten::_foreach_copy_"], rows["foreach_copy"]
    assert op.self_device_time_total == pytest.approx(task.self_device_time_total)
    assert 5_000 <= op.self_device_time_total < 5_000 + 200_000
    assert rows["npusim::foreach_copy[fast]"].self_device_time_total == 0  # ops before user ranges
    assert "Self NPU" in prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)


def test_chrome_trace_has_a_row_per_stream(tmp_path: Path):
    """In the Chrome trace a device task sits on process npu:1, on the row named after its stream, with
    the timing model's part of its duration as its "modelled us"."""
    dst, src = _pairs(device="npu:1")
    side = torch.npu.Stream(device=1)
    with npusim.timing.model(launch_us=1_000), profile(activities=ACTIVITIES) as prof:
        with torch.npu.device(1):
            torch._foreach_copy_(dst, src)
            side.wait_stream(torch.npu.current_stream())
            with torch.npu.stream(side):
                dst[1].copy_(src[2])
        torch.npu.synchronize(1)
    trace = _trace(prof, tmp_path)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in trace if e.get("ph") == "M" and e.get("name") == "process_name"}
    chunk = next(e for e in trace if e.get("name") == "foreach_copy" and e.get("ph") == "X")
    copy = next(e for e in trace if e.get("name") == "copy_d2d" and e.get("ph") == "X")
    assert chunk["cat"] == "kernel" and copy["cat"] == "gpu_memcpy"
    assert processes[1] == "npu:1" and chunk["pid"] == copy["pid"] == 1
    assert names[(1, chunk["tid"])] == "npu:1 stream 0 (default)"
    assert names[(1, copy["tid"])] == f"npu:1 stream {side.stream_id}"
    assert float(chunk["args"]["modelled us"]) == 1_000 and chunk["dur"] >= 1_000


@pytest.mark.asynchronous
@pytest.mark.parametrize("preset", ["training_soc", "inference_soc"])
def test_sleep_is_a_device_activity_of_cycles_at_the_chip_clock(preset: str):
    """torch.npu._sleep(cycles) returns at once and is a device activity of the current stream lasting
    cycles at the profile chip's clock (1.8 GHz on the 910B2, 1.068 GHz on the 310P3)."""
    with npusim.use_profile(preset) as chip:
        cycles = int(chip.clock_mhz * 20_000)  # 20 ms
        torch.npu.synchronize()
        with profile(activities=ACTIVITIES) as prof:
            torch.npu._sleep(cycles)
            assert not torch.npu.current_stream().query()
            torch.npu.synchronize()
    (sleep,) = [e for e in prof.events() if e.name == "sleep"]
    assert (sleep.device_type, sleep.device_resource_id) == (DeviceType.PrivateUse1, 0)
    assert 20_000 <= sleep.device_time_total < 20_000 + 50_000


def test_cpu_only_profile_has_no_device_activities():
    """Profiling the CPU activity only records no device activity (as CUDA's kernels need CUDA's)."""
    dst, src = _pairs()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch._foreach_copy_(dst, src)
        torch.npu.synchronize()
    assert "aten::_foreach_copy_" in {e.name for e in prof.events()}
    assert not [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def test_foreach_copy_routes_are_named_ranges():
    """The route a _foreach_copy_ group took is a record_function range: fast, batch, slow, compat."""
    dst, src = _pairs()
    host = [torch.empty(1024) for _ in range(4)]
    mixed = [torch.empty(1024, dtype=torch.float16, device="npu") for _ in range(4)]
    with profile(activities=ACTIVITIES) as prof:
        torch._foreach_copy_(dst, src)  # fast
        torch._foreach_copy_(host, src)  # batch (device -> host)
        torch._foreach_copy_([d[::2] for d in dst], [s[::2] for s in mixed])  # slow: strided
        with npusim.use_profile("no_foreach_kernel"):
            torch._foreach_copy_(dst, src)  # compat
        torch.npu.synchronize()
    names = [e.name for e in prof.events() if e.name.startswith("npusim::foreach_copy")]
    assert names == [f"npusim::foreach_copy[{r}]" for r in ("fast", "batch", "slow", "compat")]


def test_memory_events_for_npu_allocations_and_frees(tmp_path: Path):
    """profile_memory=True records a 16 MiB npu allocation and its free as PrivateUse1 memory events."""
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        block = torch.empty(4 << 20, device="npu")
        del block
    memory = [e["args"] for e in _trace(prof, tmp_path) if e.get("name") == "[memory]"]
    npu = [m for m in memory if m["Device Type"] == PRIVATEUSE1 and abs(m["Bytes"]) == 16 << 20]
    assert [m["Bytes"] for m in npu] == [16 << 20, -(16 << 20)]
    assert npu[0]["Addr"] == npu[1]["Addr"] and npu[0]["Device Id"] == 0


# PyTorch's own PrivateUse1 reference backend passes these two (OpenReg's tests/test_profiler.py,
# test_profiler_key_averages and test_profiler_elapsed_time); their logic, on the npu.
def test_openreg_key_averages_logic_on_npu(capfd: pytest.CaptureFixture[str]):
    """autograd's profile(use_device="npu"): every averaged op has a key, a count and a CPU time >= 0,
    every event ends after it starts, and no internal assert is reported."""
    with autograd_profile(use_device="npu") as prof:
        for _ in range(10):
            x = torch.randn(10, 10, device="npu")
            x + x
    averages = prof.key_averages()
    assert len(averages) > 0
    for avg in averages:
        assert avg.key is not None and avg.count >= 0 and avg.cpu_time_total >= 0
    assert all(e.time_range.end >= e.time_range.start for e in prof.function_events)
    assert "INTERNAL ASSERT" not in capfd.readouterr().err


def test_openreg_elapsed_time_logic_on_npu():
    """autograd's profile(use_device="npu") over matmuls on a side stream: aten::mm's CPU time is
    positive, and its device time (from events on the stream) is positive and within the profiled block
    (the device may finish after the host's last op: compute is a stream task)."""
    started = time.perf_counter()
    with autograd_profile(use_device="npu") as prof:
        stream = torch.Stream(device="npu")
        with stream:
            x = torch.randn(100, 100, device="npu")
            y = torch.randn(100, 100, device="npu")
            for _ in range(10):
                x = x @ y
        stream.synchronize()
    span_us = (time.perf_counter() - started) * 1e6
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    assert len(mm) == 10
    assert sum(e.cpu_time_total for e in mm) > 0
    assert all(0 < e.device_time_total <= span_us for e in mm)


def _collective_job(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    x = torch.ones(1 << 16, device=f"npu:{rank}")
    with profile(activities=ACTIVITIES) as prof:
        dist.all_reduce(x)
        dist.all_gather_into_tensor(torch.empty(2 << 16, device=f"npu:{rank}"), x)
        torch.npu.synchronize()
    assert torch.equal(x.cpu(), torch.full((1 << 16,), 2.0))
    return {"ranges": sorted({e.name for e in prof.events() if e.name.startswith("npusim::hccl")}),
            "activities": sorted((e.name, e.device_index, e.device_resource_id) for e in prof.events()
                                 if e.device_type == DeviceType.PrivateUse1 and e.name.startswith("hccl "))}


def test_collectives_are_host_ranges_and_device_activities():
    """all_reduce / all_gather_into_tensor: a host range at issue and a device activity on the rank's
    device, on its collectives row."""
    results: Any = run_ranks(_collective_job, timeout=120, name="profiled collectives")
    for rank, result in enumerate(results):
        assert result["ranges"] == ["npusim::hccl:all_gather_into_tensor", "npusim::hccl:all_reduce"]
        ops = [(name.split(" on ")[0].split()[-1], device, lane) for name, device, lane in result["activities"]]
        assert sorted(ops) == [("all_gather_into_tensor", rank, COMM_LANE), ("all_reduce", rank, COMM_LANE)]
