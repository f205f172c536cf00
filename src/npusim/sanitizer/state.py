"""Per-storage access history and the race checks (see Note [Sanitizer clocks]).

A storage is named by (device, data pointer); device -1 is host memory, which
is tracked only once a stream reads or writes it (a pinned buffer of a
non-blocking copy). Each storage keeps the stream accesses that a later
access may still race with; an access the host has observed to complete can
race with nothing later (every later operation is ordered after the host's
knowledge), so it is dropped.
"""

from __future__ import annotations

import threading
import traceback
from typing import NamedTuple

from npusim.sanitizer.clocks import Clock, Clocks, StreamKey
from npusim.sanitizer.report import Access, RaceKind, RaceReport

HOST_DEVICE = -1
StorageId = tuple[int, int]  # (device or HOST_DEVICE, data pointer)
# More accesses than this per storage: the oldest ones are forgotten (a bound, not a rule).
_MAX_ACCESSES = 64


class Span(NamedTuple):
    storage: StorageId
    lo: int
    hi: int


class StorageState:
    __slots__ = ("accesses", "alloc_stream", "recorded")

    def __init__(self, alloc_stream: StreamKey | None) -> None:
        self.accesses: list[Access] = []
        self.alloc_stream = alloc_stream  # the stream the caching allocator would give the block back to
        self.recorded: set[StreamKey] = set()  # record_stream targets


def _where(span: Span) -> str:
    device, ptr = span.storage
    place = "host memory" if device == HOST_DEVICE else f"npu:{device} memory"
    return f"{place} at 0x{ptr:x} (bytes {span.lo}..{span.hi})"


class State:
    """The sanitizer's bookkeeping; every method is called with ``lock`` held."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.clocks = Clocks()
        self.storages: dict[StorageId, StorageState] = {}
        self.reports: list[RaceReport] = []
        self.unraised = 0  # reports not yet raised (on_race="raise")
        self.ops = 0  # operations seen

    def _report(self, kind: RaceKind, message: str, stack: traceback.StackSummary, previous: Access) -> None:
        self.reports.append(RaceReport(kind, message, stack, previous))
        self.unraised += 1

    def _retire(self, state: StorageState) -> None:
        host = self.clocks.host
        state.accesses = [a for a in state.accesses if host.get(a.stream, 0) < a.seq][-_MAX_ACCESSES:]

    def stream_access(self, span: Span, s: StreamKey, seq: int, clock: Clock, write: bool, op: str,
                      stack: traceback.StackSummary, alloc: bool = False) -> None:
        """Operation ``seq`` on ``s`` reads or writes ``span``; reports unordered conflicting accesses."""
        state = self.storages.get(span.storage)
        if state is None:
            state = self.storages[span.storage] = StorageState(s)
        elif alloc:
            state.alloc_stream = s
        for prev in state.accesses:
            if (prev.stream != s and (prev.write or write) and prev.lo < span.hi and span.lo < prev.hi
                    and clock.get(prev.stream, 0) < prev.seq):
                what = "writes" if write else "reads"
                self._report(RaceKind.STREAM,
                             f"{op} on {s} {what} {_where(span)}, which {prev.op} on {prev.stream} "
                             f"{'writes' if prev.write else 'reads'}, with no event or wait ordering them",
                             stack, prev)
                break
        if write:  # what this write covers and is ordered after can race with nothing later
            state.accesses = [a for a in state.accesses if not (
                span.lo <= a.lo and a.hi <= span.hi and (a.stream == s or clock.get(a.stream, 0) >= a.seq))]
        self._retire(state)
        state.accesses.append(Access(s, seq, write, span.lo, span.hi, op, stack))

    def host_access(self, span: Span, write: bool, op: str, stack: traceback.StackSummary) -> None:
        """The host reads or writes ``span`` now."""
        state = self.storages.get(span.storage)
        if state is None:
            return
        host = self.clocks.host
        for prev in state.accesses:
            if (prev.write or write) and prev.lo < span.hi and span.lo < prev.hi and host.get(prev.stream, 0) < prev.seq:
                if prev.write:
                    kind, what = RaceKind.HOST, (f"the host {'writes' if write else 'reads'} {_where(span)} "
                                                 f"({op}) while {prev.op} on {prev.stream} may still be writing it")
                else:
                    kind, what = RaceKind.PINNED, (f"the host writes {_where(span)} ({op}) while {prev.op} on "
                                                   f"{prev.stream}, a queued non-blocking copy, may still be "
                                                   "reading it")
                self._report(kind, what + "; synchronize the stream or an event recorded after it first",
                             stack, prev)
                break
        self._retire(state)

    def allocated(self, storage: StorageId, s: StreamKey) -> None:
        """A fresh block, allocated while ``s`` was current."""
        self.storages[storage] = StorageState(s)

    def record_stream(self, storage: StorageId, s: StreamKey) -> None:
        state = self.storages.get(storage)
        if state is not None:
            state.recorded.add(s)

    def free(self, storage: StorageId, stack: traceback.StackSummary) -> None:
        """The block at ``storage`` was freed: a stream other than its allocation stream that may still
        use it, without record_stream, races with the block's next owner."""
        state = self.storages.pop(storage, None)
        if state is None or state.alloc_stream is None:
            return
        alloc = state.alloc_stream
        after = self.clocks.stream.get(alloc, {})
        host = self.clocks.host
        for prev in state.accesses:
            if prev.stream == alloc or prev.stream in state.recorded:
                continue
            if max(after.get(prev.stream, 0), host.get(prev.stream, 0)) < prev.seq:
                span = Span(storage, prev.lo, prev.hi)
                self._report(RaceKind.FREE,
                             f"{_where(span)}, allocated on {alloc}, was freed while {prev.op} on {prev.stream} "
                             f"may still use it; the allocator may hand it to new work on {alloc} at once. Call "
                             f"tensor.record_stream({prev.stream}) or make {alloc} wait for it before the free",
                             stack, prev)
                return

    def forget(self, storage: StorageId) -> None:
        self.storages.pop(storage, None)
