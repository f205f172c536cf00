"""torch.profiler on the npu: device tasks per stream with their (modelled) duration, memory
events for npu allocations and frees, ranges for the _foreach_copy_ route and the collectives,
and one Chrome trace row per npu stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

import npusim
from npusim.testing.ranks import run_ranks

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1, as the trace's memory events write it


def _pairs(n: int = 4, numel: int = 1024, device: str = "npu") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return ([torch.empty(numel, device=device) for _ in range(n)],
            [torch.randn(numel, device=device) for _ in range(n)])


def test_device_tasks_are_recorded_per_stream_with_modelled_duration():
    """A _foreach_copy_ chunk and a side-stream copy are ranges on their streams' worker threads,
    lasting at least the timing model's duration."""
    dst, src = _pairs()
    side = torch.npu.Stream()
    torch.npu.synchronize()
    with npusim.timing.model(launch_us=20_000), profile(activities=ACTIVITIES) as prof:
        torch._foreach_copy_(dst, src)
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            dst[0].copy_(src[1])
        torch.npu.synchronize()
    events = {e.name: e for e in prof.events()}
    chunk = events["npu:0 stream 0 (default): foreach_copy"]
    copy = events[f"npu:0 stream {side.stream_id}: copy_d2d"]
    host = events["aten::_foreach_copy_"]
    assert chunk.thread != host.thread and copy.thread not in (host.thread, chunk.thread)
    assert chunk.cpu_time_total >= 20_000 and copy.cpu_time_total >= 20_000
    # The host call returns before the modelled 20 ms are over (the aligned fast path never waits).
    assert host.time_range.end < chunk.time_range.end


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
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    trace = json.loads((tmp_path / "trace.json").read_text())
    memory = [e["args"] for e in trace["traceEvents"] if e.get("name") == "[memory]"]
    npu = [m for m in memory if m["Device Type"] == PRIVATEUSE1 and abs(m["Bytes"]) == 16 << 20]
    assert [m["Bytes"] for m in npu] == [16 << 20, -(16 << 20)]
    assert npu[0]["Addr"] == npu[1]["Addr"] and npu[0]["Device Id"] == 0


def test_chrome_trace_has_a_row_per_stream(tmp_path: Path):
    """In the exported Chrome trace, the device tasks sit on threads named after their npu streams."""
    dst, src = _pairs(device="npu:1")
    with profile(activities=ACTIVITIES) as prof:
        with torch.npu.device(1):
            torch._foreach_copy_(dst, src)
        torch.npu.synchronize(1)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    task = next(e for e in trace if e.get("name") == "npu:1 stream 0 (default): foreach_copy")
    rows = [e["args"]["name"] for e in trace if e.get("ph") == "M" and e.get("name") == "thread_name"
            and e.get("tid") == task["tid"]]
    assert any("npu1 stream 0" in row for row in rows)


def _collective_job(rank: int, world: int) -> list[str]:
    import torch.distributed as dist

    x = torch.ones(1 << 16, device=f"npu:{rank}")
    with profile(activities=ACTIVITIES) as prof:
        dist.all_reduce(x)
        dist.all_gather_into_tensor(torch.empty(2 << 16, device=f"npu:{rank}"), x)
        torch.npu.synchronize()
    assert torch.equal(x.cpu(), torch.full((1 << 16,), 2.0))
    return sorted({e.name for e in prof.events() if "hccl" in e.name})


def test_collectives_are_ranges_on_host_and_comm_stream():
    """all_reduce / all_gather_into_tensor: a host range at issue and a range on the comm stream."""
    names: Any = run_ranks(_collective_job, timeout=120, name="profiled collectives")
    for rank, rank_names in enumerate(names):
        assert "npusim::hccl:all_reduce" in rank_names
        assert "npusim::hccl:all_gather_into_tensor" in rank_names
        assert any(n.startswith("hccl ") and f"all_reduce on npu:{rank}" in n for n in rank_names)
