"""Streams and events of the ``torch.npu`` module.

``Stream`` and ``Event`` are ``torch.Stream`` / ``torch.Event`` bound to the
npu device; all their work goes through the device guard in the C++ core.
"""

from __future__ import annotations

from typing import Any

import torch

from npusim.runtime import acl
from npusim.runtime.device import _device_t, _get_device_index

_STREAM_KEYS = ("stream_id", "device_index", "device_type")


def _check_stream_triple(op: str, kwargs: dict[str, Any]) -> None:
    """Refuses a (stream_id, device_index, device_type) that names no npu stream, before torch.Stream
    stores it (a device index is an 8-bit field there: 999 would become npu:-25). A RuntimeError, as
    torch_npu's TORCH_CHECK raises (its test_stream's fail-fast tests expect one)."""
    unknown = sorted(set(kwargs) - set(_STREAM_KEYS))
    missing = [k for k in _STREAM_KEYS if k not in kwargs]
    if unknown or missing:
        raise TypeError(f"{op}: wrapping an existing stream takes exactly stream_id, device_index and device_type; "
                        f"got {sorted(kwargs)}")
    stream_id, device_index, device_type = (kwargs[k] for k in _STREAM_KEYS)
    call = f"{op}(stream_id={stream_id!r}, device_index={device_index!r}, device_type={device_type!r})"
    npu_type = acl.default_stream(0)[2]  # the PrivateUse1 device type every npu stream carries
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (stream_id, device_index, device_type)):
        raise TypeError(f"{call}: expected three ints, as Stream.stream_id / device_index / device_type give them")
    if device_type != npu_type:
        raise RuntimeError(f"{call}: device_type must be the npu's ({npu_type}), got {device_type}")
    if not 0 <= device_index < acl.device_count():
        raise RuntimeError(f"{call}: device_index must name an npu device, 0 <= index < device_count() = "
                         f"{acl.device_count()}, got {device_index}")
    if not 0 <= stream_id < acl.STREAMS_PER_DEVICE:
        raise RuntimeError(f"{call}: stream_id must name a stream of npu:{device_index}, 0 <= id < "
                         f"{acl.STREAMS_PER_DEVICE} (the default stream and the two pools), got {stream_id}")


class _NPUStreamBase(torch.Stream):
    """What :class:`Stream` and :class:`SyncLaunchStream` share (torch_npu's ``_NPUStreamBase``)."""

    def __new__(cls, device: _device_t = None, priority: int = 0, is_sync_launch: int = 0,
                **kwargs: Any) -> _NPUStreamBase:
        if kwargs:  # wrapping an existing stream: stream_id, device_index, device_type
            _check_stream_triple(f"torch.npu.{cls.__name__}", kwargs)
            return super().__new__(cls, **kwargs)
        index = _get_device_index(device)
        # See Note [Sync-launch streams]: a pool stream, whatever is_sync_launch says.
        return super().__new__(cls, device=torch.device("npu", index), priority=priority)

    @property
    def priority(self) -> int:
        return acl.stream_priority(self.stream_id, self.device_index)

    @property
    def npu_stream(self) -> int:
        """The raw stream handle: the stream's id, what ``torch_npu._C._npu_getCurrentRawStream`` returns
        while it is current (npusim's streams have no other handle)."""
        return self.stream_id

    def pending(self) -> int:
        """Number of tasks enqueued on the stream and not yet finished."""
        return acl.stream_pending(self.stream_id, self.device_index)

    def synchronize(self, timeout_s: float | None = None) -> None:
        """Waits for the stream; with ``timeout_s`` raises if it is not idle in time."""
        synchronize_stream(self, timeout_s)

    def __eq__(self, other: object) -> bool:
        # As torch_npu: a sync-launch stream equals only sync-launch streams (and so is never a Stream).
        if isinstance(other, SyncLaunchStream) != isinstance(self, SyncLaunchStream):
            return False
        return super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = torch.Stream.__hash__

    def __repr__(self) -> str:
        return f"<torch.npu.{type(self).__name__} device=npu:{self.device_index} stream_id={self.stream_id}>"


# Note [Sync-launch streams]
# torch_npu launches an op on an ordinary stream through its task queue (a host thread between
# the caller and ACL) and on a sync-launch stream (SyncLaunchStream, Stream(is_sync_launch=1))
# directly from the calling thread, from a pool of its own. npusim has no task queue: every
# launch is enqueued onto the stream by the calling thread, so every npu stream launches as a
# sync-launch stream does, and is_sync_launch selects nothing; the stream comes from the
# priority's pool, which ordinary streams share (the device core has no third pool).


class Stream(_NPUStreamBase):
    """An npu stream: a FIFO of device work running asynchronously to the host.

    ``priority`` < 0 picks the high-priority pool (as on CUDA). ``is_sync_launch`` is accepted as
    torch_npu's (Note [Sync-launch streams]). ``Stream(stream_id=, device_index=, device_type=)``
    wraps an existing npu stream and refuses a triple that names none.
    """


class SyncLaunchStream(_NPUStreamBase):
    """torch_npu's sync-launch stream: launched from the calling thread, not through a task queue
    (Note [Sync-launch streams]). Equal only to another SyncLaunchStream of the same stream."""

    def __new__(cls, device: _device_t = None, priority: int = 0, **kwargs: Any) -> SyncLaunchStream:
        return super().__new__(cls, device, priority, is_sync_launch=1, **kwargs)


def _wrap(stream_tuple: tuple[int, int, int]) -> Stream:
    stream_id, device_index, device_type = stream_tuple
    return Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


class _EventMeta(type):
    """Makes ``isinstance(e, torch.npu.Event)`` true for every npu ``torch.Event``."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "npu"


class Event(metaclass=_EventMeta):
    """An npu event (record / wait / query / synchronize / elapsed_time).

    Constructing one returns a plain ``torch.Event`` on the npu device: torch's
    C++ ``elapsed_time`` accepts only that exact type as its other event, so a
    subclass could not be timed against events that torch creates itself
    (``Stream.record_event``). The metaclass makes isinstance work for both.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                device: _device_t = None) -> torch.Event:  # type: ignore[misc]
        return torch.Event(device=torch.device("npu", _get_device_index(device)), enable_timing=enable_timing,
                           blocking=blocking, interprocess=interprocess)


def current_stream(device: _device_t = None) -> Stream:
    return _wrap(acl.current_stream(_get_device_index(device)))


def default_stream(device: _device_t = None) -> Stream:
    return _wrap(acl.default_stream(_get_device_index(device)))


def set_stream(stream: torch.Stream) -> None:
    """Makes ``stream`` current (its device becomes the current device)."""
    if stream is not None:
        acl.set_stream(stream.stream_id, stream.device_index)


class StreamContext:
    """Selects a stream (and its device) for the duration of a ``with`` block."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self._prev_device = -1
        self._prev_streams: list[Stream] = []

    def __enter__(self) -> torch.Stream | None:
        if self.stream is None:
            return None
        self._prev_device = acl.current_device()
        target = self.stream.device_index
        self._prev_streams = [current_stream(self._prev_device)]
        if target != self._prev_device:
            self._prev_streams.append(current_stream(target))
        set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.stream is None:
            return
        for previous in reversed(self._prev_streams):
            set_stream(previous)
        acl.set_device(self._prev_device)


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)


def synchronize_stream(stream: torch.Stream, timeout_s: float | None = None) -> None:
    """Waits for ``stream``; raises an error naming it when ``timeout_s`` passes first."""
    acl.synchronize_stream(stream.stream_id, stream.device_index, -1.0 if timeout_s is None else timeout_s)
