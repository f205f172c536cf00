"""``torch.npu.amp``: torch_npu's mixed-precision names over PyTorch's device-generic AMP.

``autocast`` is ``torch.autocast("npu")`` (the npu policies are PyTorch's own op lists, see
``csrc/autocast.cpp``), ``GradScaler`` is ``torch.amp.GradScaler("npu")``, and
``custom_fwd`` / ``custom_bwd`` are ``torch.amp``'s with ``device_type="npu"``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]


class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801  (torch.cuda.amp.autocast's spelling)
    """``torch.npu.amp.autocast(args...)`` is ``torch.autocast("npu", args...)``."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> None:
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.npu.amp.GradScaler(args...)`` is ``torch.amp.GradScaler("npu", args...)``."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True, **kwargs: Any) -> None:
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled, **kwargs)


def custom_fwd(fwd: Any = None, *, cast_inputs: torch.dtype | None = None) -> Any:
    """``torch.amp.custom_fwd`` for the npu."""
    if fwd is None:
        return functools.partial(torch.amp.custom_fwd, device_type="npu", cast_inputs=cast_inputs)
    return torch.amp.custom_fwd(fwd, device_type="npu", cast_inputs=cast_inputs)


def custom_bwd(bwd: Any = None) -> Any:
    """``torch.amp.custom_bwd`` for the npu."""
    if bwd is None:
        return functools.partial(torch.amp.custom_bwd, device_type="npu")
    return torch.amp.custom_bwd(bwd, device_type="npu")
