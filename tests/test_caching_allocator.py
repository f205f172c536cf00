"""The caching allocator, against CUDA's rules: small and large pools, rounding, best fit, splitting and
coalescing, blocks per stream, stream-ordered free, record_stream, oversize blocks, the retry before
OutOfMemoryError, CUDA's statistics, snapshots, and a cache that stays bounded when sizes keep changing.

Each test starts on npu:7 with an empty cache (``clean_npu``), so the expected figures are those CUDA's
allocator would report for the same sequence from a fresh process."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.cuda import _memory_viz

import npusim
from _allocator_util import DEVICE, KIB, MIB, blob, block_at, segment_of, stat, stats
from npusim.testing.alloc_patterns import conv2d_threads, shrinking_sizes


def test_small_requests_share_2_mib_segments_and_round_to_512_bytes(clean_npu):
    """Up to 1 MiB: rounded to 512 B, carved from 2 MiB small-pool segments; the rest is a free split block."""
    a = blob(1000)
    assert stats("allocated_bytes.small_pool.current", "requested_bytes.all.current",
                 "reserved_bytes.small_pool.current", "segment.small_pool.current") == (1024, 1000, 2 * MIB, 1)
    assert stats("inactive_split.small_pool.current", "inactive_split_bytes.all.current") == (1, 2 * MIB - 1024)
    b = blob(1)
    assert b.data_ptr() == a.data_ptr() + 1024  # best fit: the rest split off a
    assert stats("allocated_bytes.all.current", "segment.all.current", "allocation.all.current") == (1536, 1, 2)
    del a
    assert stats("inactive_split.all.current", "inactive_split_bytes.all.current") == (2, 2 * MIB - 512)
    del b  # both neighbours free: the segment is one free block again, still reserved
    assert stats("inactive_split.all.current", "inactive_split_bytes.all.current", "active.all.current",
                 "reserved_bytes.all.current", "num_device_alloc") == (0, 0, 0, 2 * MIB, 1)
    one = blob(MIB)  # the small pool's largest request
    assert segment_of(one.data_ptr())["segment_type"] == "small" and stat("segment.all.current") == 1
    more = blob(MIB + 1)
    assert segment_of(more.data_ptr())["segment_type"] == "large"
    assert stats("reserved_bytes.large_pool.current", "allocated_bytes.large_pool.current") == (20 * MIB, MIB + 512)


def test_large_requests_round_like_cuda(clean_npu):
    """Under 10 MiB: 20 MiB segments that requests share; from 10 MiB: the request rounded to 2 MiB, whose rest
    is split off only when over 1 MiB (a 33 MiB tensor counts 34 MiB, as torch_npu's test_roundup_power2_divisions)."""
    x = blob(33 * MIB)
    assert torch.npu.memory_allocated() == 34 * MIB
    assert stats("reserved_bytes.large_pool.current", "inactive_split.all.current",
                 "requested_bytes.all.current") == (34 * MIB, 0, 33 * MIB)
    y = blob(32 * MIB + 512 * KIB)  # a 34 MiB segment whose 1.5 MiB rest is split off
    assert stats("allocated_bytes.all.current", "reserved_bytes.all.current", "inactive_split_bytes.all.current") == (
        66 * MIB + 512 * KIB, 68 * MIB, MIB + 512 * KIB)
    del x, y
    torch.npu.empty_cache()
    six = [blob(6 * MIB) for _ in range(4)]  # three fit one 20 MiB segment (2 MiB left), the fourth needs another
    assert stats("segment.large_pool.current", "reserved_bytes.all.current", "allocated_bytes.all.current") == (
        2, 40 * MIB, 24 * MIB)
    assert {segment_of(t.data_ptr())["address"] for t in six[:3]} == {six[0].data_ptr()}


def test_best_fit_split_and_coalescing(clean_npu):
    """The smallest free block that fits is taken; a rest of 1 MiB or less stays with it; free neighbours merge."""
    a, b, c = blob(4 * MIB), blob(4 * MIB), blob(4 * MIB)  # one 20 MiB segment: a | b | c | 8 MiB free
    assert (b.data_ptr() - a.data_ptr(), c.data_ptr() - b.data_ptr()) == (4 * MIB, 4 * MIB)
    address = b.data_ptr()
    del b
    assert stats("inactive_split.large_pool.current", "inactive_split_bytes.large_pool.current") == (2, 12 * MIB)
    d = blob(3 * MIB)  # b's 4 MiB hole rather than the 8 MiB tail; its 1 MiB rest is not split off
    assert d.data_ptr() == address and stat("allocated_bytes.all.current") == 12 * MIB
    assert (block_at(address)["size"], block_at(address)["requested_size"]) == (4 * MIB, 3 * MIB)
    del a, d
    blocks = segment_of(address)["blocks"]
    assert [(blk["size"], blk["state"]) for blk in blocks] == [
        (8 * MIB, "inactive"), (4 * MIB, "active_allocated"), (8 * MIB, "inactive")]
    del c
    assert [blk["size"] for blk in segment_of(address)["blocks"]] == [20 * MIB]
    assert stats("inactive_split.all.current", "active.all.current") == (0, 0)


def test_best_fit_picks_the_freed_block_over_an_older_larger_hole(clean_npu):
    """A freed block stays cached; the next request of its size takes it, the smallest free block that fits,
    not an older larger one (CUDA's best fit by stream, size, address)."""
    old, keep1, x, keep2 = blob(768 * KIB), blob(4 * KIB), blob(512 * KIB), blob(4 * KIB)  # tail: 760 KiB
    address, reserved = x.data_ptr(), torch.npu.memory_reserved()
    del old, x
    assert torch.npu.memory_reserved() == reserved
    y = blob(512 * KIB)
    assert y.data_ptr() == address and stat("num_device_alloc") == 1
    z = blob(MIB + 512)  # the large pool: a segment of its own
    assert segment_of(z.data_ptr())["segment_type"] == "large" and stat("num_device_alloc") == 2
    assert keep1.numel() == keep2.numel() == 4 * KIB


def test_blocks_are_cached_per_stream(clean_npu):
    """A block freed on one stream is never handed to an allocation on another stream."""
    x = blob(3 * MIB)
    address = x.data_ptr()
    del x
    side = torch.npu.Stream()
    y = blob(3 * MIB, side)
    assert y.data_ptr() != address and segment_of(y.data_ptr())["stream"] == side.stream_id
    assert stat("num_device_alloc") == 2
    z = blob(3 * MIB)
    assert z.data_ptr() == address


@pytest.mark.asynchronous
def test_same_stream_reuse_while_its_own_work_is_pending(clean_npu):
    """A block whose only unfinished work is on its own stream is reused there at once, and results stay right;
    its segment goes back to the host only after that work."""
    a = torch.ones(MIB, device="npu")
    b = torch.empty_like(a)
    torch.npu.synchronize()
    address = a.data_ptr()
    with npusim.timing.model(copy_gbps=0.2, realtime=True):
        b.copy_(a)  # ~20 ms on the current stream, reading a
        del a
        assert torch.npu.current_stream().pending() > 0 and block_at(address)["state"] == "inactive"
        c = torch.empty(MIB, device="npu")
        assert c.data_ptr() == address  # stream order puts c's writes after the copy
        c.fill_(5.0)
        torch.npu.synchronize()
    assert b.cpu().eq(1).all() and c.cpu().eq(5).all()


@pytest.mark.asynchronous
def test_record_stream_delays_reuse_until_the_recorded_work_is_done(clean_npu):
    """A block freed while a recorded stream still has earlier work is not reused until that work finishes."""
    side = torch.npu.Stream()
    t = torch.full((MIB,), 3.0, device="npu")
    out = torch.empty_like(t)
    torch.npu.synchronize()
    address = t.data_ptr()
    with npusim.timing.model(copy_gbps=0.2, realtime=True):
        with torch.npu.stream(side):
            out.copy_(t)  # side reads t for ~20 ms
        t.record_stream(side)
        del t
        assert block_at(address)["state"] == "active_pending_free" and stat("active.all.current") == 2
        early = torch.empty(MIB, device="npu")
        assert side.pending() > 0 and early.data_ptr() != address
        side.synchronize()
    late = torch.empty(MIB, device="npu")
    assert late.data_ptr() == address
    assert out.cpu().eq(3).all()


def test_record_stream_rejects_a_stream_of_another_device():
    """record_stream with a stream of another npu names both devices."""
    t = torch.empty(16, device="npu:0")
    with pytest.raises(RuntimeError, match="record_stream: the stream is on npu:1 but the tensor's memory is on npu:0"):
        t.record_stream(torch.npu.Stream(device=1))


def test_memory_stats_have_cuda_keys_and_match_torch_accelerator(clean_npu):
    """memory_stats has exactly CUDA's flat keys (max_split_size -1 when unset), as torch.accelerator reports."""
    x = blob(1000)
    arrays = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
              "active_bytes", "inactive_split_bytes", "requested_bytes")
    expected = {f"{a}.{p}.{m}" for a in arrays for p in ("all", "small_pool", "large_pool")
                for m in ("current", "peak", "allocated", "freed")}
    expected |= {f"{o}.{m}" for o in ("oversize_allocations", "oversize_segments")
                 for m in ("current", "peak", "allocated", "freed")}
    expected |= {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
                 "max_split_size"}
    s = torch.npu.memory_stats()
    assert set(s) == expected and s == torch.accelerator.memory_stats(DEVICE)
    assert s["max_split_size"] == -1 and s["allocated_bytes.all.current"] == torch.npu.memory_allocated() == 1024
    assert torch.npu.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["current"] == 1024
    del x
    s = torch.npu.memory_stats()
    assert (s["allocation.all.allocated"], s["allocation.all.freed"], s["allocated_bytes.small_pool.peak"],
            s["segment.all.allocated"], s["reserved_bytes.all.current"]) == (1, 1, 1024, 1, 2 * MIB)


def test_max_split_size_makes_oversize_blocks_whole(clean_npu):
    """Blocks of max_split_size_mb or more are never split, serve only oversize requests at most
    max_non_split_rounding_mb (20) smaller, count as oversize, and are released first when a segment does not fit."""
    torch.npu.memory._set_allocator_settings("max_split_size_mb:40")
    try:
        x = blob(50 * MIB)
        assert stats("oversize_segments.current", "oversize_allocations.current", "max_split_size") == (
            1, 1, 40 * MIB)
        address = x.data_ptr()
        del x
        assert stats("oversize_segments.current", "oversize_allocations.current") == (1, 0)
        below = blob(30 * MIB)  # under max_split_size: not handed the oversize block
        assert below.data_ptr() != address and stat("segment.all.current") == 2
        whole = blob(45 * MIB)  # oversize and within 20 MiB: takes the 50 MiB block without splitting it
        assert whole.data_ptr() == address and block_at(address)["size"] == 50 * MIB
        assert stat("oversize_allocations.current") == 1
        del whole, below
        torch.npu.empty_cache()
        big = blob(72 * MIB)
        del big
        torch.npu.set_memory_capacity(torch.npu.memory_reserved() + 20 * MIB)
        freed, syncs = stats("num_device_free", "num_sync_all_streams")  # empty_cache synchronizes, as CUDA's
        far = blob(41 * MIB)  # 72 >= 42 + 20: not taken; the cached oversize block is released to make room
        assert stats("num_device_free", "num_alloc_retries", "num_sync_all_streams", "reserved_bytes.all.current") == (
            freed + 1, 0, syncs, 42 * MIB)
        assert far.numel() == 41 * MIB
    finally:
        torch.npu.memory._set_allocator_settings("")  # max_split_size_mb back to its default


def test_over_capacity_flushes_the_cache_and_retries(clean_npu):
    """A segment that fits only without the cache: wait for the streams, release every free segment, retry once."""
    cached = blob(12 * MIB)
    del cached
    torch.npu.set_memory_capacity(torch.npu.memory_reserved() + 2 * MIB)
    fits = blob(13 * MIB)  # a 14 MiB segment; the free 12 MiB block is too small
    assert stats("num_alloc_retries", "num_sync_all_streams", "num_device_free", "reserved_bytes.all.current") == (
        1, 1, 1, 14 * MIB)
    assert fits.numel() == 13 * MIB


def test_empty_cache_releases_every_free_segment(clean_npu):
    """empty_cache gives back every segment whose blocks are all free (once the streams are done), keeps the rest."""
    keep = torch.full((MIB // 2,), 7, dtype=torch.int32, device="npu")  # 2 MiB: a 20 MiB segment shared with ...
    rest = blob(6 * MIB)  # ... this block
    drop = [blob(14 * MIB), blob(512), blob(3 * MIB, torch.npu.Stream())]
    segments = stat("segment.all.current")
    del drop, rest
    torch.npu.empty_cache()
    assert stats("segment.all.current", "reserved_bytes.all.current", "num_device_free") == (
        segments - 3, 20 * MIB, 3)
    assert keep[-1].item() == 7


def test_mem_get_info_and_per_process_fraction():
    """mem_get_info is (capacity - reserved, capacity), the HBM size by default; the fraction caps reservations."""
    free, total = torch.npu.mem_get_info(1)
    assert total == 64 << 30 and free == total - torch.npu.memory_reserved(1)
    assert torch.accelerator.get_memory_info(1) == (free, total)
    torch.npu.set_memory_capacity("64MiB", 1)
    torch.npu.set_per_process_memory_fraction(0.5, 1)
    try:
        assert torch.npu.get_per_process_memory_fraction(1) == 0.5
        with pytest.raises(torch.OutOfMemoryError, match="npu:1"):
            torch.empty(40 * MIB, dtype=torch.uint8, device="npu:1")
        ok = torch.empty(20 * MIB, dtype=torch.uint8, device="npu:1")
        assert ok.numel() == 20 * MIB
    finally:
        torch.npu.set_per_process_memory_fraction(1.0, 1)
    with pytest.raises(TypeError, match="must be `float`"):
        torch.npu.set_per_process_memory_fraction(1, 1)
    with pytest.raises(ValueError, match="Allowed range: 0~1"):
        torch.npu.set_per_process_memory_fraction(1.5, 1)


def test_snapshot_segments_blocks_and_memory_viz(clean_npu, tmp_path):
    """memory_snapshot lists segments with their blocks in CUDA's format; the history and _dump_snapshot feed
    torch.cuda._memory_viz, whose accounting check (segsum) holds."""
    x = blob(1000)
    y = blob(4 * MIB)
    seg = segment_of(x.data_ptr())
    assert {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
            "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"} <= set(seg)
    assert (seg["total_size"], seg["allocated_size"], seg["requested_size"], seg["segment_pool_id"]) == (
        2 * MIB, 1024, 1000, (0, 0))
    assert [(b["size"], b["state"]) for b in seg["blocks"]] == [
        (1024, "active_allocated"), (2 * MIB - 1024, "inactive")]
    assert sum(b["size"] for b in segment_of(y.data_ptr())["blocks"]) == 20 * MIB
    torch.npu.memory._record_memory_history()  # noqa: SLF001  (torch.cuda's spelling)
    try:
        z = blob(18 * MIB)  # more than y's segment has free (16 MiB): a segment of its own
        del z, x
        snap = torch.npu.memory._snapshot()  # noqa: SLF001
        torch.npu.memory._dump_snapshot(str(tmp_path / "snap.pickle"))  # noqa: SLF001
    finally:
        torch.npu.memory._record_memory_history(enabled=None)  # noqa: SLF001
    actions = [(e["action"], e["size"]) for e in snap["device_traces"][DEVICE]]
    assert actions == [("segment_alloc", 18 * MIB), ("alloc", 18 * MIB), ("free_requested", 18 * MIB),
                       ("free_completed", 18 * MIB), ("free_requested", 1000), ("free_completed", 1000)]
    loaded = pickle.loads((tmp_path / "snap.pickle").read_bytes())
    summary = _memory_viz.segsum(loaded)  # raises when blocks and segments do not add up
    assert "total_reserved" in summary and "stream" not in _memory_viz.trace(loaded).splitlines()[0]
    assert "<html>" in _memory_viz.trace_plot(loaded).lower()


def test_snapshot_with_fx_traces_and_torch_npu_memory_viz(clean_npu, tmp_path):
    """_snapshot / _dump_snapshot take torch.cuda's augment_with_fx_traces (the snapshot, run through torch's FX
    augmentation, keeps its segments); torch_npu.npu._memory_viz's flame graphs (torch_npu's
    format_flamegraph_func) list each live block of the npu snapshot under its stream and segment."""
    from npusim.runtime import memory_viz

    x = blob(1000)
    plain = torch.npu.memory._snapshot()  # noqa: SLF001
    augmented = torch.npu.memory._snapshot(augment_with_fx_traces=True)  # noqa: SLF001
    assert augmented["segments"] == plain["segments"] and set(augmented) == set(plain)
    torch.npu.memory._dump_snapshot(str(tmp_path / "fx.pickle"), augment_with_fx_traces=True)  # noqa: SLF001
    assert pickle.loads((tmp_path / "fx.pickle").read_bytes())["segments"] == plain["segments"]
    seg = segment_of(x.data_ptr())
    lines = memory_viz.segments(augmented, format_flamegraph_func=lambda text: text.splitlines())
    assert f"stream_0;seg_{seg['address']};active_allocated;<non-python> 1000" in lines
    by_stream = memory_viz.memory(augmented, format_flamegraph_func=lambda text: text)
    assert "stream_0;active_allocated;<non-python> 1000" in by_stream
    with pytest.raises(ValueError, match="expected a snapshot of torch.npu.memory._snapshot"):
        memory_viz.segments({"device_traces": []})
    assert memory_viz._block_extra is _memory_viz._block_extra  # noqa: SLF001  (torch_npu's tests import it)


def test_cache_stays_bounded_when_sizes_keep_changing(clean_npu):
    """Issue 24's loop over shrinking sizes (500 sizes from 5 MiB down to 0.6 MiB: the exact-size cache reserved
    every one, about 1400 MiB) and conv2d from two threads with shrinking images (4481 MiB for 512x512 images,
    200 calls) reserve a few segments, not one per size."""
    shrinking_sizes(500, 5 * MIB, DEVICE, bottom_bytes=600 * KIB)
    # one 20 MiB large-pool segment that every size over 1 MiB is split from, one 2 MiB small-pool segment for the rest
    assert stats("reserved_bytes.all.peak", "segment.all.peak", "num_device_alloc") == (22 * MIB, 2, 2)
    torch.npu.empty_cache()
    torch.npu.reset_peak_memory_stats()
    conv2d_threads(512, 200, threads=2, trials=1, device=DEVICE)
    # each stream's host runs ahead of the other stream: its deferred frees are bounded (Note [Bounded deferred
    # frees]; without the bound, 210 MiB here and growing with the calls)
    assert stat("reserved_bytes.all.peak") <= 96 * MIB
