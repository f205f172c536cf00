"""Streams and events: FIFO order, cross-stream ordering, honest queries, copy_ asynchrony.

The timing model slows device copies so that an ordering bug would show up as
a wrong value instead of passing by luck.
"""

from __future__ import annotations

import time

import pytest
import torch

import npusim

MIB = 1 << 20


def slow_copies():
    # 0.05 GB/s: a 4 MiB copy takes about 84 ms of stream time, held in real time too, so that
    # the host's view of pending work can be checked (Note [Chip clock]: realtime).
    return npusim.timing.model(copy_gbps=0.05, realtime=True)


@pytest.mark.asynchronous
def test_same_device_copy_returns_before_it_completes():
    """A same-device D2D copy_ is enqueued: the host returns first, synchronize shows the result."""
    src = torch.full((MIB,), 7.0, device="npu")
    dst = torch.zeros(MIB, device="npu")
    torch.npu.synchronize()
    with slow_copies():
        start = time.perf_counter()
        dst.copy_(src)  # non_blocking=False: still asynchronous, as on CUDA
        returned = time.perf_counter() - start
        stream = torch.npu.current_stream()
        assert not stream.query() and stream.pending() == 1
        torch.npu.synchronize()
        finished = time.perf_counter() - start
    assert returned < 0.02 < 0.06 < finished
    assert dst.cpu().eq(7.0).all()


def test_stream_fifo_order():
    """Work on one stream runs in issue order: a later copy sees an earlier slow one."""
    a = torch.full((MIB,), 1.0, device="npu")
    b = torch.zeros(MIB, device="npu")
    c = torch.zeros(MIB, device="npu")
    torch.npu.synchronize()
    with slow_copies():
        b.copy_(a)  # slow
        c.copy_(b)  # must read b after the first copy finished
        torch.npu.synchronize()
    assert c.cpu().eq(1.0).all()


def test_cross_stream_order_via_event():
    """A side stream waiting on an event sees the producer stream's slow write."""
    a = torch.full((MIB,), 3.0, device="npu")
    b = torch.zeros(MIB, device="npu")
    c = torch.zeros(MIB, device="npu")
    side = torch.npu.Stream()
    torch.npu.synchronize()
    with slow_copies():
        b.copy_(a)
        done = torch.npu.Event()
        done.record()
        side.wait_event(done)
        with torch.npu.stream(side):
            c.copy_(b)
        side.synchronize()
    assert c.cpu().eq(3.0).all()


def test_wait_stream_orders_compute_after_side_stream():
    """current.wait_stream(side) makes host compute wait for the side stream's copy."""
    a = torch.full((MIB,), 5.0, device="npu")
    b = torch.zeros(MIB, device="npu")
    side = torch.npu.Stream(priority=-1)
    assert side.priority == -1
    side.wait_stream(torch.npu.current_stream())  # a and b are filled on the current stream
    with slow_copies():
        with torch.npu.stream(side):
            b.copy_(a)
        torch.npu.current_stream().wait_stream(side)
        total = b.sum().item()  # compute runs after the current stream's queued work
    assert total == 5.0 * MIB


@pytest.mark.asynchronous
def test_event_query_synchronize_and_elapsed_time():
    """Events report pending work honestly and time it (timing model)."""
    a = torch.ones(4 * MIB, device="npu")
    b = torch.empty_like(a)
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    with slow_copies():
        start.record()
        b.copy_(a)
        end.record()
        assert not end.query()
        end.synchronize()
        assert end.query()
    assert end.device == torch.device("npu", 0)
    assert start.elapsed_time(end) >= 250  # 16 MiB at 0.05 GB/s ~ 335 ms


def test_elapsed_time_requires_timing():
    """elapsed_time without enable_timing is an error naming the requirement."""
    a, b = torch.npu.Event(), torch.npu.Event()
    a.record()
    b.record()
    b.synchronize()
    with pytest.raises(ValueError, match="enable_timing=True"):
        a.elapsed_time(b)


def test_generic_stream_event_and_accelerator_api():
    """torch.Stream / torch.Event / torch.accelerator drive the npu device."""
    s = torch.Stream(device="npu")
    with s:
        assert torch.accelerator.current_stream() == s
        x = torch.ones(10, device="npu") * 2
    e = torch.Event(device="npu")
    e.record(s)
    torch.accelerator.current_stream().wait_event(e)
    torch.accelerator.synchronize()
    assert x.sum().item() == 20.0 and s.query()


@pytest.mark.asynchronous
def test_synchronize_timeout_names_stream():
    """A stream synchronize with a timeout raises an error naming the stream."""
    a = torch.ones(MIB, device="npu")
    b = torch.empty_like(a)
    with slow_copies():
        b.copy_(a)
        with pytest.raises(RuntimeError, match=r"npu:0 stream 0 \(default\) did not finish"):
            torch.npu.synchronize_stream(torch.npu.current_stream(), timeout_s=0.001)


@pytest.mark.asynchronous
@pytest.mark.parametrize("non_blocking", [False, True])
def test_host_to_device(non_blocking):
    """H2D: blocking waits; non_blocking enqueues; pageable sources are staged at call time."""
    src = torch.full((MIB,), 2.0)
    dst = torch.zeros(MIB, device="npu")
    torch.npu.synchronize()
    with slow_copies():
        dst.copy_(src, non_blocking=non_blocking)
        pending = torch.npu.current_stream().pending()
        src.fill_(-1.0)  # the caller reuses the pageable buffer at once
        torch.npu.synchronize()
    assert pending == (1 if non_blocking else 0)
    assert dst.cpu().eq(2.0).all()


@pytest.mark.asynchronous
@pytest.mark.parametrize("non_blocking", [False, True])
def test_device_to_host_pinned(non_blocking):
    """D2H into pinned memory: blocking waits; non_blocking is valid after synchronize."""
    src = torch.full((MIB,), 4.0, device="npu")
    dst = torch.zeros(MIB).pin_memory()
    torch.npu.synchronize()
    with slow_copies():
        dst.copy_(src, non_blocking=non_blocking)
        done_at_return = bool(dst[-1] == 4.0)
        torch.npu.synchronize()
    assert done_at_return is (not non_blocking)
    assert dst.eq(4.0).all()


@pytest.mark.asynchronous
def test_pinned_source_is_read_by_the_stream_later():
    """A non_blocking H2D from pinned memory reads the source when the stream runs."""
    gate = torch.ones(4 * MIB, device="npu")
    sink = torch.empty_like(gate)
    src = torch.full((16,), 1.0).pin_memory()
    dst = torch.zeros(16, device="npu")
    with slow_copies():
        sink.copy_(gate)  # keeps the stream busy
        dst.copy_(src, non_blocking=True)
        src.fill_(9.0)  # pinned memory is not staged: the stream reads the new value
        torch.npu.synchronize()
    assert dst.cpu().eq(9.0).all()


def test_overlapping_copy_is_rejected_like_cpu():
    """copy_ between overlapping views of one npu tensor raises CPU's overlap error and leaves dst untouched."""
    x = torch.arange(10.0, device="npu")
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        x[1:].copy_(x[:-1])
    assert torch.equal(x.cpu(), torch.arange(10.0))
    y = torch.arange(4.0, device="npu")
    y.copy_(y)  # the same view: a no-op, as on CPU
    assert torch.equal(y.cpu(), torch.arange(4.0))


@pytest.mark.asynchronous
def test_events_on_an_idle_stream_complete_on_the_host():
    """Note [Work on an idle stream]: a record on an idle stream and a wait for a completed event
    enqueue no task; on a busy stream both stay stream tasks, in order."""
    side = torch.npu.Stream()
    torch.npu.synchronize()
    stream = torch.npu.current_stream()
    done = torch.npu.Event()
    done.record()
    assert done.query() and stream.pending() == 0
    side.wait_event(done)
    assert side.pending() == 0
    src = torch.full((MIB,), 2.0, device="npu")
    dst = torch.zeros(MIB, device="npu")
    torch.npu.synchronize()
    with slow_copies():
        dst.copy_(src)
        busy = torch.npu.Event()
        busy.record()
        assert not busy.query() and stream.pending() == 2  # the copy, then the record
        side.wait_event(busy)
        assert side.pending() == 1
        side.synchronize()
        assert busy.query()
    assert dst.cpu().eq(2.0).all()


def test_events_stay_stream_tasks_under_the_profiler():
    """While torch.profiler records npu activities, a record on an idle stream is still a device task,
    so the trace shows it on the stream's row."""
    from torch.profiler import ProfilerActivity

    torch.npu.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        done = torch.npu.Event()
        done.record()
        torch.npu.synchronize()
    assert done.query()
    records = [e for e in prof.events() if e.name == "event_record"]
    assert [(e.device_type, e.device_resource_id) for e in records] == [(torch.autograd.DeviceType.PrivateUse1, 0)]


@pytest.mark.small_ops_on_the_host
def test_small_copies_on_an_idle_stream_are_done_by_the_caller():
    """Note [Work on an idle stream]: a small copy on an idle stream is no stream task; a large one, or one
    under the timing model, is. Values are right either way."""
    from npusim.runtime import acl

    stream = torch.npu.current_stream()

    def tasks() -> int:
        return acl.stream_enqueued(stream.stream_id, stream.device_index)

    small = torch.arange(16.0)
    torch.npu.synchronize()
    before = tasks()
    on_npu = small.to("npu")  # H2D
    copied = torch.empty_like(on_npu).copy_(on_npu)  # D2D
    back = copied.cpu()  # D2H
    assert tasks() == before
    assert torch.equal(back, small)
    large = torch.zeros(64 * 1024 // 4 + 1, device="npu")  # just over 64 KiB
    ones = torch.ones_like(large)
    torch.npu.synchronize()
    before = tasks()
    large.copy_(ones)
    assert tasks() == before + 1
    torch.npu.synchronize()
    doubled = on_npu * 2
    with slow_copies():
        copied.copy_(doubled)
        assert tasks() == before + 2
        torch.npu.synchronize()
    assert torch.equal(copied.cpu(), small * 2)


def test_wrapping_a_stream_refuses_a_triple_that_names_none():
    """Stream(stream_id=, device_index=, device_type=) wraps an existing npu stream and refuses an impossible
    triple naming the call, the device and what was expected (device_index 999 was stored as npu:-25), with
    torch_npu's RuntimeError (and -1 too, which torch_npu's argument parser may refuse as OverflowError)."""
    side = torch.npu.Stream()
    wrapped = torch.npu.Stream(stream_id=side.stream_id, device_index=side.device_index, device_type=side.device_type)
    assert wrapped == side and wrapped.priority == side.priority
    npu = side.device_type
    with pytest.raises(RuntimeError, match=r"torch.npu.Stream\(stream_id=3, device_index=999, device_type=20\): "
                                         r"device_index must name an npu device, 0 <= index < device_count\(\) = "
                                         rf"{torch.npu.device_count()}, got 999"):
        torch.npu.Stream(stream_id=3, device_index=999, device_type=npu)
    with pytest.raises(RuntimeError, match=rf"device_type must be the npu's \({npu}\), got 1"):
        torch.npu.Stream(stream_id=3, device_index=0, device_type=1)
    with pytest.raises(RuntimeError, match=r"stream_id must name a stream of npu:0, 0 <= id < 17 .* got 17"):
        torch.npu.Stream(stream_id=17, device_index=0, device_type=npu)
    with pytest.raises(RuntimeError, match="device_index must name an npu device"):
        torch.npu.Stream(stream_id=0, device_index=-1, device_type=npu)
    with pytest.raises(TypeError, match="takes exactly stream_id, device_index and device_type; got"):
        torch.npu.Stream(stream_id=1)


def test_sync_launch_streams_and_raw_handles():
    """SyncLaunchStream and Stream(is_sync_launch=1) are pool streams that run work in order; a sync-launch stream
    equals only sync-launch streams; npu_stream is the raw stream torch_npu._C hands out while it is current."""
    from npusim.compile.generated_calls import get_raw_stream

    sync = torch.npu.SyncLaunchStream()
    flagged = torch.npu.Stream(is_sync_launch=1)
    assert isinstance(flagged, torch.npu.Stream) and not isinstance(sync, torch.npu.Stream)
    same_id = torch.npu.Stream(stream_id=sync.stream_id, device_index=0, device_type=sync.device_type)
    assert sync == torch.npu.SyncLaunchStream(stream_id=sync.stream_id, device_index=0, device_type=sync.device_type)
    assert sync != same_id and same_id != sync and hash(sync) == hash(same_id)
    assert repr(sync).startswith("<torch.npu.SyncLaunchStream device=npu:0 stream_id=")
    x = torch.ones(64, device="npu")
    for s in (sync, flagged):
        with torch.npu.stream(s):
            assert get_raw_stream(0) == s.npu_stream == s.stream_id
            y = (x + 1) * 3
        s.synchronize()
        assert y.sum().item() == 64 * 6
    assert torch.npu.default_stream().npu_stream == 0
