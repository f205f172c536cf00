"""Shared pieces of the fused-operator tests (tests/test_fused_*.py): dtypes, tolerances, device checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.testing import assert_close

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Against a float32 reference of the same inputs: the result's rounding to its dtype, plus float32 noise.
_TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
              torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2), torch.float64: dict(rtol=1e-9, atol=1e-9)}


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """actual (on npu) equals the reference ``expected`` (computed in float32 or float64) at actual's precision."""
    dtype = dtype or actual.dtype
    assert actual.device.type == "npu"
    assert_close(actual.cpu().to(expected.dtype), expected.cpu(), **_TOLERANCE[dtype])


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """A CPU tensor of normal values, rounded to ``dtype`` (so references see exactly the npu inputs)."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def gradcheck(fn: Callable[..., Any], *inputs: torch.Tensor) -> None:
    """torch.autograd.gradcheck of fn in float64 on npu copies of the inputs."""
    args = [t.detach().to("npu", torch.float64).requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(fn, args, atol=1e-6, rtol=1e-5)


def assert_device_errors(call: Callable[..., Any], args: list[Any], position: int, name: str, op: str) -> None:
    """call(*args) with argument ``position`` on the CPU, then on npu:1, raises naming op and the argument.

    ``position`` is a tensor argument after the first (the first tensor sets the device the others must share).
    """
    for device, got in (("cpu", "cpu"), ("npu:1", "npu:1")):
        moved = list(args)
        moved[position] = args[position].to(device)
        with pytest.raises(RuntimeError, match=rf"^{op}: {name} must be on .*got {got}"):
            call(*moved)


def opcheck(op: Any, *args: Any, **kwargs: Any) -> None:
    """torch.library.opcheck: the schema is honest and the fake kernel and AOT tracing agree with the npu kernel.

    (opcheck's autograd-registration test knows only CPU / CUDA / XPU devices; the backward tests cover autograd.)
    """
    torch.library.opcheck(op, args, kwargs, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
