"""``torch.npu.utils``: torch_npu's ``torch_npu.npu.utils`` names that mean something here.

torch_npu keeps its device helpers and the CANN version queries in this submodule;
frameworks and torch_npu's own test helpers import them from it
(``from torch_npu.npu.utils import _get_device_index, get_cann_version``). The CANN
version is the one the capability profile models (``Profile.cann_version``).
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any

import torch
from torch._utils import _get_device_index as _torch_get_device_index

from npusim.runtime.device import (
    current_device,
    device,
    device_of,
    get_sync_debug_mode,
    ipc_collect,
    is_bf16_supported,
    set_device,
    set_sync_debug_mode,
    synchronize,
)
from npusim.runtime.streams import StreamContext, current_stream, default_stream, set_stream, stream

__all__ = [
    "StreamContext", "clear_npu_overflow_flag", "current_device", "current_stream", "default_stream", "device",
    "device_of", "get_cann_version", "get_npu_overflow_flag", "get_soc_version", "get_sync_debug_mode",
    "ipc_collect", "is_bf16_supported", "is_support_inf_nan", "npu_check_overflow", "set_device", "set_stream",
    "set_sync_debug_mode", "stream", "synchronize",
]

# The packages torch_npu's get_cann_version(module=...) knows.
CANN_MODULES = ("CANN", "RUNTIME", "COMPILER", "HCCL", "TOOLKIT", "OPP", "OPP_KERNEL", "DRIVER")

_VERSION = re.compile(r"(\d+)\.(\d+)\.(?:(\d+)|RC(\d+))(?:\.(?:alpha|beta|T)(\d+))?", re.IGNORECASE)


def _get_device_index(device: Any, optional: bool = False, allow_cpu: bool = False) -> int:
    """torch_npu's contract: an int is returned as is; a ``torch.device`` (or its string) must be
    an npu device (or cpu with ``allow_cpu``, giving -1); None or ``"npu"`` give the current
    device when ``optional``. The rest is PyTorch's ``torch._utils._get_device_index``."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type not in (("npu", "cpu") if allow_cpu else ("npu",)):
        expected = "an npu or cpu device" if allow_cpu else "an npu device"
        raise ValueError(f"torch.npu.utils._get_device_index: expected {expected}, got {device}")
    return _torch_get_device_index(device, optional, allow_cpu)


def get_cann_version(module: str = "CANN") -> str:
    """The version of a CANN package, as torch_npu reports it: the profile's ``cann_version``
    for every package; the driver (``"DRIVER"``) is not simulated, so its version is ``""``."""
    from npusim.runtime.profiles import get_profile

    if module not in CANN_MODULES:
        raise ValueError(f"torch.npu.utils.get_cann_version: module must be one of {CANN_MODULES}, got {module!r}")
    return "" if module == "DRIVER" else get_profile().cann_version


# torch_npu's SocVersion numbers (c10_npu::SocVersion), by the SoC name a profile models.
_SOC_VERSIONS = {
    "Ascend910PremiumA": 100, "Ascend910ProA": 101, "Ascend910A": 102, "Ascend910ProB": 103, "Ascend910B": 104,
    "Ascend310P1": 200, "Ascend310P2": 201, "Ascend310P3": 202, "Ascend310P4": 203, "Ascend310P5": 204,
    "Ascend310P7": 205, "Ascend910B1": 220, "Ascend910B2": 221, "Ascend910B2C": 222, "Ascend910B3": 223,
    "Ascend910B4": 224, "Ascend910B4-1": 225, "Ascend310B1": 240, "Ascend310B2": 241, "Ascend310B3": 242,
    "Ascend310B4": 243, "Ascend910_9391": 250, "Ascend910_9392": 251, "Ascend910_9381": 252,
    "Ascend910_9382": 253, "Ascend910_9372": 254, "Ascend910_9362": 255, "Ascend910_9363": 256,
}
_ASCEND950 = 260  # every Ascend950 variant


def get_soc_version() -> int:
    """The simulated SoC's number in torch_npu's ``SocVersion`` (221 for the training profile's
    Ascend910B2), -1 (``UnsupportedSocVersion``) for a name torch_npu does not know; also
    ``torch_npu._C._npu_get_soc_version``. torch_npu's tests compare it with 260 (Ascend950)."""
    from npusim.runtime.profiles import get_profile

    name = get_profile().soc_name
    if name.startswith("Ascend950"):
        return _ASCEND950
    return _SOC_VERSIONS.get(name, -1)


def _cann_version_key(version: str) -> tuple[int, ...]:
    """Orders CANN versions as releases follow each other: ``8.0.RC3 < 8.0.0 < 8.1.RC1 < 8.1.0``."""
    match = _VERSION.fullmatch(version.strip())
    if match is None:
        raise ValueError(f"expected a CANN version such as '8.1.RC1' or '9.1.0', got {version!r}")
    major, minor, patch, rc, pre = match.groups()
    release = (1, int(patch)) if patch is not None else (0, int(rc))
    return (int(major), int(minor), *release, int(pre) if pre is not None else 1 << 30)


def _is_gte_cann_version(version: str, module: str = "CANN") -> bool:
    """Whether the simulated CANN package ``module`` is ``version`` or newer (torch_npu's check;
    the driver has no CANN version, so asking about ``"DRIVER"`` raises, as in torch_npu)."""
    if module == "DRIVER":
        raise RuntimeError("torch.npu.utils._is_gte_cann_version: the DRIVER module has no CANN version")
    return _cann_version_key(get_cann_version(module)) >= _cann_version_key(version)


def is_support_inf_nan() -> bool:
    """True: the simulated SoC keeps IEEE infinities and NaNs (INF_NAN mode, as the 910B series);
    overflow shows up as non-finite values, not as a saturation flag."""
    return True


# torch_npu's words for the float-status calls on an INF_NAN SoC; its tests match them.
_NO_FLAG = "Unsupported api when soc_version >= Ascend910B1, please use npu_check_overflow"


def npu_check_overflow(grad: torch.Tensor | float) -> bool:
    """Whether ``grad`` overflowed, by torch_npu's INF_NAN-mode rule (the only mode simulated, see
    :func:`is_support_inf_nan`): a float, or a tensor's float32 sum read on the host (so the call
    waits for the tensor), that is infinite or NaN. Any other argument is a RuntimeError naming
    its type (torch_npu's error class)."""
    if isinstance(grad, torch.Tensor):
        total = float(grad.float().sum())
    elif isinstance(grad, float):
        total = grad
    else:
        raise RuntimeError(f"torch.npu.utils.npu_check_overflow: Unsupported type: expected a Tensor or a float, got "
                        f"{type(grad).__name__}")
    return math.isinf(total) or math.isnan(total)


def get_npu_overflow_flag() -> bool:
    """Refused as on torch_npu for an INF_NAN SoC: the float-status register it reads is the
    saturation mode's; overflow shows up as inf / NaN, which :func:`npu_check_overflow` tests."""
    raise RuntimeError(f"torch.npu.get_npu_overflow_flag: {_NO_FLAG} (the simulated "
                       f"{_soc_name()} keeps inf and NaN)")


def clear_npu_overflow_flag() -> None:
    """Nothing to clear on an INF_NAN SoC: warns as torch_npu does and returns."""
    warnings.warn("When soc_version >= Ascend910B1, clear_npu_overflow_flag is useless. Please remove it.",
                  stacklevel=2)


def _soc_name() -> str:
    from npusim.runtime.profiles import get_profile

    return get_profile().soc_name
