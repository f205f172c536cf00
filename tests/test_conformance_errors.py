"""User mistakes on npu get clear errors at call time: overlapping copy destinations,
device indices out of range, events across devices, and fork after npu use."""

from __future__ import annotations

import multiprocessing as mp
import re

import pytest
import torch

import npusim  # noqa: F401

OVERLAP = "unsupported operation: more than one element of the written-to tensor refers to a single memory location"


def _cpu_overlap_message() -> str:
    with pytest.raises(RuntimeError) as err:
        torch.zeros(1).expand(4).copy_(torch.randn(4))
    return str(err.value)


@pytest.mark.parametrize("non_blocking", [False, True])
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
def test_copy_into_expanded_destination_raises_at_call_time(direction, non_blocking):
    """Every direction raises CPU's own overlap message from copy_ itself, without a C++ backtrace."""
    dst_dev, src_dev = {"h2d": ("npu", "cpu"), "d2h": ("cpu", "npu"), "d2d": ("npu", "npu")}[direction]
    dst = torch.zeros(1, device=dst_dev).expand(4)
    src = torch.randn(4, device=src_dev)
    with pytest.raises(RuntimeError, match=re.escape(OVERLAP)) as err:
        dst.copy_(src, non_blocking=non_blocking)
    assert str(err.value).splitlines()[0] == _cpu_overlap_message().splitlines()[0]
    assert "frame #" not in str(err.value)
    torch.npu.synchronize()  # nothing failed asynchronously either
    assert dst.cpu().eq(0).all()


def test_asynchronous_failure_names_stream_and_op_without_backtrace(device_failure):
    """A copy task that fails on the stream reports the op and the stream, and only the message."""
    numel = 128 * 1024  # over the 64 KiB that the caller copies itself (Note [Work on an idle stream])
    dst = torch.empty(numel, dtype=torch.bits8, device="npu")
    torch.npu.synchronize()
    with pytest.raises(RuntimeError) as err:
        dst.copy_(torch.randn(numel))
        torch.npu.synchronize()
    message = str(err.value)
    assert "npusim: asynchronous work on npu:0 stream 0 (default)" in message and "copy_h2d failed" in message
    assert "frame #" not in message and "Exception raised from" not in message


def test_failure_of_a_copy_done_by_the_caller_names_stream_and_op_at_the_call():
    """A small copy on an idle stream runs in the call (Note [Work on an idle stream]): its failure raises there,
    naming the op and the stream as a task's would, and the stream has nothing pending to report later."""
    dst = torch.empty(4, dtype=torch.bits8, device="npu")
    torch.npu.synchronize()
    with pytest.raises(RuntimeError) as err:
        dst.copy_(torch.randn(4))
    message = str(err.value)
    assert message.startswith("npusim: copy_h2d on npu:0 stream 0 (default) failed: ")
    assert "frame #" not in message and "Exception raised from" not in message
    torch.npu.synchronize()  # nothing failed asynchronously


@pytest.mark.parametrize("make", [
    lambda bad: torch.ones(3, device="npu:200"),
    lambda bad: torch.ones(3, device=f"npu:{bad}"),
    lambda bad: torch.empty(3, device=f"npu:{bad + 2}"),
    lambda bad: torch.empty_strided((2,), (1,), device=f"npu:{bad + 4}"),
    lambda bad: torch.zeros(2).to(f"npu:{bad}"),
    lambda bad: torch.npu.set_device(bad),
    lambda bad: torch.npu.Event(device=bad),
    lambda bad: torch.npu.Stream(device=bad),
    lambda bad: torch.npu.synchronize(bad),
    lambda bad: torch.Generator(device=f"npu:{bad}"),
], ids=["factory-200", "factory-count", "empty", "empty_strided", "to", "set_device", "event", "stream",
        "synchronize", "generator"])
def test_device_index_out_of_range_raises(make):
    """An index at or above device_count() is rejected everywhere (npu:200 used to land on npu:0)."""
    with pytest.raises(RuntimeError, match="(?i)invalid npu device index"):
        make(torch.npu.device_count())


def test_event_messages_print_the_device_index_as_a_number():
    """An event re-recorded on another device's stream names both indices as numbers."""
    if torch.npu.device_count() < 2:
        pytest.skip("needs two npu devices (NPUSIM_DEVICE_COUNT >= 2)")
    event = torch.Event(device=torch.device("npu", 0))
    event.record(torch.npu.current_stream(0))
    with pytest.raises(RuntimeError, match="device index 0 does not match recording stream's device index 1") as err:
        event.record(torch.npu.current_stream(1))
    assert "\x00" not in str(err.value) and "\x01" not in str(err.value)


def test_elapsed_time_across_devices_raises():
    """elapsed_time between events of two devices raises, as on CUDA."""
    if torch.npu.device_count() < 2:
        pytest.skip("needs two npu devices (NPUSIM_DEVICE_COUNT >= 2)")
    start = torch.npu.Event(enable_timing=True, device=0)
    end = torch.npu.Event(enable_timing=True, device=1)
    start.record(torch.npu.current_stream(0))
    end.record(torch.npu.current_stream(1))
    torch.npu.synchronize(0)
    torch.npu.synchronize(1)
    with pytest.raises(RuntimeError, match="same device.*npu:0 and npu:1"):
        start.elapsed_time(end)


def _forked_child(results) -> None:
    report = {"bad_fork": torch.npu._is_in_bad_fork(), "cpu_ok": torch.ones(2).add(1).sum().item() == 4.0}
    try:
        torch.ones(3, device="npu").sum().item()
        report["error"] = None
    except RuntimeError as err:
        report["error"] = str(err)
    results.put(report)


def test_fork_after_npu_use_raises_in_the_child():
    """A child forked after the npu was used raises a clear error on its first device call instead of hanging."""
    torch.ones(2, device="npu").add_(1).cpu()  # the parent has used the npu
    assert not torch.npu._is_in_bad_fork()
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_forked_child, args=(results,))
    child.start()
    child.join(timeout=30)
    if child.is_alive():
        child.kill()
        child.join()
        raise AssertionError("the forked child hung on its first npu call")
    report = results.get(timeout=5)
    assert report["bad_fork"] and report["cpu_ok"]
    assert report["error"] is not None and "Cannot re-initialize npu in forked subprocess" in report["error"]
    assert "'spawn' start method" in report["error"]
