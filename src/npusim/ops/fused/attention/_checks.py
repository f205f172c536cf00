"""Argument checks shared by the attention operators: errors name the op and the argument.

op-plugin reports bad input with ``TORCH_CHECK``, a ``RuntimeError``; so do these. An argument
that op-plugin documents but npusim does not compute (quantization, the reserved
``padding_mask``) raises :class:`ArgumentNotSimulatedError`, a ``NotImplementedError``, so a
caller can tell "not simulated" from "wrong".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from npusim.ops.fused._checks import check, fail

__all__ = [
    "FLOAT_DTYPES", "INT_MAX", "MASK_DTYPES", "ArgumentNotSimulatedError", "check", "check_devices", "check_dim",
    "check_divisible", "check_dtype", "check_same_dtype", "fail", "refuse", "rejecting_cpu_kernel",
]

# The dtypes the attention kernels take (op-plugin: float16, bfloat16, float32).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MASK_DTYPES = (torch.bool, torch.uint8)
INT_MAX = 2147483647


class ArgumentNotSimulatedError(NotImplementedError):
    """An argument op-plugin documents for an operator that npusim does not simulate."""


def refuse(op: str, name: str, value: object, why: str) -> None:
    """Raises when ``value`` (an argument npusim does not simulate) is given."""
    if value is not None:
        raise ArgumentNotSimulatedError(f"{op}: argument {name} is not simulated by npusim ({why})")


def check_devices(op: str, tensors: dict[str, Tensor | None]) -> torch.device:
    """Every given tensor on one npu device; returns it."""
    device: torch.device | None = None
    first = ""
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        if tensor.device.type not in ("npu", "meta"):
            fail(op, f"expected {name} on the npu, got a tensor on {tensor.device}")
        if device is None:
            device, first = tensor.device, name
        elif tensor.device != device:
            fail(op, f"expected all tensors on one device, got {first} on {device} and {name} on {tensor.device}")
    assert device is not None
    return device


def check_dtype(op: str, name: str, tensor: Tensor | None, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    if tensor is not None and tensor.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        fail(op, f"{name} must be one of {names}, got {str(tensor.dtype).removeprefix('torch.')}")


def check_same_dtype(op: str, reference: str, dtype: torch.dtype, tensors: dict[str, Tensor | None]) -> None:
    for name, tensor in tensors.items():
        if tensor is not None and tensor.dtype != dtype:
            fail(op, f"{name} must have the dtype of {reference} ({str(dtype).removeprefix('torch.')}), "
                     f"got {str(tensor.dtype).removeprefix('torch.')}")


def check_dim(op: str, name: str, tensor: Tensor, dims: int | Sequence[int], layout: str) -> None:
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if tensor.dim() not in dims:
        want = " or ".join(f"{d}-D" for d in dims)
        fail(op, f"{name} must be {want} for input_layout {layout}, got shape {tuple(tensor.shape)}")


def check_divisible(op: str, what: str, total: int, part: int) -> None:
    if part <= 0 or total % part:
        fail(op, f"{what}: {total} is not a positive multiple of {part}")


def rejecting_cpu_kernel(op: str) -> Callable[..., Any]:
    """The CPU kernel of an npu-only op: an error naming the op and the device, not a missing kernel."""
    def reject(query: Tensor, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{op}: expected npu tensors, got query on {query.device}")
    return reject
