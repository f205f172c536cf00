"""Streams and events of the ``torch.npu`` module.

``Stream`` and ``Event`` are ``torch.Stream`` / ``torch.Event`` bound to the
npu device; all their work goes through the device guard in the C++ core.
"""

from __future__ import annotations

from typing import Any

import torch

from npusim.runtime import acl
from npusim.runtime.device import _device_t, _get_device_index


class Stream(torch.Stream):
    """An npu stream: a FIFO of device work running asynchronously to the host.

    ``priority`` < 0 picks the high-priority pool (as on CUDA).
    """

    def __new__(cls, device: _device_t = None, priority: int = 0, **kwargs: Any) -> Stream:
        if kwargs:  # wrapping an existing stream: stream_id, device_index, device_type
            return super().__new__(cls, **kwargs)
        index = _get_device_index(device)
        return super().__new__(cls, device=torch.device("npu", index), priority=priority)

    @property
    def priority(self) -> int:
        return acl.stream_priority(self.stream_id, self.device_index)

    def pending(self) -> int:
        """Number of tasks enqueued on the stream and not yet finished."""
        return acl.stream_pending(self.stream_id, self.device_index)

    def synchronize(self, timeout_s: float | None = None) -> None:
        """Waits for the stream; with ``timeout_s`` raises if it is not idle in time."""
        synchronize_stream(self, timeout_s)

    def __repr__(self) -> str:
        return f"<torch.npu.Stream device=npu:{self.device_index} stream_id={self.stream_id}>"


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
