"""Route trace of ``_foreach_copy_`` (docs/SPEC.md section 4.2).

Tests and benchmarks read which route each call took::

    with npusim.ops.trace_foreach_copy() as calls:
        torch._foreach_copy_(dsts, srcs)
    assert calls[0].groups[0].route == "fast"

The kernel decides the routes (See Note [The _foreach_copy_ router] in
csrc/aten/foreach_copy.cpp) and, while a trace is active, hands each call's
groups to :func:`_record`, which builds the records. Without a trace no records
are built: tracing costs nothing unless asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, NamedTuple

import torch

from npusim.runtime import acl

Route = Literal["fast", "batch", "slow", "compat"]


class GroupRecord(NamedTuple):
    """One dtype group of a call and how it was copied."""

    route: Route
    pairs: int  # tensor pairs in the group
    chunks: int  # device tasks launched (fast route); 1 for a batch; 0 for slow / compat
    non_blocking: bool  # the non_blocking the route was given (forced True on the aligned fast route)
    dtype: torch.dtype | None  # the group's source dtype; None for compat (pairs are not grouped)


class CallRecord(NamedTuple):
    """One ``torch._foreach_copy_`` call that reached the npu kernel."""

    groups: tuple[GroupRecord, ...]
    non_blocking: bool  # what the caller passed
    mode: str  # "aligned" or "legacy"

    @property
    def routes(self) -> tuple[Route, ...]:
        return tuple(g.route for g in self.groups)


# Every active trace's record list; the kernel appends to each. Empty: no tracing.
_active: list[list[CallRecord]] = []


def enabled() -> bool:
    return bool(_active)


def _record(groups: list[tuple[Route, int, int, bool, torch.dtype | None]], non_blocking: bool,
            legacy: bool) -> None:
    """The kernel's trace sink: one call's groups, appended to every active trace."""
    record = CallRecord(tuple(GroupRecord(*g) for g in groups), non_blocking, "legacy" if legacy else "aligned")
    for calls in _active:
        calls.append(record)


@contextmanager
def trace_foreach_copy() -> Iterator[list[CallRecord]]:
    """Collects a ``CallRecord`` per ``_foreach_copy_`` call on the npu inside the block."""
    calls: list[CallRecord] = []
    _active.append(calls)
    acl.set_foreach_copy_trace_sink(_record)
    try:
        yield calls
    finally:
        # By identity: two traces may hold equal lists.
        del _active[next(i for i, c in enumerate(_active) if c is calls)]
        if not _active:
            acl.set_foreach_copy_trace_sink(None)
