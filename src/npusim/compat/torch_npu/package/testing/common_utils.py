"""``torch_npu.testing.common_utils``: devices, inputs, skips and scaler cases for torch_npu's tests.

Importing it touches no device (torch_npu's rule for its test helpers). Inputs are
drawn from NumPy's global generator, as torch_npu's are; npusim keeps every tensor in
the ND format, so a requested internal format (``npu_format`` other than -1) is applied
only when op-plugin's ``npu_format_cast`` is simulated: the values are the same either way.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import statistics
import unittest
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

__all__ = [
    "SkipIfNoLapack", "SkipIfNotGteCANNVersion", "SupportedDevices", "check_operators_in_prof",
    "create_common_tensor", "create_dtype_tensor", "freeze_rng_state", "get_cycles_per_ms", "get_npu_device",
    "is_iterable", "iter_indices", "set_npu_device", "soc_family", "test_2args_broadcast",
]

PERF_TEST_ENABLE = False  # torch_npu's performance baselines have no meaning on a simulator


@contextlib.contextmanager
def freeze_rng_state() -> Iterator[None]:
    """Restores the CPU and npu generators' states when the block ends."""
    cpu_state = torch.get_rng_state()
    npu_state = torch.npu.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(cpu_state)
        torch.npu.set_rng_state(npu_state)


def iter_indices(tensor: torch.Tensor) -> Iterable[Any]:
    """Every index of ``tensor`` (ints for 1-D, tuples above; none for a scalar)."""
    if tensor.dim() == 0:
        return range(0)
    if tensor.dim() == 1:
        return range(tensor.size(0))
    return itertools.product(*(range(size) for size in tensor.size()))


def is_iterable(obj: object) -> bool:
    try:
        iter(obj)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True


def get_npu_device() -> str:
    """``npu:<SET_NPU_DEVICE>``, ``npu:0`` by default."""
    index = os.environ.get("SET_NPU_DEVICE")
    return "npu:0" if index is None else f"npu:{index}"


def set_npu_device() -> str:
    device = get_npu_device()
    torch.npu.set_device(device)
    return device


def _format_cast(tensor: torch.Tensor, npu_format: int) -> torch.Tensor:
    from npusim.ops.fused import OPS

    if npu_format == -1 or "npu_format_cast" not in OPS:
        return tensor
    return OPS["npu_format_cast"](tensor, npu_format)


def create_common_tensor(item: Any, minValue: float, maxValue: float,  # noqa: N803  (torch_npu's keywords)
                         device: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``item`` is ``[numpy dtype, npu_format, shape]``: uniform values in [minValue, maxValue), as a
    CPU tensor and the same values on the npu."""
    dtype, npu_format, shape = item[0], item[1], item[2]
    values = np.random.uniform(minValue, maxValue, shape).astype(dtype)
    cpu_input = torch.from_numpy(values)
    npu_input = torch.from_numpy(values).to(device or get_npu_device())
    return cpu_input, _format_cast(npu_input, npu_format)


def create_dtype_tensor(shape: Any, dtype: torch.dtype, npu_format: int = -1, min_value: int = -5, max_value: int = 5,
                        no_zero: bool = False, device: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A CPU tensor and its npu copy: bools, uniform half / float values, else int32 integers in
    [min, max]; ``no_zero`` replaces zeros by ones."""
    if dtype == torch.bool:
        values = np.random.randint(0, 2, size=shape).astype(bool)
    elif dtype in (torch.half, torch.float):
        values = np.random.uniform(min_value, max_value, shape).astype(np.float16 if dtype == torch.half else
                                                                       np.float32)
    else:
        values = np.random.randint(min_value, max_value + 1, size=shape).astype(np.int32)
    if no_zero:
        values = np.where(values != 0, values, np.ones_like(values))
    cpu_input = torch.from_numpy(values)
    npu_input = torch.from_numpy(values).to(device or get_npu_device())
    if dtype in (torch.half, torch.float):
        npu_input = _format_cast(npu_input, npu_format)
    return cpu_input, npu_input


def test_2args_broadcast(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> list[list[np.ndarray]]:
    """``fn`` on two broadcasting pairs (a (1, 1, 1) and a (4, 5) operand against (2, 3, 4, 5)), CPU
    and npu outputs side by side."""
    device = get_npu_device()
    outputs = []
    for small in ((1, 1, 1), (4, 5)):
        x = np.random.rand(2, 3, 4, 5).astype(np.float32)
        y = np.random.rand(*small).astype(np.float32)
        cpu_out = fn(torch.from_numpy(x), torch.from_numpy(y)).numpy()
        npu_out = fn(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)).to("cpu").numpy()
        outputs.append([cpu_out, npu_out])
    return outputs


test_2args_broadcast.__test__ = False  # type: ignore[attr-defined]  (a helper, not a pytest test)


def check_operators_in_prof(expected_operators: list[str], prof: Any,
                            unexpected_operators: list[str] | None = None) -> bool:
    """Whether every expected operator, and no unexpected one, appears in a torch.profiler
    result (npusim's ranges are aten operator names, not CANN kernel names)."""
    expected = list(expected_operators)
    unexpected = set(unexpected_operators or ())
    for event in prof.key_averages():
        key = event.key.replace("cached_", "")
        if key in unexpected:
            return False
        if key in expected:
            expected.remove(key)
    return not expected


class SkipIfNoLapack:
    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not torch._C.has_lapack:
                raise unittest.SkipTest("PyTorch compiled without Lapack")
            return fn(*args, **kwargs)

        return wrapper


def soc_family(device_name: str) -> str:
    """The name SupportedDevices compares: ``Ascend910B`` for ``Ascend910B2``, ``Ascend910_93`` for
    ``Ascend910_9391``, ``Ascend950`` for ``Ascend950PR``, else the first ten characters."""
    if device_name.startswith("Ascend910_"):
        return device_name[:12]
    if device_name.startswith("Ascend950"):
        return device_name[:9]
    return device_name[:10]


class SupportedDevices:
    """Runs the test only on the listed SoC families (``@SupportedDevices(["Ascend910B"])``); the
    simulated SoC is the capability profile's (``torch.npu.get_device_name(0)``)."""

    def __init__(self, supported_devices: list[str]) -> None:
        self.supported_devices = supported_devices

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(test: Any, *args: Any, **kwargs: Any) -> Any:
            family = soc_family(torch.npu.get_device_name(0))
            if family not in self.supported_devices:
                raise unittest.SkipTest(f"Only run on {self.supported_devices!r}, current device is {family}.")
            return fn(test, *args, **kwargs)

        return wrapper


class SkipIfNotGteCANNVersion:
    """Runs the test only when the simulated CANN package is ``base_version`` or newer."""

    def __init__(self, base_version: str, module: str = "CANN") -> None:
        self.base_version = base_version
        self.module = module

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        from npusim.runtime.utils import _is_gte_cann_version, get_cann_version

        @functools.wraps(fn)
        def wrapper(test: Any, *args: Any, **kwargs: Any) -> Any:
            if not _is_gte_cann_version(self.base_version, module=self.module):
                raise unittest.SkipTest(f"Only run on {self.base_version} or greater, current cann version is "
                                        f"{get_cann_version(module=self.module)}.")
            return fn(test, *args, **kwargs)

        return wrapper


def _create_scaling_models_optimizers(device: str = "npu", optimizer_ctor: Callable[..., Any] = torch.optim.SGD,
                                      optimizer_kwargs: dict[str, Any] | None = None) -> tuple[Any, ...]:
    """Two equal two-layer models with an optimizer each: one to train with a GradScaler, one as control."""
    mod_control = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device=device)
    mod_scaling = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device=device)
    with torch.no_grad():
        for control, scaling in zip(mod_control.parameters(), mod_scaling.parameters(), strict=True):
            scaling.copy_(control)
    kwargs = {"lr": 1.0, **(optimizer_kwargs or {})}
    return (mod_control, mod_scaling, optimizer_ctor(mod_control.parameters(), **kwargs),
            optimizer_ctor(mod_scaling.parameters(), **kwargs))


def _create_scaling_case(device: str = "npu", dtype: torch.dtype = torch.float,
                         optimizer_ctor: Callable[..., Any] = torch.optim.SGD,
                         optimizer_kwargs: dict[str, Any] | None = None) -> tuple[Any, ...]:
    """The models and optimizers above, four (input, target) batches, an MSE loss and the iteration
    at which scaler tests inject an inf (2)."""
    data = [(torch.randn((8, 8), dtype=dtype, device=device), torch.randn((8, 8), dtype=dtype, device=device))
            for _ in range(4)]
    loss_fn = torch.nn.MSELoss().to(device)
    skip_iter = 2
    return _create_scaling_models_optimizers(device, optimizer_ctor, optimizer_kwargs) + (data, loss_fn, skip_iter)


@functools.lru_cache
def get_cycles_per_ms() -> float:
    """Cycles of ``torch.npu._sleep`` per millisecond, measured with timing events (median-trimmed mean of 10)."""

    def measure() -> float:
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record()
        torch.npu._sleep(1000000)
        end.record()
        end.synchronize()
        return 1000000 / start.elapsed_time(end)

    values = sorted(measure() for _ in range(10))
    return statistics.mean(values[2:-2])
