"""The caching allocator: reuse by size class and stream, empty_cache, record_stream, capacity, settings."""

from __future__ import annotations

import pytest
import torch

import npusim
from npusim import config
from test_device import run_python

MIB = 1 << 20


def _stat(key: str, device: int = 0) -> int:
    return torch.npu.memory_stats(device)[key]


def test_freed_block_is_reused_by_the_same_size_and_stream():
    """A freed block is cached (reserved stays) and the next allocation of its size on its stream gets it."""
    torch.npu.synchronize()
    x = torch.empty(MIB, dtype=torch.uint8, device="npu")
    address, reserved, segments = x.data_ptr(), torch.npu.memory_reserved(), _stat("num_device_alloc")
    del x
    assert torch.npu.memory_reserved() == reserved >= torch.npu.memory_allocated() + MIB
    y = torch.empty(MIB, dtype=torch.uint8, device="npu")
    assert y.data_ptr() == address and _stat("num_device_alloc") == segments
    z = torch.empty(MIB + 512, dtype=torch.uint8, device="npu")  # another size class: a new segment
    assert z.data_ptr() != address and _stat("num_device_alloc") == segments + 1


def test_blocks_are_cached_per_stream():
    """A block freed on one stream is not handed to an allocation on another stream."""
    torch.npu.synchronize()
    x = torch.empty(3 * MIB, dtype=torch.uint8, device="npu")
    address = x.data_ptr()
    del x
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        y = torch.empty(3 * MIB, dtype=torch.uint8, device="npu")
    assert y.data_ptr() != address
    z = torch.empty(3 * MIB, dtype=torch.uint8, device="npu")
    assert z.data_ptr() == address


def test_empty_cache_returns_unused_blocks():
    """empty_cache gives cached blocks back (reserved and segment counts drop) and keeps live ones."""
    torch.npu.synchronize()
    torch.npu.empty_cache()
    keep = torch.empty(2 * MIB, dtype=torch.uint8, device="npu")
    drop = torch.empty(5 * MIB, dtype=torch.uint8, device="npu")
    reserved, segments = torch.npu.memory_reserved(), _stat("segment.large_pool.current")
    del drop
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() == reserved - 5 * MIB
    assert _stat("segment.large_pool.current") == segments - 1
    assert keep.fill_(7)[-1].item() == 7


def test_same_stream_reuse_while_its_own_work_is_pending():
    """A block whose only unfinished work is on its own stream is reused there at once, and results stay right."""
    a = torch.ones(MIB, device="npu")
    b = torch.empty_like(a)
    torch.npu.synchronize()
    address = a.data_ptr()
    with npusim.timing.model(copy_gbps=0.2):
        b.copy_(a)  # ~20 ms on the current stream, reading a
        del a
        assert torch.npu.current_stream().pending() > 0
        c = torch.empty(MIB, device="npu")
        assert c.data_ptr() == address  # stream order puts c's writes after the copy
        c.fill_(5.0)
        torch.npu.synchronize()
    assert b.cpu().eq(1).all() and c.cpu().eq(5).all()


def test_record_stream_delays_reuse_until_the_recorded_work_is_done():
    """A block freed while a recorded stream still has earlier work is not reused until that work finishes."""
    side = torch.npu.Stream()
    t = torch.full((MIB,), 3.0, device="npu")
    out = torch.empty_like(t)
    torch.npu.synchronize()
    address = t.data_ptr()
    with npusim.timing.model(copy_gbps=0.2):
        with torch.npu.stream(side):
            out.copy_(t)  # side reads t for ~20 ms
        t.record_stream(side)
        del t
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


def test_memory_stats_have_cuda_keys_and_match_torch_accelerator():
    """memory_stats returns CUDA's flat keys, the same as torch.accelerator.memory_stats."""
    x = torch.empty(1000, dtype=torch.uint8, device="npu")
    stats = torch.npu.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.small_pool.peak", "reserved_bytes.large_pool.freed",
                "active_bytes.all.current", "segment.all.current", "allocation.all.allocated",
                "requested_bytes.all.current", "num_alloc_retries", "num_ooms", "num_device_alloc"):
        assert key in stats, key
    assert stats == torch.accelerator.memory_stats(0)
    assert stats["allocated_bytes.all.current"] == torch.npu.memory_allocated() >= 1024  # rounded to 512 bytes
    assert torch.npu.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["current"] == torch.npu.memory_allocated()
    del x


def test_over_capacity_flushes_the_cache_and_retries():
    """An allocation that fits only without the cache frees it first (num_alloc_retries) instead of failing."""
    torch.npu.synchronize()
    torch.npu.empty_cache()
    cached = torch.empty(6 * MIB, dtype=torch.uint8, device="npu")
    del cached
    retries = _stat("num_alloc_retries")
    torch.npu.set_memory_capacity(torch.npu.memory_reserved() + 2 * MIB)
    fits = torch.empty(7 * MIB, dtype=torch.uint8, device="npu")
    assert _stat("num_alloc_retries") == retries + 1 and fits.numel() == 7 * MIB


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


def test_memory_summary_and_snapshot():
    """memory_summary tabulates the stats; memory_snapshot lists segments with their blocks' states."""
    x = torch.empty(2 * MIB, dtype=torch.uint8, device="npu")
    summary = torch.npu.memory_summary()
    assert "Allocated memory" in summary and "npu:0" in summary and "from large pool" in summary
    segments = {s["address"]: s for s in torch.npu.memory_snapshot()}
    mine = segments[x.data_ptr()]
    assert mine["total_size"] == 2 * MIB and mine["segment_type"] == "large"
    assert mine["blocks"][0]["state"] == "active_allocated"
    address = x.data_ptr()
    del x
    torch.npu.synchronize()
    torch.npu.memory._record_memory_history()  # noqa: SLF001  (torch.cuda's spelling)
    try:
        y = torch.empty(4096, dtype=torch.uint8, device="npu:2")
        del y
        snap = torch.npu.memory._snapshot()  # noqa: SLF001
    finally:
        torch.npu.memory._record_memory_history(enabled=None)  # noqa: SLF001
    assert {s["address"]: s for s in snap["segments"]}[address]["blocks"][0]["state"] == "inactive"
    actions = [e["action"] for e in snap["device_traces"][2]]
    assert actions[:2] == ["segment_alloc", "alloc"] and "free_requested" in actions


def test_alloc_conf_parsing():
    """PYTORCH_NPU_ALLOC_CONF: known keys parsed, unknown keys and bad values rejected with the variable named."""
    conf = config.parse_alloc_conf("max_split_size_mb:128, garbage_collection_threshold:0.6,roundup_power2_divisions:4")
    assert (conf.max_split_size, conf.garbage_collection_threshold, conf.roundup_power2_divisions) == (
        128 << 20, 0.6, 4)
    assert config.parse_alloc_conf("expandable_segments:True").expandable_segments
    with pytest.raises(config.ConfigError, match="PYTORCH_NPU_ALLOC_CONF: expected comma-separated key:value "
                                                 "with keys .*max_split_size_mb.*got 'nonsense:1'"):
        config.parse_alloc_conf("nonsense:1")
    with pytest.raises(config.ConfigError, match="garbage_collection_threshold: expected a number in"):
        config.parse_alloc_conf("garbage_collection_threshold:1.5")


def test_alloc_conf_is_honoured_in_a_fresh_process():
    """roundup_power2_divisions rounds request sizes; a nonsense key stops the import with the variable named."""
    code = """
        import torch, npusim
        x = torch.empty(1100 * 1024, dtype=torch.uint8, device="npu")
        print(torch.npu.memory_allocated())
    """
    result = run_python(code, env={"PYTORCH_NPU_ALLOC_CONF": "roundup_power2_divisions:4"})
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == 1280 * 1024  # 1 MiB + a quarter
    result = run_python("import npusim", env={"PYTORCH_NPU_ALLOC_CONF": "max_split_size:5"})
    assert result.returncode != 0 and "PYTORCH_NPU_ALLOC_CONF" in result.stderr
