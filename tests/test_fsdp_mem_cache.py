"""CommBufferCache on its own (one process): keys, liveness, stream safety, byte cap, release."""

from __future__ import annotations

import pytest
import torch

import npusim
from npusim.distributed.fsdp import CommBufferCache

DEV = torch.device("npu", 0)


def test_released_buffer_is_reused_and_held_one_is_not():
    """Two buffers alive at once (prefetch) are distinct; a dropped one is handed out again."""
    cache = CommBufferCache()
    a = cache.allocate((64,), dtype=torch.float32, device=DEV)
    b = cache.allocate((64,), dtype=torch.float32, device=DEV)
    assert a.data_ptr() != b.data_ptr()
    a_ptr = a.data_ptr()
    del a
    c = cache.allocate((8, 8), dtype=torch.float32, device=DEV)
    assert c.data_ptr() == a_ptr and c.shape == (8, 8)
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.buffers, stats.bytes_held) == (1, 2, 2, 2 * 64 * 4)


def test_a_view_keeps_the_buffer_in_use():
    """FSDP keeps views (all-gather input, copy-out views): any of them keeps the buffer."""
    cache = CommBufferCache()
    t = cache.allocate((64,), dtype=torch.float32, device=DEV)
    view = t[16:32]
    del t
    u = cache.allocate((64,), dtype=torch.float32, device=DEV)
    assert u.data_ptr() != view.data_ptr() - 16 * 4
    assert cache.stats().misses == 2


def test_key_is_device_dtype_and_size():
    """A buffer is reused only for the same device, dtype and number of elements."""
    cache = CommBufferCache()
    for dtype, numel, device in ((torch.float32, 64, DEV), (torch.bfloat16, 64, DEV), (torch.float32, 32, DEV),
                                 (torch.float32, 64, torch.device("npu", 1))):
        cache.allocate((numel,), dtype=dtype, device=device)  # dropped at once
    assert cache.stats().misses == 4 and cache.stats().hits == 0
    cache.allocate((64,), dtype=torch.bfloat16, device=DEV)
    assert cache.stats().hits == 1


@pytest.mark.asynchronous
def test_reuse_is_ordered_after_the_previous_users_stream():
    """A buffer released while its last writer is still queued on another stream is reused only
    after that work: the new user's stream waits on the release event."""
    cache = CommBufferCache()
    side = torch.npu.Stream()
    ones, twos = torch.ones(256, device=DEV), torch.full((256,), 2.0, device=DEV)
    torch.npu.synchronize()
    with npusim.timing.model(launch_us=200_000, realtime=True):  # every device copy takes 0.2 s
        with torch.npu.stream(side):
            t = cache.allocate((256,), dtype=torch.float32, device=DEV)
            t.copy_(twos)
            t.copy_(ones)  # lands at 0.4 s: after the copy below would without a wait
        del t
        u = cache.allocate((256,), dtype=torch.float32, device=DEV)
        u.copy_(twos)  # on the current stream: must run after the copy on `side`
        torch.npu.synchronize()
    assert cache.stats().stream_waits == 1 and cache.stats().hits == 1
    assert torch.equal(u.cpu(), torch.full((256,), 2.0))


def test_byte_cap_bypass_and_release():
    """Over the cap a request is served uncached; release() frees only buffers nobody holds."""
    cache = CommBufferCache(max_bytes=1024)
    held = cache.allocate((256,), dtype=torch.float32, device=DEV)
    extra = cache.allocate((256,), dtype=torch.float32, device=DEV)
    assert cache.stats().bypassed == 1 and cache.stats().bytes_held == 1024
    del extra
    assert cache.release() == 0 and cache.stats().bytes_in_use == 1024
    del held
    assert cache.release() == 1024
    assert cache.stats().buffers == 0 and cache.stats().bytes_held == 0
    # A smaller free buffer is dropped to make room for a new key under the cap.
    cache.allocate((128,), dtype=torch.float32, device=DEV)
    big = cache.allocate((256,), dtype=torch.float32, device=DEV)
    assert cache.stats().bypassed == 1 and cache.stats().bytes_held == big.numel() * 4
