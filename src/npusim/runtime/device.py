"""Device management of the ``torch.npu`` module."""

from __future__ import annotations

from typing import Any

import torch

from npusim.runtime import acl

_device_t = torch.device | str | int | None


def device_count() -> int:
    return acl.device_count()


def is_available() -> bool:
    return acl.device_count() > 0


def is_initialized() -> bool:
    # The device core is initialised when npusim is imported.
    return True


def init() -> None:
    """Present for API parity with torch.cuda; the device is ready on import."""


def _lazy_init() -> None:
    """Present for API parity with torch.cuda; the device is ready on import."""


def current_device() -> int:
    return acl.current_device()


def _get_device_index(device: _device_t, optional: bool = True) -> int:
    """Resolves ``device`` to an npu index; None means the current device.

    An index outside ``0 <= index < device_count()`` raises (as CUDA's
    "invalid device ordinal"); -1 passes through, meaning "none" to callers.
    """
    if device is None:
        if optional:
            return acl.current_device()
        raise ValueError("Expected an npu device, got None")
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "npu":
            raise ValueError(f"Expected an npu device, got {device}")
        if device.index is None:
            return acl.current_device()
        device = device.index
    if not isinstance(device, int):
        raise TypeError(f"Expected a torch.device, str or int for an npu device, got {type(device).__name__}")
    if device != -1 and not 0 <= device < acl.device_count():
        raise RuntimeError(f"Invalid npu device index {device}: expected 0 <= index < device_count() = "
                           f"{acl.device_count()}")
    return device


def set_device(device: _device_t) -> None:
    index = _get_device_index(device)
    if index >= 0:
        acl.set_device(index)


class device:  # noqa: N801  (mirrors torch.cuda.device)
    """Context manager that changes the current npu device."""

    def __init__(self, device: Any) -> None:
        self.idx = _get_device_index(device, optional=True) if device is not None else -1
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx >= 0:
            self.prev_idx = acl.current_device()
            acl.set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0:
            acl.set_device(self.prev_idx)


class device_of(device):  # noqa: N801
    """Context manager that makes the device of ``obj`` (a tensor) current."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "npu" else None)


def get_device_name(device: _device_t = None) -> str:
    from npusim.runtime.profiles import get_profile

    return f"npusim NPU {_get_device_index(device)} ({get_profile().name})"


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes torch.autocast("npu") may cast to."""
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def synchronize(device: _device_t = None) -> None:
    """Waits for all work on every stream of the device."""
    acl.synchronize_device(_get_device_index(device))
