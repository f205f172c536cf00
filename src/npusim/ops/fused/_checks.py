"""Argument checks and the precision rule that the fused-operator families share.

Every message starts with the operator's name and names the argument, then says what was
expected and what came: ``npu_rms_norm: gamma must be on npu:0 (where self is), got cpu``.
The checks read only metadata (sizes, dtypes, devices), so the fake kernels run them too
and a bad call fails the same way eagerly, under FakeTensor and under ``torch.compile``.

Note [Precision of the fused operators]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The NPU's vector units compute float16 and bfloat16 operands in float32 (op-plugin's
references cast to float32, compute, and cast the result back), and its cube unit
accumulates matrix products in float32. The kernels here do the same: they compute in
:func:`compute_dtype` (float32 for every 16-bit input) and cast results to the dtype the
operator documents (usually the input's; statistics such as ``rstd`` stay float32).

Note [float64 inputs]
~~~~~~~~~~~~~~~~~~~~~
op-plugin's floating operators take float16, bfloat16 and float32. npusim also accepts
float64 and then computes in float64 (statistics too), so that ``torch.autograd.gradcheck``
can check every backward in the precision it needs, as PyTorch's own OpInfo tests do; it is
the one place npusim accepts more than the NPU does. Any other dtype is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

import torch
from torch import Tensor

__all__ = [
    "FLOATING", "check", "check_devices", "check_dim", "check_dtype", "check_same_dtype", "check_shape",
    "compute_dtype", "fail", "upcast",
]

# See Note [float64 inputs].
FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def fail(op: str, message: str) -> NoReturn:
    """Raises the RuntimeError that torch_npu raises for a bad argument (TORCH_CHECK), naming the op."""
    raise RuntimeError(f"{op}: {message}")


def check(condition: bool, op: str, message: str) -> None:
    if not condition:
        fail(op, message)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    names = [str(d).removeprefix("torch.") for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def check_dtype(op: str, name: str, tensor: Tensor, allowed: Sequence[torch.dtype] = FLOATING) -> None:
    check(tensor.dtype in allowed, op,
          f"{name} must be {_dtype_names(allowed)}, got {str(tensor.dtype).removeprefix('torch.')}")


def check_same_dtype(op: str, reference: str, tensors: Mapping[str, Tensor | None]) -> None:
    """Every non-None tensor of ``tensors`` has the dtype of the one named ``reference``."""
    want = tensors[reference]
    assert want is not None
    for name, tensor in tensors.items():
        if tensor is not None:
            check(tensor.dtype == want.dtype, op,
                  f"{name} must have the dtype of {reference} ({str(want.dtype).removeprefix('torch.')}), "
                  f"got {str(tensor.dtype).removeprefix('torch.')}")


def check_dim(op: str, name: str, tensor: Tensor, dims: Iterable[int]) -> None:
    dims = tuple(dims)
    check(tensor.dim() in dims, op, f"{name} must be {'-D or '.join(map(str, dims))}-D, got {tensor.dim()}-D "
                                    f"(shape {tuple(tensor.shape)})")


def check_shape(op: str, name: str, tensor: Tensor, shape: Sequence[int], why: str = "") -> None:
    check(tuple(tensor.shape) == tuple(shape), op,
          f"{name} must have shape {tuple(shape)}{f' ({why})' if why else ''}, got {tuple(tensor.shape)}")


def _tensors(arguments: Mapping[str, Any]) -> Iterable[tuple[str, Tensor]]:
    for name, value in arguments.items():
        if isinstance(value, Tensor):
            yield name, value
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, Tensor):
                    yield f"{name}[{i}]", item


def check_devices(op: str, arguments: Mapping[str, Any]) -> None:
    """Every tensor argument (also inside tensor lists) is on one npu device, as the NPU kernel requires.

    The first tensor argument sets the device; a CPU tensor or one on another npu is named.
    """
    first: tuple[str, torch.device] | None = None
    for name, tensor in _tensors(arguments):
        if tensor.device.type != "npu":
            where = f" (where {first[0]} is)" if first else ""
            want = str(first[1]) if first else "an npu device"
            fail(op, f"{name} must be on {want}{where}, got {tensor.device}")
        if first is None:
            first = (name, tensor.device)
        elif tensor.device != first[1]:
            fail(op, f"{name} must be on {first[1]} (where {first[0]} is), got {tensor.device}")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel computes in for inputs of ``dtype``. See Note [Precision of the fused operators]."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def upcast(tensor: Tensor) -> Tensor:
    """``tensor`` in its compute dtype (no copy when it already is)."""
    return tensor.to(compute_dtype(tensor.dtype))
