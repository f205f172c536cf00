"""The npu's device interface for dynamo and inductor (``torch._dynamo.device_interface``).

Imported only once ``torch._dynamo`` is (see Note [Registering with dynamo and
inductor lazily]). Every method is ``torch.npu``'s own call.

Note [npu streams inside a compiled region]
-------------------------------------------
Dynamo traces stream contexts only for the devices it lists in its own trace
rules (cuda, xpu); it would inline ``torch.npu.stream(s)`` and stop at the
first call into the device core with a message about a pybind builtin. So the
npu's stream context is marked ``torch.compiler.disable``d with a reason:
the block graph-breaks and runs eagerly, on ``s`` and in stream order, which
gives the eager results; with ``fullgraph=True`` dynamo raises an error that
names ``torch.npu.stream`` and says why. The compiled code itself always
runs on the stream current at call time (Note [Compiled code in stream order]).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device

from npusim.runtime import npu, streams

__all__ = ["NpuDeviceProperties", "NpuInterface", "register_device_interface"]

_STREAM_REASON = (
    "npusim: a torch.npu.stream(s) block is not traced by torch.compile on the npu; "
    "it runs eagerly (graph break), on its stream and in stream order. Move the block out of the "
    "compiled function, or drop fullgraph=True to let it graph-break")


class NpuDeviceProperties(NamedTuple):
    """What inductor asks of a device's properties (npu compute runs on the host's cores)."""

    name: str
    multi_processor_count: int
    total_memory: int


class NpuInterface(DeviceInterface):
    """``torch.npu`` as dynamo and inductor see a device runtime."""

    device = npu.device  # type: ignore[assignment]
    Event = torch.Event  # type: ignore[assignment]
    Stream = npu.Stream  # type: ignore[assignment]

    class Worker:
        """Properties for inductor's compile workers; npusim needs no fork-safe copy."""

        @staticmethod
        def set_device(device: int) -> None:
            npu.set_device(device)

        @staticmethod
        def current_device() -> int:
            return npu.current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> NpuDeviceProperties:
            import os

            index = npu._get_device_index(device)
            # total_memory 0: no capacity set (unlimited), as mem_get_info reports it.
            return NpuDeviceProperties(npu.get_device_name(index), os.cpu_count() or 1,
                                       npu.mem_get_info(index)[1])

    current_device = staticmethod(npu.current_device)
    set_device = staticmethod(npu.set_device)
    device_count = staticmethod(npu.device_count)
    is_available = staticmethod(npu.is_available)
    stream = staticmethod(npu.stream)
    current_stream = staticmethod(npu.current_stream)
    set_stream = staticmethod(npu.set_stream)
    synchronize = staticmethod(npu.synchronize)
    memory_allocated = staticmethod(npu.memory_allocated)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        npu.set_stream(npu.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = npu.current_device()
        if device >= 0 and device != previous:
            npu.set_device(device)
        return previous

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return NpuInterface.exchange_device(device)

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return npu.current_stream(device_idx).stream_id

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> str:
        return ""  # no Triton target: inductor's C++ backend computes on npu memory

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return npu.is_bf16_supported(including_emulation)

    @staticmethod
    def is_triton_capable(device: torch.types.Device = None) -> bool:
        return False

    @classmethod
    def get_device_properties(cls, device: torch.types.Device = None) -> Any:
        return cls.Worker.get_device_properties(device)


def register_device_interface() -> None:
    """Registers ``NpuInterface`` for ``"npu"`` and ``"npu:<i>"`` (as dynamo does for cuda)."""
    register_interface_for_device("npu", NpuInterface)
    for index in range(npu.device_count()):
        register_interface_for_device(f"npu:{index}", NpuInterface)
    # See Note [npu streams inside a compiled region].
    for name in ("__enter__", "__exit__"):
        method = getattr(streams.StreamContext, name)
        if not hasattr(method, "_torchdynamo_disable"):
            setattr(streams.StreamContext, name, torch.compiler.disable(method, reason=_STREAM_REASON))
