"""The chip clock (Note [Chip clock] in csrc/runtime/chip_clock.cpp): with the timing model on, every
time npusim reports is the chip's, the same in every run whatever this machine's load."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import npusim
from npusim.runtime import chip_clock, collective_cost, cost_model, overlap
from npusim.runtime.profiles import get_profile
from npusim.testing.ranks import run_ranks

LAUNCH_US = 10.0


def _matmul_elapsed_ms() -> tuple[float, float]:
    a = torch.randn(2048, 2048, device="npu")
    b = torch.randn(2048, 2048, device="npu")
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    start.record()
    c = a @ b
    end.record()
    end.synchronize()
    modelled = cost_model.op_cost(torch.ops.aten.mm.default, (a, b), {}, c, launch_us=LAUNCH_US).us
    return start.elapsed_time(end), modelled / 1e3


def test_matmul_elapsed_time_is_the_cost_models_figure():
    """Event.elapsed_time around one 2048x2048 float32 matmul on the 910B2 equals the cost model's
    figure (launch included), in every run: 0.107 ms at the roofline (docs/BENCHMARKS.md's figure),
    0.259 ms calibrated (Note [Calibrated efficiencies]), not this CPU's tens of milliseconds."""
    with npusim.use_profile("training_soc", roofline=True), npusim.timing.model(launch_us=LAUNCH_US, compute=True):
        runs = [_matmul_elapsed_ms() for _ in range(3)]
    # Equal to the cost model's figure up to the rounding of chip times that may be large (the suite's
    # earlier tests moved the clocks on), and the same in every run.
    assert all(elapsed == pytest.approx(modelled, rel=1e-9) for elapsed, modelled in runs), runs
    assert len({elapsed for elapsed, _ in runs}) == 1 and runs[0][0] == pytest.approx(0.1071, abs=1e-4)
    with npusim.timing.model(launch_us=LAUNCH_US, compute=True):  # the default profile, calibrated
        elapsed, modelled = _matmul_elapsed_ms()
    assert elapsed == pytest.approx(modelled, rel=1e-9) and elapsed == pytest.approx(0.2590, abs=1e-4)


def test_the_host_pays_launches_and_jumps_at_waits():
    """The host's clock moves by the profile's host_launch_us per launch and, at a synchronize, to the
    end of what it waited for; a query answers in chip time and does not wait in it."""
    x = torch.ones(1 << 16, device="npu")
    torch.npu.synchronize()
    cost = get_profile().host_launch_us
    with npusim.timing.model(launch_us=LAUNCH_US):
        host = npusim.timing.host_clock_us()
        stream = torch.npu.current_stream()
        start = npusim.timing.stream_clock_us(stream)
        x.add_(1)
        x.add_(1)
        assert npusim.timing.host_clock_us() == host + 2 * cost
        torch.npu._sleep(int(get_profile().clock_mhz * 1000))  # 1 ms of chip time
        after_launches = npusim.timing.host_clock_us()
        assert after_launches == host + 3 * cost
        assert not stream.query()  # the sleep ends 1 ms of chip time after its launch
        torch.npu.synchronize()
        end = npusim.timing.stream_clock_us(stream)
        assert npusim.timing.host_clock_us() == end
        # Each add (10 us) starts at its issue and ends before the next launch; the sleep starts at its
        # issue, two launches after the first.
        assert start <= host and end == host + 2 * cost + 1000.0
        assert stream.query()


def _host_time_of_a_busy_gap(host: str, busy_s: float) -> float:
    """How far the host's chip clock moves over one launch that follows ``busy_s`` of this thread's CPU."""
    x = torch.ones(16, device="npu")
    torch.npu.synchronize()
    with npusim.timing.model(launch_us=LAUNCH_US, host=host):
        x.add_(1)  # the measured mode counts from a thread's previous launch
        before = npusim.timing.host_clock_us()
        start = time.thread_time()
        while time.thread_time() - start < busy_s:
            pass
        x.add_(1)
        return npusim.timing.host_clock_us() - before


def test_the_measured_host_mode_adds_this_cpus_time_between_launches():
    """host="measured" adds the launching thread's CPU time since its previous launch, scaled by the
    profile's host_cpu_factor, to the launch's cost; the default mode charges the launch alone."""
    profile = get_profile()
    assert _host_time_of_a_busy_gap("launch", 0.02) == profile.host_launch_us
    measured = _host_time_of_a_busy_gap("measured", 0.02)
    assert measured >= profile.host_launch_us + 0.02e6 * profile.host_cpu_factor
    assert npusim.timing.parse("launch_us=1,host=measured").host == "measured"
    with pytest.raises(ValueError, match="NPUSIM_TIMING host: expected one of launch, measured, got 'fast'"):
        npusim.timing.parse("host=fast")
    with pytest.raises(ValueError, match="host must be one of"):
        npusim.timing.set(launch_us=1, host="fast")


def test_a_range_that_ends_just_before_a_sample_of_the_host_clock_includes_it(monkeypatch: pytest.MonkeyPatch):
    """The profiler and npusim convert the approximate clock each with its own converter (about 0.25 us
    apart): a range's end stamped up to END_TOLERANCE_NS before a move of the host's clock (a wait's jump,
    sampled just before the op that waited ends its range) includes the move; a start, or an end stamped
    earlier than that, does not."""
    anchor_ns, anchor_us = 1_000_000, 50.0
    times, chip_us = [1_000_000, 1_010_000, 1_020_000], [50.0, 72.5, 272.5]  # launch, then a wait's jump
    monkeypatch.setattr(chip_clock, "_samples", lambda: ((anchor_ns, anchor_us), times, chip_us))

    def on_axis(us: float) -> int:
        return anchor_ns + round((us - anchor_us) * 1e3)

    assert chip_clock.END_TOLERANCE_NS == 500
    assert chip_clock.host_ns_to_chip_ns(1_019_800) == on_axis(72.5)
    assert chip_clock.host_ns_to_chip_ns(1_019_800, end=True) == on_axis(272.5)
    assert chip_clock.host_ns_to_chip_ns(1_019_400, end=True) == on_axis(72.5)
    assert chip_clock.host_ns_to_chip_ns(1_020_000) == on_axis(272.5)
    assert chip_clock.host_ns_to_chip_ns(999_000) == on_axis(50.0)  # before the first sample: the anchor's


def test_waits_carry_chip_time_between_streams():
    """A stream that waits for an event recorded on a busy stream starts after the record's chip time."""
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    torch.npu.synchronize()
    with npusim.timing.model(launch_us=LAUNCH_US):
        with torch.npu.stream(side):
            torch.npu._sleep(int(get_profile().clock_mhz * 500))  # 0.5 ms on the side stream
            done = torch.npu.Event(enable_timing=True)
            done.record()
        begin = torch.npu.Event(enable_timing=True)
        begin.record()
        torch.npu.current_stream().wait_event(done)
        finish = torch.npu.Event(enable_timing=True)
        finish.record()
        finish.synchronize()
        assert finish.elapsed_time(begin) < 0 < begin.elapsed_time(finish)
        assert npusim.timing.stream_clock_us() >= npusim.timing.stream_clock_us(side)
        # The sleep starts at its issue; begin is recorded one launch (its host cost) later.
        assert begin.elapsed_time(finish) == pytest.approx((500.0 - get_profile().host_launch_us) / 1e3)


def _fsdp_step_in_chip_time(rank: int, world: int) -> dict[str, Any]:
    """One profiled FSDP2 step of a small transformer on 2 ranks under the 910B2 model: its chip
    time, the host's, and the Overlap Analysis of device 0's tasks."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from npusim.testing.fsdp_harness import sharded_step

    _, step = sharded_step(rank, 32, 1)
    with npusim.timing.model(launch_us=LAUNCH_US, compute=True, copy_gbps=get_profile().hbm_gbps / 2):
        step()  # warm-up: lazy initialization
        dist.barrier()
        torch.npu.synchronize()
        host_before = npusim.timing.host_clock_us()
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            step()
        end.record()
        end.synchronize()
        host_after = npusim.timing.host_clock_us()
    with tempfile.TemporaryDirectory() as out:
        path = Path(out) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    device = [e for e in events if e.get("ph") == "X" and e.get("pid") == rank and e.get("cat") == "kernel"]
    span = [(e["ts"], e["ts"] + e["dur"]) for e in device]
    collectives = [s for e, s in zip(device, span, strict=True) if e["tid"] == 17]
    kernels = [s for e, s in zip(device, span, strict=True) if e["tid"] != 17]
    return {"step_ms": start.elapsed_time(end), "host_us": host_after - host_before, "tasks": len(device),
            "overlap": tuple(round(v, 3) for v in overlap.step_figures(kernels, collectives))}


def _busy_loops(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


@pytest.mark.asynchronous
def test_an_fsdp_step_has_the_same_chip_times_in_every_run_and_under_load():
    """The same FSDP2 step on 2 ranks, three times, the third beside two busy loops on this 2-core
    machine: identical chip step times, host times, task counts and Overlap Analysis, to the bit."""
    runs = [run_ranks(_fsdp_step_in_chip_time, timeout=180) for _ in range(2)]
    loops = _busy_loops(2)
    try:
        runs.append(run_ranks(_fsdp_step_in_chip_time, timeout=180))
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert runs[0] == runs[1] == runs[2], runs
    for figures in runs[0]:
        assert figures["step_ms"] > 0 and figures["tasks"] > 0
        computing, not_overlapped, overlapped, communication = figures["overlap"][:4]
        assert computing > 0 and communication > 0 and overlapped + not_overlapped == pytest.approx(communication)


NODES_OF_FOUR = 4
ALL_REDUCE_BYTES = 4 << 20


def _timed_all_reduce(rank: int, world: int) -> float:
    import torch.distributed as dist

    t = torch.ones(ALL_REDUCE_BYTES // 4, device="npu")
    with npusim.timing.model(launch_us=LAUNCH_US):
        dist.all_reduce(torch.ones(1, device="npu"))  # lines the ranks' clocks up
        torch.npu.synchronize()
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record()
        dist.all_reduce(t)
        end.record()
        end.synchronize()
    assert t[0].item() == world
    return start.elapsed_time(end)


@pytest.mark.asynchronous
def test_eight_ranks_on_two_nodes_take_the_hierarchical_cost():
    """An all_reduce of 4 MiB over 8 ranks on 2 nodes of 4 lasts, on every rank, the hierarchical cost
    Note [Collective cost model] derives (intra-node reduce-scatter, inter-node all-reduce of a
    quarter, intra-node all-gather), plus the model's launch."""
    elapsed = run_ranks(_timed_all_reduce, world_size=8, timeout=300, bind_device=False,
                        env={"NPUSIM_RANKS_PER_NODE": str(NODES_OF_FOUR)})
    cost = collective_cost.collective_cost("all_reduce", ALL_REDUCE_BYTES, range(8), ranks_per_node=NODES_OF_FOUR)
    assert cost.algorithm == "hierarchical"
    assert elapsed == [pytest.approx((cost.us + LAUNCH_US) / 1e3, rel=1e-12)] * 8
