"""What inductor's generated code for the npu calls at run time.

Kept apart from :mod:`npusim.compile.inductor` so that loading a compiled
module (also from inductor's on-disk cache) imports only the device core's
facade, not inductor's code generation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from npusim.runtime import acl

__all__ = ["get_raw_stream", "launch"]


def launch(device: int, kernel: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Runs C++ kernel ``kernel(*args)`` of a compiled region in npu ``device``'s stream order.

    Called for every C++ kernel of a compiled region: the kernel reads and writes npu memory
    on the host, so it runs after whatever the current stream still has queued (a copy, a
    collective, an eager op's output); see Note [Compiled code in stream order]. While that
    stream is captured into an npu graph the call is recorded instead, as a stream task that
    calls the kernel on the same tensors when the graph is replayed (Note [Compiled code in
    an npu graph]).
    """
    acl.launch_host_kernel(device, kernel, args)


def get_raw_stream(device: int) -> int:
    """The id of npu ``device``'s current stream (what inductor calls a raw stream)."""
    return acl.current_stream(device)[0]
