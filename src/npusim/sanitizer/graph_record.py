"""The sanitizer's view of npu graphs: a captured op's accesses belong to the graph, and happen at its replays.

Note [Sanitizer and npu graphs]
An op issued on a stream an npu graph is capturing does not run then: the
graph records it, and each replay runs it again. So a captured op touches no
memory at capture time; its reads and writes go to the graph's
:class:`GraphRecord`. A replay (``NPUGraph.replay()``) on stream ``s`` is one
operation on ``s`` that reads and writes everything the graph's ops do: after
what precedes the replay on ``s`` and before what follows it, since the
replay runs the captured lanes after ``s``'s earlier work and its task on
``s`` completes only after every lane (Note [Replaying the lanes] in
``csrc/graph/replay.cpp``). Its accesses are then checked against other
streams' and the host's as any op's are. So "copy the new input into the
static input, then replay" on one stream is clean, and a replay on one stream
racing with a write of its input (or a read of its output) on another is
reported.

Event records and waits on a capturing stream are nodes of the graph, not
orderings of eager work: the clocks ignore them, except that a stream waiting
on an event recorded in the capture joins it (Note [Multi-stream capture]),
and its ops become the graph's too. Blocks allocated during a capture belong
to the graph's private pool, which eager allocations never reuse, so they have
no allocation stream for the free check (Note [Sanitizer free check]).

What is not seen: the lanes of one graph are not checked against each other
(the capture orders them, and an unjoined lane fails ``capture_end``); a graph
captured before the sanitizer was enabled, or through
``torch.accelerator.Graph`` (which never calls ``NPUGraph``'s Python methods),
replays unseen, though its captured ops are still kept out of the eager
accesses, since every op asks the core whether its stream is being captured.
"""

from __future__ import annotations

from typing import NamedTuple

from npusim.sanitizer.spans import Span


class GraphAccess(NamedTuple):
    write: bool
    op: str  # the first captured op that wrote the range (or read it, when none wrote it)


class GraphRecord:
    """What one captured graph's replays read and write (Note [Sanitizer and npu graphs])."""

    __slots__ = ("accesses", "device", "tracked")

    def __init__(self, device: int, tracked: bool = True) -> None:
        self.device = device  # a replay runs on the current stream of the device the graph captured
        # False: a capture the sanitizer did not see begin (torch.accelerator.Graph), whose replays it
        # cannot see either; its ops are dropped.
        self.tracked = tracked
        self.accesses: dict[Span, GraphAccess] = {}

    def add(self, span: Span, write: bool, op: str) -> None:
        """A captured op reads or writes ``span`` at every replay. A write subsumes a read of the same
        bytes: any access another stream makes that races with the read races with the write."""
        if not self.tracked:
            return
        known = self.accesses.get(span)
        if known is None or (write and not known.write):
            self.accesses[span] = GraphAccess(write, op)
