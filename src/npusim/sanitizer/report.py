"""What the sanitizer reports: the four kinds of race, each with both stack traces."""

from __future__ import annotations

import traceback
from enum import IntEnum
from typing import NamedTuple

from npusim.sanitizer.clocks import StreamKey


class RaceKind(IntEnum):
    STREAM = 1  # an op on one stream touches memory another stream writes, unordered
    HOST = 2  # the host reads or writes memory a stream may still be writing
    PINNED = 3  # a pinned host buffer changed while a queued non-blocking copy reads it
    FREE = 4  # freed (and reusable) while another stream may still use it, no record_stream


class Access(NamedTuple):
    """One operation's use of a byte range of a storage, on a stream."""

    stream: StreamKey
    seq: int  # the operation's number on its stream (Note [Sanitizer clocks])
    write: bool
    lo: int  # byte range [lo, hi) inside the storage
    hi: int
    op: str
    stack: traceback.StackSummary


class RaceReport(NamedTuple):
    kind: RaceKind
    message: str
    stack: traceback.StackSummary  # the access (for a FREE race: the free) that revealed the race
    previous: Access  # the unordered earlier access

    def __str__(self) -> str:
        return (f"npusim sanitizer [{self.kind.name.lower()} race] {self.message}\n"
                f"  {'Freed' if self.kind is RaceKind.FREE else 'Accessed'} at:\n"
                + "".join("    " + line for line in traceback.format_list(self.stack))
                + f"  Earlier {'write' if self.previous.write else 'read'} by {self.previous.op} on "
                  f"{self.previous.stream}, at:\n"
                + "".join("    " + line for line in traceback.format_list(self.previous.stack)))


class StreamRaceError(RuntimeError):
    """Raised (``on_race="raise"``) at the operation that revealed a race."""

    def __init__(self, reports: list[RaceReport]) -> None:
        self.reports = reports
        super().__init__(f"npusim sanitizer found {len(reports)} race(s):\n" + "\n".join(map(str, reports)))
