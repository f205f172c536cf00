"""A cache of FSDP2 communication buffers (all-gather outputs, reduce-scatter buffers).

Plugged in through FSDP2's public comm extension points
(``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``): FSDP2
asks the comm object to ``allocate`` each buffer and then calls it to run the
collective, so the cache sees every buffer and every stream that uses it
without replacing any PyTorch function. See Note [When a cached buffer is free].
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from npusim.distributed import backend as _backend
from npusim.distributed.fsdp.fsdp_private import DefaultAllGather, DefaultReduceScatter, storage_use_count

# Note [When a cached buffer is free]
# FSDP2 holds a buffer as long as it needs it on the host: the all-gather
# output until its copy-out was issued (one group later under implicit
# prefetch, so two outputs are alive at once), the reduce-scatter input until
# the reduce-scatter was waited for (ReduceScatterState), the reduce-scatter
# output as long as it backs the sharded gradient. The cache therefore hands
# out a separate tensor over the buffer's storage and treats the buffer as
# released on the host once the storage is referenced by the cache alone
# (storage use count), which also covers views FSDP keeps.
# Device work may still be queued after that. On release the cache records an
# event on every stream known to have used the buffer (the stream current at
# ``allocate``, where FSDP runs the copy-in; the stream the collective was
# issued on; the stream current when the release is seen; the default
# stream, where copy-out and the optimizer run). A released buffer is handed
# out again only once those events completed; if none has completed yet, the
# new user's stream is made to wait on them (a device-side wait, like
# ``Stream.wait_event``), so its work still starts only after every earlier
# reader and writer finished. An async collective's Work must also report
# completion before its buffers count as released.


# The longest wait for earlier collectives to finish before the cache grows instead.
_IN_FLIGHT_TIMEOUT_S = 5.0


class CacheStats(NamedTuple):
    hits: int  # allocate() served from a released buffer
    misses: int  # allocate() that created a new buffer (an allocation)
    bypassed: int  # allocate() not cached because of the byte cap
    stream_waits: int  # hits whose events had not completed: the new stream waits on them
    bytes_held: int  # bytes of all buffers the cache owns (in use and free)
    bytes_in_use: int
    buffers: int


class _Buffer:
    __slots__ = ("tensor", "nbytes", "baseline", "streams", "events", "work", "done", "in_use")

    def __init__(self, tensor: torch.Tensor, baseline: int) -> None:
        self.tensor = tensor
        self.nbytes = tensor.untyped_storage().nbytes()
        self.baseline = baseline  # storage use count when only the cache holds it
        self.streams: dict[tuple[int, int, int], torch.Stream] = {}
        self.events: list[torch.Event] = []
        self.work: dist.Work | None = None
        self.done: torch.Event | None = None  # recorded after its last collective was issued
        self.in_use = False


def _stream_key(s: torch.Stream) -> tuple[int, int, int]:
    return (s.device_index, s.device_type, s.stream_id)


class CommBufferCache:
    """Buffers keyed by (device, dtype, numel), reused once no stream can still touch them.

    ``max_bytes`` caps the bytes the cache owns; a request that does not fit
    after dropping free buffers is served uncached (``bypassed``).
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # allocate runs on the autograd thread too
        self._buffers: dict[tuple[torch.device, torch.dtype, int], list[_Buffer]] = {}
        self._by_ptr: dict[int, _Buffer] = {}
        self._hits = self._misses = self._bypassed = self._stream_waits = 0

    # -- allocation ---------------------------------------------------------------------------
    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        """A tensor of ``size`` over a cached buffer; same contract as ``Comm.allocate``."""
        shape = tuple(int(s) for s in size)
        numel = math.prod(shape)
        device = torch.device(device)
        key = (device, dtype, numel)
        with self._lock:
            self._collect_released()
            buf = self._claim_free(key)
            in_flight = [] if buf is not None else self._in_flight(key)
        if buf is None and in_flight:
            # Outside the lock: the wait can take as long as a collective does.
            self._wait_in_flight(in_flight)
            with self._lock:
                self._collect_released()
                buf = self._claim_free(key)
        with self._lock:
            if buf is None:
                nbytes = numel * torch.empty((), dtype=dtype).element_size()
                if not self._make_room(nbytes):
                    self._bypassed += 1
                    return torch.empty(shape, dtype=dtype, device=device)
                tensor = torch.empty(numel, dtype=dtype, device=device)
                buf = _Buffer(tensor, storage_use_count(tensor))
                buf.in_use = True
                self._buffers.setdefault(key, []).append(buf)
                self._by_ptr[tensor.data_ptr()] = buf
                self._misses += 1
            self._note_stream(buf, _current_stream(device))
            # A new TensorImpl over the same storage: the storage use count
            # then tells whether FSDP still holds it (Note [When a cached buffer is free]).
            return buf.tensor.detach().view(shape)

    def note_collective(self, tensors: Sequence[torch.Tensor], work: dist.Work | None) -> None:
        """Called by the comm objects when a collective on ``tensors`` was issued."""
        with self._lock:
            for t in tensors:
                buf = self._by_ptr.get(t.untyped_storage().data_ptr())
                if buf is not None:
                    stream = _current_stream(t.device)
                    self._note_stream(buf, stream)
                    buf.done = stream.record_event()
                    if work is not None:
                        buf.work = work

    def _note_stream(self, buf: _Buffer, stream: torch.Stream) -> None:
        buf.streams[_stream_key(stream)] = stream

    def _collect_released(self) -> None:
        """Marks buffers FSDP no longer holds as free, recording their release events."""
        for buf in self._by_ptr.values():
            if not buf.in_use or storage_use_count(buf.tensor) > buf.baseline:
                continue
            if buf.work is not None and not buf.work.is_completed():
                continue
            device = buf.tensor.device
            self._note_stream(buf, _current_stream(device))
            self._note_stream(buf, torch.get_device_module(device.type).default_stream(device))
            buf.events = [s.record_event() for s in buf.streams.values()]
            buf.streams.clear()
            buf.work = buf.done = None
            buf.in_use = False

    def _in_flight(self, key: tuple[torch.device, torch.dtype, int]) -> list[tuple[Any, Any]]:
        """The (event, Work) of every collective still running on a held buffer of ``key``."""
        return [(b.done, b.work) for b in self._buffers.get(key, ()) if b.in_use]

    def _wait_in_flight(self, in_flight: list[tuple[Any, Any]]) -> None:
        """Before growing: waits for the collectives still running on buffers of the key.

        The collective backend keeps the tensors of a running collective
        alive (as NCCL does), so a buffer FSDP already dropped still looks
        held until its collective ends. Without this wait, whether a step
        allocates would depend on timing; with it, the cache grows only for
        buffers FSDP itself holds, and steady state allocates nothing.
        Called without the cache lock held.
        """
        for done, work in in_flight:
            if done is not None:
                done.synchronize()
            if work is not None:
                work.wait()
        # The backend holds a job's tensors until its release thread drops them,
        # after the collective finished on the comm stream. Once it is idle, a
        # buffer still in use is held by FSDP itself and the cache must grow.
        if not _backend.wait_idle(_IN_FLIGHT_TIMEOUT_S):
            warnings.warn(
                f"npusim comm-buffer cache: the npu collective backend did not finish its collectives "
                f"within {_IN_FLIGHT_TIMEOUT_S} s; allocating a new buffer instead of reusing one",
                RuntimeWarning, stacklevel=3)

    def _claim_free(self, key: tuple[torch.device, torch.dtype, int]) -> _Buffer | None:
        """A released buffer of ``key`` marked in use again (a hit), or None."""
        buf = self._take_free(key)
        if buf is not None:
            buf.in_use = True
            self._hits += 1
        return buf

    def _take_free(self, key: tuple[torch.device, torch.dtype, int]) -> _Buffer | None:
        free = [b for b in self._buffers.get(key, ()) if not b.in_use]
        if not free:
            return None
        # Prefer a buffer whose release events all completed: no wait at all.
        for buf in free:
            if all(e.query() for e in buf.events):
                buf.events = []
                return buf
        buf = free[0]
        stream = _current_stream(key[0])
        for e in buf.events:
            stream.wait_event(e)
        buf.events = []
        self._stream_waits += 1
        return buf

    def _make_room(self, nbytes: int) -> bool:
        held = self._bytes_held()
        if held + nbytes <= self.max_bytes:
            return True
        for key, bufs in self._buffers.items():
            for buf in [b for b in bufs if not b.in_use]:
                if held + nbytes <= self.max_bytes:
                    break
                self._drop(key, buf)
                held -= buf.nbytes
        return held + nbytes <= self.max_bytes

    def _drop(self, key: tuple[torch.device, torch.dtype, int], buf: _Buffer) -> None:
        # The memory goes back to the device allocator only after its last
        # users finished: the allocator itself is stream-ordered, but the
        # release events make it explicit and cheap to reason about.
        for e in buf.events:
            e.synchronize()
        self._buffers[key].remove(buf)
        del self._by_ptr[buf.tensor.data_ptr()]

    def _bytes_held(self) -> int:
        return sum(b.nbytes for b in self._by_ptr.values())

    # -- public -------------------------------------------------------------------------------
    def stats(self) -> CacheStats:
        with self._lock:
            self._collect_released()
            in_use = sum(b.nbytes for b in self._by_ptr.values() if b.in_use)
            return CacheStats(self._hits, self._misses, self._bypassed, self._stream_waits,
                              self._bytes_held(), in_use, len(self._by_ptr))

    def release(self) -> int:
        """Frees every buffer FSDP no longer holds (after its last users finished); returns the bytes freed."""
        with self._lock:
            self._collect_released()
            freed = 0
            for key, bufs in self._buffers.items():
                for buf in [b for b in bufs if not b.in_use]:
                    self._drop(key, buf)
                    freed += buf.nbytes
            return freed

def _current_stream(device: torch.device) -> torch.Stream:
    return torch.get_device_module(device.type).current_stream(device)


class CachedAllGather(DefaultAllGather):
    """FSDP2 ``AllGather`` whose output buffers come from a :class:`CommBufferCache`.

    The collective itself is PyTorch's (``dist.all_gather_single``); only the
    buffer's origin and the bookkeeping of the streams that use it differ.
    """

    def __init__(self, cache: CommBufferCache) -> None:
        self.cache = cache

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return self.cache.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        work = super().__call__(output_tensor, input_tensor, group, async_op)
        self.cache.note_collective((output_tensor, input_tensor), work)
        return work


class CachedReduceScatter(DefaultReduceScatter):
    """FSDP2 ``ReduceScatter`` whose input and output buffers come from a :class:`CommBufferCache`.

    The output backs the sharded gradient, so it returns to the cache only
    once the gradient is dropped (``zero_grad(set_to_none=True)``).
    """

    def __init__(self, cache: CommBufferCache) -> None:
        self.cache = cache

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return self.cache.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> dist.Work | None:
        work = super().__call__(output_tensor, input_tensor, group, op, async_op)
        self.cache.note_collective((output_tensor, input_tensor), work)
        return work


_default_caches: dict[int, CommBufferCache] = {}


def default_cache() -> CommBufferCache:
    """The process-wide cache that ``fully_shard(..., mem_cache=True)`` uses."""
    return _default_caches.setdefault(0, CommBufferCache())
