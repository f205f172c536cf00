"""What inductor's generated code for the npu calls at run time.

Kept apart from :mod:`npusim.compile.inductor` so that loading a compiled
module (also from inductor's on-disk cache) imports only the device core's
facade, not inductor's code generation.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from npusim.runtime import acl

__all__ = ["get_raw_stream", "launch"]

# Each kernel's C entry point, 0 where it has none to call (Note [Compiled kernels without the GIL]).
_entry_points: dict[Callable[..., Any], int] = {}


def _entry_point(kernel: Callable[..., Any]) -> int:
    """The address of ``kernel``'s C entry point: the ``kernel`` symbol of the library inductor
    loaded it from (its Python binding calls that), or 0."""
    try:
        return _entry_points[kernel]
    except KeyError:
        pass
    address = 0
    path = getattr(getattr(kernel, "__self__", None), "__file__", None)
    if isinstance(path, str) and path.endswith(".so") and getattr(kernel, "__name__", None) == "kernel":
        try:
            address = ctypes.cast(ctypes.CDLL(path).kernel, ctypes.c_void_p).value or 0
        except (OSError, AttributeError):
            address = 0
    _entry_points[kernel] = address
    return address


def launch(device: int, kernel: Callable[..., Any], args: tuple[Any, ...], signature: str = "") -> None:
    """Runs C++ kernel ``kernel(*args)`` of a compiled region in npu ``device``'s stream order.

    Called for every C++ kernel of a compiled region. With ``signature`` (a letter per argument:
    ``r`` a tensor it reads, ``w`` one it writes, ``i`` an integer) the kernel is a task of the
    current stream that calls its C entry point without Python, asynchronous to the host as an
    eager op is (Note [Compiled kernels without the GIL]). Otherwise (an argument of another kind)
    the kernel reads and writes npu memory on the host, so it runs after whatever the current
    stream still has queued (a copy, a collective, an eager op's output); see Note [Compiled code
    in stream order]. While that stream is captured into an npu graph the call is recorded
    instead, as a stream task that calls the kernel on the same tensors when the graph is replayed
    (Note [Compiled code in an npu graph]).
    """
    entry = _entry_point(kernel) if signature else 0
    acl.launch_host_kernel(device, kernel, args, entry, signature)


def get_raw_stream(device: int) -> int:
    """The id of npu ``device``'s current stream (what inductor calls a raw stream)."""
    return acl.current_stream(device)[0]
