"""Device memory accounting, capacity and the out-of-memory error."""

from __future__ import annotations

import gc

import pytest
import torch

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _collect_earlier_garbage() -> None:
    """Earlier tests' tracebacks hold npu tensors in reference cycles; freed mid-test they would skew the counts."""
    gc.collect()


def test_allocated_peak_and_reset():
    """memory_allocated / max_memory_allocated track live tensors; reset_peak works."""
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    torch.npu.reset_peak_memory_stats()
    x = torch.empty(MIB, dtype=torch.uint8, device="npu")
    assert torch.npu.memory_allocated() == base + MIB
    y = torch.empty(2 * MIB, dtype=torch.uint8, device="npu")
    assert torch.npu.max_memory_allocated() == base + 3 * MIB
    del x, y
    assert torch.npu.memory_allocated() == base
    assert torch.npu.max_memory_allocated() == base + 3 * MIB
    torch.npu.reset_peak_memory_stats()
    assert torch.npu.max_memory_allocated() == base
    assert torch.accelerator.memory_allocated("npu") == base


def test_accounting_is_per_device():
    """Allocations on npu:1 count on npu:1 only."""
    before0, before1 = torch.npu.memory_allocated(0), torch.npu.memory_allocated(1)
    t = torch.empty(MIB, dtype=torch.uint8, device="npu:1")
    assert torch.npu.memory_allocated(1) == before1 + MIB
    assert torch.npu.memory_allocated(0) == before0
    del t


def test_compute_outputs_are_accounted():
    """Fresh outputs of compute ops (CPU kernels on device memory) count as device memory."""
    a = torch.ones(MIB // 4, device="npu")
    before = torch.npu.memory_allocated()
    b = a * 2
    assert torch.npu.memory_allocated() == before + MIB
    del b
    assert torch.npu.memory_allocated() == before


def test_out_of_memory_error_and_recovery():
    """Going over capacity raises OutOfMemoryError (torch.npu.OutOfMemoryError, torch's class as torch.cuda's)
    naming device, request and free bytes; work goes on."""
    torch.npu.synchronize()
    torch.npu.empty_cache()  # cached blocks would be flushed to make room (test_caching_allocator.py)
    used = torch.npu.memory_reserved()
    torch.npu.set_memory_capacity(used + 24 * MIB)
    keep = torch.empty(12 * MIB, dtype=torch.uint8, device="npu")  # from 10 MiB: a segment of its own
    assert torch.npu.OutOfMemoryError is torch.OutOfMemoryError is torch.cuda.OutOfMemoryError
    with pytest.raises(torch.npu.OutOfMemoryError) as info:
        torch.empty(14 * MIB, dtype=torch.uint8, device="npu")
    message = str(info.value)
    # torch_npu's first sentence (frameworks and torch_npu's tests match it), then npusim's detail
    assert message.startswith("NPU out of memory. Tried to allocate 14.00 MiB (NPU 0; ")
    assert "total capacity; " in message and "already allocated; " in message and "current active; " in message
    assert "12.00 MiB free; " in message and "reserved in total by PyTorch). On npu:0, " in message
    assert "npu:0" in message and "14.00 MiB (14680064 bytes)" in message
    assert "12.00 MiB free (12582912 bytes)" in message
    assert torch.npu.memory_stats()["num_ooms"] >= 1 and "npu:0" in torch.npu.memory_summary()
    del keep
    again = torch.empty(14 * MIB, dtype=torch.uint8, device="npu")  # the process carries on
    assert again.numel() == 14 * MIB
    torch.npu.set_memory_capacity("1GiB", 1)
    assert torch.npu.mem_get_info(1)[1] == 1 << 30


def test_free_is_deferred_while_a_stream_may_use_the_block():
    """A block freed while queued work may touch it stays reserved until the stream passes."""
    import npusim

    a = torch.ones(4 * MIB, device="npu")
    b = torch.empty_like(a)
    torch.npu.synchronize()
    torch.npu.empty_cache()
    reserved = torch.npu.memory_reserved()
    with npusim.timing.model(copy_gbps=0.1, realtime=True):
        b.copy_(a)
        del a  # the pending copy still reads a's bytes
        assert torch.npu.memory_reserved() == reserved
        torch.npu.synchronize()
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() == reserved - 16 * MIB
    assert b.cpu().eq(1).all()


def test_storage_resize_to_zero_and_back():
    """untyped_storage().resize_(0) frees device memory and resize_(n) re-allocates (FSDP2's pattern)."""
    t = torch.ones(MIB // 4, device="npu")
    before = torch.npu.memory_allocated()
    t.untyped_storage().resize_(0)
    assert torch.npu.memory_allocated() == before - MIB
    t.untyped_storage().resize_(MIB)
    t.fill_(3.0)
    assert torch.npu.memory_allocated() == before and t.sum().item() == 3.0 * (MIB // 4)


def _state(address: int) -> str:
    """The state of the block that holds ``address`` (a freed block may have merged with its free neighbours)."""
    for segment in torch.npu.memory_snapshot():
        for block in segment["blocks"]:
            if segment["device"] == 0 and block["address"] <= address < block["address"] + block["size"]:
                return block["state"]
    return "released"


@pytest.mark.asynchronous
def test_a_block_freed_under_another_streams_work_is_handed_out_after_it():
    """A block freed while another stream's queued copy reads it is free at once, as on CUDA (the snapshot
    shows it inactive and allocated drops), so the allocations that follow choose blocks as a computing
    run with the same program does whatever the streams' pace (Note [Stream-ordered free]); one that takes
    it returns only once that stream has passed the copy, so the copy reads the freed tensor's values."""
    import npusim

    side = torch.npu.Stream()
    src = torch.full((1024,), 5.0, device="npu")
    dst = torch.empty(1024, device="npu")
    torch.npu.synchronize()
    with npusim.timing.model(launch_us=20000, realtime=True):
        with torch.npu.stream(side):
            gate = torch.empty(16, device="npu")
            gate.copy_(torch.ones(16, device="npu"))  # a slow task ahead of the real copy
            dst.copy_(src)
        address = src.data_ptr()
        allocated = torch.npu.memory_allocated()
        del src
        assert side.pending() > 0
        assert _state(address) == "inactive" and torch.npu.memory_allocated() == allocated - 4096
        again = torch.empty(1024, device="npu")  # the best fit: src's block, handed out after side's copy
        assert again.data_ptr() == address and side.pending() == 0
        again.fill_(7.0)
        torch.npu.synchronize()
    assert dst.cpu().eq(5.0).all() and again.cpu().eq(7.0).all()


def test_memory_functions_survive_torch_accelerator_built_from_torch_npu(monkeypatch):
    """MindSpeed-LLM's FSDP2 backend replaces ``torch.accelerator`` by a module whose every name is ``torch.npu``'s
    where torch.npu has it (mindspeed_llm/fsdp2/utils/device.py): torch.npu's memory functions then still answer
    (no recursion through torch.accelerator), with the allocator's own figures."""
    import sys
    import types

    torch.npu.synchronize()
    expected_stats = torch.accelerator.memory_stats(0)
    expected_info = torch.accelerator.get_memory_info(0)
    replacement = types.ModuleType("torch.accelerator")
    for name in dir(torch.accelerator):
        if not name.startswith("__"):
            setattr(replacement, name, getattr(torch.npu, name, getattr(torch.accelerator, name)))
    assert replacement.memory_stats is torch.npu.memory_stats  # the pattern that recursed
    monkeypatch.setattr(torch, "accelerator", replacement)
    monkeypatch.setitem(sys.modules, "torch.accelerator", replacement)
    assert torch.npu.memory_stats(0) == expected_stats
    assert torch.npu.mem_get_info(0) == expected_info
    base = torch.npu.memory_allocated(0)
    x = torch.empty(MIB, dtype=torch.uint8, device="npu:0")
    assert torch.accelerator.memory_allocated(0) == base + MIB
    assert torch.accelerator.memory_stats(0)["allocated_bytes.all.current"] == base + MIB
    assert torch.accelerator.max_memory_allocated(0) >= base + MIB
    assert torch.npu.memory_stats_as_nested_dict(0)["allocated_bytes"]["all"]["current"] == base + MIB
    assert torch.accelerator.memory_reserved(0) >= base + MIB
    torch.accelerator.reset_peak_memory_stats(0)
    assert torch.accelerator.max_memory_allocated(0) == base + MIB
    assert torch.npu.mem_get_info(0)[1] == expected_info[1]
    del x


def test_pinned_host_memory_stats_have_cudas_keys_and_resets():
    """torch.npu.host_memory_stats reports CUDA's keys for pinned memory, counting each pin_memory() block from its
    allocation to the host's free; reset_peak_host_memory_stats sets each peak to its current value and
    reset_accumulated_host_memory_stats zeroes the allocated / freed history, as torch.cuda's do (torch_npu's
    test_aclgraph_pin_memory calls both in its setUp)."""
    torch.npu.synchronize()
    gc.collect()
    torch.npu.reset_accumulated_host_memory_stats()
    torch.npu.reset_peak_host_memory_stats()
    before = torch.npu.host_memory_stats()
    assert before["allocations.allocated"] == before["allocations.freed"] == 0
    assert before["num_host_alloc"] == before["num_host_free"] == 0
    a, b = torch.empty(1000, dtype=torch.uint8).pin_memory(), torch.empty(24, dtype=torch.uint8).pin_memory()
    stats = torch.npu.host_memory_stats()
    for stat in ("allocations", "active_requests"):
        assert stats[f"{stat}.current"] == before[f"{stat}.current"] + 2
        assert stats[f"{stat}.allocated"] == 2 and stats[f"{stat}.freed"] == 0
    for stat in ("allocated_bytes", "active_bytes"):
        assert stats[f"{stat}.current"] == before[f"{stat}.current"] + 1024
        assert stats[f"{stat}.allocated"] == 1024
    assert stats["num_host_alloc"] == 2
    del a
    stats = torch.npu.host_memory_stats()
    assert stats["allocations.current"] == before["allocations.current"] + 1 and stats["allocations.freed"] == 1
    assert stats["allocated_bytes.peak"] == before["allocated_bytes.current"] + 1024
    assert stats["allocated_bytes.current"] == before["allocated_bytes.current"] + 24 and stats["num_host_free"] == 1
    torch.npu.reset_peak_host_memory_stats()
    assert torch.npu.host_memory_stats()["allocated_bytes.peak"] == before["allocated_bytes.current"] + 24
    torch.npu.reset_accumulated_host_memory_stats()
    stats = torch.npu.host_memory_stats()
    assert stats["allocations.allocated"] == stats["allocations.freed"] == stats["num_host_alloc"] == 0
    assert stats["allocations.current"] == before["allocations.current"] + 1  # current values stay
    nested = torch.npu.host_memory_stats_as_nested_dict()
    assert nested["allocations"]["current"] == stats["allocations.current"]
    del b
