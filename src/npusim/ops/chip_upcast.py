"""aten ops that the chip computes in float32 for float16 / bfloat16 operands.

Note [float16 losses computed in float32]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``binary_cross_entropy_with_logits`` has no CPU or CUDA kernel: PyTorch runs its
CompositeExplicitAutograd kernel, a chain of elementwise ops, and its backward formula is
another chain. On a float16 input every link rounds to float16 (CUDA's too: each op
computes in float32 and stores float16), so a "sum" over 640 elements is off by tens of
ulps. On the chip the op is one aclnn kernel (op-plugin's
``BinaryCrossEntropyWithLogits``, and ``npu_binary_cross_entropy_with_logits_backward``
for the gradient) whose vector units compute 16-bit operands in float32 and round once
(Note [Precision of the fused operators]); torch_npu's and op-plugin's tests compare the
float16 result and gradient with CPU's float32 ones cast to float16
(test/npu/test_binary_cross_entropy_with_logits.py).

So where every tensor operand has the same 16-bit dtype, the npu computes the op on
float32 copies and casts the result back, twice over:

- at AutogradPrivateUse1, so the backward is the float32 one too: autograd
  differentiates the casts and the float32 op, and each gradient is rounded once;
- at PrivateUse1, for calls that skip autograd (``torch.inference_mode``).

Any other call (float32, float64, mixed dtypes) runs the kernel PyTorch would have run,
taken with ``torch.library.get_kernel`` before the registration: the composite and its
derivatives.yaml formula, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

# The ops computed in float32 for 16-bit operands. See Note [float16 losses computed in float32].
UPCAST_OPS: tuple[str, ...] = ("binary_cross_entropy_with_logits",)
_SIXTEEN_BIT = (torch.float16, torch.bfloat16)

# The registrations live as long as this library object (made by register()).
_lib: torch.library.Library | None = None


def sixteen_bit_dtype(args: tuple[Any, ...]) -> torch.dtype | None:
    """The 16-bit dtype that every tensor argument has, None if they differ or are wider."""
    dtypes = {a.dtype for a in args if isinstance(a, Tensor)}
    if len(dtypes) != 1:
        return None
    (dtype,) = dtypes
    return dtype if dtype in _SIXTEEN_BIT else None


def _float32(value: Any) -> Any:
    return value.float() if isinstance(value, Tensor) else value


def _kernel(op: torch._ops.OpOverload, key: str) -> Callable[..., Any]:
    """The npu kernel of ``op`` at ``key``: float32 inside for 16-bit operands, else PyTorch's."""
    original = torch.library.get_kernel(op, key)

    def kernel(keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any) -> Any:
        dtype = sixteen_bit_dtype((*args, *kwargs.values()))
        if dtype is None:
            return original.call_boxed(keyset, *args, **kwargs)
        wide = [_float32(a) for a in args]
        # A new call: at AutogradPrivateUse1 autograd records the casts and the float32 op.
        return op(*wide, **{k: _float32(v) for k, v in kwargs.items()}).to(dtype)

    return kernel


def register() -> None:
    """Registers the float32-inside npu kernels of :data:`UPCAST_OPS` (idempotent)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    for name in UPCAST_OPS:
        op = getattr(torch.ops.aten, name).default
        for key in ("AutogradPrivateUse1", "PrivateUse1"):
            _lib.impl(name, _kernel(op, key), key, with_keyset=True)
