"""``torch.npu.amp``: torch_npu's mixed-precision names over PyTorch's device-generic AMP.

``autocast`` is ``torch.autocast("npu")`` (the npu policies are PyTorch's own op lists, see
``csrc/aten/autocast.cpp``), ``GradScaler`` is ``torch.amp.GradScaler("npu")`` with torch_npu's
overflow rule (Note [torch_npu's overflow flag]), and ``custom_fwd`` / ``custom_bwd`` are
``torch.amp``'s with ``device_type="npu"``.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import torch
from torch.amp.grad_scaler import _refresh_per_optimizer_state

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]


class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801  (torch.cuda.amp.autocast's spelling)
    """``torch.npu.amp.autocast(args...)`` is ``torch.autocast("npu", args...)``."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> None:
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


# Note [torch_npu's overflow flag]
# torch_npu's ``torch.npu.amp.GradScaler`` keeps one ``_has_overflow`` flag per iteration
# besides PyTorch's per-optimizer ``found_inf``: it is set when any optimizer's gradients
# are found non-finite while unscaling, and while it is set no optimizer steps, including
# one whose own gradients are finite and one unscaled before the overflow was seen; update()
# clears it. PyTorch's rule, which ``torch.amp.GradScaler("npu")`` keeps, skips only the
# optimizers whose own gradients overflowed. With ``dynamic=False`` (torch_npu's static loss
# scale) gradients are unscaled without an overflow check and the scale never changes.


class GradScaler(torch.amp.GradScaler):
    """``torch.npu.amp.GradScaler``: ``torch.amp.GradScaler("npu")`` with torch_npu's overflow rule
    and its ``dynamic`` switch. See Note [torch_npu's overflow flag]."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, dynamic: bool = True, enabled: bool = True) -> None:
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)
        self._dynamic = dynamic
        self._has_overflow = False

    def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor,
                        allow_fp16: bool) -> dict[torch.device, torch.Tensor]:
        if not self._dynamic:
            with torch.no_grad():
                for group in optimizer.param_groups:
                    for param in group["params"]:
                        if param.grad is not None:
                            param.grad.mul_(inv_scale.to(param.grad.device))
            return {found_inf.device: found_inf}
        per_device = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        # A host read, as torch_npu's: the flag decides the other optimizers' steps.
        if any(bool(flag.item()) for flag in per_device.values()):
            self._has_overflow = True
        if self._has_overflow:
            for flag in per_device.values():
                flag.fill_(1.0)
        return per_device

    def _maybe_opt_step(self, optimizer: torch.optim.Optimizer, optimizer_state: dict[str, Any], *args: Any,
                        **kwargs: Any) -> float | None:
        if self._has_overflow:
            return None
        return super()._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        if self._enabled and not self._dynamic and new_scale is None:
            # A static scale: only the per-iteration optimizer states are cleared.
            self._check_scale_growth_tracker("update")
            self._per_optimizer_states = collections.defaultdict(_refresh_per_optimizer_state)
        else:
            super().update(new_scale)
        self._has_overflow = False

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._enabled:
            state["dynamic"] = self._dynamic
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._dynamic = state_dict.get("dynamic", self._dynamic)


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
