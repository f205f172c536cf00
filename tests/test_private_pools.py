"""Private pools with CUDA's semantics: an npu graph's pool reuses blocks freed during capture, pools shared by
handle live while any graph holds them, torch.npu.MemPool / use_mem_pool, and the graph-tree calls (live
allocations, checkpoint and restore of a pool's state)."""

from __future__ import annotations

import pytest
import torch

from _allocator_util import DEVICE, MIB, blob, segment_of, stat
from npusim.runtime import acl


def _pool_segments(pool: tuple[int, int]) -> list[dict]:
    return torch.npu.memory_snapshot(pool)


def test_capture_reuses_blocks_freed_during_capture(clean_npu):
    """A temporary freed during capture goes back to the graph's pool and the next allocation of the pool takes it;
    eager allocations never take pool blocks; replays still compute right."""
    x = torch.ones(1024, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=torch.npu.Stream()):
        t1 = x * 2
        first = t1.data_ptr()
        del t1
        t2 = x * 3
        out = t2 + 1
    assert t2.data_ptr() == first
    assert {s["segment_pool_id"] for s in _pool_segments(g.pool())} == {g.pool()}
    assert segment_of(out.data_ptr())["segment_pool_id"] == g.pool()
    eager = torch.empty(1024, device="npu")
    assert segment_of(eager.data_ptr())["segment_pool_id"] == (0, 0)
    x.fill_(2.0)
    g.replay()
    torch.npu.synchronize()
    assert out.cpu().eq(7.0).all()


def test_a_stream_joining_the_capture_allocates_from_the_graphs_pool(clean_npu):
    """A side stream forked from the capturing stream allocates from the graph's pool while it is in the capture
    and from the device's own pool after it; the joined stream adds no hold (use count 1, 0 after reset)."""
    a = torch.ones(256, 256, device="npu")
    capture, side = torch.npu.Stream(), torch.npu.Stream(priority=-1)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=capture):
        side.wait_stream(capture)
        with torch.npu.stream(side):
            expert = a @ a
        capture.wait_stream(side)
        out = expert + 1
    assert segment_of(expert.data_ptr())["segment_pool_id"] == g.pool()
    assert segment_of(out.data_ptr())["segment_pool_id"] == g.pool()
    with torch.npu.stream(side):
        after = torch.empty(1024, device="npu")
    assert segment_of(after.data_ptr())["segment_pool_id"] == (0, 0)
    assert acl.pool_use_count(DEVICE, g.pool()) == 1
    g.replay()
    torch.npu.synchronize()
    assert out.cpu().eq(257.0).all()
    pool = g.pool()
    g.reset()
    assert acl.pool_use_count(DEVICE, pool) == 0


def test_graphs_sharing_a_pool_keep_it_alive_while_either_holds_it(clean_npu):
    """Two graphs captured with one handle share the pool (use count 2); it lives until both let go, and its
    segments go back to the host at empty_cache once their tensors are gone."""
    handle = torch.npu.graph_pool_handle()
    x = torch.ones(4096, device="npu")
    g1, g2 = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    capture = torch.npu.Stream()
    with torch.npu.graph(g1, pool=handle, stream=capture):
        y1 = x + 1
    with torch.npu.graph(g2, pool=handle, stream=capture):
        y2 = y1 * 2  # reads g1's output: the pool must keep it
    assert acl.pool_use_count(DEVICE, handle) == 2 and g1.pool() == g2.pool() == handle
    g1.replay()
    g2.replay()
    torch.npu.synchronize()
    assert y2.cpu().eq(4.0).all()
    g1.reset()
    assert acl.pool_use_count(DEVICE, handle) == 1
    g2.reset()
    assert acl.pool_use_count(DEVICE, handle) == 0
    torch.npu.empty_cache()
    assert _pool_segments(handle) != []  # the static outputs keep their segment
    del y1, y2
    torch.npu.empty_cache()
    assert _pool_segments(handle) == [] and stat("segment.all.current") == 1  # x's


def test_mem_pool_routes_the_threads_allocations_and_reuses_its_blocks(clean_npu):
    """use_mem_pool routes this thread's allocations to the MemPool (use count 2 inside), its freed blocks serve its
    next allocations only, and the pool lives while the MemPool object does."""
    pool = torch.npu.MemPool()
    assert pool.use_count() == 1 and pool.id[0] == 0 and pool.allocator is None
    with torch.npu.use_mem_pool(pool):
        assert pool.use_count() == 2
        a = blob(MIB)
        address = a.data_ptr()
        del a
        b = blob(MIB)
    assert pool.use_count() == 1 and b.data_ptr() == address
    outside = blob(MIB)
    assert segment_of(outside.data_ptr())["segment_pool_id"] == (0, 0) and outside.data_ptr() != address
    assert [s["segment_pool_id"] for s in pool.snapshot()] == [pool.id]
    pool_id = pool.id
    del pool
    assert acl.pool_use_count(DEVICE, pool_id) == 0
    del b
    torch.npu.empty_cache()
    assert _pool_segments(pool_id) == []
    with pytest.raises(RuntimeError, match="pluggable allocators are not simulated"):
        torch.npu.MemPool(allocator=object())


def test_mem_pool_no_split_and_use_on_oom(clean_npu):
    """no_split: a request takes a whole segment. use_on_oom: an allocation outside that would fail takes a free
    block of the pool instead."""
    whole = torch.npu.MemPool(no_split=True)
    with torch.npu.use_mem_pool(whole):
        small = blob(1000)
    assert segment_of(small.data_ptr())["blocks"][0]["size"] == 2 * MIB
    spare = torch.npu.MemPool(use_on_oom=True)
    with torch.npu.use_mem_pool(spare):
        kept = blob(12 * MIB)
    address = kept.data_ptr()
    del kept
    torch.npu.set_memory_capacity(torch.npu.memory_reserved() + 1 * MIB)
    rescued = blob(12 * MIB)  # no room for a segment of its own
    assert rescued.data_ptr() == address


def test_checkpoint_and_restore_a_pool(clean_npu):
    """The graph-tree contract (_cuda_getCheckpointState / _cuda_setCheckpointPoolState / checkPoolLiveAllocations):
    restoring frees what the pool holds now and allocates the checkpoint's blocks again, handing them to the
    storages given; the stale storages lose their deleter."""
    memory = torch.npu.memory
    pool = torch.npu.MemPool()
    with torch.npu.use_mem_pool(pool):
        a, b = blob(4096), blob(4096)
    a.fill_(5)
    a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
    state = memory._npu_getCheckpointState(DEVICE, pool.id)
    assert memory._npu_checkPoolLiveAllocations(DEVICE, pool.id, {a_ptr, b_ptr})
    assert [[(ptr, size, alloc) for ptr, size, alloc in seg] for seg in state.segments] == [
        [(a_ptr, 4096, True), (b_ptr, 4096, True), (b_ptr + 4096, 2 * MIB - 8192, False)]]
    del b
    with torch.npu.use_mem_pool(pool):
        c = blob(8192)  # the pool moves on after the checkpoint
    assert memory._npu_checkPoolLiveAllocations(DEVICE, pool.id, {a_ptr, c.data_ptr()})
    allocated = stat("allocated_bytes.all.current")
    a_storage, c_storage = a.untyped_storage()._cdata, c.untyped_storage()._cdata
    memory._npu_setCheckpointPoolState(DEVICE, state, [a_storage, c_storage], [a_storage])
    # a's block is allocated again and handed to a; b's is not claimed and goes back; c's storage lost its deleter
    assert memory._npu_checkPoolLiveAllocations(DEVICE, pool.id, {a_ptr})
    assert stat("allocated_bytes.all.current") == allocated - 8192
    assert a.cpu().eq(5).all()
    del c
    assert memory._npu_checkPoolLiveAllocations(DEVICE, pool.id, {a_ptr})
    del a
    assert memory._npu_checkPoolLiveAllocations(DEVICE, pool.id, set())
    with pytest.raises(RuntimeError, match="does not exist on npu:7"):
        memory._npu_getCheckpointState(DEVICE, (0, 987654))
