"""What inductor's generated code for the npu calls at run time.

Kept apart from :mod:`npusim.compile.inductor` so that loading a compiled
module (also from inductor's on-disk cache) imports only the device core's
facade, not inductor's code generation.
"""

from __future__ import annotations

from npusim.runtime import acl

__all__ = ["get_raw_stream", "wait_stream"]


def wait_stream(device: int) -> None:
    """Waits until the current stream of npu ``device`` has run its earlier work.

    Called before every C++ kernel of a compiled region: the kernel then reads
    and writes npu memory on the host at once, so it must come after whatever
    the stream still has queued (a copy, a collective, an eager op's output).
    See Note [Compiled code in stream order].
    """
    acl.synchronize_current_stream(device)


def get_raw_stream(device: int) -> int:
    """The id of npu ``device``'s current stream (what inductor calls a raw stream)."""
    return acl.current_stream(device)[0]
