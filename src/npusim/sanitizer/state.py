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
from npusim.sanitizer.graph_record import GraphRecord
from npusim.sanitizer.report import Access, RaceKind, RaceReport
from npusim.sanitizer.spans import Span, StorageId

HOST_DEVICE = -1
# More accesses than this per storage: the oldest ones are forgotten (a bound, not a rule).
_MAX_ACCESSES = 64


class StorageState:
    __slots__ = ("accesses", "alloc_stream", "fresh", "recorded")

    def __init__(self, alloc_stream: StreamKey | None) -> None:
        self.accesses: list[Access] = []
        self.fresh = True  # no access yet: its first one may be a reuse of a freed block
        self.alloc_stream = alloc_stream  # the stream the caching allocator would give the block back to
        self.recorded: set[StreamKey] = set()  # record_stream targets


def _where(span: Span) -> str:
    device, ptr = span.storage
    place = "host memory" if device == HOST_DEVICE else f"npu:{device} memory"
    return f"{place} at 0x{ptr:x} (bytes {span.lo}..{span.hi})"


class PendingFree(NamedTuple):
    """A block freed while ``use`` (on another stream than the block's allocation stream) was unordered
    with the allocation stream; a race once a new block's first use on that stream is still unordered."""

    span: Span
    use: Access
    stack: traceback.StackSummary  # where it was freed


# Note [Sanitizer free check]
# CUDA's caching allocator gives a freed block back to its allocation stream at
# once: the next allocation there may get it, without waiting for other streams
# that still use it (record_stream tells it to wait). The race is between such
# a use and the new owner's first access, so the check is made then: a block
# freed while a use on another stream was unordered with the allocation stream
# is pending until the allocation stream is ordered after that use; the first
# access, on that stream, of any block allocated meanwhile that is still not
# ordered after it is reported. (npusim's own allocator defers every free until
# all streams pass it, so nothing breaks here; on a device it would.) FSDP2
# frees gradients allocated on its reduce-scatter stream after the optimizer
# used them on the default stream, and is right to: the reduce-scatter stream
# waits for the default stream before its next allocation.


class State:
    """The sanitizer's bookkeeping; every method is called with ``lock`` held."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.clocks = Clocks()
        self.storages: dict[StorageId, StorageState] = {}
        self.reports: list[RaceReport] = []
        self.unraised = 0  # reports not yet raised (on_race="raise")
        self.ops = 0  # operations seen
        self.pending_frees: dict[StreamKey, list[PendingFree]] = {}  # Note [Sanitizer free check]
        # Streams an npu graph is capturing -> the graph their ops' accesses go to, and events recorded
        # in a capture -> its graph (Note [Sanitizer and npu graphs]).
        self.captured: dict[StreamKey, GraphRecord] = {}
        self.capture_events: dict[int, GraphRecord] = {}

    def _report(self, kind: RaceKind, message: str, stack: traceback.StackSummary, previous: Access) -> None:
        self.reports.append(RaceReport(kind, message, stack, previous))
        self.unraised += 1

    def _retire(self, state: StorageState) -> None:
        host = self.clocks.host
        state.accesses = [a for a in state.accesses if host.get(a.stream, 0) < a.seq][-_MAX_ACCESSES:]

    def stream_access(self, span: Span, s: StreamKey, seq: int, clock: Clock, write: bool, op: str,
                      stack: traceback.StackSummary, alloc: bool = False) -> None:
        """Operation ``seq`` on ``s`` reads or writes ``span``; reports unordered conflicting accesses.
        On a stream an npu graph is capturing, the access is the graph's (Note [Sanitizer and npu graphs])."""
        record = self.captured.get(s)
        if record is not None:
            record.add(span, write, op)
            return
        state = self.storages.get(span.storage)
        if state is None:
            state = self.storages[span.storage] = StorageState(s)
        elif alloc:
            state.alloc_stream = s
        if state.fresh:
            state.fresh = False
            if s in self.pending_frees:
                self._check_reuse(s, clock, stack)
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
            if ((prev.write or write) and prev.lo < span.hi and span.lo < prev.hi
                    and host.get(prev.stream, 0) < prev.seq):
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
        """A fresh block, allocated while ``s`` was current (in a capture: from the graph's private pool,
        which no eager allocation reuses; Note [Sanitizer and npu graphs])."""
        self.storages[storage] = StorageState(None if s in self.captured else s)

    # ---- npu graphs (Note [Sanitizer and npu graphs]) ----------------------

    def capturing(self, s: StreamKey, captured: bool) -> None:
        """Whether a graph captures ``s`` now, as the core says. A capture begun unseen
        (torch.accelerator.Graph) gets an untracked record: its ops are still not eager accesses."""
        if captured:
            if s not in self.captured:
                self.captured[s] = GraphRecord(s.device, tracked=False)
        else:  # only this stream: the graph's other streams may still be captured
            self.captured.pop(s, None)

    def capture_stream_op(self, record_event: bool, event: int, s: StreamKey) -> None:
        """An event record or wait on ``s`` while a graph captures ``s``: a node of the graph. A wait on an
        event recorded in a capture is how ``s`` joined that capture."""
        if record_event:
            self.capture_events[event] = self.captured.setdefault(s, GraphRecord(s.device, tracked=False))
        elif event in self.capture_events:
            self.captured[s] = self.capture_events[event]
        else:
            self.captured.setdefault(s, GraphRecord(s.device, tracked=False))

    def end_capture(self, record: GraphRecord) -> None:
        """The capture of ``record``'s graph ended: its streams and events are eager again."""
        self.captured = {s: r for s, r in self.captured.items() if r is not record}
        self.capture_events = {e: r for e, r in self.capture_events.items() if r is not record}

    def replay(self, record: GraphRecord, s: StreamKey, stack: traceback.StackSummary) -> None:
        """One replay of ``record``'s graph on ``s``: one operation that makes all of the graph's accesses."""
        seq, clock = self.clocks.issue(s)
        for span, access in record.accesses.items():
            if span.storage not in self.storages:  # a block of the graph's pool (or one allocated unseen)
                state = self.storages[span.storage] = StorageState(None)
                state.fresh = False  # from the graph's pool: never a reuse of an eagerly freed block
            self.stream_access(span, s, seq, clock, access.write, f"{access.op} (replayed by an npu graph)", stack)

    def record_stream(self, storage: StorageId, s: StreamKey) -> None:
        state = self.storages.get(storage)
        if state is not None:
            state.recorded.add(s)

    def free(self, storage: StorageId, stack: traceback.StackSummary) -> None:
        """The block at ``storage`` was freed (Note [Sanitizer free check])."""
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
                self.pending_frees.setdefault(alloc, []).append(
                    PendingFree(Span(storage, prev.lo, prev.hi), prev, stack))

    def _check_reuse(self, s: StreamKey, clock: Clock, stack: traceback.StackSummary) -> None:
        """A new block's first access on ``s``: pending frees still unordered with it are races."""
        for pending in self.pending_frees.pop(s):
            use = pending.use
            if clock.get(use.stream, 0) < use.seq:
                self._report(RaceKind.FREE,
                             f"{_where(pending.span)}, allocated on {s}, was freed while {use.op} on {use.stream} "
                             f"may still use it, and new work on {s} may reuse it now (its first access "
                             f"is shown). Call tensor.record_stream({use.stream}) or make {s} wait for "
                             f"{use.stream} before the free",
                             pending.stack, use)

    def forget(self, storage: StorageId) -> None:
        self.storages.pop(storage, None)
