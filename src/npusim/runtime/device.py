"""Device management of the ``torch.npu`` module."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import torch

from npusim import config
from npusim.runtime import acl

_device_t = torch.device | str | int | None


def device_count() -> int:
    return acl.device_count()


def is_available() -> bool:
    return acl.device_count() > 0


def is_initialized() -> bool:
    """True: the device core is initialised when npusim is imported; False in a child forked after
    npu use, which may not use it (as torch.cuda.is_initialized there)."""
    return not acl.in_bad_fork()


def init() -> None:
    """As torch.cuda.init: the device is ready on import, so this only checks that this process may
    use it. In a child forked after the parent used the npu it raises, as CUDA does (Note [Fork
    after npu use] in csrc/runtime/device.cpp)."""
    if acl.in_bad_fork():
        raise RuntimeError("Cannot re-initialize npu in forked subprocess. To use npu with multiprocessing, "
                           "you must use the 'spawn' start method")


def _lazy_init() -> None:
    """As torch.cuda._lazy_init; see :func:`init`."""
    init()


def current_device() -> int:
    return acl.current_device()


def _check_index(index: int, op: str) -> int:
    """torch.cuda's check for the device-query functions: AssertionError on a bad index."""
    count = acl.device_count()
    if not 0 <= index < count:
        raise AssertionError(f"Invalid device id {index}: torch.npu.{op} expects 0 <= id < device_count() = {count}")
    return index


def _get_device_index(device: _device_t, optional: bool = True, check_range: bool = True) -> int:
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
    if check_range and device != -1 and not 0 <= device < acl.device_count():
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


class _NPUDeviceProperties(NamedTuple):
    """What torch_npu's ``get_device_properties`` reports, taken from the capability profile."""

    name: str
    total_memory: int
    cube_core_num: int
    vector_core_num: int
    L2_cache_size: int  # noqa: N815  (torch_npu's spelling)

    def __repr__(self) -> str:
        return (f"_NPUDeviceProperties(name='{self.name}', total_memory={self.total_memory >> 20}MB, "
                f"cube_core_num={self.cube_core_num}, vector_core_num={self.vector_core_num}, "
                f"L2_cache_size={self.L2_cache_size >> 20}MB)")


def get_device_properties(device: _device_t = None) -> _NPUDeviceProperties:
    """The SoC the profile models; ``total_memory`` is the device's capacity (the HBM size by default)."""
    from npusim.runtime.profiles import get_profile

    index = _check_index(_get_device_index(device, check_range=False), "get_device_properties")
    profile = get_profile()
    capacity = acl.memory_capacity(index)
    return _NPUDeviceProperties(profile.soc_name, capacity if capacity >= 0 else profile.total_memory,
                                profile.cube_core_num, profile.vector_core_num, profile.l2_cache_size)


def get_device_name(device: _device_t = None) -> str:
    """The modelled SoC's name, e.g. ``Ascend910B2``."""
    return get_device_properties(device).name


def get_device_capability(device: _device_t = None) -> tuple[int, int] | None:
    """torch_npu's contract, not CUDA's: ``(major, minor)`` from ``TORCH_NPU_DEVICE_CAPABILITY``
    ("8.0"), else None with a warning (an NPU has no CUDA compute capability)."""
    _check_index(_get_device_index(device, check_range=False), "get_device_capability")
    capability = config.device_capability()
    if capability is None:
        warnings.warn("torch.npu.get_device_capability: set TORCH_NPU_DEVICE_CAPABILITY (e.g. '8.0') to report "
                      "a capability; an NPU has none, so None is returned (as torch_npu does)", stacklevel=2)
        return None
    return capability


def can_device_access_peer(device: _device_t, peer_device: _device_t) -> bool:
    """Every simulated device can copy to every other (their memory is host memory)."""
    _check_index(_get_device_index(device, check_range=False), "can_device_access_peer")
    _check_index(_get_device_index(peer_device, check_range=False), "can_device_access_peer")
    return True


def utilization(device: _device_t = None) -> int:
    """Percent of the device's streams that have unfinished work right now (torch_npu: the
    device's utilization rate)."""
    index = _check_index(_get_device_index(device, check_range=False), "utilization")
    busy = acl.busy_streams(index)
    return round(100 * busy[0] / busy[1]) if busy[1] else 0


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes torch.autocast("npu") may cast to; float32 as torch_npu lists it, so that
    ``torch.autocast("npu", dtype=torch.float32)`` is honoured rather than disabled."""
    return [torch.float16, torch.bfloat16, torch.float32]


def get_arch_list() -> list[str]:
    """The architectures the device code supports (torch.cuda: those it was compiled for): the SoC
    the profile models, e.g. ``["Ascend910B2"]`` (npusim computes with PyTorch's CPU kernels)."""
    from npusim.runtime.profiles import get_profile

    return [get_profile().soc_name]


def _sleep(cycles: int) -> None:
    """A task on the current stream that takes ``cycles`` AI Core cycles (the profile's
    ``clock_mhz``) and does nothing, as ``torch.cuda._sleep``: the host does not wait."""
    from npusim.runtime.profiles import get_profile

    if isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 0:
        raise RuntimeError(f"torch.npu._sleep: expected a non-negative integer number of cycles, got {cycles!r}")
    acl.launch_delay(acl.current_device(), cycles / get_profile().clock_mhz)


def _lazy_call(callable: Any, **kwargs: Any) -> None:  # noqa: A002  (torch.cuda's name)
    """Runs ``callable`` now: the device is initialised on import, so nothing is deferred
    (torch.cuda queues it until initialisation)."""
    callable()


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def synchronize(device: _device_t = None) -> None:
    """Waits for all work on every stream of the device."""
    acl.synchronize_device(_get_device_index(device))


_sync_debug_mode = 0
_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """Stored and returned by :func:`get_sync_debug_mode`; npusim does not intercept
    synchronizing calls, so no warning or error is raised by it."""
    global _sync_debug_mode
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    _sync_debug_mode = int(debug_mode)


def get_sync_debug_mode() -> int:
    return _sync_debug_mode


def ipc_collect() -> None:
    """Nothing to collect: npusim shares no device memory between processes (no IPC handles)."""
