"""A stream race sanitizer for the npu, in the spirit of ``torch.cuda._sanitizer``.

Off by default, at no cost: the device core's observers are unset and no
dispatch mode is active. Turn it on with ``NPUSIM_SANITIZER=1`` (at
``import npusim``) or::

    import npusim.sanitizer
    npusim.sanitizer.enable()                       # raises StreamRaceError at a race
    with npusim.sanitizer.enabled(on_race="record") as san:
        ...
    san.reports                                     # RaceReport list, each with both stack traces

It reports (see :class:`RaceKind`): an op or copy on one stream touching memory
another stream writes with no ordering between them; the host reading or
writing memory a stream may still be writing; a pinned host buffer changed
while a non-blocking copy from it is still queued; and a block freed while a
stream other than its allocation stream may still use it, without
``record_stream``. Orderings come from the device core (every event record,
stream wait and host synchronize) and from npusim's copy rules; see Note
[Sanitizer clocks]. An op captured into an npu graph accesses memory at each
replay, on the replay's stream, not at the capture (Note [Sanitizer and npu
graphs]).

The dispatch mode is per thread: :func:`enable` covers the calling thread
(and the autograd threads it starts); other host threads join with
``with sanitizer.thread():``. All of them share one set of clocks.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from npusim import config
from npusim.runtime import acl, graphs
from npusim.sanitizer.clocks import StreamKey
from npusim.sanitizer.graph_record import GraphRecord
from npusim.sanitizer.mode import SanitizerMode, _stack
from npusim.sanitizer.mode import current as current_stream
from npusim.sanitizer.report import Access, RaceKind, RaceReport, StreamRaceError
from npusim.sanitizer.state import HOST_DEVICE, State

__all__ = ["Access", "RaceKind", "RaceReport", "Sanitizer", "StreamRaceError", "current", "disable", "enable",
           "enabled", "is_enabled"]

OnRace = Literal["raise", "warn", "record"]
ENV = "NPUSIM_SANITIZER"

# StreamOp numbers of csrc/runtime/trace.h
_RECORD, _WAIT, _SYNC_EVENT, _SYNC_STREAM, _SYNC_DEVICE, _SYNC_ALL, _DESTROY = range(7)


class Sanitizer:
    """One sanitizer session: clocks, per-storage history and the reports found."""

    def __init__(self, on_race: OnRace = "raise") -> None:
        if on_race not in ("raise", "warn", "record"):
            raise ValueError(f"npusim sanitizer: on_race must be 'raise', 'warn' or 'record', got {on_race!r}")
        self.on_race = on_race
        self.state = State()
        self._modes: dict[int, SanitizerMode] = {}  # thread id -> its entered mode
        # What each NPUGraph captured while this sanitizer was on (Note [Sanitizer and npu graphs]).
        self._graphs: weakref.WeakKeyDictionary[graphs.NPUGraph, GraphRecord] = weakref.WeakKeyDictionary()

    @property
    def reports(self) -> list[RaceReport]:
        return self.state.reports

    @property
    def ops(self) -> int:
        """Operations the dispatch mode has seen (on every thread)."""
        return self.state.ops

    # ---- observers of the device core (called on host threads) ----------

    def _on_stream_op(self, op: int, event: int, device: int, stream: int) -> None:
        clocks = self.state.clocks
        with self.state.lock:
            self._drain()
            if op in (_RECORD, _WAIT) and acl.stream_is_capturing(stream, device):
                # A node of a graph, not an ordering of eager work (Note [Sanitizer and npu graphs]).
                self.state.capture_stream_op(op == _RECORD, event, StreamKey(device, stream))
            elif op in (_WAIT, _SYNC_EVENT) and event in self.state.capture_events:
                pass  # an event recorded in a capture orders no eager work
            elif op == _RECORD:
                self.state.capture_events.pop(event, None)
                clocks.record(event, StreamKey(device, stream))
            elif op == _WAIT:
                clocks.wait_event(StreamKey(device, stream), event)
            elif op == _SYNC_EVENT:
                clocks.host_sync_event(event)
            elif op == _SYNC_STREAM:
                clocks.host_sync_stream(StreamKey(device, stream))
            elif op == _SYNC_DEVICE:
                clocks.host_sync_device(device)
            elif op == _SYNC_ALL:
                clocks.host_sync_device(None)
            elif op == _DESTROY:
                clocks.destroy_event(event)
                self.state.capture_events.pop(event, None)

    def _on_graph(self, what: str, graph: graphs.NPUGraph) -> None:
        """An NPUGraph's capture began or ended, it was reset, or it was replayed (Note [Sanitizer and
        npu graphs])."""
        state = self.state
        with state.lock:
            self._drain()
            if what == "capture_begin":  # the graph captures the current stream of the current device
                device = acl.current_device()
                record = self._graphs[graph] = GraphRecord(device)
                state.captured[current_stream(state, device)] = record
                return
            record = self._graphs.get(graph)
            if record is None:
                return  # captured before this sanitizer was on: its accesses are unknown
            if what == "replay":
                state.replay(record, current_stream(state, record.device), _stack())
            else:
                state.end_capture(record)
                if what == "reset":
                    del self._graphs[graph]
        self._after_op()

    def _on_memory(self, ptr: int, delta: int, device: int) -> None:
        with self.state.lock:
            self._drain()  # events logged before this one come first
            self._memory_event(ptr, delta, device, None)

    def _memory_event(self, ptr: int, delta: int, device: int, stack: object) -> None:
        storage = (HOST_DEVICE if device < 0 else device, ptr)
        if delta > 0:
            self.state.forget(storage)  # a new block at a freed address
        elif storage in self.state.storages:
            self.state.free(storage, _stack() if stack is None else stack)  # type: ignore[arg-type]

    def _drain(self) -> None:
        """Frees logged on threads without the GIL (stream workers), in order."""
        for ptr, delta, device in acl.take_memory_events():
            self._memory_event(ptr, delta, device, None)

    def _after_op(self) -> None:
        state = self.state
        if not state.unraised:
            return
        with state.lock:
            fresh, state.unraised = state.reports[len(state.reports) - state.unraised:], 0
        if self.on_race == "raise":
            raise StreamRaceError(fresh)
        if self.on_race == "warn":
            import warnings

            for report in fresh:
                warnings.warn(str(report), RuntimeWarning, stacklevel=3)

    # ---- switching on and off ---------------------------------------------

    def attach(self) -> None:
        """Enters the dispatch mode on the calling thread."""
        ident = threading.get_ident()
        if ident in self._modes:
            return
        mode = SanitizerMode(self.state, self._drain, self._after_op)
        mode.__enter__()
        self._modes[ident] = mode

    def detach(self) -> None:
        mode = self._modes.pop(threading.get_ident(), None)
        if mode is not None:
            mode.__exit__(None, None, None)

    @contextmanager
    def thread(self) -> Iterator[Sanitizer]:
        """Covers another host thread for the duration of the block."""
        self.attach()
        try:
            yield self
        finally:
            self.detach()


_current: Sanitizer | None = None


def current() -> Sanitizer | None:
    return _current


def is_enabled() -> bool:
    return _current is not None


def enable(on_race: OnRace = "raise") -> Sanitizer:
    """Turns the sanitizer on for the process (the dispatch mode on the calling thread)."""
    global _current
    if _current is not None:
        raise RuntimeError("npusim sanitizer: already enabled; disable() it first")
    acl.synchronize_all()  # work issued before this point is complete: nothing to track
    san = Sanitizer(on_race)
    acl.set_stream_op_observer(san._on_stream_op)
    acl.set_memory_observer(san._on_memory)
    graphs.set_graph_observer(san._on_graph)
    san.attach()
    _current = san
    return san


def disable() -> None:
    """Turns the sanitizer off; its reports stay readable on the object enable() returned."""
    global _current
    san, _current = _current, None
    if san is None:
        return
    acl.set_stream_op_observer(None)
    acl.set_memory_observer(None)
    graphs.set_graph_observer(None)
    san.detach()


@contextmanager
def enabled(on_race: OnRace = "raise") -> Iterator[Sanitizer]:
    san = enable(on_race)
    try:
        yield san
    finally:
        disable()


def enable_from_env() -> None:
    if config.sanitizer():
        enable()
