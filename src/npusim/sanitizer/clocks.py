"""Happens-before between npu streams and the host: vector clocks.

Note [Sanitizer clocks]
Every stream numbers the operations issued to it (1, 2, ...). A clock maps a
stream to the number of its operations known to be complete, for one
observer: each stream (what its next operation is ordered after) and the host
(what a host access is ordered after). The rules are CUDA's:

- an operation on stream ``s`` comes after every earlier one on ``s`` and
  after everything the host has observed before issuing it;
- ``event.record(s)`` captures ``s``'s clock plus ``s``'s own count;
  ``s.wait_event(e)`` merges that capture into ``s``; ``wait_stream`` is both
  at once;
- a host synchronize (stream, event, device) merges into the host's clock.

All host threads share one host clock: host threads order among themselves by
locks and barriers the sanitizer cannot see, and treating them as one avoids
reports about host-to-host ordering, which is not what it checks.
"""

from __future__ import annotations

from typing import NamedTuple

Clock = dict["StreamKey", int]


class StreamKey(NamedTuple):
    device: int
    stream: int

    def __str__(self) -> str:
        return f"npu:{self.device} stream {self.stream}" + (" (default)" if self.stream == 0 else "")


def merge(into: Clock, other: Clock) -> None:
    for key, seq in other.items():
        if into.get(key, 0) < seq:
            into[key] = seq


class Clocks:
    """The clocks of every stream, recorded event and the host (Note [Sanitizer clocks])."""

    def __init__(self) -> None:
        self.seq: dict[StreamKey, int] = {}
        self.stream: dict[StreamKey, Clock] = {}
        self.event: dict[int, Clock] = {}
        self.host: Clock = {}

    def issue(self, s: StreamKey) -> tuple[int, Clock]:
        """Numbers a new operation on ``s``; returns its number and what it is ordered after."""
        seq = self.seq.get(s, 0) + 1
        self.seq[s] = seq
        clock = self.stream.setdefault(s, {})
        merge(clock, self.host)
        return seq, clock

    def _point(self, s: StreamKey) -> Clock:
        """Everything up to and including the last operation issued on ``s``."""
        point = dict(self.stream.get(s, {}))
        merge(point, self.host)
        point[s] = self.seq.get(s, 0)
        return point

    def record(self, event: int, s: StreamKey) -> None:
        self.event[event] = self._point(s)

    def wait_event(self, s: StreamKey, event: int) -> None:
        captured = self.event.get(event)
        if captured is not None:  # waiting on a never-recorded event orders nothing (CUDA)
            merge(self.stream.setdefault(s, {}), captured)

    def wait_stream(self, waiter: StreamKey, target: StreamKey) -> None:
        merge(self.stream.setdefault(waiter, {}), self._point(target))

    def host_sync_stream(self, s: StreamKey) -> None:
        merge(self.host, self._point(s))

    def host_sync_event(self, event: int) -> None:
        captured = self.event.get(event)
        if captured is not None:
            merge(self.host, captured)

    def host_sync_device(self, device: int | None) -> None:
        for s in list(self.seq):
            if device is None or s.device == device:
                self.host_sync_stream(s)

    def destroy_event(self, event: int) -> None:
        self.event.pop(event, None)
